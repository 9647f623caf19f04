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
Confidence (union bound over the N distinct states smoothed, no independence needed): with a constant
per-state α (``alpha_mode: state``) the whole tree holds with prob ≥ 1 − N·α; with the summable schedule
α_i = α·6/(π² i²) for the i-th state (``alpha_mode: family``, :func:`crop.stats.lore_state_alpha`) it holds
with prob ≥ 1 − Σ_{i≤N} α_i ≥ 1 − α whatever N turns out to be.  The i-th state's α depends only on i, and
its noise is fresh, so the bound holds although which state comes i-th depends on earlier certificates.
Reported as ``confidence_tree`` (= ``confidence_union``) with the α actually spent.

Long searches are resumable: the whole search state (queue, depth-first stack, nodes with their environment
snapshots, memoised certificates, bound so far, the noise generator's state) is written to a resume file
at most every ``checkpoint_every`` seconds, at any node; a run killed at any point and restarted with the
same arguments continues from it and produces the same result.  The resume file is our own pickle, trusted
like the rest of the results folder; it is keyed by the run's arguments and deleted on success.
"""
from __future__ import annotations

import heapq
import math
import os
import pickle
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from crop.progress import pbar

from crop import stats
from crop.envs import make_env, restore, snapshot, to_obs
from crop.loact import Certificate, certify_state
from crop.smoothing import SmoothedQ

__all__ = ["run_lore", "lore_bound_at"]


@dataclass
class _Node:
    snap: object
    obs: np.ndarray
    t: int
    J: float
    leaf: bool


def run_lore(env_id: str, smoother: SmoothedQ, horizon: int, env_seed: int, *, gamma: float = 1.0,
             eps_max: float = math.inf, prune: bool = True, profile: str | None = None,
             progress: bool | None = None, reward_fn=None, make=None, resume_file=None,
             checkpoint_every: float = 60.0, alpha_of=None) -> tuple[pd.DataFrame, dict]:
    """Algorithm 3.  ``prune`` must only be true when every reward is ≥ 0 (the caller checks the env).

    ``make`` (optional) builds the environment instead of ``make_env(env_id, profile)``.  ``alpha_of``
    (optional) maps i = 1, 2, … to the per-state α of the i-th distinct state smoothed (e.g.
    ``lambda i: stats.lore_state_alpha(alpha, "family", i)``); by default every state uses the smoother's α.
    ``resume_file``: where the search state is saved (and resumed from when it matches this run).
    """
    started = time.time()
    env = make() if make is not None else make_env(env_id, profile)
    obs, _ = env.reset(seed=int(env_seed))
    root = _Node(snapshot(env), to_obs(obs), 0, 0.0, horizon == 0)

    memo: dict[bytes, Certificate] = {}
    alphas: list[float] = []  # per-state α actually used, in smoothing order
    queue: list = []
    state = {"J": math.inf, "transitions": 0, "leaves": 0, "tie": 0}
    bar = pbar(desc=f"LoRe σ={smoother.sigma:g}", unit="node", progress=progress)
    key = {"env": env_id, "horizon": horizon, "env_seed": int(env_seed), "gamma": gamma, "eps_max": eps_max,
           "prune": prune, "sigma": smoother.sigma, "m": smoother.m, "alpha": smoother.alpha,
           "v": (smoother.v_min, smoother.v_max), "bound": smoother.bound,
           "reward_fn": getattr(reward_fn, "__qualname__", None),
           "alpha_of": [alpha_of(i) for i in (1, 2, 3)] if alpha_of is not None else None}

    def save(pairs) -> None:
        from crop.io import atomic_write_bytes

        blob = {"key": key, "queue": queue, "stack": stack, "memo": memo, "alphas": alphas, "state": state,
                "pairs": pairs,
                "generator": smoother.generator.get_state(), "calls": smoother.calls}
        atomic_write_bytes(resume_file, pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL))

    def load():
        if resume_file is None or not os.path.exists(resume_file):
            return False
        with open(resume_file, "rb") as f:
            blob = pickle.load(f)  # our own file (see module docstring)
        if blob.get("key") != key:
            return False  # a different run's state: start afresh
        queue[:] = blob["queue"]
        stack[:] = blob["stack"]
        pairs[:] = blob["pairs"]
        memo.update(blob["memo"])
        alphas[:] = blob["alphas"]
        state.update(blob["state"])
        smoother.generator.set_state(blob["generator"])
        smoother.calls = blob["calls"]
        return True

    def cert_of(node: _Node) -> Certificate:
        key = node.obs.tobytes()
        c = memo.get(key)
        if c is None:
            a = smoother.alpha if alpha_of is None else float(alpha_of(len(memo) + 1))
            c = certify_state(smoother, node.obs, index=f"LoRe node t={node.t}",
                              alpha=None if alpha_of is None else a)
            memo[key] = c
            alphas.append(a)
        return c

    def child(node: _Node, a: int) -> _Node:
        e = restore(env, node.snap)  # the working instance for Atari, a fresh copy otherwise
        obs, reward, terminated, truncated, _ = e.step(int(a))
        if reward_fn is not None:
            reward = reward_fn(reward)
        state["transitions"] += 1
        bar.update(1)
        done = bool(terminated or truncated) or node.t + 1 >= horizon
        return _Node(snapshot(e), to_obs(obs), node.t + 1, node.J + (gamma ** node.t) * float(reward), done)

    def drain(eps: float) -> None:
        """Depth-first expansion of everything on the stack at perturbation ``eps``."""
        while stack:
            maybe_save()
            node = stack.pop()
            if prune and node.J >= state["J"]:
                continue
            if node.leaf:
                state["leaves"] += 1
                state["J"] = min(state["J"], node.J)
                continue
            c = cert_of(node)
            # Explore the policy's own action last (pushed first) so each branch's cheaper alternatives
            # are visited depth-first in a stable order.
            for a in sorted(range(len(c.radii)), key=lambda a: (a != c.action, a)):
                r = float(c.radii[a])
                if r <= eps:
                    stack.append(child(node, a))
                else:
                    state["tie"] += 1
                    heapq.heappush(queue, (r, state["tie"], node, a))

    last_save = [time.time()]

    def maybe_save() -> None:
        if resume_file is not None and time.time() - last_save[0] >= checkpoint_every:
            save(pairs)
            last_save[0] = time.time()

    stack: list = []
    pairs: list = []
    resumed = load()
    if not resumed:
        stack.append(root)
        state["eps"] = 0.0
    valid_until = math.inf
    # The search as a loop over (stack, queue) alone, so it can be saved and resumed at any node.
    while True:
        eps = state["eps"]
        drain(eps)
        if queue and queue[0][0] <= eps:  # equal radii: expand all before recording
            _, _, node, a = heapq.heappop(queue)
            if not (prune and node.J >= state["J"]):
                stack.append(child(node, a))
            continue
        if not pairs or state["J"] != pairs[-1][1]:
            pairs.append((eps, state["J"]))
        if not queue:
            break
        if queue[0][0] > eps_max:
            valid_until = queue[0][0]
            break
        state["eps"] = queue[0][0]
    bar.close()
    env.close()
    if resume_file is not None and os.path.exists(resume_file):
        os.unlink(resume_file)
    n = len(memo)
    info = {
        "distinct_states_smoothed": n,
        "resumed": resumed,
        "transitions": state["transitions"],
        "leaves": state["leaves"],
        "valid_until_eps": valid_until,
        "eps_max": eps_max,
        "pruning": prune,
        "per_state_alpha": smoother.alpha if alpha_of is None else None,
        "per_state_alpha_first": alphas[0] if alphas else None,
        "per_state_alpha_last": alphas[-1] if alphas else None,
        "alpha_spent": float(sum(alphas)),
        "confidence_tree": stats.union_confidence(alphas),
        "confidence_union": stats.union_confidence(alphas),
        "runtime_s": round(time.time() - started, 3),
        "nodes_per_s": round(state["transitions"] / max(time.time() - started, 1e-9), 2),
    }
    return pd.DataFrame(pairs, columns=["eps", "lower_bound"]), info


def lore_bound_at(table: pd.DataFrame, eps: float, valid_until: float = math.inf) -> float:
    """J̲ at ε from the step function (ε_i, J̲_i); NaN beyond the searched range."""
    if eps >= valid_until:
        return math.nan
    t = table.sort_values("eps")
    ok = t[t["eps"] <= eps]
    return float(ok["lower_bound"].iloc[-1]) if len(ok) else math.nan
