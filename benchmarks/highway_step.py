"""highway-fast-v0's step, stock highway-env against crop's (crop/envs/highway.py), in the same run.

Two lines per path, measured in CPU seconds of this process (steps per second per core, whatever else the
machine runs):

* ``plain``: one environment, seeded resets, ``--steps`` steps of seeded random actions, reset at episode ends;
* ``GRe``: :func:`crop.certify.gre.sample_randomized_returns` (a random-init 25-64-5 MLP, σ = 0.1, ``--m``
  trajectories of ``--horizon`` steps, one worker), counted in trajectory steps actually taken.

    python benchmarks/highway_step.py [--steps 300] [--m 16] [--horizon 30] [--repeats 2] [--profile]

The two paths alternate ``--repeats`` times; the best of each is reported.  GRe's returns are checked equal
byte for byte between the two paths.  ``--profile`` prints the top of a cProfile of each plain loop.

Measured with the defaults on a shared 2-core machine (load average 3.9): stock 59.5 plain steps and 60.5 GRe
trajectory steps per CPU second, crop 87.3 and 85.4 (1.47× and 1.41×), GRe's returns byte-identical.  Of that,
one observation takes 0.26 ms instead of 3.0 ms, one ``neighbour_vehicles`` 31 µs instead of 39 µs (21 vehicles).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import time
import warnings

import numpy as np
import torch

from crop.envs import highway


@contextlib.contextmanager
def stock_highway():
    """crop's environments with the stock highway-env classes (speed_up leaves them unchanged)."""
    saved = dict(highway._FAST)
    highway._FAST.clear()
    try:
        yield
    finally:
        highway._FAST.update(saved)


def plain(steps: int) -> float:
    from crop.envs import make_env

    env = make_env("highway-fast-v0")
    rng = np.random.default_rng(0)
    t0 = time.process_time()
    env.reset(seed=0)
    for t in range(steps):
        _, _, term, trunc, _ = env.step(int(rng.integers(5)))
        if term or trunc:
            env.reset(seed=t + 1)
    return steps / (time.process_time() - t0)


def gre(m: int, horizon: int) -> tuple[float, bytes]:
    from crop.certify.gre import GReSettings, sample_randomized_returns
    from crop.envs import vector

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(25, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    steps, step = [0], vector._step

    def counted(envs, local_idx, actions):  # one worker: the pool steps its environments in this process
        steps[0] += len(local_idx)
        return step(envs, local_idx, actions)

    vector._step = counted
    try:
        t0 = time.process_time()
        returns = sample_randomized_returns("highway-fast-v0", net,
                                            GReSettings(0.1, m, horizon, 1.0, seed=1, env_seed=0), progress=False)
        seconds = time.process_time() - t0
    finally:
        vector._step = step
    return steps[0] / seconds, returns.tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--horizon", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    best = {}
    for _ in range(args.repeats):
        for name, ctx in (("stock", stock_highway), ("crop", contextlib.nullcontext)):
            with ctx():
                p = plain(args.steps)
                g, r = gre(args.m, args.horizon)
            old = best.get(name, (0.0, 0.0, r))
            best[name] = (max(old[0], p), max(old[1], g), r)
    print(f"load average {os.getloadavg()[0]:.2f}; steps per CPU second, best of {args.repeats}")
    for name in ("stock", "crop"):
        print(f"{name:6s} plain {best[name][0]:8.1f}   GRe trajectory steps {best[name][1]:8.1f}")
    print(f"ratio  plain {best['crop'][0] / best['stock'][0]:8.2f}x  GRe {best['crop'][1] / best['stock'][1]:8.2f}x   "
          f"GRe returns byte-identical: {best['crop'][2] == best['stock'][2]}")
    if args.profile:
        for name, ctx in (("stock", stock_highway), ("crop", contextlib.nullcontext)):
            with ctx():
                prof = cProfile.Profile()
                prof.runcall(plain, args.steps)
            print(f"--- {name}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
