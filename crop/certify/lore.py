"""LoRe — local smoothing for certifying the cumulative reward by adaptive search (Algorithm 3, Theorem 4).

From a fixed initial state s₀ the search grows the tree of every trajectory the smoothed policy π̃ could
follow under ℓ2 perturbations of size ≤ ε.  At a node, action a is possible iff ε ≥ r(a) (Theorem 4's
radius for a, 0 for the top action and for actions the confidence bounds cannot separate from it).  A
priority queue holds the not-yet-possible (node, action) pairs keyed by r(a); popping the smallest key
gives the next critical ε.  All entries with the same radius are expanded before the bound for that ε is
recorded.  Output: pairs (ε_i, J̲_i) — for every ε ∈ [ε_i, ε_{i+1}), J_ε(π̃) ≥ J̲_i.

Details that the official implementation got wrong and this one keeps:
  * every node carries a faithful snapshot of the *whole* environment (wrappers, frame stacks, emulator),
    so backtracking never loses state;
  * terminal transitions are kept: the reward of the last step counts, and a terminal node is a leaf;
  * pruning (a node whose return so far already reaches the bound cannot lower it) is used only when no
    reward is negative;
  * every distinct observation is smoothed once (memoised), with fresh noise.

Many states per launch: a certificate the search lacks is smoothed in one :meth:`SmoothedNetwork.estimate_batch`
call with every other *pending* node — an open node not a leaf, not pruned, not yet smoothed — up to ``batch``
distinct observations, in the order the search would reach them.  Given the certificates the result does not
depend on ``batch``; it decides which noise each state draws, and a pending node later pruned may have been
smoothed for nothing (it still counts in the union bound: conservative).  Under ``alpha_mode: family`` the i-th
state *smoothed* gets α_i.
Confidence (union bound over the N distinct states smoothed, no independence needed): with a constant
per-state α (``alpha_mode: state``) the whole tree holds with prob ≥ 1 − N·α; with the summable schedule
α_i = α·6/(π² i²) for the i-th state (``alpha_mode: family``, :func:`crop.smoothing.stats.lore_state_alpha`) it holds
with prob ≥ 1 − Σ_{i≤N} α_i ≥ 1 − α whatever N turns out to be.  The i-th state's α depends only on i, and
its noise is fresh, so the bound holds although which state comes i-th depends on earlier certificates.
Reported as ``confidence_union`` with the α actually spent.

Bounded search (``max_nodes``, :mod:`crop.certify.lore_budget`): the search stops expanding once the tree holds
``max_nodes`` nodes and still returns a sound bound: a node n it leaves open (on the stack, or waiting in the queue
for an ε it has reached) contributes its worst case w(n) = J_n + min(0, r_min·Σ_{k=t_n}^{H-1} γ^k) instead of the
leaves below it (proof: docs/statistics.md, "Bounded LoRe"); ``truncated`` says whether the budget was hit.  Under
a budget the open nodes are expanded best-first on w(n) (``order``), which raises the bound soonest.

Long searches are resumable (:mod:`crop.certify.lore_resume`): the search state is written to a resume file at
most every :class:`Resume`'s ``every`` seconds and on SIGTERM (a cluster's wall-time kill; the process then exits
with status 143), at any node; a run killed at any point and restarted with the same arguments continues from it
and produces the same result, byte for byte.

For the audit the search also returns every state it smoothed (:meth:`LoRe.states_table`, ``lore_states.csv``):
its observation's digest, depth, critical ε, certificate (a₁, L(a₁), every action's radius) and α — what is
needed to bound, at each state an attacked episode visits, the chance of leaving the certified tree.
"""
from __future__ import annotations

import hashlib
import heapq
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from crop import columns as cols
from crop.certify import lore_budget, lore_resume
from crop.certify.loact import Certificate, certify_estimate
from crop.certify.lore_resume import CHECKPOINT_EVERY, Resume, fn_digest, key_of, schedule_key, state_digest
from crop.envs import make_env, restore, snapshot, to_obs
from crop.progress import pbar
from crop.schema import default_of
from crop.smoothing import stats
from crop.smoothing.smoothed import SmoothedNetwork

__all__ = ["LoRe", "LoReSettings", "LoReResult", "Problem", "Search", "Resume", "run_lore", "obs_digest",
           "lore_bound_at", "CHECKPOINT_EVERY"]


@dataclass
class _Node:
    """A node of the search tree: the environment's snapshot and observation at step ``t``, the discounted
    return ``J`` collected on the way there, whether it is a leaf (terminal or at the horizon), and the
    actions from s₀ that reach it (``path``: a linked list ``(a_t, parent's path)``, shared with the parent)."""

    snap: object
    obs: np.ndarray
    t: int
    J: float
    leaf: bool
    path: tuple | None = None

    def actions(self) -> list[int]:
        """The action path from s₀ to this node."""
        out, p = [], self.path
        while p is not None:
            out.append(p[0])
            p = p[1]
        return out[::-1]


def obs_digest(obs: np.ndarray) -> str:
    """The hex digest that names an observation in ``lore_states.csv`` and ``attack_local_steps.csv`` (the
    audit matches an attacked step's clean state to the LoRe state of the same observation by it)."""
    return state_digest(np.asarray(obs)).hex()


def _coerce(obj, **kinds) -> None:
    """The fields ``kinds`` names converted (int, float) in place, None left as it is (a frozen dataclass)."""
    for name, kind in kinds.items():
        value = getattr(obj, name)
        if value is not None:
            object.__setattr__(obj, name, kind(value))


@dataclass(frozen=True)
class Problem:
    """What LoRe certifies: the return of the episode from ``env_seed``'s reset (s₀) over ``horizon`` steps,
    discounted by ``gamma``, each reward counted through ``reward_fn`` (a reward modification, named by
    ``reward_key``)."""

    horizon: int
    env_seed: int
    gamma: float = default_of("environment.lore.gamma")
    reward_fn: Callable | None = field(default=None, metadata={"key": fn_digest})
    reward_key: str | None = None

    def __post_init__(self):
        _coerce(self, horizon=int, env_seed=int, gamma=float)
        if self.horizon < 0:
            raise ValueError(f"horizon must be >= 0, got {self.horizon}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")


@dataclass(frozen=True)
class Search:
    """How Algorithm 3 searches: up to ``eps_max``; ``prune`` (only when every reward is ≥ 0: the caller checks
    the env); ``alpha_of`` (i ↦ the per-state α of the i-th distinct state smoothed, e.g.
    ``lambda i: stats.lore_state_alpha(alpha, "family", i)``; None: the smoother's α for every state);
    ``batch`` (at most this many pending nodes smoothed in one call); ``max_nodes`` (the node budget, the root
    included, with ``reward_min``: the lowest reward per step as the search counts it, which the open
    subtrees' worst case needs; ``order``: the order a bounded search expands its open nodes in, and
    ``report_double``: also the bound at twice the budget, :mod:`crop.certify.lore_budget`)."""

    eps_max: float = math.inf
    prune: bool = True
    alpha_of: Callable | None = field(default=None, metadata={"key": schedule_key})
    batch: int = 64
    max_nodes: int | None = default_of("environment.lore.max_nodes")
    reward_min: float | None = None
    order: str = default_of("environment.lore.order")
    report_double: bool = default_of("environment.lore.report_double")

    def __post_init__(self):
        if int(self.batch) < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.max_nodes is not None and (int(self.max_nodes) < 1 or self.reward_min is None):
            raise ValueError(f"max_nodes must be >= 1 and comes with reward_min, got {self.max_nodes}, "
                             f"{self.reward_min}")
        if self.order not in lore_budget.ORDERS:
            raise ValueError(f"order must be one of {', '.join(lore_budget.ORDERS)}, got {self.order!r}")
        if self.report_double and self.max_nodes is None:
            raise ValueError("report_double needs max_nodes (the bound at twice the budget)")
        if not self.eps_max >= 0:
            raise ValueError(f"eps_max must be >= 0, got {self.eps_max}")
        _coerce(self, batch=int, max_nodes=int, reward_min=float)


@dataclass(frozen=True)
class LoReSettings:
    """Every setting LoRe's search reads, in one frozen value: the :class:`Problem`, the :class:`Search` and
    ``run_key`` (what else names the run, e.g. the checkpoint's sha256).  :meth:`key`, the resume file's key,
    is derived from all their fields, so an option added to any of them cannot be forgotten there."""

    problem: Problem
    search: Search = Search()
    run_key: dict | None = None

    def key(self) -> dict:
        return key_of(self)


@dataclass(frozen=True)
class LoReResult:
    """What :func:`run_lore` returns: the step function (ε_i, J̲_i) (:meth:`LoRe.bound_table`, ``lore.csv``),
    every state smoothed (:meth:`LoRe.states_table`, ``lore_states.csv``) and the search's record
    (:meth:`LoRe.info`)."""

    table: pd.DataFrame
    states: pd.DataFrame
    info: dict


class LoRe:
    """Algorithm 3 from one initial state: the bound J̲ of Theorem 4 at every critical ε, by adaptive search.

    Read like Cohen et al.'s ``Smooth.certify``: build it with the environment (``env_id``, built by ``make``
    when given, else ``make_env(env_id, profile)``), the smoother and its :class:`LoReSettings`; :meth:`certify`
    returns the table of pairs (ε_i, J̲_i).  Its fields are Algorithm 3's state: the ``stack`` of open items at
    the current ``eps``, the priority ``queue`` of (r(a), tie, node, a) for actions not yet possible, the
    memoised certificates ``memo`` (per-state α in ``alphas``), the bound ``J`` so far (the smallest return over
    the leaves reached) and the recorded ``pairs``; :meth:`save` and :meth:`load` (:mod:`crop.certify.lore_resume`)
    write and read exactly these so that a killed search resumes where it stopped.  One object runs one search.
    """

    def __init__(self, env_id: str, smoother: SmoothedNetwork, settings: LoReSettings, *,
                 profile: str | None = None, make: Callable | None = None):
        self.env_id, self.profile, self.make = env_id, profile, make
        self.settings, self.problem, self.search = settings, settings.problem, settings.search
        self.smoother = smoother
        self._network = None                                   # its network digest, once computed
        # Algorithm 3's state (everything save/load carries)
        self.queue: list = []                      # heap of (r(a), tie, node, a)
        self.stack: list = []                      # open items at ε = eps: nodes (depth-first), or a heap of
        #                                            (w(n), -t, -seq, node, a) (best-first; a ≥ 0: the child via a)
        self.best_first = self.search.max_nodes is not None and self.search.order == "best-first"
        self.memo: dict[bytes, Certificate] = {}   # observation bytes -> its certificate
        self.alphas: list[float] = []              # per-state α actually used, in smoothing order
        self.smoothed: list[tuple[int, float, float]] = []  # per state, in smoothing order: (t, ε, L(a₁))
        self.pairs: list[tuple[float, float]] = []  # the output (ε_i, J̲_i)
        self.eps = 0.0                             # the current critical ε
        self.J = math.inf                          # min return over the leaves reached so far
        self.transitions = self.leaves = self.tie = 0
        self.smoothing_calls = 0                   # estimate_batch calls (batches of pending nodes)
        self.valid_until = math.inf                # the next critical ε beyond eps_max, if the search stopped
        self.truncated = False                     # the budget refused a child: open subtrees count their worst case
        self.exact_below = None                    # truncated: the ε it stopped at (pairs below it are exact)
        self.closed = None                         # truncated: what closing the search found (lore_budget.closing)
        self.at_budget = None                      # report_double: the result captured at max_nodes
        self.double = None                         # report_double: the search's own result at 2·max_nodes
        self.env = None
        self._bar = None
        self._autosave = None                      # (resume file, seconds between saves, time of last save)
        self._signal = None                        # a termination signal received, handled at the next node

    # ---- the search ---------------------------------------------------------------------------------------

    def certify(self, *, resume: Resume | None = None, progress: bool | None = None) -> tuple[pd.DataFrame, dict]:
        """Run Algorithm 3 to the end (or to ``eps_max``, or to the node budget): the table (ε_i, J̲_i) and the
        search's record.  ``resume``: where the search state is saved (and resumed from when it matches this
        run), how often, and whether the file is deleted on success (:class:`Resume`)."""
        started = time.time()
        # The working environment (Atari restores every snapshot into it), also when resuming.
        self.env = self.make() if self.make is not None else make_env(self.env_id, self.profile)
        obs, _ = self.env.reset(seed=self.problem.env_seed)
        root = _Node(snapshot(self.env), to_obs(obs), 0, 0.0, self.problem.horizon == 0)
        self._bar = pbar(desc=f"LoRe σ={self.smoother.sigma:g}", unit="node", progress=progress)
        resumed = resume is not None and self.load(resume.path, root)
        if not resumed:
            self.push(root)  # Algorithm 3 starts at s₀ with ε = 0
        if resume is not None:
            self._autosave = (resume.path, resume.every, time.time())
        # The search as a loop over (stack, queue) alone, so it can be saved and resumed at any node.
        with lore_resume.save_on_sigterm(self):
            while True:
                lore_resume.checkpoint(self)
                self.drain(self.eps)
                if self.queue and self.queue[0][0] <= self.eps and not self.truncated:
                    # equal radii: expand all before recording
                    if self.best_first:  # every child of this ε joins the open items, ordered by w(parent)
                        while self.queue and self.queue[0][0] <= self.eps:
                            _, _, node, a = heapq.heappop(self.queue)
                            if not self.pruned(node):
                                self.push(node, a)
                        continue
                    if self.pruned(self.queue[0][2]) or not self.refuse():
                        _, _, node, a = heapq.heappop(self.queue)
                        if not self.pruned(node):
                            self.push(self.expand(node, a))
                        continue
                    self.truncated = True  # the budget refuses a child the tree holds at ε
                if self.truncated:
                    self.close()
                    break
                self.record(self.eps, self.J)
                if not self.queue:
                    break
                if self.queue[0][0] > self.search.eps_max:
                    self.valid_until = self.queue[0][0]
                    break
                self.eps = self.queue[0][0]  # the next critical ε: the smallest radius not yet reached
        if self.search.report_double:
            lore_budget.settle(self)
        self._bar.close()
        self.env.close()
        if resume is not None and resume.remove and os.path.exists(resume.path):
            os.unlink(resume.path)
        return self.bound_table(), self.info(resumed, started)

    def drain(self, eps: float) -> None:
        """Expansion of every open item at perturbation ``eps`` (depth-first, or best-first on w(n) under a
        budget): at each node every action with r(a) ≤ ε is followed, the others wait in the queue keyed by
        r(a).  The first child the node budget refuses stops the search (:meth:`close`)."""
        while self.stack:
            lore_resume.checkpoint(self)
            if self.best_first:
                _, _, _, node, a = self.stack[0]
                if a >= 0 and not self.pruned(node) and self.refuse():
                    self.truncated = True  # the budget refuses a child the tree holds at ε
                    return
                heapq.heappop(self.stack)
            else:
                node, a = self.stack.pop(), -1
            if self.pruned(node):
                continue
            if a >= 0:
                self.push(self.expand(node, a))
                continue
            if node.leaf:
                self.leaves += 1
                self.J = min(self.J, node.J)
                continue
            c = self.certificate(node)
            # Explore the policy's own action last (pushed first) so each branch's cheaper alternatives
            # are visited depth-first in a stable order.
            order = sorted(range(len(c.radii)), key=lambda a: (a != c.action, a))
            for i, a in enumerate(order):
                r = float(c.radii[a])
                if r <= eps and not self.refuse(node, [float(c.radii[b]) for b in order[i:]]):
                    self.push(self.expand(node, a))
                else:
                    self.truncated |= r <= eps  # the budget refuses a child the tree holds at ε
                    self.tie += 1
                    heapq.heappush(self.queue, (r, self.tie, node, a))
            if self.truncated:
                return

    def record(self, eps: float, bound: float) -> None:
        """Record the pair (ε, J̲) where the bound changes."""
        if not self.pairs or bound != self.pairs[-1][1]:
            self.pairs.append((eps, bound))

    def refuse(self, node: _Node | None = None, radii: list[float] = ()) -> bool:
        """The node budget refuses the next child (of ``node``, whose children yet to create have ``radii``): the
        tree holds ``max_nodes`` nodes (the root and every child created); ``report_double``: twice that, the
        result at ``max_nodes`` captured when that budget first refuses."""
        if self.search.max_nodes is None:
            return False
        if self.search.report_double and self.at_budget is None and self.transitions + 1 >= self.search.max_nodes:
            self.at_budget = lore_budget.closing(self, node, sum(r <= self.eps for r in radii))
        return self.transitions + 1 >= self.search.max_nodes * (2 if self.search.report_double else 1)

    def push(self, node: _Node, a: int = -1) -> None:
        """An open item: ``node`` to expand (``a`` = -1) or, best-first, the child of ``node`` via ``a``."""
        if self.best_first:
            self.tie += 1
            heapq.heappush(self.stack, (lore_budget.key(self, node), -node.t, -self.tie, node, a))
        else:
            self.stack.append(node)

    def open_items(self) -> list[tuple[_Node, int]]:
        """The open items (node, a) in the order the search would take them."""
        if self.best_first:
            return [(i[3], i[4]) for i in sorted(self.stack, key=lambda i: i[:3])]
        return [(n, -1) for n in reversed(self.stack)]

    def close(self) -> None:
        """The budget refused a child: the bound at the current ε and at each later critical ε (up to
        ``eps_max``) is the minimum of the leaves reached and the worst case w(n) of every open node
        the tree holds at that ε (:func:`crop.certify.lore_budget.closing`).  The pairs recorded before, at
        ε < ``exact_below`` (the current ε), are the full search's."""
        self.closed = lore_budget.closing(self)
        self.pairs, self.valid_until = self.closed["pairs"], self.closed["valid_until"]
        self.exact_below, self.eps, self.stack, self.queue = self.eps, self.closed["eps"], [], []

    def pruned(self, node: _Node) -> bool:
        """A node whose return so far already reaches the bound cannot lower it (rewards ≥ 0 only)."""
        return self.search.prune and node.J >= self.J

    def certificate(self, node: _Node) -> Certificate:
        """Theorem 4's radii r(a) at the node's observation (Algorithm 1 with fresh noise), once per
        distinct observation; the i-th new one spends α_i = ``alpha_of(i)``.  A miss smooths the node
        together with the other pending nodes (:meth:`pending`) in one batch."""
        key = node.obs.tobytes()
        if key not in self.memo:
            self.smooth(self.pending(node))
        return self.memo[key]

    def pending(self, node: _Node) -> list[_Node]:
        """``node`` and the open nodes (in the order the search takes them) that may still need a certificate: not
        leaves, not pruned now (the bound only falls, so a node pruned now stays pruned), not yet smoothed;
        one per distinct observation, at most ``batch``.  Depends only on the saved search state, so a
        resumed search forms the same batches."""
        out, seen = [node], {node.obs.tobytes()}
        for n, a in self.open_items():
            if len(out) >= self.search.batch:
                break
            k = n.obs.tobytes()
            if a < 0 and k not in seen and k not in self.memo and not n.leaf and not self.pruned(n):
                seen.add(k)
                out.append(n)
        return out

    def smooth(self, nodes: list[_Node]) -> None:
        """Algorithm 1 for the nodes' observations in one :meth:`SmoothedNetwork.estimate_batch` call (fresh
        noise for each); the i-th distinct state smoothed overall spends α_i = ``alpha_of(i)``."""
        sm, i0 = self.smoother, len(self.memo)
        alphas = [sm.alpha] * len(nodes) if self.search.alpha_of is None else \
            [float(self.search.alpha_of(i0 + 1 + j)) for j in range(len(nodes))]
        ests = sm.estimate_batch(np.stack([n.obs for n in nodes]), [f"LoRe node t={n.t}" for n in nodes],
                                 alpha=None if self.search.alpha_of is None else alphas)
        self.smoothing_calls += 1
        for n, a, est in zip(nodes, alphas, ests):
            cert = certify_estimate(est, sm.sigma, sm.v_min, sm.v_max)
            self.memo[n.obs.tobytes()] = cert
            self.alphas.append(a)
            self.smoothed.append((n.t, self.eps, float(est.lower[cert.action])))

    def expand(self, node: _Node, a: int) -> _Node:
        """The child reached by taking action ``a`` at ``node`` (from the node's snapshot, never in place)."""
        child, reward = self.step(node, a)
        if self.search.prune and reward < 0:  # pruning on a negative reward would cut a lower return: unsound
            self._false_reward_range(f"reward {reward} < 0 in a search that prunes (rewards declared non-negative)")
        # a reward below reward_min would make the budget's worst cases unsound
        if self.search.reward_min is not None and reward < self.search.reward_min:
            self._false_reward_range(f"reward {reward} < {self.search.reward_min}, the lowest reward declared")
        self.transitions += 1
        self._bar.update(1)
        return child

    def step(self, node: _Node, a: int) -> tuple[_Node, float]:
        """One transition from the node's snapshot: the child and the reward as the search counts it."""
        e = restore(self.env, node.snap)  # the working instance for Atari, a fresh copy otherwise
        obs, reward, terminated, truncated, _ = e.step(int(a))
        reward = float(reward if self.problem.reward_fn is None else self.problem.reward_fn(reward))
        done = bool(terminated or truncated) or node.t + 1 >= self.problem.horizon
        return _Node(snapshot(e), to_obs(obs), node.t + 1, node.J + (self.problem.gamma ** node.t) * reward, done,
                     (int(a), node.path)), reward

    def _false_reward_range(self, what: str):
        from crop.io import InputError

        raise InputError(f"{self.env_id}: {what}; give the environment's true reward range (rewards.range)")

    def states_table(self) -> pd.DataFrame:
        """Every state the search smoothed, in smoothing order (``lore_states.csv``): its observation's digest
        (:func:`obs_digest`), the depth ``t`` and critical ε at which the search first needed it, its
        certificate's top action a₁, whether certified, L(a₁) (``smoothed_top_lower``), the radius r(a) of every
        action (``radius_a``: Theorem 4's; 0 for a₁ and for actions the bounds cannot separate from it) and its
        per-state α.  With the V range and σ this is what the audit needs to bound, at each state an attacked
        episode visits, the chance that the m-sample policy takes an action LoRe's tree excludes (Lemma 3:
        U(a) = V_min + w·Φ(Φ⁻¹(p_L) − 2r(a)/σ) for every a with r(a) > 0)."""
        certs = list(self.memo.values())
        out = pd.DataFrame({
            cols.OBS_DIGEST: [hashlib.blake2b(k, digest_size=16).hexdigest() for k in self.memo],
            cols.STEP: [t for t, _, _ in self.smoothed], cols.EPS: [e for _, e, _ in self.smoothed],
            cols.ACTION: [c.action for c in certs], cols.CERTIFIED: [c.certified for c in certs],
            cols.SMOOTHED_TOP_LOWER: [low for _, _, low in self.smoothed], cols.ALPHA: self.alphas})
        radii = np.array([c.radii for c in certs], np.float64).reshape(len(certs), self.smoother.n_actions)
        for a in range(self.smoother.n_actions):
            out[f"{cols.RADIUS}_{a}"] = radii[:, a]
        return out

    def bound_table(self) -> pd.DataFrame:
        """The step function (ε_i, J̲_i): for every ε ∈ [ε_i, ε_{i+1}), J_ε(π̃) ≥ J̲_i (Theorem 4)."""
        return pd.DataFrame(self.pairs, columns=[cols.EPS, cols.LOWER_BOUND])

    def key(self) -> dict:
        """The resume file's key (:func:`crop.certify.lore_resume.resume_key`)."""
        return lore_resume.resume_key(self)

    def save(self, path) -> None:
        """Write the search state to ``path`` (:func:`crop.certify.lore_resume.save`)."""
        lore_resume.save(self, path)

    def load(self, path, root: _Node) -> bool:
        """Restore the state saved at ``path`` if it belongs to this run (:func:`crop.certify.lore_resume.load`)."""
        return lore_resume.load(self, path, root)

    def info(self, resumed: bool, started: float) -> dict:
        """What the search did and the confidence it holds with (union bound over the states smoothed)."""
        alphas, elapsed = self.alphas, max(time.time() - started, 1e-9)
        return {
            "distinct_states_smoothed": len(self.memo), "smoothing_calls": self.smoothing_calls,
            "batch": self.search.batch, "resumed": resumed, "transitions": self.transitions,
            "nodes": self.transitions + 1, "max_nodes": self.search.max_nodes, "truncated": self.truncated,
            "exact_below_eps": self.exact_below,
            "order": self.search.order if self.search.max_nodes is not None else "depth-first",
            **lore_budget.explored(self), "double_budget": self.double,
            "leaves": self.leaves, "valid_until_eps": self.valid_until, "eps_max": self.search.eps_max,
            "pruning": self.search.prune,
            "per_state_alpha": self.smoother.alpha if self.search.alpha_of is None else None,
            "per_state_alpha_first": alphas[0] if alphas else None,
            "per_state_alpha_last": alphas[-1] if alphas else None,
            "alpha_spent": float(sum(alphas)), "confidence_union": stats.union_confidence(alphas),
            "runtime_s": round(time.time() - started, 3), "nodes_per_s": round(self.transitions / elapsed, 2),
        }


def run_lore(env_id: str, smoother: SmoothedNetwork, settings: LoReSettings, *, profile: str | None = None,
             progress: bool | None = None, make: Callable | None = None, resume: Resume | None = None) -> LoReResult:
    """Algorithm 3 (:class:`LoRe`) from ``settings.problem.env_seed``'s reset of ``env_id``: the table
    (ε_i, J̲_i), every state smoothed and the search's record (:class:`LoReResult`).  ``make``: an environment
    factory in place of ``make_env(env_id, profile)``; ``resume``: the resume file (:class:`Resume`)."""
    search = LoRe(env_id, smoother, settings, profile=profile, make=make)
    table, info = search.certify(resume=resume, progress=progress)
    return LoReResult(table, search.states_table(), info)


def lore_bound_at(table: pd.DataFrame, eps: float, valid_until: float = math.inf) -> float:
    """J̲ at ε from the step function (ε_i, J̲_i); NaN beyond the searched range."""
    if eps >= valid_until:
        return math.nan
    t = table.sort_values(cols.EPS)
    ok = t[t[cols.EPS] <= eps]
    return float(ok[cols.LOWER_BOUND].iloc[-1]) if len(ok) else math.nan
