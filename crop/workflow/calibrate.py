"""``crop calibrate``: measure on this machine the unit costs of the cost model (:mod:`crop.workflow.cost`).

Per environment, with a network of the architecture its policies have (random weights: the cost does not
depend on them): the smoothed step per state and noise sample (:class:`crop.smoothing.smoothed.SmoothedNetwork`, the
engine every certifier uses), a PGD gradient per sample, an environment step and a snapshot's size, a
LoRe transition (small full searches of two depths, differenced), GRe's workflow path per trajectory step,
per trajectory and per slot of its pool (:func:`crop.certify.gre.sample_randomized_returns` with one worker, timed by
phase), a training's
environment step and gradient update (:func:`train_costs`); and a job's fixed start
cost (a fresh interpreter importing what a stage imports).  All on one core (torch threads: 1).  Each is
the best of a few repetitions: on a shared machine the best is the least disturbed by other processes.
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

from crop.workflow.cost_units import GLOBAL_UNITS, calibration_path, check_table, check_tables, shipped_table

__all__ = ["calibrate", "machine", "PAPER_ENVS"]

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


def _best(fn, repeats: int = 3) -> float:
    """The least seconds ``fn`` took in ``repeats`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _net_spec(env: str, n_actions: int, obs_shape: tuple) -> dict:
    if len(obs_shape) == 3:
        return {"arch": "nature_cnn", "in_channels": obs_shape[0], "in_size": obs_shape[1], "out": n_actions}
    width = 256 if env.startswith("highway") else 128   # the published highway networks; CartPole's recipe
    return {"arch": "mlp", "in": int(obs_shape[0]), "hidden": [width, width], "out": n_actions}


def gre_phases(env: str, net, m: int, horizon: int, device: str = "cpu", workers: int = 1, sigma: float = 0.01,
               batch: int | None = None):
    """GRe's workflow path (:func:`crop.certify.gre.sample_randomized_returns`) timed by phase: seconds in all
    (``total``), of making the pool (``start``), of each block's seeded resets (``resets``: (seconds,
    trajectories) per block; the first also waits for the workers' start and their environments' making), of
    the lockstep loop (``loop``: the rest until the pool closes) and of closing it (``closing``: stopping the
    workers), the pool's ``slots`` and the ``returns``."""
    import time

    import crop.certify.gre as gre

    marks = {"resets": []}
    make = gre.make_env_pool

    def timed(*a, **k):
        t = time.perf_counter()
        pool = make(*a, **k)
        marks["made"] = time.perf_counter()
        marks["start"], marks["slots"] = marks["made"] - t, pool.num_envs
        reset, close = pool.reset, pool.close

        def timed_reset(*a, **k):
            t = time.perf_counter()
            out = reset(*a, **k)
            marks["resets"].append((time.perf_counter() - t, len(out)))
            return out

        def timed_close():
            marks["end"] = time.perf_counter()
            close()
            marks["closed"] = time.perf_counter()

        pool.reset, pool.close = timed_reset, timed_close
        return pool

    gre.make_env_pool = timed
    try:
        t0 = time.perf_counter()
        returns = gre.sample_randomized_returns(env, net, gre.GReSettings(sigma, m, horizon, 1.0, seed=0, env_seed=0,
                                                                          chunk=1000, device=device, workers=workers,
                                                                          batch=batch), progress=False)
        total = time.perf_counter() - t0
    finally:
        gre.make_env_pool = make
    resets = marks["resets"]
    return {"total": total, "start": marks["start"], "resets": resets,
            "loop": marks["end"] - marks["made"] - sum(s for s, _ in resets), "closing": marks["closed"] - marks["end"],
            "slots": marks["slots"], "returns": returns}


def gre_costs(env: str, net, device: str, image: bool) -> dict:
    """GRe's path on one worker: ``gre_step_s`` per trajectory step (environment, noise, forward: the loop),
    ``gre_reset_s`` per trajectory (its environment's seeded reset, from the second block, whose slots are
    reused) and ``gre_start_s`` per slot of the pool (the rest of the start: an environment made and closed,
    the worker's start shared out), each the least of two runs of short trajectories a random network keeps
    alive to the horizon."""
    gm, gh = (32, 50) if image else ((8, 5) if env.startswith("highway") else (2000, 8))
    runs = [gre_phases(env, net, gm, gh, device, batch=gm // 2) for _ in range(2)]
    reset = min(sum(s for s, _ in r["resets"][1:]) / sum(n for _, n in r["resets"][1:]) for r in runs)
    first = [r["start"] + r["resets"][0][0] - r["resets"][0][1] * reset + r["closing"] for r in runs]
    out = {"gre_step_s": min(r["loop"] for r in runs) / (gm * gh), "gre_reset_s": reset,
           "gre_start_s": min(first) / runs[0]["slots"]}
    if env == "CartPole-v0":
        out["gre_single_process"] = True   # numpy arrays in one process: no workers to spread over
    return out


def _env_costs(env: str, device: str, log) -> dict:
    import pickle

    import numpy as np
    import torch
    import torch.nn.functional as F

    from crop.envs import make_env, snapshot, to_obs
    from crop.models import build_network
    from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings

    e = make_env(env)
    obs, _ = e.reset(seed=0)
    obs = to_obs(obs)
    k, image = int(e.action_space.n), obs.ndim == 3
    net = build_network(_net_spec(env, k, obs.shape)).to(device).eval()
    out = {}

    m = 2000 if image and device == "cpu" else 10000
    sm = SmoothedNetwork(net, SmoothingSettings(0.01, m, -1.0, 1.0, 0.05, chunk=1000, device=device), k)
    out["smooth_sample_s"] = _best(lambda: sm.estimate_batch(obs[None])) / m
    log(f"{env}: smoothed step {out['smooth_sample_s'] * m * 1e3:.1f} ms per state at m = {m}")

    b = 64 if image else 256
    x = torch.as_tensor(np.repeat(obs[None], b, 0), device=device)

    def grad():
        z = x.clone().requires_grad_(True)
        F.cross_entropy(net(z + 0.01 * torch.randn_like(z)), torch.zeros(b, dtype=torch.long, device=device)) \
            .backward()
        if device == "cuda":
            torch.cuda.synchronize()

    out["grad_sample_s"] = _best(grad) / b

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
    log(f"{env}: GRe {1 / out['gre_step_s']:.0f} trajectory steps/s on one core, "
        f"{out['gre_reset_s'] * 1e3:.0f} ms to reset a trajectory's environment, "
        f"{out['gre_start_s'] * 1e3:.0f} ms to make a slot's")

    out.update(train_costs(env, device))
    log(f"{env}: training {1 / out['train_step_s']:.0f} env steps/s, "
        f"a gradient update {out['train_update_s'] * 1e3:.2f} ms")
    return out


def train_costs(env: str, device: str) -> dict:
    """A training's units (:func:`crop.workflow.cost.training_work`) from :func:`crop.train.dqn.train_dqn` with
    the environment's DQN settings (StdTrain's network, batch and replay): ``train_step_s``, an environment step
    with a greedy action (ε = 0) and no update, from runs of n and 3n steps (what a run pays once, making its
    environment and its one-step final evaluation, cancels out); ``train_update_s``, a gradient update of a
    batch every step from the first, over a run of n steps with updates against the one without."""
    from crop.train import dqn_config
    from crop.train.dqn import train_dqn

    n = 100 if env in ("PongNoFrameskip-v4", "FreewayNoFrameskip-v4") else (150 if env.startswith("highway") else 500)

    def train(steps: int, updates: bool) -> float:
        cfg = dqn_config(env, "StdTrain", {"learning_starts": 0 if updates else steps, "train_every": 1,
                                           "buffer_size": 1000, "eps_start": 0.0, "eps_end": 0.0,
                                           "eval_every": 10 * steps, "quick_eval_episodes": 1, "eval_max_steps": 1,
                                           "device": device}, {"total_steps": steps, "target_return": None,
                                                               "eval_episodes": 1})
        t = time.perf_counter()
        train_dqn(env, 0, cfg, progress=False)
        return time.perf_counter() - t

    short, long, learning = train(n, False), train(3 * n, False), train(n, True)
    # Timing noise can leave a difference at nothing: then the longer run's whole time per step (its start
    # included), which errs long, never a free step (a calibration holds no zero: crop.workflow.cost_units).
    step = (long - short) / (2 * n) if long > short else long / (3 * n)
    update = (learning - short) / n if learning > short else learning / n
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
