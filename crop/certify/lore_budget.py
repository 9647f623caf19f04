"""LoRe's bounded search (:mod:`crop.certify.lore`, ``max_nodes``): the order of the open nodes, their worst case
and the bound of a search cut short (docs/statistics.md, "Bounded LoRe").

A node n left open contributes its worst case w(n) = J_n + min(0, r_min·Σ_{k=t_n}^{H-1} γ^k) (:func:`worst`) in
place of the leaves below it.  Under a budget the order in which open nodes are expanded decides which are left
open, so ``order: best-first`` (the default) expands the open item of lowest w first (:func:`key`: ties deeper
first, then the last pushed first, so equal worst cases are searched depth-first): the minimum of w over the open
nodes, the truncated bound, then rises as soon as it can.  ``order: depth-first`` keeps Algorithm 3's stack.
The order is used only with a budget: an unbounded search has no open nodes at the end and runs depth-first.

``report_double``: the search continues to 2·``max_nodes`` in the same order, the result at ``max_nodes``
captured on the way (:func:`closing` at the first child that budget would refuse) is the certified one, the
bound at twice the budget is reported beside it (:func:`settle`).
"""
from __future__ import annotations

import math

import numpy as np

from crop.io import count_value as _count
from crop.io import real_value as _real

__all__ = ["ORDERS", "worst", "key", "closing", "settle", "at_budget_state"]

#: The orders a bounded search may expand its open nodes in.
ORDERS = ("best-first", "depth-first")


def worst(search, nodes: list) -> dict[int, float]:
    """The lowest return of any trajectory through each open node (its leaves, at any ε), by ``id``: the
    return so far plus J_min of its remaining steps, min(0, r_min·Σ_{k=t}^{H-1} γ^k) (it may terminate at
    any step).  With r_min < 0 it is summed as a leaf's return is, J ← J + γ^k·r_min step by step
    (rounding to nearest is monotone, so no leaf below the node is computed lower), then rounded down one
    more step: it is ≤ every computed leaf return below the node, not only up to rounding."""
    J = np.array([n.J for n in nodes], np.float64)
    r_min, gamma, horizon = search.search.reward_min, search.problem.gamma, search.problem.horizon
    if r_min < 0 and nodes:
        t = np.array([n.t for n in nodes], np.int64)
        inner = ~np.array([n.leaf for n in nodes], bool)
        for k in range(int(t[inner].min()) if inner.any() else horizon, horizon):
            live = inner & (t <= k)
            J[live] = J[live] + (gamma ** k) * r_min
        J[inner] = np.nextafter(J[inner], -np.inf)
    return {id(n): float(j) for n, j in zip(nodes, J)}


def key(search, node) -> float:
    """The best-first order's key: the node's worst case w(n), exactly as :func:`worst` computes it for the
    closing bound."""
    return worst(search, [node])[id(node)]


def _record(pairs: list, eps: float, bound: float) -> None:
    if not pairs or bound != pairs[-1][1]:
        pairs.append((eps, bound))


def closing(search, extra=None, refused_extra: int = 0) -> dict:
    """The bound of the search stopped now (nothing changed): at the current ε and at each later critical ε (up
    to ``eps_max``), the minimum of the leaves reached and the worst case of every open node the tree holds at
    that ε — an item left on the stack (a node, or a child waiting for its parent), ``extra`` (a node whose
    children the budget refuses, ``refused_extra`` of them in the tree at ε), or the parent of a queue entry
    with r(a) ≤ ε.  A pruned node cannot lower it (its return so far already reaches the leaves' minimum).
    Also what was explored at the current ε: ``explored_nodes`` (the nodes created and not left open) of
    ``known_nodes`` (the nodes created and the children the budget refused, all in the tree at that ε)."""
    items = [(n, a) for n, a in search.open_items() if not search.pruned(n)]
    opened = [n for n, _ in items] + ([extra] if extra is not None and not search.pruned(extra) else [])
    queue = sorted(search.queue, key=lambda q: q[:2])
    w = worst(search, opened + [q[2] for q in queue if not search.pruned(q[2])])
    bound = min([search.J] + [w[id(n)] for n in opened])
    created = search.transitions + 1
    refused = refused_extra + sum(a >= 0 for _, a in items)
    pairs, eps, i, valid_until = list(search.pairs), search.eps, 0, search.valid_until
    while True:
        while i < len(queue) and queue[i][0] <= eps:
            node = queue[i][2]
            i += 1
            if not search.pruned(node):
                bound = min(bound, w[id(node)])
                refused += eps == search.eps
        _record(pairs, eps, bound)
        if i == len(queue):
            break
        if queue[i][0] > search.search.eps_max:
            valid_until = queue[i][0]
            break
        eps = queue[i][0]
    return {"pairs": pairs, "valid_until": valid_until, "exact_below": search.eps, "eps": eps,
            "explored_nodes": created - sum(a < 0 for _, a in items), "known_nodes": created + refused,
            "transitions": search.transitions, "leaves": search.leaves, "states": len(search.memo),
            "smoothing_calls": search.smoothing_calls}


def explored(search) -> dict:
    """How much of the tree at the ε the search stopped at it expanded (the whole tree when not truncated)."""
    at = search.closed or {}
    n = search.transitions + 1
    known, done = at.get("known_nodes", n), at.get("explored_nodes", n)
    return {"explored_nodes": done, "known_nodes": known, "explored": done / known,
            "explored_at_eps": at.get("exact_below")}


def settle(search) -> None:
    """``report_double``: the search ran to 2·``max_nodes``; its state becomes the one at ``max_nodes``
    (captured when that budget refused its first child: the same operations, hence the same pairs, states and
    counts as a search with that budget), and the bound at twice the budget goes to ``search.double``."""
    pairs = search.pairs
    search.double = {"max_nodes": 2 * search.search.max_nodes, "nodes": search.transitions + 1,
                     "truncated": search.truncated, "exact_below_eps": search.exact_below,
                     "lower_bound_at_smallest_eps": pairs[0][1] if pairs else None,
                     "pairs": [list(p) for p in pairs], **explored(search)}
    at = search.at_budget
    if at is None:   # the tree is smaller than max_nodes: both budgets give the full search
        return
    search.pairs = [tuple(p) for p in at["pairs"]]
    search.valid_until, search.exact_below, search.truncated = at["valid_until"], at["exact_below"], True
    search.transitions, search.leaves, search.smoothing_calls = at["transitions"], at["leaves"], at["smoothing_calls"]
    k = at["states"]
    search.memo = dict(list(search.memo.items())[:k])
    search.alphas, search.smoothed = search.alphas[:k], search.smoothed[:k]
    search.closed = at


def at_budget_state(value, n_states: int, eps: float) -> dict | None:
    """A resume file's captured result at ``max_nodes`` (``report_double``), checked as untrusted input."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("pairs"), list):
        raise ValueError("at_budget is not a captured result")
    out = {k: _count(value.get(k), k) for k in ("transitions", "leaves", "states", "smoothing_calls",
                                                "explored_nodes", "known_nodes")}
    out.update({k: _real(value.get(k), k) for k in ("valid_until", "exact_below", "eps")})
    pairs = []
    for p in value["pairs"]:
        if not isinstance(p, list) or len(p) != 2:
            raise ValueError("a captured pair is not (eps, bound)")
        pairs.append((_real(p[0], "pairs"), _real(p[1], "pairs")))
    if out["states"] > n_states or out["exact_below"] > eps or out["explored_nodes"] > out["known_nodes"] or \
            any(e1 > e2 for (e1, _), (e2, _) in zip(pairs, pairs[1:])) or not pairs or \
            math.isnan(out["valid_until"]):
        raise ValueError("a captured result inconsistent with the search state")
    return {**out, "pairs": pairs}
