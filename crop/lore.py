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

Many states per launch: when the search needs a certificate it does not have, it smooths, in one
:meth:`SmoothedQ.estimate_batch` call, that node together with every other *pending* node — a node on the
depth-first stack whose state is known, that is not a leaf, not pruned by the bound so far and not yet
smoothed — up to ``batch`` distinct observations (the current node first, then the stack from its top, i.e.
in the order the search would reach them).  Given the certificates, the search's result does not depend on
``batch`` (it only reads the memo); ``batch`` decides which noise each state draws (the stream is consumed
batch by batch), and a pending node later pruned may have been smoothed for nothing (it still counts in the
union bound, which only makes the confidence conservative).  ``batch=1`` smooths one state per call, in the
order the search reaches them.  Under ``alpha_mode: family`` the i-th state *smoothed* (in batch order)
gets α_i.
Confidence (union bound over the N distinct states smoothed, no independence needed): with a constant
per-state α (``alpha_mode: state``) the whole tree holds with prob ≥ 1 − N·α; with the summable schedule
α_i = α·6/(π² i²) for the i-th state (``alpha_mode: family``, :func:`crop.stats.lore_state_alpha`) it holds
with prob ≥ 1 − Σ_{i≤N} α_i ≥ 1 − α whatever N turns out to be.  The i-th state's α depends only on i, and
its noise is fresh, so the bound holds although which state comes i-th depends on earlier certificates.
Reported as ``confidence_tree`` (= ``confidence_union``) with the α actually spent.

Long searches are resumable: the whole search state (queue, depth-first stack, nodes with their environment
snapshots, memoised certificates, bound so far, the smoother's noise generator and randomised-rounding
stream) is written to a resume file at most every ``checkpoint_every`` seconds, at any node; a run killed at
any point and restarted with the same arguments continues from it and produces the same result, byte for
byte.  The resume file is our own pickle, trusted like the rest of the results folder; it is keyed by the
run's arguments and deleted on success.
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

from crop import columns as cols
from crop import stats
from crop.envs import make_env, restore, snapshot, to_obs
from crop.loact import Certificate, certify_estimate
from crop.progress import pbar
from crop.smoothing import SmoothedQ

__all__ = ["LoRe", "run_lore", "lore_bound_at", "CHECKPOINT_EVERY"]

#: Seconds between saves of the resumable search state.
CHECKPOINT_EVERY = 60.0


@dataclass
class _Node:
    """A node of the search tree: the environment's snapshot and observation at step ``t``, the discounted
    return ``J`` collected on the way there, and whether it is a leaf (terminal or at the horizon)."""

    snap: object
    obs: np.ndarray
    t: int
    J: float
    leaf: bool


class LoRe:
    """Algorithm 3 from one initial state: the bound J̲ of Theorem 4 at every critical ε, by adaptive search.

    Read like Cohen et al.'s ``Smooth.certify``: build it with the smoothed Q (:class:`SmoothedQ`) and the
    environment, then :meth:`certify` returns the table of pairs (ε_i, J̲_i).  Its fields are Algorithm 3's
    state: the depth-first ``stack`` of nodes to expand at the current ``eps``, the priority ``queue`` of
    (r(a), tie, node, a) for actions not yet possible (keyed by Theorem 4's radius r(a)), the memoised
    certificates ``memo`` (one per distinct observation, with its per-state α in ``alphas``), the bound
    ``J`` so far (the smallest return over the leaves reached) and the recorded ``pairs``.  :meth:`save`
    and :meth:`load` write and read exactly these fields (and the smoother's random state) so that a
    killed search resumes where it stopped; the search itself knows nothing about files.

    ``prune`` must only be true when every reward is ≥ 0 (the caller checks the env).  ``make`` (optional)
    builds the environment instead of ``make_env(env_id, profile)``.  ``alpha_of`` (optional) maps
    i = 1, 2, … to the per-state α of the i-th distinct state smoothed (e.g.
    ``lambda i: stats.lore_state_alpha(alpha, "family", i)``); by default every state uses the smoother's α.
    ``batch`` (default 64): at most this many pending nodes smoothed in one call (module docstring).
    One object runs one search.
    """

    #: Version of the resume file's layout: a file of another layout never matches, the search starts afresh.
    RESUME_FORMAT = 3

    def __init__(self, env_id: str, smoother: SmoothedQ, horizon: int, env_seed: int, *, gamma: float = 1.0,
                 eps_max: float = math.inf, prune: bool = True, profile: str | None = None, reward_fn=None,
                 make=None, alpha_of=None, batch: int = 64):
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = int(batch)
        self.env_id, self.smoother, self.horizon, self.env_seed = env_id, smoother, horizon, int(env_seed)
        self.gamma, self.eps_max, self.prune, self.profile = gamma, eps_max, prune, profile
        self.reward_fn, self.make, self.alpha_of = reward_fn, make, alpha_of
        # Algorithm 3's state (everything save/load carries)
        self.queue: list = []                      # heap of (r(a), tie, node, a)
        self.stack: list[_Node] = []               # nodes to expand depth-first at ε = eps
        self.memo: dict[bytes, Certificate] = {}   # observation bytes -> its certificate
        self.alphas: list[float] = []              # per-state α actually used, in smoothing order
        self.pairs: list[tuple[float, float]] = []  # the output (ε_i, J̲_i)
        self.eps = 0.0                             # the current critical ε
        self.J = math.inf                          # min return over the leaves reached so far
        self.transitions = self.leaves = self.tie = 0
        self.smoothing_calls = 0                   # estimate_batch calls (batches of pending nodes)
        self.valid_until = math.inf                # the next critical ε beyond eps_max, if the search stopped
        self.env = None
        self._bar = None
        self._autosave = None                      # (resume file, seconds between saves, time of last save)

    # ---- the search ---------------------------------------------------------------------------------------

    def certify(self, *, resume_file=None, checkpoint_every: float = CHECKPOINT_EVERY,
                progress: bool | None = None) -> tuple[pd.DataFrame, dict]:
        """Run Algorithm 3 to the end (or to ``eps_max``): the table (ε_i, J̲_i) and the search's record.

        ``resume_file``: where the search state is saved at most every ``checkpoint_every`` seconds (and
        resumed from when it matches this run); deleted on success.
        """
        started = time.time()
        # The working environment (Atari restores every snapshot into it), also when resuming.
        self.env = self.make() if self.make is not None else make_env(self.env_id, self.profile)
        obs, _ = self.env.reset(seed=self.env_seed)
        root = _Node(snapshot(self.env), to_obs(obs), 0, 0.0, self.horizon == 0)
        self._bar = pbar(desc=f"LoRe σ={self.smoother.sigma:g}", unit="node", progress=progress)
        resumed = resume_file is not None and self.load(resume_file)
        if not resumed:
            self.stack.append(root)  # Algorithm 3 starts at s₀ with ε = 0
        if resume_file is not None:
            self._autosave = (resume_file, checkpoint_every, time.time())
        # The search as a loop over (stack, queue) alone, so it can be saved and resumed at any node.
        while True:
            self.drain(self.eps)
            if self.queue and self.queue[0][0] <= self.eps:  # equal radii: expand all before recording
                _, _, node, a = heapq.heappop(self.queue)
                if not self.pruned(node):
                    self.stack.append(self.expand(node, a))
                continue
            if not self.pairs or self.J != self.pairs[-1][1]:
                self.pairs.append((self.eps, self.J))
            if not self.queue:
                break
            if self.queue[0][0] > self.eps_max:
                self.valid_until = self.queue[0][0]
                break
            self.eps = self.queue[0][0]  # the next critical ε: the smallest radius not yet reached
        self._bar.close()
        self.env.close()
        if resume_file is not None and os.path.exists(resume_file):
            os.unlink(resume_file)
        return self.bound_table(), self.info(resumed, started)

    def drain(self, eps: float) -> None:
        """Depth-first expansion of everything on the stack at perturbation ``eps``: at each node every
        action with r(a) ≤ ε is followed, the others wait in the queue keyed by r(a)."""
        while self.stack:
            self._maybe_save()
            node = self.stack.pop()
            if self.pruned(node):
                continue
            if node.leaf:
                self.leaves += 1
                self.J = min(self.J, node.J)
                continue
            c = self.certificate(node)
            # Explore the policy's own action last (pushed first) so each branch's cheaper alternatives
            # are visited depth-first in a stable order.
            for a in sorted(range(len(c.radii)), key=lambda a: (a != c.action, a)):
                r = float(c.radii[a])
                if r <= eps:
                    self.stack.append(self.expand(node, a))
                else:
                    self.tie += 1
                    heapq.heappush(self.queue, (r, self.tie, node, a))

    def pruned(self, node: _Node) -> bool:
        """A node whose return so far already reaches the bound cannot lower it (rewards ≥ 0 only)."""
        return self.prune and node.J >= self.J

    def certificate(self, node: _Node) -> Certificate:
        """Theorem 4's radii r(a) at the node's observation (Algorithm 1 with fresh noise), once per
        distinct observation; the i-th new one spends α_i = ``alpha_of(i)``.  A miss smooths the node
        together with the other pending nodes (:meth:`pending`) in one batch."""
        key = node.obs.tobytes()
        if key not in self.memo:
            self.smooth(self.pending(node))
        return self.memo[key]

    def pending(self, node: _Node) -> list[_Node]:
        """``node`` and the stack's nodes (top first) that the search may still need a certificate for: not
        leaves, not pruned now (the bound only falls, so a node pruned now stays pruned), not yet smoothed;
        one per distinct observation, at most ``batch``.  Depends only on the saved search state, so a
        resumed search forms the same batches."""
        out, seen = [node], {node.obs.tobytes()}
        for n in reversed(self.stack):
            if len(out) >= self.batch:
                break
            k = n.obs.tobytes()
            if k not in seen and k not in self.memo and not n.leaf and not self.pruned(n):
                seen.add(k)
                out.append(n)
        return out

    def smooth(self, nodes: list[_Node]) -> None:
        """Algorithm 1 for the nodes' observations in one :meth:`SmoothedQ.estimate_batch` call (fresh
        noise for each); the i-th distinct state smoothed overall spends α_i = ``alpha_of(i)``."""
        sm, i0 = self.smoother, len(self.memo)
        alphas = [sm.alpha] * len(nodes) if self.alpha_of is None else \
            [float(self.alpha_of(i0 + 1 + j)) for j in range(len(nodes))]
        ests = sm.estimate_batch(np.stack([n.obs for n in nodes]), [f"LoRe node t={n.t}" for n in nodes],
                                 alpha=None if self.alpha_of is None else alphas)
        self.smoothing_calls += 1
        for n, a, est in zip(nodes, alphas, ests):
            self.memo[n.obs.tobytes()] = certify_estimate(est, sm.sigma, sm.v_min, sm.v_max)
            self.alphas.append(a)

    def expand(self, node: _Node, a: int) -> _Node:
        """The child reached by taking action ``a`` at ``node`` (from the node's snapshot, never in place)."""
        e = restore(self.env, node.snap)  # the working instance for Atari, a fresh copy otherwise
        obs, reward, terminated, truncated, _ = e.step(int(a))
        if self.reward_fn is not None:
            reward = self.reward_fn(reward)
        if self.prune and float(reward) < 0:  # pruning on a negative reward would cut a lower return: unsound
            from crop.io import InputError

            raise InputError(f"{self.env_id}: reward {float(reward)} < 0 in a search that prunes (rewards declared "
                             "non-negative); give the environment's true reward range (rewards.range)")
        self.transitions += 1
        self._bar.update(1)
        done = bool(terminated or truncated) or node.t + 1 >= self.horizon
        return _Node(snapshot(e), to_obs(obs), node.t + 1, node.J + (self.gamma ** node.t) * float(reward), done)

    def bound_table(self) -> pd.DataFrame:
        """The step function (ε_i, J̲_i): for every ε ∈ [ε_i, ε_{i+1}), J_ε(π̃) ≥ J̲_i (Theorem 4)."""
        return pd.DataFrame(self.pairs, columns=[cols.EPS, cols.LOWER_BOUND])

    def info(self, resumed: bool, started: float) -> dict:
        """What the search did and the confidence it holds with (union bound over the states smoothed)."""
        n = len(self.memo)
        alphas = self.alphas
        return {
            "distinct_states_smoothed": n,
            "smoothing_calls": self.smoothing_calls,
            "batch": self.batch,
            "resumed": resumed,
            "transitions": self.transitions,
            "leaves": self.leaves,
            "valid_until_eps": self.valid_until,
            "eps_max": self.eps_max,
            "pruning": self.prune,
            "per_state_alpha": self.smoother.alpha if self.alpha_of is None else None,
            "per_state_alpha_first": alphas[0] if alphas else None,
            "per_state_alpha_last": alphas[-1] if alphas else None,
            "alpha_spent": float(sum(alphas)),
            "confidence_tree": stats.union_confidence(alphas),
            "confidence_union": stats.union_confidence(alphas),
            "runtime_s": round(time.time() - started, 3),
            "nodes_per_s": round(self.transitions / max(time.time() - started, 1e-9), 2),
        }

    # ---- resume: kept apart from the search ------------------------------------------------------------------

    def key(self) -> dict:
        """What identifies this run: a resume file written under another key is ignored."""
        sm, alpha_of = self.smoother, self.alpha_of
        return {"format": self.RESUME_FORMAT, "env": self.env_id, "horizon": self.horizon,
                "env_seed": self.env_seed, "batch": self.batch, "gamma": self.gamma, "eps_max": self.eps_max,
                "prune": self.prune,
                "sigma": sm.sigma, "m": sm.m, "alpha": sm.alpha, "v": (sm.v_min, sm.v_max), "bound": sm.bound,
                "reward_fn": getattr(self.reward_fn, "__qualname__", None),
                "alpha_of": [alpha_of(i) for i in (1, 2, 3)] if alpha_of is not None else None,
                # probs and vote share the range [0, 1]: the target tells their searches apart (q, the default: none)
                **({"target": sm.target} if getattr(sm, "target", "q") != "q" else {})}

    _FIELDS = ("queue", "stack", "memo", "alphas", "pairs", "eps", "J", "transitions", "leaves", "tie",
               "smoothing_calls")

    def save(self, path) -> None:
        """Write the whole search state and the smoother's random state (noise generator and randomised
        rounding stream) to ``path`` atomically."""
        from crop.io import atomic_write_bytes

        blob = {"key": self.key(), "smoother": self.smoother.get_state(),
                **{f: getattr(self, f) for f in self._FIELDS}}
        atomic_write_bytes(path, pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL))

    def load(self, path) -> bool:
        """Restore the state saved by :meth:`save` if ``path`` exists and belongs to this run."""
        if not os.path.exists(path):
            return False
        with open(path, "rb") as f:
            blob = pickle.load(f)  # our own file (see module docstring)
        if blob.get("key") != self.key():
            return False  # a different run's state: start afresh
        for f in self._FIELDS:
            setattr(self, f, blob[f])
        self.smoother.set_state(blob["smoother"])
        return True

    def _maybe_save(self) -> None:
        if self._autosave is None:
            return
        path, every, last = self._autosave
        if time.time() - last >= every:
            self.save(path)
            self._autosave = (path, every, time.time())


def run_lore(env_id: str, smoother: SmoothedQ, horizon: int, env_seed: int, *, gamma: float = 1.0,
             eps_max: float = math.inf, prune: bool = True, profile: str | None = None,
             progress: bool | None = None, reward_fn=None, make=None, resume_file=None,
             checkpoint_every: float = CHECKPOINT_EVERY, alpha_of=None, batch: int = 64) -> tuple[pd.DataFrame, dict]:
    """Algorithm 3 (:class:`LoRe`) in one call: the table (ε_i, J̲_i) and the search's record."""
    search = LoRe(env_id, smoother, horizon, env_seed, gamma=gamma, eps_max=eps_max, prune=prune,
                  profile=profile, reward_fn=reward_fn, make=make, alpha_of=alpha_of, batch=batch)
    return search.certify(resume_file=resume_file, checkpoint_every=checkpoint_every, progress=progress)


def lore_bound_at(table: pd.DataFrame, eps: float, valid_until: float = math.inf) -> float:
    """J̲ at ε from the step function (ε_i, J̲_i); NaN beyond the searched range."""
    if eps >= valid_until:
        return math.nan
    t = table.sort_values(cols.EPS)
    ok = t[t[cols.EPS] <= eps]
    return float(ok[cols.LOWER_BOUND].iloc[-1]) if len(ok) else math.nan
