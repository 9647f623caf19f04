"""``crop calibrate``: measure on this machine the unit costs of the cost model (:mod:`crop.workflow.cost`).

Per environment, with a network of the architecture its policies have (random weights: the cost does not
depend on them): the smoothed step per state and noise sample (:class:`crop.smoothing.smoothed.SmoothedNetwork`, the
engine every certifier uses), a PGD gradient per sample, an environment step and a snapshot's size, a
LoRe transition (small full searches of two depths, differenced), GRe's workflow path per trajectory step —
its workers' stepping and its main process's noise, forward and lockstep apart —, per trajectory and per slot
of its pool (:func:`crop.certify.gre.sample_randomized_returns`, timed by phase), a training's environment step
and gradient update (:func:`train_costs`), an algorithm's own network where it costs more than the plain one
(CARRL's bound per sample, NoisyNet's layers: :func:`algo_costs`); and a job's fixed start cost (a fresh
interpreter importing what a stage imports).  All on one core (torch threads: 1).

Each unit is the CPU time of the measured work — this process's and its workers', not the wall-clock — so other
processes on a busy machine do not inflate it (they share the cores, not the work); the least of repetitions
spread over a second (:func:`_best`), on networks seeded alike (``crop calibrate``, like every ``crop`` job, runs
with the allocator :func:`crop.__main__.keep_freed_memory` sets); the load average is recorded beside the units
(``machine.load``).  ``benchmarks/calibrate_load.py`` measures how far a busy machine moves them.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from crop.workflow.cost_units import GLOBAL_UNITS, calibration_path, check_table, check_tables, shipped_table

__all__ = ["calibrate", "machine", "PAPER_ENVS", "cpu_seconds", "algo_costs", "grad_costs", "ALGO_NETS"]

PAPER_ENVS = ("CartPole-v0", "highway-fast-v0", "PongNoFrameskip-v4", "FreewayNoFrameskip-v4")


def machine(device: str) -> dict:
    """CPU model, cores and GPU name of this machine (recorded beside its unit costs)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = None
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name(0)
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu}


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, all its threads, and of its children that have ended."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _workers_cpu(pids) -> float:
    """CPU seconds the live processes ``pids`` have used so far (Linux): the scheduler's nanoseconds on a CPU
    of each of their threads (``/proc/PID/task/TID/schedstat``), where the kernel keeps them; else user +
    system time in clock ticks (``/proc/PID/stat``), 10 ms steps that a worker's part of a short block (24
    highway resets, 30 ms) cannot be measured in."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            total += sum(int(t.joinpath("schedstat").read_text().split()[0])
                         for t in Path(f"/proc/{pid}/task").iterdir()) / 1e9
            continue
        except (OSError, ValueError, IndexError):
            pass
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick   # utime, stime (fields 14, 15 of stat)
    return total


def _best(fn, repeats: int = 5, budget_s: float = 1.0, most: int = 500) -> float:
    """The least CPU seconds (:func:`cpu_seconds`) ``fn`` took, over at least ``repeats`` calls and as many
    more as fill ``budget_s`` seconds (at most ``most`` calls), after one warm-up call.  The work is the same
    in every call; what varies only adds to it (page faults, a virtual CPU that its host takes away): the least
    of calls spread over a second is steady where the least of five calls of a few milliseconds is not."""
    fn()
    times, start = [], time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - start < budget_s and len(times) < most):
        t = cpu_seconds()
        fn()
        times.append(cpu_seconds() - t)
    return min(times)


def _net_spec(env: str, n_actions: int, obs_shape: tuple) -> dict:
    if len(obs_shape) == 3:
        return {"arch": "nature_cnn", "in_channels": obs_shape[0], "in_size": obs_shape[1], "out": n_actions}
    width = 256 if env.startswith("highway") else 128   # the published highway networks; CartPole's recipe
    return {"arch": "mlp", "in": int(obs_shape[0]), "hidden": [width, width], "out": n_actions}


def gre_phases(env: str, net, m: int, horizon: int, device: str = "cpu", workers: int = 1, sigma: float = 0.01,
               batch: int | None = None):
    """GRe's workflow path (:func:`crop.certify.gre.sample_randomized_returns`) timed by phase, each phase as
    ``(wall, main, workers)`` seconds — the wall-clock and the CPU seconds of this (the main) process and of the
    pool's worker processes (none where the pool steps in this process): in all (``total``), of making the pool
    (``start``), of each block's seeded resets (``resets``: (phase, trajectories) per block; the first also waits
    for the workers' start and their environments' making), of the lockstep loop (``loop``: the rest until the
    pool closes) and of closing it (``closing``); the pool's ``slots``, the trajectory ``steps`` taken (a trajectory
    that ends before the horizon takes fewer) and the ``returns``."""
    import crop.certify.gre as gre

    marks = {"resets": [], "steps": 0}
    make = gre.make_env_pool

    def now(pool=None):
        pids = [p.pid for p in getattr(pool, "procs", ())] if pool is not None else ()
        return np.array([time.perf_counter(), time.process_time(), _workers_cpu(pids)])

    def timed(*a, **k):
        t = now()
        pool = make(*a, **k)
        marks["made"] = now(pool)
        marks["start"], marks["slots"] = marks["made"] - t, pool.num_envs
        reset, close = pool.reset, pool.close

        def timed_reset(*a, **k):
            t = now(pool)
            out = reset(*a, **k)
            marks["resets"].append((now(pool) - t, len(out)))
            return out

        def timed_close():
            marks["end"] = now(pool)
            close()
            marks["closed"] = now()

        step = pool.step_async

        def counted_step(idx, *a, **k):
            marks["steps"] += len(idx)
            return step(idx, *a, **k)

        pool.reset, pool.close, pool.step_async = timed_reset, timed_close, counted_step
        return pool

    gre.make_env_pool = timed
    try:
        t0 = now()
        returns = gre.sample_randomized_returns(env, net, gre.GReSettings(sigma, m, horizon, 1.0, seed=0, env_seed=0,
                                                                          chunk=1000, device=device, workers=workers,
                                                                          batch=batch), progress=False)
        total = now() - t0
    finally:
        gre.make_env_pool = make
    resets = marks["resets"]
    closing = marks["closed"] - marks["end"]
    closing[2] = 0.0   # the workers have ended: their last CPU seconds are not read
    return {"total": total, "start": marks["start"], "resets": resets,
            "loop": marks["end"] - marks["made"] - sum(r for r, _ in resets), "closing": closing,
            "slots": marks["slots"], "steps": marks["steps"], "returns": returns}


def _gre_sizes(env: str, image: bool) -> tuple[int, int, int]:
    """(m, H, workers) of the calibration's GRe runs: short trajectories (the units are per step taken: a random
    network's CartPole episode ends sooner), in two blocks; worker processes wherever a job's pool has them, so
    the main process's part is measured apart (CartPole steps in one process)."""
    if image:
        return 64, 40, 1
    if env == "CartPole-v0":
        return 10000, 50, 1   # the paper's m: each lockstep step's calls are shared by its m trajectories
    return 48, 10, 2   # 480 steps: the main process's part (0.1 ms a step on highway) over tens of milliseconds


def gre_costs(env: str, net, device: str, image: bool) -> dict:
    """GRe's path, in CPU seconds: ``gre_step_s`` per trajectory step of the workers' stepping (what more
    workers divide), ``gre_parent_step_s`` per trajectory step of the main process's noise, forward and lockstep
    (what they do not; where the pool steps in this process, CartPole, all of it is ``gre_step_s``),
    ``gre_reset_s`` per trajectory (its environment's seeded reset, from the second block, whose slots are reused)
    and ``gre_start_s`` per slot of the pool (an environment made and closed: where the pool steps in this
    process, a pool made and closed; elsewhere an environment made here, since the worker processes' own start
    — an interpreter's imports each, paid once per worker, not per slot — is not the slots'), each the least
    of a few runs."""
    from crop.envs import make_env, make_env_pool

    gm, gh, workers = _gre_sizes(env, image)
    runs = [gre_phases(env, net, gm, gh, device, workers=workers, batch=gm // 2) for _ in range(2 if image else 3)]

    def cpu(phase):
        return float(phase[1] + phase[2])

    if env == "CartPole-v0":
        # One process, numpy arrays: a slot's making and a reset are fractions of a microsecond, measured on
        # their own over a second each (from a run's phases they were differences of a millisecond or two).
        n = gm // 2
        pool = make_env_pool(env, n)
        try:
            reset = _best(lambda: pool.reset(0, n)) / n
        finally:
            pool.close()
        return {"gre_reset_s": reset,
                "gre_start_s": max(_best(lambda: make_env_pool(env, n).close()) / n, 1e-9),
                "gre_step_s": min(cpu(r["loop"]) / r["steps"] for r in runs),
                "gre_single_process": True}   # numpy arrays in one process: no workers to spread over
    return {"gre_reset_s": min(sum(cpu(r) for r, _ in run["resets"][1:]) / sum(n for _, n in run["resets"][1:])
                               for run in runs),
            "gre_start_s": _best(lambda: make_env(env).close(), repeats=2),
            "gre_step_s": min(float(r["loop"][2]) / r["steps"] for r in runs),
            "gre_parent_step_s": min(float(r["loop"][1]) / r["steps"] for r in runs)}


def _env_costs(env: str, device: str, log) -> dict:
    import pickle

    import torch

    from crop.envs import make_env, snapshot, to_obs
    from crop.models import build_network

    e = make_env(env)
    obs, _ = e.reset(seed=0)
    obs = to_obs(obs)
    k, image = int(e.action_space.n), obs.ndim == 3
    torch.manual_seed(0)   # the same weights every calibration: CARRL's bound's work depends on them
    net = build_network(_net_spec(env, k, obs.shape)).to(device).eval()
    out = {}

    m = 2000 if image and device == "cpu" else 10000
    out.update(_network_costs(net, obs, k, device, image, m))
    log(f"{env}: smoothed step {out['smooth_sample_s'] * m * 1e3:.1f} ms per state at m = {m}")

    n = 200 if image else 500

    def steps():
        e.reset(seed=1)
        for _ in range(n):
            _, _, term, trunc, _ = e.step(e.action_space.sample())
            if term or trunc:
                e.reset()

    out["env_step_s"] = _best(steps) / n
    snap = snapshot(e)
    out["node_mb"] = len(pickle.dumps(snap, protocol=pickle.HIGHEST_PROTOCOL)) / 1e6
    log(f"{env}: env step {out['env_step_s'] * 1e3:.2f} ms, a node's snapshot {out['node_mb']:.3g} MB")

    out["lore_transition_s"] = _lore_transition_s(env, net, k, out["smooth_sample_s"], device)
    log(f"{env}: LoRe transition {out['lore_transition_s'] * 1e3:.2f} ms (restore, step, snapshot)")

    out.update(gre_costs(env, net, device, image))
    parent = f" + {out['gre_parent_step_s'] * 1e3:.3f} ms in the main process" if "gre_parent_step_s" in out else ""
    log(f"{env}: GRe {out['gre_step_s'] * 1e3:.3f} ms per trajectory step on a worker{parent}, "
        f"{out['gre_reset_s'] * 1e3:.1f} ms to reset a trajectory's environment, "
        f"{out['gre_start_s'] * 1e3:.1f} ms to make a slot's")
    algos = algo_costs(env, _net_spec(env, k, obs.shape), obs, device, image)
    if algos:
        out["algos"] = algos
        for algo, units in algos.items():
            log(f"{env}: {algo}'s network {units['smooth_sample_s'] / out['smooth_sample_s']:.1f}x the smoothed "
                f"step, {units['grad_sample_s'] / out['grad_sample_s']:.1f}x the gradient")

    out.update(train_costs(env, device))
    log(f"{env}: training {1 / out['train_step_s']:.0f} env steps/s, "
        f"a gradient update {out['train_update_s'] * 1e3:.2f} ms")
    return out


#: The algorithms whose network costs more per sample than their environment's plain one: CARRL acts on a CROWN
#: bound computed for every (noisy) input, NoisyNet's linear layers are noisy layers.  (recipe, spec of it).
ALGO_NETS = ("CARRL", "NoisyNet")


def _algo_net(env: str, algo: str, spec: dict):
    """``algo``'s network on ``env`` over the plain architecture ``spec`` (random weights), or None where the
    registry has no such algorithm there or its network is the plain one."""
    from crop.agents.registry import sources
    from crop.models import build_network

    try:
        entry = sources(env, algo)
    except (KeyError, ValueError):
        return None
    if algo == "CARRL" and "derive" in entry:
        from crop.models.carrl import carrl_spec

        d = entry["derive"]
        return build_network(carrl_spec(spec, d["eps"], d.get("norm", 2), d.get("method", "crown")))
    if algo == "NoisyNet" and spec["arch"] == "mlp":
        return build_network({"arch": "noisy_mlp", "in": spec["in"], "hidden": spec["hidden"], "out": spec["out"],
                              "sigma0": 0.5})
    return None


def algo_costs(env: str, spec: dict, obs, device: str, image: bool) -> dict:
    """``{algo: units}`` of the algorithms of :data:`ALGO_NETS` that ``env`` has, measured with their own network:
    ``smooth_sample_s``, ``grad_sample_s`` and GRe's per-step units (:func:`gre_costs`), which the model uses for
    that algorithm's jobs instead of the environment's (:class:`crop.workflow.cost_units.Units`)."""
    import torch

    out = {}
    for algo in ALGO_NETS:
        torch.manual_seed(0)
        net = _algo_net(env, algo, spec)
        if net is None:
            continue
        net = net.to(device).eval()
        units = _network_costs(net, obs, spec["out"], device, image, m=2000)
        g = gre_costs(env, net, device, image)
        units.update({k: g[k] for k in ("gre_step_s", "gre_parent_step_s") if k in g})
        out[algo] = units
    return out


def _network_costs(net, obs, k: int, device: str, image: bool, m: int) -> dict:
    """``smooth_sample_s`` (the smoothed step per state and noise sample, m samples) and a PGD gradient's units
    (:func:`grad_costs`) of ``net``."""
    from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings

    sm = SmoothedNetwork(net, SmoothingSettings(0.01, m, -1.0, 1.0, 0.05, chunk=1000, device=device), k)
    out = {"smooth_sample_s": _best(lambda: sm.estimate_batch(obs[None])) / m}
    out.update(grad_costs(net, obs, device, image))
    return out


def grad_costs(net, obs, device: str, image: bool) -> dict:
    """A PGD gradient of ``net`` as a call's fixed cost plus a cost per sample: ``grad_call_s`` and
    ``grad_sample_s``, from the least CPU time of a batch of one sample and of ``big`` samples, differenced.
    The attacks step every run in lockstep, one call per PGD step over runs × samples, where a price per sample
    measured at 32 samples a call overstates a CartPole job of 160 runs about 5×."""
    import torch
    import torch.nn.functional as F

    def per_call(b: int) -> float:
        x = torch.as_tensor(np.repeat(obs[None], b, 0), device=device)

        def grad():
            z = x.clone().requires_grad_(True)
            F.cross_entropy(net(z + 0.01 * torch.randn_like(z)), torch.zeros(b, dtype=torch.long, device=device)) \
                .backward()
            if device == "cuda":
                torch.cuda.synchronize()

        return _best(grad)

    # One sample and many: the call's cost is then the one-sample call less one sample, where from 32 samples
    # less 32 it was a small difference of large times (CARRL's: 1.2 of 18 ms) that moved 2x between runs.
    big = 256 if image else 1024
    t_one, t_big = per_call(1), per_call(big)
    sample = max((t_big - t_one) / (big - 1), t_big / big / 4)   # timing noise cannot make it vanish
    return {"grad_sample_s": sample, "grad_call_s": max(t_one - sample, 1e-9)}   # within its range


def train_costs(env: str, device: str) -> dict:
    """A training's units (:func:`crop.workflow.cost.training_work`) from :func:`crop.train.dqn.train_dqn` with
    the environment's DQN settings (StdTrain's network, batch and replay): ``train_step_s``, an environment step
    with a greedy action (ε = 0) and no update, from runs of n and 3n steps (what a run pays once, making its
    environment and its one-step final evaluation, cancels out); ``train_update_s``, a gradient update of a
    batch, as the training times its updates (``update_cpu_s``) over a run of n steps with one every step from
    the first; each the least of three runs."""
    from crop.train import dqn_config
    from crop.train.dqn import train_dqn

    n = 100 if env in ("PongNoFrameskip-v4", "FreewayNoFrameskip-v4") else (150 if env.startswith("highway") else 500)

    def train(steps: int, updates: bool) -> tuple[float, float]:
        cfg = dqn_config(env, "StdTrain", {"learning_starts": 0 if updates else steps, "train_every": 1,
                                           "buffer_size": 1000, "eps_start": 0.0, "eps_end": 0.0,
                                           "eval_every": 10 * steps, "quick_eval_episodes": 1, "eval_max_steps": 1,
                                           "device": device}, {"total_steps": steps, "target_return": None,
                                                               "eval_episodes": 1})
        t = cpu_seconds()
        _, info = train_dqn(env, 0, cfg, progress=False)
        return cpu_seconds() - t, info["update_cpu_s"]

    # The least of three runs each.  The update is timed by the training itself (its updates' own CPU time):
    # as a difference of runs with and without updates it was a small part of their time (a highway step takes
    # 12x an update), which moved it up to 2.6x between calibrations.
    short, long = (min(train(steps, False)[0] for _ in range(3)) for steps in (n, 3 * n))
    update = min(train(n, True)[1] for _ in range(3)) / n
    # Timing noise can leave a difference at nothing: then the longer run's whole time per step (its start
    # included), which errs long, never a free step (a calibration holds no zero: crop.workflow.cost_units).
    step = (long - short) / (2 * n) if long > short else long / (3 * n)
    return {"train_step_s": step, "train_update_s": update}


def _lore_transition_s(env: str, net, k: int, smooth_sample_s: float, device: str) -> float:
    """A LoRe transition's cost — restore the parent's snapshot, step, snapshot the child, the search's
    bookkeeping — from full searches (no pruning) of two small trees, depth d and d + 1, 16 samples per state:
    their difference in seconds, less its smoothing, over their difference in transitions, so that what a
    search pays once (making and resetting its environment: two ROM loads on Atari) cancels out."""
    from crop.certify.lore import LoReSettings, Problem, Search, run_lore
    from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings

    depth = {"CartPole-v0": 8, "FreewayNoFrameskip-v4": 4}.get(env, 2)
    m = 16

    def search(d: int) -> tuple[float, dict]:
        info = {}

        def run():
            sm = SmoothedNetwork(net, SmoothingSettings(0.01, m, -1.0, 1.0, 0.05, chunk=1000, device=device), k)
            info.update(run_lore(env, sm, LoReSettings(Problem(d, 0), Search(prune=False)), progress=False).info)

        return _best(run, repeats=2), info

    (t1, i1), (t2, i2) = search(depth), search(depth + 1)
    smoothed = i2["distinct_states_smoothed"] - i1["distinct_states_smoothed"]
    residual = (t2 - t1 - smoothed * m * smooth_sample_s) / max(1, i2["transitions"] - i1["transitions"])
    # Timing noise can leave nothing after the smoothing is taken out: then the deeper search's whole time per
    # transition (its start included), which errs long, never a free transition.
    return residual if residual > 0 else t2 / max(1, i2["transitions"])


def _start_s() -> float:
    """A stage job's fixed cost: a fresh interpreter importing what ``crop loact`` imports."""
    code = ("import crop.__main__, crop.smoothing.smoothed, crop.certify.loact, crop.envs, "
            "pandas")

    def run():
        subprocess.run([sys.executable, "-c", code], check=True)

    return _best(run, repeats=3)


def calibrate(device: str, envs=PAPER_ENVS, out: str | Path | None = None, log=print) -> dict:
    """Measure every unit cost of ``envs`` on ``device`` and store them under ``device`` in the calibration file
    (other devices' tables in it are kept, and so are the device's other environments, whose units this run
    did not measure).  Returns the table written.  A file there that is JSON but fails the checks every reader
    makes (:func:`crop.workflow.cost_units.check_tables`) is refused before anything is measured, since what it would
    keep of it would make the new file fail them too; one that is not JSON is replaced.  The new table is
    checked before it is written."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device here")
    path = Path(out) if out else calibration_path()
    tables = {}
    if path.is_file():
        try:
            tables = json.loads(path.read_text())
        except ValueError:
            tables = {}
        else:
            check_tables(tables, f"calibration {path} (fix or remove it)")
    torch.set_num_threads(1)   # the unit is one core: a job's threads divide what scales
    shipped = shipped_table(device)
    load = os.getloadavg()[0]
    table = {"device": device, "machine": machine(device),
             "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "source": "crop calibrate", "envs": {}}
    table["start_s"] = _start_s()
    log(f"start of a job (imports): {table['start_s']:.2f} s")
    for name in GLOBAL_UNITS:
        if name != "start_s":   # not measurable by a micro-benchmark: the shipped table's (docs/speed.md)
            table[name] = shipped[name]
    for env in envs:
        table["envs"][env] = _env_costs(env, device, log)
    table["machine"]["load"] = f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end (1-minute averages)"
    log(f"load average {table['machine']['load']} on {os.cpu_count()} cores (units are CPU seconds: the load "
        "does not enter them)")
    old = tables.get(device) or {}
    table["envs"] = {**(old.get("envs") or {}), **table["envs"]}
    check_table(table, device, f"calibrate --device {device} measured")
    path.parent.mkdir(parents=True, exist_ok=True)
    tables[device] = table
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(tables, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    log(f"wrote {path}")
    return table
