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
:meth:`SmoothedNetwork.estimate_batch` call, that node together with every other *pending* node — a node on the
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
α_i = α·6/(π² i²) for the i-th state (``alpha_mode: family``, :func:`crop.smoothing.stats.lore_state_alpha`) it holds
with prob ≥ 1 − Σ_{i≤N} α_i ≥ 1 − α whatever N turns out to be.  The i-th state's α depends only on i, and
its noise is fresh, so the bound holds although which state comes i-th depends on earlier certificates.
Reported as ``confidence_union`` with the α actually spent.

Bounded search (``max_nodes``): the search stops expanding once the tree holds ``max_nodes`` nodes and still
returns a sound bound.  A node n it leaves unexpanded (on the stack, or waiting in the queue for an ε it has
reached) contributes its worst case J_n + min(0, r_min·Σ_{k=t_n}^{H-1} γ^k) — the return so far plus J_min of
the remaining steps from the reward range, summed step by step as a leaf's return is and rounded down — instead
of the leaves below it; the bound at every ε is the
minimum of the leaves reached and those contributions (proof: docs/statistics.md, "Bounded LoRe").  It is
≤ the unbounded search's bound at every ε, equal when the budget is not hit, and ``truncated`` says which.

Long searches are resumable: the search state is written to a resume file at most every ``checkpoint_every``
seconds and on SIGTERM (a cluster's wall-time kill; the process then exits with status 143), at any node; a
run killed at any point and restarted with the same arguments continues from it and produces the same
result, byte for byte.  The file holds data only (an ``.npz`` read with ``allow_pickle=False``: numbers, the
memoised certificates and, instead of environment snapshots, each open node's action path from s₀, which a
resumed search re-simulates from the seeded reset as the search built it, checking each node's return and
observation digest).  It is keyed by every field of the search's settings (:class:`LoReSettings`, whose key
is derived from all its fields), the smoother's settings and the network's parameters (a digest), and deleted
on success (by the caller, once it has written the result, when it
asks to); a file of another run, or one that cannot be read, is inconsistent or does not replay, is ignored
with a line on stderr before anything of it is used, and the search starts afresh.

For the audit the search also returns every state it smoothed (:meth:`LoRe.states_table`, ``lore_states.csv``):
its observation's digest, depth, critical ε, certificate (a₁, L(a₁), every action's radius) and α — what is
needed to bound, at each state an attacked episode visits, the chance of leaving the certified tree.
"""
from __future__ import annotations

import hashlib
import heapq
import io
import json
import math
import os
import signal
import sys
import time
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from crop import columns as cols
from crop.certify.loact import Certificate, certify_estimate
from crop.envs import make_env, restore, snapshot, to_obs
from crop.io import count_value as _count
from crop.io import real_value as _real
from crop.io import sigterm_noted
from crop.progress import pbar
from crop.smoothing import stats
from crop.smoothing.smoothed import SmoothedNetwork

__all__ = ["LoRe", "LoReSettings", "Problem", "Search", "run_lore", "obs_digest", "lore_bound_at", "CHECKPOINT_EVERY"]

#: Seconds between saves of the resumable search state.
CHECKPOINT_EVERY = 60.0


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


def _digest(obs: np.ndarray) -> bytes:
    return hashlib.blake2b(obs.tobytes(), digest_size=16).digest()


def obs_digest(obs: np.ndarray) -> str:
    """The hex digest that names an observation in ``lore_states.csv`` and ``attack_local_steps.csv`` (the
    audit matches an attacked step's clean state to the LoRe state of the same observation by it)."""
    return _digest(np.asarray(obs)).hex()


#: The resume file's members: name -> (dtype, dimensions); the file holds exactly these, stored uncompressed.
_MEMBERS = {"header": ("u1", 1), "generator": ("u1", 1), "stack": ("i8", 1), "queue_r": ("f8", 1),
            "queue_tie": ("i8", 1), "queue_node": ("i8", 1), "queue_a": ("i8", 1), "path_actions": ("i8", 1),
            "path_ends": ("i8", 1), "node_J": ("f8", 1), "node_leaf": ("?", 1), "node_digest": ("u1", 2),
            "memo_keys": ("u1", 1), "memo_ends": ("i8", 1), "memo_action": ("i8", 1), "memo_certified": ("?", 1),
            "memo_radius": ("f8", 1), "memo_radii": ("f8", 2), "memo_lower": ("f8", 1), "memo_t": ("i8", 1),
            "memo_eps": ("f8", 1)}


def _members(z: zipfile.ZipFile, file_size: int) -> dict:
    """The resume file's members by name, checked before any is read: exactly the known names, each stored
    (not compressed) with its size at most the file's, the sizes summing to at most the file's size."""
    infos = z.infolist()
    names = [i.filename for i in infos]
    if sorted(names) != sorted(f"{n}.npy" for n in _MEMBERS):
        raise ValueError(f"members {sorted(names)[:20]} are not the resume file's")
    if any(i.compress_type != zipfile.ZIP_STORED or i.compress_size != i.file_size for i in infos):
        raise ValueError("a compressed member (a resume file is stored uncompressed)")
    if sum(i.file_size for i in infos) > file_size:
        raise ValueError("members larger than the file")
    return {i.filename[:-4]: i for i in infos}


def _read_npy(z: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> np.ndarray:
    """One ``.npy`` member as an array of the dtype and dimensions :data:`_MEMBERS` expects; its declared shape
    must match its bytes (no allocation beyond them), no object or pickled data."""
    data = z.read(info)
    fp = io.BytesIO(data)
    version = np.lib.format.read_magic(fp)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(fp)
    kind, ndim = _MEMBERS[name]
    if dtype != np.dtype(kind) or len(shape) != ndim or fortran:
        raise ValueError(f"{name}: {dtype} of {len(shape)} dimensions, not {np.dtype(kind)} of {ndim}")
    if name == "node_digest" and shape[1] != 16:
        raise ValueError(f"{name}: digests of {shape[1]} bytes")
    body = memoryview(data)[fp.tell():]
    if math.prod(shape) * dtype.itemsize != len(body):
        raise ValueError(f"{name}: shape {shape} does not match its {len(body)} bytes")
    return np.frombuffer(body, dtype).reshape(shape)


def _split(values: np.ndarray, ends: np.ndarray, name: str) -> list[np.ndarray]:
    """``values`` cut at the cumulative ``ends`` (non-decreasing, from 0 to ``len(values)``)."""
    if len(ends) == 0:
        if len(values):
            raise ValueError(f"{name} values without ends")
        return []
    if ends[0] < 0 or np.any(np.diff(ends) < 0) or ends[-1] != len(values):
        raise ValueError(f"{name} ends not non-decreasing from 0 to {len(values)}")
    return np.split(values, ends[:-1])


def _net_digest(net) -> str:
    """sha256 of a network's parameters and buffers (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256()
    for name, t in net.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def _fn_digest(fn) -> str | None:
    """A reward modification without a name: its code and constants (two lambdas differ where their code does)."""
    if fn is None:
        return None
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    return hashlib.sha256(code.co_code + repr(code.co_consts).encode() + repr(code.co_names).encode()).hexdigest()


def _schedule_key(alpha_of) -> list | None:
    """A per-state α schedule keyed by its first values (two schedules that agree there are the same rule)."""
    return None if alpha_of is None else [float(alpha_of(i)) for i in (1, 2, 3)]


def _key_of(obj) -> dict:
    """Every field of a settings dataclass by name: as it is, a nested settings dataclass by its own key, a
    function through its field's ``key`` metadata (a code digest, or a schedule's first values) — a callable
    without one by its code digest.  So a field added to a settings class is in the key without a word more."""
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if hasattr(value, "__dataclass_fields__"):
            out[f.name] = _key_of(value)
            continue
        rule = f.metadata.get("key", _fn_digest if callable(value) else None)
        out[f.name] = rule(value) if rule is not None else value
    return out


def _coerce(obj, **kinds) -> None:
    """The fields ``kinds`` names converted (int, float) in place, None left as it is (a frozen dataclass)."""
    for name, kind in kinds.items():
        value = getattr(obj, name)
        if value is not None:
            object.__setattr__(obj, name, kind(value))


@dataclass(frozen=True)
class Problem:
    """What LoRe certifies: the return of the episode from ``env_seed``'s reset (s₀) of ``env_id`` (built by
    ``make`` when given, else ``make_env(env_id, profile)``) over ``horizon`` steps, discounted by ``gamma``,
    each reward counted through ``reward_fn`` (a reward modification, named by ``reward_key``)."""

    env_id: str
    horizon: int
    env_seed: int
    gamma: float = 1.0
    profile: str | None = None
    make: Callable | None = field(default=None, metadata={"key": _fn_digest})
    reward_fn: Callable | None = field(default=None, metadata={"key": _fn_digest})
    reward_key: str | None = None

    def __post_init__(self):
        _coerce(self, horizon=int, env_seed=int)


@dataclass(frozen=True)
class Search:
    """How Algorithm 3 searches: up to ``eps_max``; ``prune`` (only when every reward is ≥ 0: the caller checks
    the env); ``alpha_of`` (i ↦ the per-state α of the i-th distinct state smoothed, e.g.
    ``lambda i: stats.lore_state_alpha(alpha, "family", i)``; None: the smoother's α for every state);
    ``batch`` (at most this many pending nodes smoothed in one call); ``max_nodes`` (the node budget, the root
    included, with ``reward_min``: the lowest reward per step as the search counts it, which the open
    subtrees' worst case needs)."""

    eps_max: float = math.inf
    prune: bool = True
    alpha_of: Callable | None = field(default=None, metadata={"key": _schedule_key})
    batch: int = 64
    max_nodes: int | None = None
    reward_min: float | None = None

    def __post_init__(self):
        if int(self.batch) < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.max_nodes is not None and (int(self.max_nodes) < 1 or self.reward_min is None):
            raise ValueError(f"max_nodes must be >= 1 and comes with reward_min, got {self.max_nodes}, "
                             f"{self.reward_min}")
        _coerce(self, batch=int, max_nodes=int, reward_min=float)


@dataclass(frozen=True)
class LoReSettings:
    """Every setting LoRe's search reads, in one frozen value: the :class:`Problem`, the :class:`Search` and
    ``run_key`` (what else names the run, e.g. the checkpoint's sha256).  :meth:`key`, the resume file's key,
    is derived from all their fields (:func:`_key_of`), so an option added to any of them cannot be forgotten
    there.  :meth:`of` builds it from the fields' names, flat."""

    problem: Problem
    search: Search = Search()
    run_key: dict | None = None

    @classmethod
    def of(cls, env_id: str, horizon: int, env_seed: int, **options) -> LoReSettings:
        """From flat options (each the name of a field of :class:`Problem`, :class:`Search` or ``run_key``); an
        unknown one raises TypeError naming it."""
        parts = {part: {k: options.pop(k) for k in list(options) if k in part.__dataclass_fields__}
                 for part in (Problem, Search)}
        run_key = options.pop("run_key", None)
        if options:
            raise TypeError(f"unknown LoRe settings: {sorted(options)}")
        return cls(Problem(env_id, horizon, env_seed, **parts[Problem]), Search(**parts[Search]), run_key)

    def key(self) -> dict:
        return _key_of(self)

    def __getattr__(self, name: str):
        """A field of the problem or the search read as the settings' own (``settings.horizon``)."""
        for part in (self.__dict__.get("problem"), self.__dict__.get("search")):
            if part is not None and name in part.__dataclass_fields__:
                return getattr(part, name)
        raise AttributeError(name)


class LoRe:
    """Algorithm 3 from one initial state: the bound J̲ of Theorem 4 at every critical ε, by adaptive search.

    Read like Cohen et al.'s ``Smooth.certify``: build it with the smoothed Q (:class:`SmoothedNetwork`) and the
    environment, then :meth:`certify` returns the table of pairs (ε_i, J̲_i).  Its fields are Algorithm 3's
    state: the depth-first ``stack`` of nodes to expand at the current ``eps``, the priority ``queue`` of
    (r(a), tie, node, a) for actions not yet possible (keyed by Theorem 4's radius r(a)), the memoised
    certificates ``memo`` (one per distinct observation, with its per-state α in ``alphas``), the bound
    ``J`` so far (the smallest return over the leaves reached) and the recorded ``pairs``.  :meth:`save`
    and :meth:`load` write and read exactly these fields (an open node as its action path from s₀, and the
    smoother's random state) so that a killed search resumes where it stopped; the search itself knows
    nothing about files.

    Build it with its settings (a :class:`LoReSettings`, or the flat options of :meth:`LoReSettings.of`) and
    the smoother; a setting reads as the search's own attribute (``self.horizon``).  :meth:`key`, the resume
    file's key, is the settings' whole key with the smoother's settings and the network's digest.  One object
    runs one search.
    """

    #: Version of the resume file's layout: a file of another layout never matches, the search starts afresh.
    RESUME_FORMAT = 6

    def __init__(self, settings: LoReSettings | None = None, smoother: SmoothedNetwork | None = None, **options):
        self.settings = settings if settings is not None else LoReSettings.of(**options)
        if settings is not None and options:
            raise TypeError(f"LoRe takes its settings or options, not both: {sorted(options)}")
        self.smoother = smoother
        self._network = None                                   # its network digest, once computed
        # Algorithm 3's state (everything save/load carries)
        self.queue: list = []                      # heap of (r(a), tie, node, a)
        self.stack: list[_Node] = []               # nodes to expand depth-first at ε = eps
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
        self.env = None
        self._bar = None
        self._autosave = None                      # (resume file, seconds between saves, time of last save)
        self._signal = None                        # a termination signal received, handled at the next node

    # ---- the search ---------------------------------------------------------------------------------------

    def certify(self, *, resume_file=None, checkpoint_every: float = CHECKPOINT_EVERY,
                progress: bool | None = None, remove_resume: bool = True) -> tuple[pd.DataFrame, dict]:
        """Run Algorithm 3 to the end (or to ``eps_max``, or to the node budget): the table (ε_i, J̲_i) and the
        search's record.

        ``resume_file``: where the search state is saved at most every ``checkpoint_every`` seconds and on
        SIGTERM (and resumed from when it matches this run); deleted on success unless ``remove_resume`` is
        false (a caller that writes the result deletes it once the result is written).
        """
        started = time.time()
        # The working environment (Atari restores every snapshot into it), also when resuming.
        self.env = self.make() if self.make is not None else make_env(self.env_id, self.profile)
        obs, _ = self.env.reset(seed=self.env_seed)
        root = _Node(snapshot(self.env), to_obs(obs), 0, 0.0, self.horizon == 0)
        self._bar = pbar(desc=f"LoRe σ={self.smoother.sigma:g}", unit="node", progress=progress)
        resumed = resume_file is not None and self.load(resume_file, root)
        if not resumed:
            self.stack.append(root)  # Algorithm 3 starts at s₀ with ε = 0
        if resume_file is not None:
            self._autosave = (resume_file, checkpoint_every, time.time())
        # The search as a loop over (stack, queue) alone, so it can be saved and resumed at any node.
        with self._save_on_sigterm():
            while True:
                self._checkpoint()
                self.drain(self.eps)
                if self.queue and self.queue[0][0] <= self.eps and not self.truncated:
                    # equal radii: expand all before recording
                    if self.pruned(self.queue[0][2]) or not self.spent():
                        _, _, node, a = heapq.heappop(self.queue)
                        if not self.pruned(node):
                            self.stack.append(self.expand(node, a))
                        continue
                    self.truncated = True  # the budget refuses a child the tree holds at ε
                if self.truncated:
                    self.close()
                    break
                self.record(self.eps, self.J)
                if not self.queue:
                    break
                if self.queue[0][0] > self.eps_max:
                    self.valid_until = self.queue[0][0]
                    break
                self.eps = self.queue[0][0]  # the next critical ε: the smallest radius not yet reached
        self._bar.close()
        self.env.close()
        if remove_resume and resume_file is not None and os.path.exists(resume_file):
            os.unlink(resume_file)
        return self.bound_table(), self.info(resumed, started)

    def drain(self, eps: float) -> None:
        """Depth-first expansion of everything on the stack at perturbation ``eps``: at each node every
        action with r(a) ≤ ε is followed, the others wait in the queue keyed by r(a).  The first child the
        node budget refuses stops the search (:meth:`close`), the actions of that node waiting in the queue."""
        while self.stack:
            self._checkpoint()
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
                if r <= eps and not self.spent():
                    self.stack.append(self.expand(node, a))
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

    def spent(self) -> bool:
        """The node budget is spent: the tree holds ``max_nodes`` nodes (the root and every child created)."""
        return self.max_nodes is not None and self.transitions + 1 >= self.max_nodes

    def worst(self, nodes: list[_Node]) -> dict[int, float]:
        """The lowest return of any trajectory through each open node (its leaves, at any ε), by ``id``: the
        return so far plus J_min of its remaining steps, min(0, r_min·Σ_{k=t}^{H-1} γ^k) (it may terminate at
        any step).  With r_min < 0 it is summed as a leaf's return is, J ← J + γ^k·r_min step by step
        (rounding to nearest is monotone, so no leaf below the node is computed lower), then rounded down one
        more step: it is ≤ every computed leaf return below the node, not only up to rounding."""
        J = np.array([n.J for n in nodes], np.float64)
        if self.reward_min < 0 and nodes:
            t = np.array([n.t for n in nodes], np.int64)
            inner = ~np.array([n.leaf for n in nodes], bool)
            for k in range(int(t[inner].min()) if inner.any() else self.horizon, self.horizon):
                live = inner & (t <= k)
                J[live] = J[live] + (self.gamma ** k) * self.reward_min
            J[inner] = np.nextafter(J[inner], -np.inf)
        return {id(n): float(j) for n, j in zip(nodes, J)}

    def close(self) -> None:
        """The budget refused a child: the bound at the current ε and at each later critical ε (up to
        ``eps_max``) is the minimum of the leaves reached and the worst case (:meth:`worst`) of every open node
        the tree holds at that ε — left on the stack, or in the queue with r(a) ≤ ε.  A pruned node cannot
        lower it (its return so far already reaches the leaves' minimum).  The pairs recorded before, at
        ε < ``exact_below`` (the current ε), are the full search's."""
        self.exact_below = self.eps
        worst = self.worst([n for n in [*self.stack, *(q[2] for q in self.queue)] if not self.pruned(n)])
        bound = min([self.J] + [worst[id(n)] for n in self.stack if not self.pruned(n)])
        self.stack.clear()
        while True:
            while self.queue and self.queue[0][0] <= self.eps:
                _, _, node, _ = heapq.heappop(self.queue)
                if not self.pruned(node):
                    bound = min(bound, worst[id(node)])
            self.record(self.eps, bound)
            if not self.queue:
                break
            if self.queue[0][0] > self.eps_max:
                self.valid_until = self.queue[0][0]
                break
            self.eps = self.queue[0][0]

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
        """Algorithm 1 for the nodes' observations in one :meth:`SmoothedNetwork.estimate_batch` call (fresh
        noise for each); the i-th distinct state smoothed overall spends α_i = ``alpha_of(i)``."""
        sm, i0 = self.smoother, len(self.memo)
        alphas = [sm.alpha] * len(nodes) if self.alpha_of is None else \
            [float(self.alpha_of(i0 + 1 + j)) for j in range(len(nodes))]
        ests = sm.estimate_batch(np.stack([n.obs for n in nodes]), [f"LoRe node t={n.t}" for n in nodes],
                                 alpha=None if self.alpha_of is None else alphas)
        self.smoothing_calls += 1
        for n, a, est in zip(nodes, alphas, ests):
            cert = certify_estimate(est, sm.sigma, sm.v_min, sm.v_max)
            self.memo[n.obs.tobytes()] = cert
            self.alphas.append(a)
            self.smoothed.append((n.t, self.eps, float(est.lower[cert.action])))

    def expand(self, node: _Node, a: int) -> _Node:
        """The child reached by taking action ``a`` at ``node`` (from the node's snapshot, never in place)."""
        child, reward = self.step(node, a)
        if self.prune and reward < 0:  # pruning on a negative reward would cut a lower return: unsound
            self._false_reward_range(f"reward {reward} < 0 in a search that prunes (rewards declared non-negative)")
        if self.reward_min is not None and reward < self.reward_min:  # the budget's worst cases would be unsound
            self._false_reward_range(f"reward {reward} < {self.reward_min}, the lowest reward declared")
        self.transitions += 1
        self._bar.update(1)
        return child

    def step(self, node: _Node, a: int) -> tuple[_Node, float]:
        """One transition from the node's snapshot: the child and the reward as the search counts it."""
        e = restore(self.env, node.snap)  # the working instance for Atari, a fresh copy otherwise
        obs, reward, terminated, truncated, _ = e.step(int(a))
        reward = float(reward if self.reward_fn is None else self.reward_fn(reward))
        done = bool(terminated or truncated) or node.t + 1 >= self.horizon
        return _Node(snapshot(e), to_obs(obs), node.t + 1, node.J + (self.gamma ** node.t) * reward, done,
                     (int(a), node.path)), reward

    def _false_reward_range(self, what: str):
        from crop.io import InputError

        raise InputError(f"{self.env_id}: {what}; give the environment's true reward range (rewards.range)")

    def states_table(self) -> pd.DataFrame:
        """Every state the search smoothed, in smoothing order (``lore_states.csv``): its observation's digest
        (:func:`obs_digest`), the depth ``t`` and critical ε at which the search first needed it, its
        certificate's top action a₁, whether certified, L(a₁) (``q_top_lower``), the radius r(a) of every action
        (``radius_a``: Theorem 4's; 0 for a₁ and for actions the bounds cannot separate from it) and its
        per-state α.  With the V range and σ this is what the audit needs to bound, at each state an attacked
        episode visits, the chance that the m-sample policy takes an action LoRe's tree excludes (Lemma 3:
        U(a) = V_min + w·Φ(Φ⁻¹(p_L) − 2r(a)/σ) for every a with r(a) > 0)."""
        certs = list(self.memo.values())
        out = pd.DataFrame({
            cols.OBS_DIGEST: [hashlib.blake2b(k, digest_size=16).hexdigest() for k in self.memo],
            cols.STEP: [t for t, _, _ in self.smoothed], cols.EPS: [e for _, e, _ in self.smoothed],
            cols.ACTION: [c.action for c in certs], cols.CERTIFIED: [c.certified for c in certs],
            cols.Q_TOP_LOWER: [low for _, _, low in self.smoothed], cols.ALPHA: self.alphas})
        radii = np.array([c.radii for c in certs], np.float64).reshape(len(certs), self.smoother.n_actions)
        for a in range(self.smoother.n_actions):
            out[f"{cols.RADIUS}_{a}"] = radii[:, a]
        return out

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
            "nodes": self.transitions + 1,
            "max_nodes": self.max_nodes,
            "truncated": self.truncated,
            "exact_below_eps": self.exact_below,
            "leaves": self.leaves,
            "valid_until_eps": self.valid_until,
            "eps_max": self.eps_max,
            "pruning": self.prune,
            "per_state_alpha": self.smoother.alpha if self.alpha_of is None else None,
            "per_state_alpha_first": alphas[0] if alphas else None,
            "per_state_alpha_last": alphas[-1] if alphas else None,
            "alpha_spent": float(sum(alphas)),
            "confidence_union": stats.union_confidence(alphas),
            "runtime_s": round(time.time() - started, 3),
            "nodes_per_s": round(self.transitions / max(time.time() - started, 1e-9), 2),
        }

    # ---- resume: kept apart from the search ------------------------------------------------------------------

    def key(self) -> dict:
        """What identifies this run: a resume file written under another key is ignored.  Every field of
        :class:`LoReSettings` (:meth:`LoReSettings.key`: a setting added there is in the key without a word
        here), every field of the smoother's
        :class:`crop.smoothing.smoothed.SmoothingSettings` (its device as resolved),
        the smoothed network's parameters (a digest) and the file's layout: a file left by another network,
        checkpoint or option never resumes."""
        sm = self.smoother
        smoothing = {**_key_of(sm.settings), "device": str(sm.device)}
        return {"format": self.RESUME_FORMAT, **self.settings.key(), "smoothing": smoothing,
                "n_actions": sm.n_actions, "network": self._network_digest()}

    def __getattr__(self, name: str):
        """A setting (:class:`LoReSettings`) read as the search's own attribute (``self.horizon``)."""
        settings = self.__dict__.get("settings")
        if settings is None:
            raise AttributeError(name)
        return getattr(settings, name)

    def _network_digest(self) -> str:
        """sha256 of the smoothed network's parameters, computed once (the key is built at every save)."""
        if self._network is None:
            self._network = _net_digest(self.smoother.net)
        return self._network

    def save(self, path) -> None:
        """Write the whole search state and the smoother's random state (noise generator and randomised
        rounding stream) to ``path`` atomically, as data only: arrays and a JSON header in an ``.npz``.  The
        open nodes (on the stack or in the queue) are stored as their action paths from s₀, with their
        return and a digest of their observation for the replay's check."""
        from crop.io import atomic_write_bytes

        nodes, index = [], {}
        for n in [*self.stack, *(q[2] for q in self.queue)]:
            if id(n) not in index:
                index[id(n)] = len(nodes)
                nodes.append(n)
        paths = [n.actions() for n in nodes]
        keys = list(self.memo)
        certs = list(self.memo.values())
        state = self.smoother.get_state()
        header = {"key": self.key(), "rounding": state["rounding"], "calls": state["calls"], "alphas": self.alphas,
                  "pairs": self.pairs, "eps": self.eps, "J": self.J, "transitions": self.transitions,
                  "leaves": self.leaves, "tie": self.tie, "smoothing_calls": self.smoothing_calls,
                  "truncated": self.truncated, "exact_below": self.exact_below}
        arrays = {
            "header": np.frombuffer(json.dumps(header).encode(), np.uint8),
            "generator": np.asarray(state["generator"].cpu().numpy(), np.uint8),
            "stack": np.array([index[id(n)] for n in self.stack], np.int64),
            "queue_r": np.array([q[0] for q in self.queue], np.float64),
            "queue_tie": np.array([q[1] for q in self.queue], np.int64),
            "queue_node": np.array([index[id(q[2])] for q in self.queue], np.int64),
            "queue_a": np.array([q[3] for q in self.queue], np.int64),
            "path_actions": np.array([a for p in paths for a in p], np.int64),
            "path_ends": np.cumsum([len(p) for p in paths], dtype=np.int64),
            "node_J": np.array([n.J for n in nodes], np.float64),
            "node_leaf": np.array([n.leaf for n in nodes], bool),
            "node_digest": np.array([np.frombuffer(_digest(n.obs), np.uint8) for n in nodes], np.uint8).reshape(-1, 16),
            "memo_keys": np.frombuffer(b"".join(keys), np.uint8),
            "memo_ends": np.cumsum([len(k) for k in keys], dtype=np.int64),
            "memo_action": np.array([c.action for c in certs], np.int64),
            "memo_certified": np.array([c.certified for c in certs], bool),
            "memo_radius": np.array([c.radius for c in certs], np.float64),
            "memo_radii": np.array([c.radii for c in certs], np.float64).reshape(len(certs), self.smoother.n_actions),
            "memo_t": np.array([t for t, _, _ in self.smoothed], np.int64),
            "memo_eps": np.array([e for _, e, _ in self.smoothed], np.float64),
            "memo_lower": np.array([low for _, _, low in self.smoothed], np.float64),
        }
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        atomic_write_bytes(path, buf.getvalue())

    def load(self, path, root: _Node) -> bool:
        """Restore the state saved by :meth:`save` if ``path`` exists and belongs to this run.  The file is
        data and is checked like any input before anything of it is used: a zip of the known members only,
        stored uncompressed with sizes summing to at most the file's (so it takes no more memory than its
        size), the header read first and its key compared before the rest is read; then every array's type,
        shape and range, each node's replay (its return and observation digest checked as soon as it is
        re-simulated) and the state's internal consistency (:meth:`_restore`).  A file failing any check is
        ignored with one line on stderr; the search's fields and the smoother's random state change only
        once all checks have passed."""
        if not os.path.exists(path):
            return False
        try:
            with zipfile.ZipFile(path) as z:
                members = _members(z, os.path.getsize(path))
                header = json.loads(bytes(_read_npy(z, members["header"], "header")).decode())
                if not isinstance(header, dict) or header.get("key") != json.loads(json.dumps(self.key())):
                    print(f"LoRe: {path} belongs to another run (other settings); starting afresh", file=sys.stderr)
                    return False
                f = {name: _read_npy(z, info, name) for name, info in members.items() if name != "header"}
            state, smoother_state = self._restore(header, f, root)
            previous = self.smoother.get_state()
            try:
                self.smoother.set_state(smoother_state)
            except Exception:
                self.smoother.set_state(previous)
                raise
        except Exception as exc:  # noqa: BLE001 -- any content of an untrusted file: ignore it, run afresh
            print(f"LoRe: ignoring the resume file {path} ({type(exc).__name__}: {str(exc)[:200]}); starting afresh",
                  file=sys.stderr)
            return False
        for name, value in state.items():
            setattr(self, name, value)
        return True

    def _restore(self, header: dict, f: dict, root: _Node) -> tuple[dict, dict]:
        """The search state and the smoother's random state of a resume file's contents (nothing set yet);
        raises ValueError where they do not describe a consistent search of this run."""
        import torch

        n_actions, obs_bytes = self.smoother.n_actions, root.obs.nbytes
        scalars = {k: _count(header.get(k), k) for k in ("transitions", "leaves", "tie", "smoothing_calls", "calls")}
        eps, J = _real(header.get("eps"), "eps"), _real(header.get("J"), "J")
        exact_below = None if header.get("exact_below") is None else _real(header["exact_below"], "exact_below")
        if (exact_below is None) == header.get("truncated") or (exact_below is not None and exact_below > eps):
            raise ValueError("exact_below does not go with truncated, or lies beyond eps")
        if not isinstance(header.get("truncated"), bool) or not isinstance(header.get("alphas"), list) or \
                not isinstance(header.get("pairs"), list) or not isinstance(header.get("rounding"), dict):
            raise ValueError("header fields of the wrong type")
        alphas = [_real(a, "alphas") for a in header["alphas"]]
        if any(not 0 < a < 1 for a in alphas):
            raise ValueError("a per-state alpha outside (0, 1)")
        pairs = []
        for pair in header["pairs"]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError("a recorded pair is not (eps, bound)")
            pairs.append((_real(pair[0], "pairs"), _real(pair[1], "pairs")))
        if any(e1 > e2 for (e1, _), (e2, _) in zip(pairs, pairs[1:])) or (pairs and eps < pairs[-1][0]):
            raise ValueError("the recorded pairs are not in order of eps up to the current eps")
        paths = _split(f["path_actions"], f["path_ends"], "path")
        if any(len(p) and (p.min() < 0 or p.max() >= n_actions or len(p) > self.horizon) for p in paths):
            raise ValueError("an action path outside the search's actions or horizon")
        if not len(f["node_J"]) == len(f["node_leaf"]) == len(f["node_digest"]) == len(paths):
            raise ValueError("node arrays of different lengths")
        keys = _split(f["memo_keys"], f["memo_ends"], "memo")
        if any(len(k) != obs_bytes for k in keys):
            raise ValueError("a memoised observation of another size")
        radii = f["memo_radii"]
        if radii.shape[1:] != (n_actions,) or not len(keys) == len(radii) == len(f["memo_action"]) == \
                len(f["memo_certified"]) == len(f["memo_radius"]) == len(alphas) == len(f["memo_t"]) == \
                len(f["memo_eps"]) == len(f["memo_lower"]):
            raise ValueError("certificates of another action count, or not one per memoised state and alpha")
        if len(f["memo_action"]) and (f["memo_action"].min() < 0 or f["memo_action"].max() >= n_actions):
            raise ValueError("a certified action outside the search's actions")
        n_queue = len(f["queue_r"])
        if not len(f["queue_tie"]) == len(f["queue_node"]) == len(f["queue_a"]) == n_queue:
            raise ValueError("queue arrays of different lengths")
        for name, index, bound in (("stack", f["stack"], len(paths)), ("queue_node", f["queue_node"], len(paths)),
                                   ("queue_a", f["queue_a"], n_actions)):
            if len(index) and (index.min() < 0 or index.max() >= bound):
                raise ValueError(f"{name} indices outside [0, {bound})")
        ties = f["queue_tie"]
        if len(np.unique(ties)) != n_queue or (n_queue and (ties.min() < 1 or ties.max() > scalars["tie"])):
            raise ValueError("queue ties not unique or beyond the tie counter")
        memo = {k.tobytes(): Certificate(int(a), bool(c), float(r), rr, None) for k, a, c, r, rr in
                zip(keys, f["memo_action"], f["memo_certified"], f["memo_radius"], radii, strict=True)}
        nodes = self._replay(root, [tuple(int(a) for a in p) for p in paths],
                             list(zip(f["node_J"], f["node_leaf"], f["node_digest"])))
        queue = [(float(r), int(t), nodes[i], int(a)) for r, t, i, a in
                 zip(f["queue_r"], ties, f["queue_node"], f["queue_a"], strict=True)]
        for r, _, node, a in queue:  # a queued action waits at its parent's certified radius
            cert = memo.get(node.obs.tobytes())
            if cert is None or float(cert.radii[a]) != r:
                raise ValueError(f"a queued radius that is not its node's certificate's (t={node.t})")
        heapq.heapify(queue)  # a no-op on the saved heap; the pop order is fixed by the unique ties anyway
        if len(f["memo_t"]) and (f["memo_t"].min() < 0 or f["memo_t"].max() >= max(self.horizon, 1)
                                 or np.any(f["memo_eps"] > eps)):
            raise ValueError("a smoothed state's depth outside the horizon, or its eps beyond the current eps")
        smoothed = [(int(t), float(e), float(low)) for t, e, low in zip(f["memo_t"], f["memo_eps"], f["memo_lower"])]
        state = {"queue": queue, "stack": [nodes[i] for i in f["stack"]], "memo": memo, "alphas": alphas,
                 "smoothed": smoothed,
                 "pairs": pairs, "eps": eps, "J": J, "truncated": header["truncated"], "exact_below": exact_below,
                 **{k: scalars[k] for k in ("transitions", "leaves", "tie", "smoothing_calls")}}
        return state, {"generator": torch.from_numpy(f["generator"].copy()), "rounding": header["rounding"],
                       "calls": scalars["calls"]}

    def _replay(self, root: _Node, paths: list[tuple[int, ...]], expected: list) -> list[_Node]:
        """The nodes at ``paths`` (action paths from s₀), re-simulated as the search built them (each child by
        :meth:`step` from its parent's snapshot), every shared prefix once; each is checked against its
        ``expected`` (return, leaf, observation digest) as soon as it is reached."""
        trie: dict = {}
        for i, p in enumerate(paths):
            d = trie
            for a in p:
                d = d.setdefault(a, {})
            d.setdefault(None, []).append(i)
        out: list = [None] * len(paths)
        todo = [(root, trie)]
        while todo:
            node, d = todo.pop()
            for i in d.get(None, ()):
                J, leaf, digest = expected[i]
                if node.J != float(J) or node.leaf != bool(leaf) or _digest(node.obs) != digest.tobytes():
                    raise ValueError(f"the environment does not replay the saved node at t={node.t} (not "
                                     "deterministic from its seed?)")
                out[i] = node
            if node.leaf and len(d) > (None in d):
                raise ValueError(f"a saved path continues past a leaf at t={node.t}")
            todo += [(self.step(node, a)[0], sub) for a, sub in d.items() if a is not None]
        return out

    @contextmanager
    def _save_on_sigterm(self):
        """While the search runs with a resume file: SIGTERM (a cluster's wall-time kill, SIGKILL follows after
        a grace period) is noted and handled at the next node, where the state is consistent (:meth:`_checkpoint`)."""
        if self._autosave is None:
            yield
            return
        with sigterm_noted(lambda signum: setattr(self, "_signal", signum)):
            yield

    def _checkpoint(self) -> None:
        """Save the state when ``checkpoint_every`` seconds have passed; on SIGTERM save it and exit (143)."""
        if self._autosave is None:
            return
        path, every, last = self._autosave
        if self._signal is not None or time.time() - last >= every:
            self.save(path)
            self._autosave = (path, every, time.time())
        if self._signal is not None:
            print(f"LoRe: {signal.Signals(self._signal).name}: search state saved to {path} after "
                  f"{self.transitions + 1} nodes; the same command resumes it", file=sys.stderr)
            raise SystemExit(128 + self._signal)


def run_lore(env_id: str, smoother: SmoothedNetwork, horizon: int, env_seed: int, **options):
    """Algorithm 3 (:class:`LoRe`) in one call: the table (ε_i, J̲_i) and the search's record, and with
    ``states=True`` also :meth:`LoRe.states_table`.  ``options``: the fields of :class:`LoReSettings`, and
    ``resume_file``, ``checkpoint_every``, ``progress``, ``remove_resume`` of :meth:`LoRe.certify`."""
    run = {k: options.pop(k) for k in ("resume_file", "checkpoint_every", "progress", "remove_resume") if k in options}
    states = options.pop("states", False)
    search = LoRe(LoReSettings.of(env_id, horizon, env_seed, **options), smoother)
    table, info = search.certify(**run)
    return (table, info, search.states_table()) if states else (table, info)


def lore_bound_at(table: pd.DataFrame, eps: float, valid_until: float = math.inf) -> float:
    """J̲ at ε from the step function (ε_i, J̲_i); NaN beyond the searched range."""
    if eps >= valid_until:
        return math.nan
    t = table.sort_values(cols.EPS)
    ok = t[t[cols.EPS] <= eps]
    return float(ok[cols.LOWER_BOUND].iloc[-1]) if len(ok) else math.nan
