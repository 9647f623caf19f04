"""LoRe's resume file (:mod:`crop.certify.lore`): the search state written as data and read back as untrusted input.

The file is an ``.npz`` read with ``allow_pickle=False``: numbers, the memoised certificates and, instead of
environment snapshots, each open node's action path from s₀, which a resumed search re-simulates from the seeded
reset as the search built it, checking each node's return and observation digest.  It is keyed by every field of
the search's settings (:class:`crop.certify.lore.LoReSettings`, its key derived from all their fields), the
environment, the smoother's settings and the network's parameters (a digest); a file of another run, or one that
cannot be read, is inconsistent or does not replay, is ignored with a line on stderr before anything of it is used.
It must be a regular file (not a symbolic link, device or FIFO) of at most :func:`largest_file` bytes, and its
numbers what a search computes: returns finite, radii and ε never NaN nor negative (a radius may be +inf: bounds
that leave no doubt).  A finite edit that keeps the state consistent and replayable is not detected
(docs/reliability.md).
A run killed at any point and restarted with the same arguments continues from it and produces the same result,
byte for byte.
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
from contextlib import contextmanager
from dataclasses import dataclass, fields

import numpy as np

from crop.certify.loact import Certificate
from crop.io import count_value as _count
from crop.io import open_state_file, sigterm_noted
from crop.io import real_value as _real

__all__ = ["Resume", "CHECKPOINT_EVERY", "RESUME_FORMAT", "resume_key", "save", "load", "checkpoint",
           "save_on_sigterm", "largest_file"]

#: Seconds between saves of the resumable search state.
CHECKPOINT_EVERY = 60.0

#: Version of the resume file's layout: a file of another layout never matches, the search starts afresh.
RESUME_FORMAT = 8


@dataclass(frozen=True)
class Resume:
    """Where a search is saved: ``path``, at most every ``every`` seconds and on SIGTERM; deleted on success
    unless ``remove`` is false (a caller that writes the result deletes it once the result is written)."""

    path: object
    every: float = CHECKPOINT_EVERY
    remove: bool = True

    def __post_init__(self):
        if not float(self.every) >= 0:
            raise ValueError(f"every must be >= 0 seconds, got {self.every}")


def state_digest(obs: np.ndarray) -> bytes:
    """16 bytes naming an observation (its bytes' BLAKE2b)."""
    return hashlib.blake2b(obs.tobytes(), digest_size=16).digest()



#: The resume file's members: name -> (dtype, dimensions); the file holds exactly these, stored uncompressed.
_MEMBERS = {"header": ("u1", 1), "generator": ("u1", 1), "stack": ("i8", 1), "stack_a": ("i8", 1),
            "stack_seq": ("i8", 1), "queue_r": ("f8", 1),
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


def fn_digest(fn) -> str | None:
    """A reward modification without a name: its code and constants (two lambdas differ where their code does)."""
    if fn is None:
        return None
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    return hashlib.sha256(code.co_code + repr(code.co_consts).encode() + repr(code.co_names).encode()).hexdigest()


def schedule_key(alpha_of) -> list | None:
    """A per-state α schedule keyed by its first values (two schedules that agree there are the same rule)."""
    return None if alpha_of is None else [float(alpha_of(i)) for i in (1, 2, 3)]


def key_of(obj) -> dict:
    """Every field of a settings dataclass by name: as it is, a nested settings dataclass by its own key, a
    function through its field's ``key`` metadata (a code digest, or a schedule's first values) — a callable
    without one by its code digest.  So a field added to a settings class is in the key without a word more."""
    out = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if hasattr(value, "__dataclass_fields__"):
            out[f.name] = key_of(value)
            continue
        rule = f.metadata.get("key", fn_digest if callable(value) else None)
        out[f.name] = rule(value) if rule is not None else value
    return out


def resume_key(search) -> dict:
    """What identifies a search's run: a resume file written under another key is ignored.  The environment
    (its id, profile and factory), every field of its :class:`crop.certify.lore.LoReSettings` (a setting added
    there is in the key without a word here), every field of the smoother's
    :class:`crop.smoothing.smoothed.SmoothingSettings` (its device as resolved), the smoothed network's
    parameters (a digest) and the file's layout: a file left by another network, checkpoint or option never
    resumes."""
    sm = search.smoother
    smoothing = {**key_of(sm.settings), "device": str(sm.device)}
    return {"format": RESUME_FORMAT, "env_id": search.env_id, "profile": search.profile,
            "make": fn_digest(search.make), **search.settings.key(), "smoothing": smoothing,
            "n_actions": sm.n_actions, "network": _network_digest(search)}


def _network_digest(search) -> str:
    """sha256 of the smoothed network's parameters, computed once (the key is built at every save)."""
    if search._network is None:
        search._network = _net_digest(search.smoother.net)
    return search._network


def save(search, path) -> None:
    """Write the whole search state and the smoother's random state (noise generator and randomised
    rounding stream) to ``path`` atomically, as data only: arrays and a JSON header in an ``.npz``.  The
    open nodes (on the stack or in the queue) are stored as their action paths from s₀, with their
    return and a digest of their observation for the replay's check."""
    from crop.io import atomic_write_bytes

    nodes, index = [], {}
    rows = _stack_rows(search)
    for n in [*(r[0] for r in rows), *(q[2] for q in search.queue)]:
        if id(n) not in index:
            index[id(n)] = len(nodes)
            nodes.append(n)
    paths = [n.actions() for n in nodes]
    keys = list(search.memo)
    certs = list(search.memo.values())
    state = search.smoother.get_state()
    header = {"key": resume_key(search), "rounding": state["rounding"], "calls": state["calls"],
              "alphas": search.alphas, "pairs": search.pairs, "eps": search.eps, "J": search.J,
              "transitions": search.transitions, "leaves": search.leaves, "tie": search.tie,
              "smoothing_calls": search.smoothing_calls, "truncated": search.truncated,
              "exact_below": search.exact_below, "at_budget": search.at_budget}
    arrays = {
        "header": np.frombuffer(json.dumps(header).encode(), np.uint8),
        "generator": np.asarray(state["generator"].cpu().numpy(), np.uint8),
        "stack": np.array([index[id(n)] for n, _, _ in rows], np.int64),
        "stack_a": np.array([a for _, a, _ in rows], np.int64),
        "stack_seq": np.array([seq for _, _, seq in rows], np.int64),
        "queue_r": np.array([q[0] for q in search.queue], np.float64),
        "queue_tie": np.array([q[1] for q in search.queue], np.int64),
        "queue_node": np.array([index[id(q[2])] for q in search.queue], np.int64),
        "queue_a": np.array([q[3] for q in search.queue], np.int64),
        "path_actions": np.array([a for p in paths for a in p], np.int64),
        "path_ends": np.cumsum([len(p) for p in paths], dtype=np.int64),
        "node_J": np.array([n.J for n in nodes], np.float64),
        "node_leaf": np.array([n.leaf for n in nodes], bool),
        "node_digest": np.frombuffer(b"".join(state_digest(n.obs) for n in nodes), np.uint8).reshape(-1, 16),
        "memo_keys": np.frombuffer(b"".join(keys), np.uint8),
        "memo_ends": np.cumsum([len(k) for k in keys], dtype=np.int64),
        "memo_action": np.array([c.action for c in certs], np.int64),
        "memo_certified": np.array([c.certified for c in certs], bool),
        "memo_radius": np.array([c.radius for c in certs], np.float64),
        "memo_radii": np.array([c.radii for c in certs], np.float64).reshape(len(certs), search.smoother.n_actions),
        "memo_t": np.array([t for t, _, _ in search.smoothed], np.int64),
        "memo_eps": np.array([e for _, e, _ in search.smoothed], np.float64),
        "memo_lower": np.array([low for _, _, low in search.smoothed], np.float64),
    }
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def _stack_rows(search) -> list[tuple]:
    """The stack as stored, in its list order: (node, a, seq) — a depth-first stack's nodes with a = -1, seq = 0;
    a best-first heap's items (whose key, w(n) and depth, the replayed node gives back bit for bit)."""
    if search.best_first:
        return [(node, a, -neg_seq) for _, _, neg_seq, node, a in search.stack]
    return [(n, -1, 0) for n in search.stack]


def _stack_of(search, nodes: list, f: dict, memo: dict, eps: float, tie: int) -> list:
    """The stack of a resume file's rows, checked: best-first, a child waiting for its parent (a ≥ 0) is one the
    parent's certificate allows at ε, each item's seq unique and within the tie counter; depth-first, nodes only."""
    from crop.certify.lore_budget import key

    a, seq = f["stack_a"], f["stack_seq"]
    if not len(a) == len(seq) == len(f["stack"]):
        raise ValueError("stack arrays of different lengths")
    if not search.best_first:
        if np.any(a != -1) or np.any(seq != 0):
            raise ValueError("a depth-first stack holds nodes only")
        return [nodes[i] for i in f["stack"]]
    if len(seq) and (len(np.unique(seq)) != len(seq) or seq.min() < 1 or seq.max() > tie or a.min() < -1 or
                     a.max() >= search.smoother.n_actions):
        raise ValueError("best-first stack items with seq not unique or beyond the tie counter, or a bad action")
    out = []
    for i, ai, si in zip(f["stack"], a, seq, strict=True):
        node = nodes[i]
        cert = memo.get(node.obs.tobytes())
        if ai >= 0 and (cert is None or not float(cert.radii[ai]) <= eps):
            raise ValueError(f"a waiting child that its parent's certificate does not allow at eps (t={node.t})")
        out.append((key(search, node), -node.t, -int(si), node, int(ai)))
    if any(out[(j - 1) // 2][:3] > out[j][:3] for j in range(1, len(out))):
        raise ValueError("the best-first stack is not a heap")
    return out


def largest_file(search, root) -> float:
    """The most bytes a resume file of this search can take: twice, for headroom, what its largest tree needs —
    per node its action path (H actions), return, leaf flag and digest, its certificate (observation, action,
    radius, |A| radii, α, depth, ε, lower bound), |A| waiting children and queued actions, and the header's
    numbers — plus 1 MiB for the header and the members' own headers.  The tree is the node budget
    (``max_nodes``, twice it with ``report_double``), else Σ_{d≤H} |A|^d (``inf`` when that overflows: the
    file is then bounded by its members' sizes only)."""
    s, n_actions = search.settings.search, search.smoother.n_actions
    horizon = search.settings.problem.horizon
    if s.max_nodes is not None:
        nodes = float(s.max_nodes * (2 if s.report_double else 1))
    else:
        try:
            nodes = float(sum(n_actions ** d for d in range(horizon + 1))) if n_actions > 1 else horizon + 1.0
        except OverflowError:
            nodes = math.inf
    per_node = 8 * horizon + root.obs.nbytes + 154 + 128 * n_actions
    return 2 * nodes * per_node + (1 << 20)


def load(search, path, root) -> bool:
    """Restore the state saved by :func:`save` if ``path`` exists and belongs to this run.  The file is
    data and is checked like any input before anything of it is used: a zip of the known members only,
    stored uncompressed with sizes summing to at most the file's (so it takes no more memory than its
    size), the header read first and its key compared before the rest is read; then every array's type,
    shape and range, each node's replay (its return and observation digest checked as soon as it is
    re-simulated) and the state's internal consistency (:func:`_restore`).  A file failing any check is
    ignored with one line on stderr; the search's fields and the smoother's random state change only
    once all checks have passed."""
    if not os.path.lexists(path):
        return False
    try:
        with open_state_file(path, largest_file(search, root)) as fh, zipfile.ZipFile(fh) as z:
            members = _members(z, os.fstat(fh.fileno()).st_size)
            header = json.loads(bytes(_read_npy(z, members["header"], "header")).decode())
            if not isinstance(header, dict) or header.get("key") != json.loads(json.dumps(resume_key(search))):
                print(f"LoRe: {path} belongs to another run (other settings); starting afresh", file=sys.stderr)
                return False
            f = {name: _read_npy(z, info, name) for name, info in members.items() if name != "header"}
        state, smoother_state = _restore(search, header, f, root)
        previous = search.smoother.get_state()
        try:
            search.smoother.set_state(smoother_state)
        except Exception:
            search.smoother.set_state(previous)
            raise
    except Exception as exc:  # noqa: BLE001 -- any content of an untrusted file: ignore it, run afresh
        print(f"LoRe: ignoring the resume file {path} ({type(exc).__name__}: {str(exc)[:200]}); starting afresh",
              file=sys.stderr)
        return False
    for name, value in state.items():
        setattr(search, name, value)
    return True


def _numbers(f: dict) -> None:
    """The arrays' numbers, as a search computes them: returns finite, radii and ε not NaN and >= 0 (+inf is a
    radius), lower bounds not NaN."""
    if not np.isfinite(f["node_J"]).all():
        raise ValueError("node_J: a value that is not a finite number")
    for name in ("queue_r", "memo_radius", "memo_radii", "memo_eps"):
        if not (f[name] >= 0).all():   # NaN fails too
            raise ValueError(f"{name}: a value that is NaN or negative")
    if np.isnan(f["memo_lower"]).any():
        raise ValueError("memo_lower: a value that is NaN")


def _restore(search, header: dict, f: dict, root) -> tuple[dict, dict]:
    """The search state and the smoother's random state of a resume file's contents (nothing set yet);
    raises ValueError where they do not describe a consistent search of this run."""
    import torch

    n_actions, obs_bytes = search.smoother.n_actions, root.obs.nbytes
    scalars = {k: _count(header.get(k), k) for k in ("transitions", "leaves", "tie", "smoothing_calls", "calls")}
    eps, J = _real(header.get("eps"), "eps"), _real(header.get("J"), "J")
    if eps < 0:
        raise ValueError(f"eps {eps} below 0")
    if J == -math.inf:
        raise ValueError("a return J of -inf")
    _numbers(f)
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
    if any(len(p) and (p.min() < 0 or p.max() >= n_actions or len(p) > search.settings.problem.horizon) for p in paths):
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
    nodes = _replay(search, root, [tuple(int(a) for a in p) for p in paths],
                         list(zip(f["node_J"], f["node_leaf"], f["node_digest"])))
    queue = [(float(r), int(t), nodes[i], int(a)) for r, t, i, a in
             zip(f["queue_r"], ties, f["queue_node"], f["queue_a"], strict=True)]
    for r, _, node, a in queue:  # a queued action waits at its parent's certified radius
        cert = memo.get(node.obs.tobytes())
        if cert is None or float(cert.radii[a]) != r:
            raise ValueError(f"a queued radius that is not its node's certificate's (t={node.t})")
    heapq.heapify(queue)  # a no-op on the saved heap; the pop order is fixed by the unique ties anyway
    if len(f["memo_t"]) and (f["memo_t"].min() < 0 or f["memo_t"].max() >= max(search.settings.problem.horizon, 1)
                             or np.any(f["memo_eps"] > eps)):
        raise ValueError("a smoothed state's depth outside the horizon, or its eps beyond the current eps")
    smoothed = [(int(t), float(e), float(low)) for t, e, low in zip(f["memo_t"], f["memo_eps"], f["memo_lower"])]
    from crop.certify.lore_budget import at_budget_state

    state = {"queue": queue, "stack": _stack_of(search, nodes, f, memo, eps, scalars["tie"]), "memo": memo,
             "alphas": alphas, "at_budget": at_budget_state(header.get("at_budget"), len(keys), eps),
             "smoothed": smoothed,
             "pairs": pairs, "eps": eps, "J": J, "truncated": header["truncated"], "exact_below": exact_below,
             **{k: scalars[k] for k in ("transitions", "leaves", "tie", "smoothing_calls")}}
    return state, {"generator": torch.from_numpy(f["generator"].copy()), "rounding": header["rounding"],
                   "calls": scalars["calls"]}


def _replay(search, root, paths: list[tuple[int, ...]], expected: list) -> list:
    """The nodes at ``paths`` (action paths from s₀), re-simulated as the search built them (each child by
    the search's ``step`` from its parent's snapshot), every shared prefix once; each is checked against its
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
            if node.J != float(J) or node.leaf != bool(leaf) or state_digest(node.obs) != digest.tobytes():
                raise ValueError(f"the environment does not replay the saved node at t={node.t} (not "
                                 "deterministic from its seed?)")
            out[i] = node
        if node.leaf and len(d) > (None in d):
            raise ValueError(f"a saved path continues past a leaf at t={node.t}")
        todo += [(search.step(node, a)[0], sub) for a, sub in d.items() if a is not None]
    return out


@contextmanager
def save_on_sigterm(search):
    """While the search runs with a resume file: SIGTERM (a cluster's wall-time kill, SIGKILL follows after
    a grace period) is noted and handled at the next node, where the state is consistent (:func:`checkpoint`)."""
    if search._autosave is None:
        yield
        return
    with sigterm_noted(lambda signum: setattr(search, "_signal", signum)):
        yield


def checkpoint(search) -> None:
    """Save the state when :class:`Resume`'s ``every`` seconds have passed; on SIGTERM save it and exit (143)."""
    if search._autosave is None:
        return
    path, every, last = search._autosave
    if search._signal is not None or time.time() - last >= every:
        save(search, path)
        search._autosave = (path, every, time.time())
    if search._signal is not None:
        print(f"LoRe: {signal.Signals(search._signal).name}: search state saved to {path} after "
              f"{search.transitions + 1} nodes; the same command resumes it", file=sys.stderr)
        raise SystemExit(128 + search._signal)


