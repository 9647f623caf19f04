"""GRe at the simulator's speed: GRe's trajectory steps per core beside a plain loop of the same environment, and
what a trajectory's start costs.

    python benchmarks/gre_reuse.py [--envs CartPole-v0 highway-fast-v0 PongNoFrameskip-v4 FreewayNoFrameskip-v4]

Per environment (its default profile) one line:

* ``plain``: one environment stepped with random actions (a seeded generator), its steps per second of wall
  time and per CPU-second (resets excluded: the simulator's own rate);
* ``gre``: :func:`crop.certify.gre.sample_randomized_returns` with one worker, blocks of ``batch`` trajectories (the
  architecture the environment's policies have, random weights, σ = 0.1): trajectory steps per CPU-second of
  the main process and its workers together (``per_core``, start included) and of the lockstep loop alone
  (``loop``: a second run of twice the horizon, differenced); ``vs_plain`` gives both over the plain loop's
  steps per CPU-second;
* ``setup_ms``: per trajectory, the pool's start (worker processes, environments made), the seeded resets and
  closing the pool, in wall milliseconds, and of it the resets of the blocks after the first (``later
  blocks' resets``: what a trajectory's start costs once the workers run, i.e. at the paper's m of many
  blocks); ``returns`` a digest of the returns (equal digests: byte-identical returns, e.g. before and after
  a change).

``--tiny`` replaces the network by one linear layer: the pool path's own cost beside the simulator's.

Run it from another source tree with ``PYTHONPATH=TREE`` (its ``crop`` is imported) to compare releases.  A
measurement on a shared machine: note the load (``uptime``) beside it.
"""
from __future__ import annotations

import argparse
import hashlib
import resource
import time

import numpy as np
import torch

SIZES = {  # m, batch, horizon: small, several blocks
    "CartPole-v0": (2000, 500, 200),
    "highway-fast-v0": (8, 4, 10),
    "PongNoFrameskip-v4": (16, 8, 100),
    "FreewayNoFrameskip-v4": (16, 8, 100),
}


def _cpu() -> float:
    """CPU seconds of this process and its ended children (GRe's workers are joined when its pool closes)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def plain(env_id: str, steps: int) -> tuple[float, float]:
    """(steps per wall second, per CPU-second) of one environment under random actions, resets excluded."""
    from crop.envs import make_env

    env = make_env(env_id)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    wall = cpu = 0.0
    for k in range(steps):
        a = int(rng.integers(env.action_space.n))
        t, c = time.perf_counter(), time.process_time()
        _, _, term, trunc, _ = env.step(a)
        wall, cpu = wall + time.perf_counter() - t, cpu + time.process_time() - c
        if term or trunc:
            env.reset(seed=k + 1)
    env.close()
    return steps / wall, steps / cpu


def _network(env_id: str, tiny: bool):
    """The architecture ``env_id``'s policies have (random weights), or with ``tiny`` one linear layer (the
    pool path's own cost, nearly without a forward)."""
    from crop.envs import env_shapes
    from crop.models import build_network

    n, shape = env_shapes(env_id)
    torch.manual_seed(0)
    if tiny:
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(shape)), n)).eval()
    spec = ({"arch": "nature_cnn", "in_channels": shape[0], "out": n} if len(shape) == 3 else
            {"arch": "mlp", "in": shape[0], "hidden": [256 if env_id.startswith("highway") else 128] * 2, "out": n})
    return build_network(spec).eval()


def gre(env_id: str, m: int, batch: int, horizon: int, tiny: bool = False) -> dict:
    """GRe's workflow path on one worker, timed by phase through the pools it makes."""
    import crop.certify.gre as g

    net = _network(env_id, tiny)
    t = {"start": 0.0, "resets": [], "closing": 0.0, "steps": 0, "pools": 0}
    make = g.make_env_pool

    def timed(*a, **k):
        t0 = time.perf_counter()
        pool = make(*a, **k)
        t["start"] += time.perf_counter() - t0
        t["pools"] += 1
        reset, step, close = pool.reset, pool.step, pool.close

        def timed_reset(*a, **k):
            t0 = time.perf_counter()
            out = reset(*a, **k)
            t["resets"].append((time.perf_counter() - t0, len(out)))
            return out

        def counted_step(idx, *a, **k):
            t["steps"] += len(idx)
            return step(idx, *a, **k)

        def counted_start(idx, *a, **k):
            t["steps"] += len(idx)
            return start(idx, *a, **k)

        def timed_close():
            t0 = time.perf_counter()
            close()
            t["closing"] += time.perf_counter() - t0

        pool.reset, pool.close = timed_reset, timed_close
        start = getattr(pool, "step_async", None)   # a pool's step goes through it where it has one
        if start is None:
            pool.step = counted_step
        else:
            pool.step_async = counted_start
        return pool

    g.make_env_pool = timed
    try:
        w0, c0 = time.perf_counter(), _cpu()
        returns = g.sample_randomized_returns(env_id, net, g.GReSettings(0.1, m, horizon, 1.0, seed=0, env_seed=0,
                                                                         batch=batch, workers=1), progress=False)
        wall, cpu = time.perf_counter() - w0, _cpu() - c0
    finally:
        g.make_env_pool = make
    resets = sum(r for r, _ in t["resets"])
    setup = t["start"] + resets + t["closing"]
    later = t["resets"][1:]   # the first block's reset waits for the worker's start and its environments' making
    return {"cpu": cpu, "per_core": t["steps"] / cpu, "loop_wall": t["steps"] / max(wall - setup, 1e-9), "wall": wall,
            "setup_ms": 1e3 * setup / m, "later_ms": 1e3 * sum(r for r, _ in later) / max(1, sum(n for _, n in later)),
            "pools": t["pools"], "steps": t["steps"],
            "returns": hashlib.sha256(np.asarray(returns, np.float64).tobytes()).hexdigest()[:12]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=list(SIZES))
    ap.add_argument("--tiny", action="store_true", help="one linear layer instead of the policies' architecture")
    ap.add_argument("--size", nargs=3, type=int, metavar=("M", "BATCH", "H"), help="instead of each env's own")
    a = ap.parse_args()
    torch.set_num_threads(1)
    import crop

    print(f"# crop from {crop.__file__}; GRe with 1 worker, torch threads 1{', tiny network' if a.tiny else ''}",
          flush=True)
    for env_id in a.envs:
        m, batch, horizon = a.size or SIZES[env_id]
        r = gre(env_id, m, batch, horizon, a.tiny)
        wall_rate, cpu_rate = plain(env_id, min(r["steps"], 2000))
        # the loop per core: a second run of twice the horizon, differenced (the same start, the same resets)
        r2 = gre(env_id, m, batch, 2 * horizon, a.tiny)
        loop_core = (r2["steps"] - r["steps"]) / max(r2["cpu"] - r["cpu"], 1e-9) or float("nan")   # nan: all ended
        print(f"{env_id}: m={m} batch={batch} H={horizon} ({r['pools']} pools, {r['steps']} steps, {r['wall']:.1f} s) "
              f"plain {cpu_rate:.0f} steps/CPU-s ({wall_rate:.0f}/s wall); gre per_core {r['per_core']:.0f} "
              f"steps/CPU-s, loop {loop_core:.0f} steps/CPU-s ({r['loop_wall']:.0f}/s wall); vs_plain "
              f"{r['per_core'] / cpu_rate:.2f}, loop {loop_core / cpu_rate:.2f}; setup_ms "
              f"{r['setup_ms']:.1f} (later blocks' resets {r['later_ms']:.1f}); returns {r['returns']}",
              flush=True)


if __name__ == "__main__":
    main()
