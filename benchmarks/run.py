"""Speed of the smoothing engine (not a test): ``python benchmarks/run.py``.

Prints one line per measure as ``<measure>: <ratio>``.  The smoothed step is what LoAct/LoRe do per
state at m = 10,000 (fresh noise + forward + clip + mean + bounds, ``SmoothedQ.estimate``); the reference
is a bare batched forward of the same noisy batch, pre-drawn, in the same chunks.  Goal ≤ 1.15.  For the
Nature-CNN the Gaussian draw itself costs about as much as the forward on a CPU (``normal_`` is
single-threaded), so its floor is forward + noise, printed as a second ratio.  First, ``bound_cost_<name>_ms``:
the cost of each confidence bound per state at m samples and |A| = 6 (milliseconds, not a ratio).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crop.models import build_q_network  # noqa: E402
from crop.smoothing import SmoothedQ  # noqa: E402


def timeit(fns: dict, reps: int) -> dict:
    """Median time of each function, measured interleaved (so drifts of a shared machine hit all alike)."""
    for f in fns.values():
        f()  # warm-up: buffers, allocator, kernel selection
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def measure(name: str, spec: dict, obs_shape: tuple, n_actions: int, m: int, chunk: int, reps: int):
    net = build_q_network(spec).eval()
    x = np.random.default_rng(0).random(obs_shape, dtype=np.float32)
    sm = SmoothedQ(net, 0.1, m, -10.0, 10.0, 0.05, n_actions, chunk=chunk, seed=0)
    g = torch.Generator().manual_seed(1)
    xt = torch.as_tensor(x)
    chunks = [torch.randn((min(chunk, m - s), *obs_shape), generator=g) * 0.1 + xt for s in range(0, m, chunk)]

    @torch.inference_mode()
    def bare():
        for c in chunks:
            net(c)

    @torch.inference_mode()
    def noise_only():
        buf = torch.empty((chunk, *obs_shape))
        for s in range(0, m, chunk):
            torch.randn(buf[: min(chunk, m - s)].shape, generator=g, out=buf[: min(chunk, m - s)])

    t = timeit({"step": lambda: sm.estimate(x), "fwd": bare, "noise": noise_only}, reps)
    t_step, t_fwd, t_noise = t["step"], t["fwd"], t["noise"]
    print(f"# {name}: smoothed step {t_step:.4f} s, bare forward {t_fwd:.4f} s, noise alone {t_noise:.4f} s "
          f"(m={m}, chunk={chunk}, threads={torch.get_num_threads()})", flush=True)
    print(f"smoothing_{name}_vs_forward: {t_step / t_fwd:.3f}", flush=True)
    print(f"smoothing_{name}_vs_forward_plus_noise: {t_step / (t_fwd + t_noise):.3f}", flush=True)


def measure_bounds(m: int, n_actions: int, reps: int) -> None:
    """Cost of each confidence bound of ``SmoothedQ`` per state (the bound alone, given the m × |A| clipped
    samples that the smoothing produced), in milliseconds: ``bound_cost_<name>_ms``."""
    from crop.smoothing import BOUNDS
    from crop.stats import per_bound_alpha

    torch.manual_seed(0)
    net = build_q_network({"arch": "mlp", "in": 4, "hidden": [128, 128], "out": n_actions}).eval()
    with torch.inference_mode():
        q = net(0.1 * torch.randn(m, 4)).double().numpy()
    lo, hi = float(q.min()) - 0.5, float(q.max()) + 0.5
    total, alpha_each = q.sum(0), per_bound_alpha(0.05, n_actions)
    rng = np.random.default_rng(0)
    fns = {name: (lambda fn=fn: fn(total, m, lo, hi, alpha_each, q, rng=rng)) for name, (fn, _) in BOUNDS.items()}
    t = timeit(fns, reps)
    print(f"# confidence bounds alone, m={m}, |A|={n_actions} (compare: the CartPole MLP forward of m samples)",
          flush=True)
    for name, sec in t.items():
        print(f"bound_cost_{name}_ms: {1e3 * sec:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--skip-cnn", action="store_true")
    ap.add_argument("--bounds-only", action="store_true", help="only the bound_cost_* lines")
    a = ap.parse_args()
    measure_bounds(a.m, 6, a.reps)
    if a.bounds_only:
        return
    measure("cartpole_mlp", {"arch": "mlp", "in": 4, "hidden": [128, 128], "out": 2}, (4,), 2, a.m, 1000, a.reps)
    measure("highway_mlp", {"arch": "mlp", "in": 25, "hidden": [256, 256], "out": 5}, (25,), 5, a.m, 1000, a.reps)
    if not a.skip_cnn:
        measure("nature_cnn", {"arch": "nature_cnn", "in_channels": 4, "out": 6}, (4, 84, 84), 6, a.m, 250,
                max(3, a.reps // 10))


if __name__ == "__main__":
    main()
