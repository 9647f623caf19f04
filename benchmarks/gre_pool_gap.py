"""GRe on Atari as the workflow runs it (:func:`crop.certify.gre.sample_randomized_returns`) against the bare
:class:`crop.envs.atari.AtariPool` loop with the same envs and workers, phase by phase: the pool's start
(worker processes, each environment made and reset) and the lockstep loop.  A random-init Nature CNN (the
cost does not depend on the weights), torch threads 1, the device's forward in the main process.

    python benchmarks/gre_pool_gap.py [--env PongNoFrameskip-v4] [--m 64] [--horizon 100] [--workers 2]
                                      [--repeats 3] [--save RETURNS.npy | --compare RETURNS.npy]

The two paths alternate, ``--repeats`` times back to back, and the best of each is reported (on a shared
machine the best is the least disturbed).  ``--save``/``--compare`` write or check the workflow path's
returns byte for byte (a seed's results before and after a change).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def bare(env, net, m, horizon, workers):
    """(seconds in all, of the loop, of closing the pool) of the AtariPool loop: one noise draw for all envs per
    step."""
    from crop.envs.atari import AtariPool

    t0 = time.perf_counter()
    pool = AtariPool(env, m, workers=workers, profile="cleanrl")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        x = torch.as_tensor(pool.reset(0))
        t1 = time.perf_counter()
        alive = np.ones(m, bool)
        for _ in range(horizon):
            idx = np.nonzero(alive)[0]
            if not idx.size:
                break
            a = net(torch.randn(x[idx].shape, generator=g).mul_(0.1).add_(x[idx])).argmax(1)
            o, _, te, tr = pool.step(idx, a.numpy())
            x[idx] = torch.as_tensor(o)
            alive[idx] &= ~(te | tr)
        t2 = time.perf_counter()
    pool.close()
    t3 = time.perf_counter()
    return t3 - t0, t2 - t1, t3 - t2


def main():
    from crop.models import build_network
    from crop.workflow.calibrate import gre_phases

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="PongNoFrameskip-v4")
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--horizon", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--save")
    ap.add_argument("--compare")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval()
    w_runs, b_runs, returns = [], [], None
    for _ in range(a.repeats):
        r = gre_phases(a.env, net, a.m, a.horizon, "cpu", a.workers, sigma=0.1)
        w_runs.append((r["total"], r["loop"], r["closing"]))
        returns = r["returns"]
        b_runs.append(bare(a.env, net, a.m, a.horizon, a.workers))
    steps = a.m * a.horizon
    (wt, wl, wc), (bt, bl, bc) = min(w_runs, key=lambda r: r[1]), min(b_runs, key=lambda r: r[1])
    import crop

    print(f"# crop from {crop.__file__}; {a.env}: m = {a.m}, H = {a.horizon}, {a.workers} workers, {a.threads} torch "
          f"threads, best of {a.repeats} (by the loop)")
    for name, (t, loop, close) in (("workflow", (wt, wl, wc)), ("bare AtariPool", (bt, bl, bc))):
        print(f"{name}: {t:.2f} s in all: start {t - loop - close:.2f} s, loop {loop:.2f} s = {steps / loop:.0f} "
              f"steps/s, closing {close:.2f} s")
    print(f"loop ratio workflow / bare: {wl / bl:.2f}")
    if a.save:
        np.save(a.save, returns)
    if a.compare:
        same = np.load(a.compare).tobytes() == returns.tobytes()
        print(f"returns byte-identical to {a.compare}: {same}")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
