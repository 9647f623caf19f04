"""Resumable training: the whole state of :func:`crop.train.dqn.train_dqn` in a resume file, written every
``every_s`` seconds and on SIGTERM (a cluster's wall-time signal; the process then exits with status 143), so
that the same command run again continues where it stopped and writes the same model.pt, byte for byte (CPU).

What is saved, at the end of an environment step: both networks (every parameter and buffer), Adam's state
and learning rate, the filled part of the replay buffer with its priorities, every random state (the ε-greedy
and replay-sampling numpy Generator, the recipe's numpy Generator and torch Generator, and the global
``random``, ``numpy.random`` and torch CPU states), the counters (next step, episodes), the current episode's
return, the last 20 episode returns, the evaluations so far and the recipe's statistics.  The environment
itself cannot be snapshotted in general (ALE, highway-env), so the file holds the actions of the current
episode since its seeded reset instead; a resumed run re-creates the environment, resets it with that seed
and replays the actions, and resumes only if the replay reproduces the saved observation and the episode's
return exactly (an environment that is not deterministic given its reset seed starts afresh instead).

Saving a state takes about 12 ms for CartPole (a full 50k-transition buffer, 3 MB) and 2 s per 10k Atari
transitions (590 MB); a periodic save waits at least 100 times as long as the last one took, so that saving
costs at most 1 % of the training time.

A resume file is untrusted input: a regular file (not a symbolic link, device or FIFO) of at most the bytes the
largest state of this run takes (:func:`largest_state`), an uncompressed ``.npz`` of numeric arrays and a JSON
header, each member's type and shape checked against the run's own structures before a byte of it is read
(nothing pickled, no allocation beyond the file's size).  It is keyed by every training setting (the DQN
configuration, recipe and hyper-parameters, network, environment, profile, seed, device) and a digest of the
training code and the versions of the libraries it runs on, compared whole.  Its state is checked against what
those settings imply: every number finite (weights, Adam's moments, the replay buffer's observations and
rewards, returns, statistics), Adam's second moments ≥ 0 and its step count the number of updates the saved
step implies, the learning rate the schedule's at that step, the replay priorities finite, positive and at
most the largest priority's.  A file of another run, a damaged one, one failing a check or one that does not
replay is ignored with one line on stderr and training starts afresh, and nothing of it is used unless every
check has passed.  A finite edit of a weight, a random state or the largest priority is indistinguishable
from a real state and is not detected (docs/reliability.md says why no signature is kept).  Writes are atomic
(a temporary file renamed onto it); the caller deletes it once model.pt is written.
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from crop.fingerprint import code_digest, library_versions
from crop.io import count_value as _count
from crop.io import finite_value as _real
from crop.io import open_state_file, sigterm_noted
from crop.train.defaults import CHECKPOINT_EVERY

__all__ = ["CHECKPOINT_EVERY", "ResumeOptions", "Progress", "Checkpointer", "training_key", "largest_state"]

#: The layout of the file: a file of another layout never matches, training starts afresh.
FORMAT = 1
_CODE = ("train", "models", "envs", "certify/attack.py")


@dataclass(frozen=True)
class ResumeOptions:
    """Where the training state is saved and resumed from, how often, and (for tests) a step after which
    to save and stop exactly as on SIGTERM."""

    path: Path
    every_s: float = CHECKPOINT_EVERY
    stop_after: int | None = None


@dataclass
class Progress:
    """The trainer's loop state besides its objects: what a resumed run continues from."""

    next_step: int = 0
    episodes: int = 0
    ep_ret: float = 0.0
    recent: list = field(default_factory=list)     # the last 20 episode returns
    evals: list = field(default_factory=list)      # the evaluation records so far
    actions: list = field(default_factory=list)    # the current episode's actions since its seeded reset
    runtime_s: float = 0.0                         # wall and CPU seconds of the processes before this one
    cpu_s: float = 0.0
    resumed_at: list = field(default_factory=list)  # the steps this training was resumed at


def training_key(run: dict) -> dict:
    """What identifies a training: ``run`` (every setting: env, profile, seed, recipe, hyper-parameters, DQN
    configuration, network, device), the file's layout, the training code's digest and the library versions."""
    key = {"format": FORMAT, **run, "code": code_digest(_CODE), "versions": library_versions(),
           "python": list(sys.version_info[:2])}
    return json.loads(json.dumps(key, default=repr))   # as a file holds it: tuples are lists


# ------------------------------------------------------------------------------------------- reading

def _reals(v, name: str, most: int | None = None) -> list:
    if not isinstance(v, list) or (most is not None and len(v) > most):
        raise ValueError(f"{name} is not a list of at most {most} numbers")
    return [_real(x, name) for x in v]


def _record(v, name: str) -> dict:
    """A record of numbers by name, as it was (an int stays an int)."""
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ValueError(f"{name} is not a record")
    for k, x in v.items():
        _real(x, f"{name}.{k}")
    return v


class _Reader:
    """The members of a resume file, each checked against the (dtype, shape) the run expects before any of
    its bytes is read: a zip of uncompressed members whose sizes sum to at most the file's."""

    def __init__(self, f, size: int):
        self.zip = zipfile.ZipFile(f)
        infos = self.zip.infolist()
        if any(i.compress_type != zipfile.ZIP_STORED or i.compress_size != i.file_size for i in infos):
            raise ValueError("a compressed member (a resume file is stored uncompressed)")
        if sum(i.file_size for i in infos) > size:
            raise ValueError("members larger than the file")
        self.infos = {i.filename[:-4]: i for i in infos if i.filename.endswith(".npy")}
        if len(self.infos) != len(infos) or len({i.filename for i in infos}) != len(infos):
            raise ValueError("a member that is not an array")

    def names(self, expected) -> None:
        if sorted(self.infos) != sorted(expected):
            extra, missing = sorted(set(self.infos) - set(expected)), sorted(set(expected) - set(self.infos))
            raise ValueError(f"members not this run's (unexpected {extra[:5]}, missing {missing[:5]})")

    def close(self) -> None:
        self.zip.close()

    def read(self, name: str, dtype, shape: tuple | None, out: np.ndarray | None = None) -> np.ndarray:
        """Member ``name`` as an array of ``dtype`` and ``shape`` (``None``: any 1-D length), read into ``out``
        if given (the bytes go straight into it: a large replay buffer is not held twice)."""
        info = self.infos[name]
        with self.zip.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"{name}: .npy format {version}")
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            got, fortran, got_dtype = read(f)
            want = np.dtype(dtype)
            if got_dtype != want or fortran or (got != tuple(shape) if shape is not None else len(got) != 1):
                raise ValueError(f"{name}: {got_dtype} {got}, expected {want} {shape if shape is not None else '(n,)'}")
            nbytes = math.prod(got) * want.itemsize
            if info.file_size - f.tell() != nbytes:
                raise ValueError(f"{name}: shape {got} does not match its {info.file_size - f.tell()} bytes")
            if out is None:
                out = np.empty(got, want)
            view, done = memoryview(out.reshape(-1).view(np.uint8)), 0
            while done < nbytes:
                n = f.readinto(view[done:])
                if not n:
                    raise ValueError(f"{name}: truncated")
                done += n
        return out


# ------------------------------------------------------------------------------------------- the state

def _module_tensors(net: torch.nn.Module) -> dict:
    """Every parameter and buffer (persistent or not: NoisyNet's noise too) by name."""
    return {**dict(net.named_parameters()), **dict(net.named_buffers())}


_ADAM = ("step", "exp_avg", "exp_avg_sq")


def _dtype(t: torch.Tensor) -> np.dtype:
    return torch.empty((), dtype=t.dtype).numpy().dtype


def _adam_layout(opt: torch.optim.Optimizer) -> dict:
    params = [p for g in opt.param_groups for p in g["params"]]
    out = {}
    for i, p in enumerate(params):
        out[f"opt.{i}.step"] = (np.float32, ())
        out[f"opt.{i}.exp_avg"] = out[f"opt.{i}.exp_avg_sq"] = (_dtype(p), tuple(p.shape))
    return out


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


@dataclass
class State:
    """The objects of a training that a resume file holds (the trainer's own, saved and restored in place)."""

    ctx: object                      # crop.train.dqn.TrainContext: networks, recipe generators, statistics
    opt: torch.optim.Optimizer
    buf: object                      # crop.train.dqn._Replay
    rng: np.random.Generator         # ε-greedy and replay sampling
    progress: Progress
    obs: np.ndarray                  # the current observation
    started: tuple = (0.0, 0.0)      # time.time() and time.process_time() when this process started training


def _arrays_and_header(st: State) -> tuple[dict, dict]:
    ctx, opt, buf, p = st.ctx, st.opt, st.buf, st.progress
    count = min(buf.n, buf.size)
    arrays = {f"{net}.{k}": _np(t) for net in ("q", "target") for k, t in _module_tensors(getattr(ctx, net)).items()}
    opt_state = opt.state_dict()["state"]
    for i, s in opt_state.items():
        arrays.update({f"opt.{i}.{k}": _np(s[k]) for k in _ADAM})
    arrays.update({"buf.s": buf.s[:count], "buf.s2": buf.s2[:count], "buf.a": buf.a[:count], "buf.r": buf.r[:count],
                   "buf.d": buf.d[:count], "obs": np.asarray(st.obs), "actions": np.asarray(p.actions, np.int64),
                   "gen": _np(ctx.gen.get_state()), "torch_rng": _np(torch.get_rng_state())})
    if buf.prio is not None:
        arrays["buf.prio"] = buf.prio[:count]
    legacy = np.random.get_state()
    arrays["np_legacy"] = np.asarray(legacy[1], np.uint32)
    py = random.getstate()
    header = {"next_step": p.next_step, "episodes": p.episodes, "ep_ret": p.ep_ret, "recent": p.recent,
              "evals": p.evals, "runtime_s": p.runtime_s + time.time() - st.started[0],
              "cpu_s": p.cpu_s + time.process_time() - st.started[1], "resumed_at": p.resumed_at,
              "stats": ctx.stats, "buf_n": buf.n, "max_prio": buf.max_prio, "opt_state": bool(opt_state),
              "lr": [g["lr"] for g in opt.param_groups], "rng": st.rng.bit_generator.state,
              "recipe_rng": ctx.rng.bit_generator.state, "np_legacy": [legacy[0], *legacy[2:]],
              "random": [py[0], list(py[1]), py[2]]}
    return arrays, header


def save(path: Path, key: dict, st: State) -> None:
    """Write the training state to ``path`` atomically (a temporary file beside it, renamed onto it)."""
    from crop.io import temp_file

    arrays, header = _arrays_and_header(st)
    arrays["header"] = np.frombuffer(json.dumps({"key": key, **header}).encode(), np.uint8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file(path)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _progress(h: dict, total_steps: int) -> Progress:
    p = Progress(next_step=_count(h.get("next_step"), "next_step"), episodes=_count(h.get("episodes"), "episodes"),
                 ep_ret=_real(h.get("ep_ret"), "ep_ret"), recent=_reals(h.get("recent"), "recent", 20),
                 runtime_s=_real(h.get("runtime_s"), "runtime_s"), cpu_s=_real(h.get("cpu_s"), "cpu_s"),
                 resumed_at=[_count(s, "resumed_at") for s in h.get("resumed_at", None) or []])
    if not 1 <= p.next_step <= total_steps:
        raise ValueError(f"next step {p.next_step} outside 1…{total_steps}")
    if not isinstance(h.get("evals"), list):
        raise ValueError("evals is not a list")
    p.evals = [_record(e, "evals") for e in h["evals"]]
    return p


def _generators(h: dict, arrays: dict, ctx) -> dict:
    """The saved random states, each set on a throwaway generator first (a bad state raises here)."""
    rng, recipe_rng = np.random.default_rng(), np.random.default_rng()
    rng.bit_generator.state, recipe_rng.bit_generator.state = h.get("rng"), h.get("recipe_rng")
    gen = torch.Generator(device=ctx.gen.device)
    gen.set_state(torch.from_numpy(arrays["gen"]))
    torch.Generator().set_state(torch.from_numpy(arrays["torch_rng"]))
    legacy = h.get("np_legacy")
    if not isinstance(legacy, list) or len(legacy) != 4:
        raise ValueError("numpy.random's state is not (name, pos, has_gauss, cached_gaussian)")
    legacy = (legacy[0], arrays["np_legacy"], *legacy[1:])
    np.random.RandomState().set_state(legacy)
    py = h.get("random")
    if not isinstance(py, list) or len(py) != 3 or not isinstance(py[1], list):
        raise ValueError("random's state is not (version, state, gauss)")
    py = (py[0], tuple(py[1]), py[2])
    random.Random().setstate(py)
    return {"rng": rng.bit_generator.state, "recipe_rng": recipe_rng.bit_generator.state, "gen": gen.get_state(),
            "torch_rng": torch.from_numpy(arrays["torch_rng"].copy()), "np_legacy": legacy, "random": py}


def largest_state(st: State, cfg) -> int:
    """The most bytes a resume file of this training can take: every array at its largest (both networks,
    Adam's two moments and step per parameter, a full replay buffer, the observation, the random states, an
    episode of ``total_steps`` actions), a header of 1 MiB plus 1 KiB per evaluation (one every
    ``eval_every`` steps), and 1 KiB per member for the zip's and ``.npy``'s own headers."""
    arrays = [t for net in (st.ctx.q, st.ctx.target) for t in _module_tensors(net).values()]
    params = [p for g in st.opt.param_groups for p in g["params"]]
    nbytes = sum(t.numel() * t.element_size() for t in arrays) + sum(2 * p.numel() * p.element_size() + 4
                                                                      for p in params)
    buf = [x for x in (st.buf.s, st.buf.s2, st.buf.a, st.buf.r, st.buf.d, st.buf.prio) if x is not None]
    nbytes += sum(x.nbytes for x in buf) + np.asarray(st.obs).nbytes + 8 * cfg.total_steps + 624 * 4
    nbytes += st.ctx.gen.get_state().numel() + torch.get_rng_state().numel()
    members = len(arrays) + 3 * len(params) + len(buf) + 6
    return nbytes + (1 << 20) + 1024 * (cfg.total_steps // max(cfg.eval_every, 1) + 1) + 1024 * members


def _all_finite(name: str, x: np.ndarray) -> None:
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise ValueError(f"{name}: a value that is not a finite number (NaN or ±inf)")


def _check_optimiser(arrays: dict, h: dict, opt, cfg, next_step: int) -> list:
    """The learning rates, after checking Adam's state against the training's schedule: saved iff an update
    was made, every step count the number of updates before ``next_step``, second moments ≥ 0, the learning
    rate the schedule's at the last update (``lr`` before any)."""
    updates = cfg.updates(next_step)
    if h.get("opt_state") is not (updates > 0):
        raise ValueError(f"opt_state {h.get('opt_state')!r}, but {updates} updates precede step {next_step}")
    steps = {float(v) for k, v in arrays.items() if k.startswith("opt.") and k.endswith(".step")}
    if updates and steps != {float(np.float32(min(updates, 2**24)))}:   # float32 counts stop at 2^24
        raise ValueError(f"Adam's step counts {sorted(steps)[:3]}, not the {updates} updates before step {next_step}")
    if any(k.endswith(".exp_avg_sq") and (v < 0).any() for k, v in arrays.items()):
        raise ValueError("a negative second moment in Adam's state")
    lrs = _reals(h.get("lr"), "lr")
    last = cfg.last_update(next_step)
    want = cfg.lr if last is None else cfg.lr_at(last)
    if len(lrs) != len(opt.param_groups) or any(lr != want for lr in lrs):
        raise ValueError(f"learning rates {lrs[:3]}, not the schedule's {want} at step {next_step}")
    return lrs


def _checked(r: _Reader, h: dict, st: State, cfg, new_buffer, replay) -> dict:
    """Everything a resume file of this run holds, checked (types, shapes, ranges, finite values, the
    optimiser's state against the schedule, the episode's replay); raises ValueError where it does not
    describe a consistent state of this training.  Nothing of ``st`` changes."""
    ctx, opt = st.ctx, st.opt
    p = _progress(h, cfg.total_steps)
    buf = new_buffer()
    buf.n, buf.max_prio = _count(h.get("buf_n"), "buf_n"), _real(h.get("max_prio"), "max_prio")
    if not 1 <= buf.max_prio < math.inf:
        raise ValueError("the largest priority is not a finite number >= 1")
    if buf.n != p.next_step:   # one transition a step
        raise ValueError(f"{buf.n} transitions stored in {p.next_step} steps")
    count = min(buf.n, buf.size)
    layout = {f"{net}.{k}": (_dtype(t), tuple(t.shape)) for net in ("q", "target")
              for k, t in _module_tensors(getattr(ctx, net)).items()}
    if h.get("opt_state") is True:
        layout.update(_adam_layout(opt))
    elif h.get("opt_state") is not False:
        raise ValueError("opt_state is not a boolean")
    layout.update({"obs": (st.obs.dtype, st.obs.shape), "actions": (np.int64, None),
                   "gen": (np.uint8, tuple(ctx.gen.get_state().shape)),
                   "torch_rng": (np.uint8, tuple(torch.get_rng_state().shape)), "np_legacy": (np.uint32, (624,))})
    stored = ["buf.s", "buf.s2", "buf.a", "buf.r", "buf.d", *(["buf.prio"] if buf.prio is not None else [])]
    r.names([*layout, *stored, "header"])
    arrays = {name: r.read(name, *spec) for name, spec in layout.items()}
    for name in stored:   # straight into the new buffer
        into = getattr(buf, name[4:])
        r.read(name, into.dtype, (count, *into.shape[1:]), out=into[:count])
        _all_finite(name, into[:count])
    for name, x in arrays.items():
        _all_finite(name, x)
    if count and (buf.a[:count].min() < 0 or buf.a[:count].max() >= ctx.n_actions
                  or not np.isin(buf.d[:count], (0.0, 1.0)).all()):
        raise ValueError("stored actions outside the environment's, or done flags other than 0 and 1")
    if buf.prio is not None and count and not ((buf.prio[:count] > 0).all() and  # stored as priority^α
                                               buf.prio[:count].max() <= buf.max_prio ** cfg.per_alpha * (1 + 1e-6)):
        raise ValueError("a priority that is not positive or above the largest priority")
    lrs = _check_optimiser(arrays, h, opt, cfg, p.next_step)
    p.actions = [int(a) for a in arrays["actions"]]
    if any(not 0 <= a < ctx.n_actions for a in p.actions):
        raise ValueError("an action outside the environment's")
    out = {"progress": p, "buf": buf, "arrays": arrays, "lrs": lrs, "stats": _record(h.get("stats"), "stats"),
           "generators": _generators(h, arrays, ctx), "opt_state": h["opt_state"]}
    obs, ret, early = replay(p.episodes, p.actions)
    if early or ret != p.ep_ret or obs.dtype != arrays["obs"].dtype or not np.array_equal(obs, arrays["obs"]):
        raise ValueError(f"the environment does not replay episode {p.episodes} to the saved state (not "
                         "deterministic from its reset seed?)")
    return out


def _restore(st: State, f: dict) -> None:
    """Set the checked contents ``f`` of a resume file on the training's objects, in place."""
    ctx, opt, arrays = st.ctx, st.opt, f["arrays"]
    with torch.no_grad():
        for net in ("q", "target"):
            for k, t in _module_tensors(getattr(ctx, net)).items():
                t.copy_(torch.from_numpy(arrays[f"{net}.{k}"]))
    if f["opt_state"]:
        params = [p for g in opt.param_groups for p in g["params"]]
        state = {i: {k: torch.from_numpy(arrays[f"opt.{i}.{k}"]).to("cpu" if k == "step" else params[i].device)
                     for k in _ADAM} for i in range(len(params))}
        opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})
    for g, lr in zip(opt.param_groups, f["lrs"]):
        g["lr"] = lr
    st.buf, st.obs, st.progress = f["buf"], arrays["obs"], f["progress"]
    ctx.stats.clear()
    ctx.stats.update(f["stats"])
    gens = f["generators"]
    st.rng.bit_generator.state, ctx.rng.bit_generator.state = gens["rng"], gens["recipe_rng"]
    ctx.gen.set_state(gens["gen"])
    torch.set_rng_state(gens["torch_rng"])
    np.random.set_state(gens["np_legacy"])
    random.setstate(gens["random"])


def load(path: Path, key: dict, st: State, cfg, new_buffer, replay) -> Progress | None:
    """Restore ``st`` in place (its buffer replaced by one from ``new_buffer()``, filled from the file) from
    ``path`` if it holds a state of this run (``key``, the DQN configuration ``cfg``) that ``replay(episode,
    actions)`` — the environment reset with that episode's seed and stepped through the actions, returning
    (observation, return, ended early) — reproduces.  Returns the progress to continue from, or None: training
    starts afresh, and one line on stderr says why unless there was no file.  Nothing of ``st`` changes unless
    every check has passed."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    r = f = None
    try:
        f = open_state_file(path, largest_state(st, cfg))
        r = _Reader(f, os.fstat(f.fileno()).st_size)
        if "header" not in r.infos:
            raise ValueError("no header")
        h = json.loads(bytes(r.read("header", np.uint8, None)).decode())
        if not isinstance(h, dict) or h.get("key") != key:
            print(f"train: {path} belongs to another run (other settings, code or versions); starting afresh",
                  file=sys.stderr)
            return None
        state = _checked(r, h, st, cfg, new_buffer, replay)
    except Exception as exc:  # noqa: BLE001 -- any content of an untrusted file: ignore it, train afresh
        print(f"train: ignoring the resume file {path} ({type(exc).__name__}: {str(exc)[:200]}); starting afresh",
              file=sys.stderr)
        return None
    finally:
        if r is not None:
            r.close()
        if f is not None:
            f.close()
    _restore(st, state)
    return st.progress


# ------------------------------------------------------------------------------------------- when to save

#: A periodic save waits at least this many times as long as the last save took, so that saving costs at most
#: 1 % of the training time whatever the state's size (an Atari replay buffer: every 30 minutes or so).
SAVE_SPACING = 100.0


class Checkpointer:
    """When to save: every ``every_s`` seconds (or :data:`SAVE_SPACING` times the last save's duration, if
    longer), on SIGTERM (noted by a handler, acted on at the end of the step: then saved, one line on stderr,
    and the process exits with 143) and after ``stop_after``."""

    def __init__(self, options: ResumeOptions, key: dict):
        self.options, self.key = options, key
        self.signal = None
        self.next_save = time.monotonic() + options.every_s

    @contextmanager
    def on_sigterm(self):
        """SIGTERM noted (not acted on) while training runs, in the main thread only."""
        with sigterm_noted(lambda signum: setattr(self, "signal", signum)):
            yield

    def save_now(self, st: State) -> None:
        began = time.monotonic()
        save(self.options.path, self.key, st)
        took = time.monotonic() - began
        self.next_save = began + took + max(self.options.every_s, SAVE_SPACING * took)

    def after_step(self, step: int, st: State) -> None:
        """Save ``st`` if due; stop (SystemExit 143) on SIGTERM or after ``stop_after``."""
        stop = self.signal is not None or step == self.options.stop_after
        if not stop and time.monotonic() < self.next_save:
            return
        self.save_now(st)
        if stop:
            name = signal.Signals(self.signal).name if self.signal is not None else f"stop after step {step}"
            print(f"train: {name}: training state saved to {self.options.path} after step {step}; the same "
                  "command resumes it", file=sys.stderr)
            raise SystemExit(128 + signal.SIGTERM)
