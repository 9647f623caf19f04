"""Speed of the certification engine (not a test): ``python benchmarks/run.py``.

Prints one line per measure as ``<measure>: <ratio>`` (lines starting with ``#`` give the raw times). The smoothed
step is what LoAct/LoRe do per state at m = 10,000 (fresh noise + forward + clip + mean + bounds,
``SmoothedNetwork.estimate``); the reference is a bare batched forward of the same noisy batch, pre-drawn, in the same
chunks.  Goal ≤ 1.15.  For the Nature-CNN the Gaussian draw itself costs about as much as the forward on a CPU
(``normal_`` is single-threaded), so its floor is forward + noise, printed as a second ratio.  First,
``bound_cost_<name>_ms``: the cost of each confidence bound per state at m samples and |A| = 6 (milliseconds, not a
ratio).

``--device cuda`` prints the GPU lines instead, designed to finish in a few minutes on an
H100/H200: ``smoothing_nature_cnn_vs_randn_plus_cl_forward`` (one smoothed step at m against a bare
``randn`` + channels-last forward of the same m samples; goal ≤ 1.15), ``per_state_<net>_b<B>_vs_b64_floor``
(an MLP's cost per state when B states are smoothed in one ``estimate_batch`` call, against the bare forward
of 64·m pre-drawn samples divided by 64; goal ≤ 1.3 for B ≥ 8), ``smoothing_nature_cnn_vs_randn_plus_its_forward``
(the step against randn + a forward of the network as the engine runs it: space-to-depth input layer),
``speedup_vs_sequential_<net>``, and absolute numbers: ``loact_pong_s_per_state`` (LoAct end to end on Pong,
10 episodes of 100 steps in lockstep, pipelined as on any GPU, env steps included; also
``loact_pong_paper_protocol_s_per_state``, the paper's 10 episodes of H = 500) and ``gre_pong_env_steps_per_s`` (GRe's
lockstep sampler on Pong, one worker per core), the latter
also with :class:`crop.envs.atari.AtariPool` feeding pixels to the GPU (``gre_pong_atari_pool_env_steps_per_s``).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crop.models import build_network  # noqa: E402
from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings  # noqa: E402


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timeit(fns: dict, reps: int) -> dict:
    """Median time of each function, measured interleaved (so drifts of a shared machine hit all alike);
    on CUDA each timing waits for the device (asynchronous launches)."""
    for f in fns.values():
        f()  # warm-up: buffers, allocator, kernel selection
    _sync()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            _sync()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def measure(name: str, spec: dict, obs_shape: tuple, n_actions: int, m: int, chunk: int, reps: int):
    net = build_network(spec).eval()
    x = np.random.default_rng(0).random(obs_shape, dtype=np.float32)
    sm = SmoothedNetwork(net, SmoothingSettings(0.1, m, -10.0, 10.0, 0.05, chunk=chunk, seed=0), n_actions)
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
    # Minor page faults of a step: memory the C heap handed back and takes again (each costs a kernel entry
    # and a zeroed page); the bare forward has none, so any here are step overhead.
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        sm.estimate(x)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 10
    print(f"# {name}: smoothed step {t_step:.4f} s, bare forward {t_fwd:.4f} s, noise alone {t_noise:.4f} s "
          f"(m={m}, chunk={chunk}, threads={torch.get_num_threads()}; {faults:.0f} page faults per step)", flush=True)
    print(f"smoothing_{name}_vs_forward: {t_step / t_fwd:.3f}", flush=True)
    print(f"smoothing_{name}_vs_forward_plus_noise: {t_step / (t_fwd + t_noise):.3f}", flush=True)


def sequential_speedup(name: str, spec: dict, obs_shape: tuple, n_actions: int, m: int, chunk: int, probe: int,
                       device: str = "cpu"):
    """The paper's stated procedure — m sequential single-sample passes per state (the official code) —
    timed on ``probe`` passes and scaled to m, against one batched smoothed step."""
    net = build_network(spec).eval().to(device)
    x = torch.as_tensor(np.random.default_rng(0).random(obs_shape, dtype=np.float32), device=device)
    g = torch.Generator(device=device).manual_seed(2)

    @torch.inference_mode()
    def sequential():
        for _ in range(probe):
            q = net(x + 0.1 * torch.randn((1, *obs_shape), generator=g, device=device))
            q.clamp(-10, 10)

    sm = SmoothedNetwork(net, SmoothingSettings(0.1, m, -10.0, 10.0, 0.05, chunk=chunk, seed=0, device=device),
                         n_actions)
    xn = x.cpu().numpy()
    t = timeit({"seq": sequential, "step": lambda: sm.estimate(xn)}, 9)   # medians of 9: a shared machine drifts
    seq = t["seq"] * m / probe
    print(f"# {name}: sequential m={m} single-sample passes ≈ {seq:.3f} s, batched smoothed step {t['step']:.4f} s",
          flush=True)
    print(f"speedup_vs_sequential_{name}: {seq / t['step']:.1f}", flush=True)


def gre_lockstep(name: str, env_id: str, spec: dict, m: int, horizon: int, single: int):
    """GRe's m trajectories in lockstep (one batched forward per step) vs one trajectory at a time."""
    from crop.certify.gre import GReSettings, sample_randomized_returns
    from crop.envs import make_env, to_obs

    net = build_network(spec).eval()
    t0 = time.perf_counter()
    sample_randomized_returns(env_id, net, GReSettings(0.1, m, horizon, 1.0, seed=0, env_seed=0), progress=False)
    t_lock = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(single):
            env = make_env(env_id)
            obs, _ = env.reset(seed=i)
            for _ in range(horizon):
                x = torch.as_tensor(to_obs(obs)).unsqueeze(0)
                a = int(net(x + 0.1 * torch.randn(x.shape, generator=g)).argmax(1))
                obs, r, term, trunc, _ = env.step(a)
                if term or trunc:
                    break
    t_one = (time.perf_counter() - t0) * m / single
    print(f"# GRe {name}: m={m}, H={horizon}: lockstep {t_lock:.2f} s, one at a time ≈ {t_one:.2f} s "
          f"(timed on {single} trajectories)", flush=True)
    print(f"gre_lockstep_speedup_{name}: {t_one / t_lock:.1f}", flush=True)


def lore_rate(name: str, env_id: str, spec: dict, profile, m: int, horizon: int, sigma: float):
    """Nodes per second of LoRe's search (every distinct state smoothed once)."""
    from crop.certify.lore import LoReSettings, Problem, Search, run_lore

    net = build_network(spec).eval()
    sm = SmoothedNetwork(net, SmoothingSettings(sigma, m, -1.0, 1.0, 0.05, chunk=min(m, 1000), seed=0), spec["out"])
    t0 = time.perf_counter()
    info = run_lore(env_id, sm, LoReSettings(Problem(horizon, 0), Search(eps_max=4 * sigma)), profile=profile,
                    progress=False).info
    dt = time.perf_counter() - t0
    print(f"# LoRe {name}: {info['transitions']} transitions, {info['distinct_states_smoothed']} states smoothed "
          f"(m={m}) in {dt:.2f} s", flush=True)
    print(f"lore_nodes_per_s_{name}: {info['transitions'] / dt:.1f}", flush=True)
    return dt / max(info["transitions"], 1), info


def _device_name(device) -> str:
    return torch.cuda.get_device_name() if torch.device(device).type == "cuda" else "cpu"


def measure_cuda_cnn(m: int, reps: int, device="cuda") -> None:
    """CUDA: one smoothed Nature-CNN step vs its floor, randn + a channels-last forward of the same m samples."""
    import copy

    dev = torch.device(device)
    shape = (4, 84, 84)
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval()
    net_cl = copy.deepcopy(net).to(dev, memory_format=torch.channels_last)
    net_contiguous = copy.deepcopy(net).to(dev)
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    xt = torch.as_tensor(x, device=dev)
    sm = SmoothedNetwork(net, SmoothingSettings(0.1, m, -10.0, 10.0, 0.05, seed=0, device=dev), 6)
    g = torch.Generator(device=dev).manual_seed(1)
    buf = torch.empty((m, *shape), device=dev, memory_format=torch.channels_last)
    fixed = (torch.randn((m, *shape), generator=g, device=dev) * 0.1 + xt).contiguous(
        memory_format=torch.channels_last)
    contiguous = fixed.contiguous()

    @torch.inference_mode()
    def floor():
        buf.normal_(generator=g)
        net_cl(buf.mul_(0.1).add_(xt))

    @torch.inference_mode()
    def fwd_cl():
        net_cl(fixed)

    @torch.inference_mode()
    def fwd_contiguous():
        net_contiguous(contiguous)

    @torch.inference_mode()
    def noise():
        buf.normal_(generator=g)

    from crop.models.s2d import space_to_depth_input

    s2d = {}
    for inner in (False, True):   # the engine's input layer in space-to-depth (and optionally the later convs)
        net_s, k = space_to_depth_input(net, shape, inner=inner)
        net_s = net_s.to(dev, memory_format=torch.channels_last)
        xs = torch.nn.functional.pixel_unshuffle(fixed.contiguous(), k).contiguous(memory_format=torch.channels_last)
        s2d[inner] = (net_s, xs)

    @torch.inference_mode()
    def fwd_s2d():
        s2d[False][0](s2d[False][1])

    @torch.inference_mode()
    def fwd_s2d_inner():
        s2d[True][0](s2d[True][1])

    t = timeit({"step": lambda: sm.estimate(x), "floor": floor, "fwd_cl": fwd_cl, "noise": noise, "s2d": fwd_s2d,
                "s2d_inner": fwd_s2d_inner}, reps)
    t_contig = timeit({"c": fwd_contiguous}, reps)["c"]
    print(f"# nature_cnn on {_device_name(dev)}: smoothed step {t['step'] * 1e3:.2f} ms, randn + "
          f"channels-last forward {t['floor'] * 1e3:.2f} ms (randn {t['noise'] * 1e3:.2f} ms, channels-last forward "
          f"{t['fwd_cl'] * 1e3:.2f} ms, contiguous forward {t_contig * 1e3:.2f} ms; space-to-depth input layer "
          f"{t['s2d'] * 1e3:.2f} ms, all strided layers {t['s2d_inner'] * 1e3:.2f} ms; m={m}, block {sm.engine.chunk} "
          f"samples, channels_last={sm.engine.channels_last}, space-to-depth factor {sm.engine._s2d})", flush=True)
    print(f"smoothing_nature_cnn_vs_randn_plus_cl_forward: {t['step'] / t['floor']:.3f}", flush=True)
    engine = t["s2d_inner"] if sm.engine.S2D_INNER else t["s2d"]
    print(f"smoothing_nature_cnn_vs_randn_plus_its_forward: {t['step'] / (t['noise'] + engine):.3f}", flush=True)


def measure_cuda_batches(name: str, spec: dict, obs_shape: tuple, n_actions: int, m: int, reps: int,
                         device="cuda") -> None:
    """CUDA: an MLP's cost per state at B = 1, 8, 64 states per ``estimate_batch`` call, against the floor:
    a bare forward of 64·m pre-drawn samples in one launch, per state."""
    dev = torch.device(device)
    net = build_network(spec).eval().to(dev)
    rng = np.random.default_rng(0)
    g = torch.Generator(device=dev).manual_seed(1)
    pre = torch.randn((64 * m, *obs_shape), generator=g, device=dev)

    @torch.inference_mode()
    def bare():
        net(pre)

    fns = {"bare": bare}
    sms = {}
    for b in (1, 8, 64):
        sms[b] = SmoothedNetwork(net, SmoothingSettings(0.1, m, -10.0, 10.0, 0.05, seed=b, device=dev), n_actions)
        xs = rng.random((b, *obs_shape), dtype=np.float32)
        fns[b] = (lambda sm=sms[b], xs=xs: sm.estimate_batch(xs))
        fns[f"bare{b}"] = (lambda b=b: net(pre[:b * m]))
    eager = SmoothedNetwork(net, SmoothingSettings(0.1, m, -10.0, 10.0, 0.05, seed=8, device=dev), n_actions)
    eager.engine.cuda_graphs = False
    x8 = rng.random((8, *obs_shape), dtype=np.float32)
    fns["eager8"] = lambda: eager.estimate_batch(x8)
    with torch.inference_mode():
        t = timeit(fns, reps)
    floor = t["bare"] / 64
    print(f"# {name} on {_device_name(dev)}: floor {floor * 1e3:.4f} ms/state (64·m={64 * m} samples in one launch); "
          f"per state at B=1, 8, 64: " + ", ".join(f"{t[b] / b * 1e3:.4f} ms" for b in (1, 8, 64)) +
          "; a bare forward of B·m samples alone: " +
          ", ".join(f"{t[f'bare{b}'] / b / floor:.2f}x" for b in (1, 8, 64)) +
          f"; B=8 without CUDA graphs: {t['eager8'] / 8 / floor:.2f}x", flush=True)
    for b in (1, 8, 64):
        print(f"per_state_{name}_b{b}_vs_b64_floor: {t[b] / b / floor:.3f}", flush=True)


def loact_pong(m: int, episodes: int, horizon: int, device: str, paper_horizon: int = 0) -> None:
    """LoAct end to end on Pong (cleanrl profile, an untrained Nature CNN): seconds per certified state, at
    ``horizon`` with and without the pipeline, and (``paper_horizon``) as the paper runs it."""
    from crop.certify.loact import LoActSettings, run_loact

    torch.manual_seed(0)
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval()
    sm = SmoothedNetwork(net, SmoothingSettings(0.1, m, -10.0, 10.0, 0.05, seed=0, device=device), 6)
    # warm-up: buffers, cuDNN selection
    run_loact("PongNoFrameskip-v4", sm, LoActSettings(2, 3, [0, 1]), progress=False)
    for pipeline in (False, True):
        _sync()
        t0 = time.perf_counter()
        steps, _ = run_loact("PongNoFrameskip-v4", sm, LoActSettings(episodes, horizon, list(range(episodes)),
                                                                     pipeline=pipeline), progress=False)
        _sync()
        dt = time.perf_counter() - t0
        how = "two halves pipelined with the environments" if pipeline else "one lockstep call per step"
        print(f"# LoAct Pong: {len(steps)} states ({episodes} episodes in lockstep, {how}, H={horizon}, m={m}) "
              f"in {dt:.1f} s: {dt / len(steps) * 1e3:.2f} ms/state", flush=True)
    from crop.envs import make_env

    t0 = time.perf_counter()
    for ep in range(episodes):
        make_env("PongNoFrameskip-v4", "cleanrl").reset(seed=ep)
    made = time.perf_counter() - t0
    print(f"# of which making and resetting the {episodes} environments (sequential, before any smoothing): "
          f"{made:.2f} s = {made / len(steps) * 1e3:.2f} ms/state", flush=True)
    print(f"loact_pong_s_per_state: {dt / len(steps):.4f}", flush=True)
    if paper_horizon:   # the paper's Atari protocol (Appendix E: 10 episodes, H = 500), pipelined
        _sync()
        t0 = time.perf_counter()
        steps, _ = run_loact("PongNoFrameskip-v4", sm, LoActSettings(episodes, paper_horizon, list(range(episodes))),
                             progress=False)
        _sync()
        dt = time.perf_counter() - t0
        print(f"# LoAct Pong, paper protocol: {len(steps)} states ({episodes} episodes, H={paper_horizon}, m={m}) in "
              f"{dt:.1f} s, environments made and reset included", flush=True)
        print(f"loact_pong_paper_protocol_s_per_state: {dt / len(steps):.4f}", flush=True)


def gre_pong(m: int, horizon: int, device: str, workers: int) -> None:
    """GRe's sampler on Pong: env steps per second, as crop.certify.gre runs it and with AtariPool feeding pixels."""
    from crop.certify.gre import GReSettings, sample_randomized_returns
    from crop.envs.atari import AtariPool

    torch.manual_seed(0)
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval().to(device)
    t0 = time.perf_counter()
    sample_randomized_returns("PongNoFrameskip-v4", net, GReSettings(0.1, m, horizon, 1.0, seed=0, env_seed=0,
                                                                     device=device, workers=workers), progress=False)
    dt = time.perf_counter() - t0
    print(f"# GRe Pong (certify.gre): m={m}, H={horizon}, {workers} workers: {dt:.1f} s, resets included", flush=True)
    print(f"gre_pong_env_steps_per_s: {m * horizon / dt:.0f}", flush=True)

    pool = AtariPool("PongNoFrameskip-v4", m, workers=workers, profile="cleanrl")
    g = torch.Generator(device=device).manual_seed(0)
    with torch.inference_mode():
        pix = torch.as_tensor(pool.reset(0, pixels=True), device=device)
        alive = np.ones(m, bool)
        t0 = time.perf_counter()
        for _ in range(horizon):
            idx = np.nonzero(alive)[0]
            if not idx.size:
                break
            it = torch.as_tensor(idx, device=device)
            x = pix[it].float().mul_(pool.scale)
            a = net(torch.randn(x.shape, generator=g, device=device).mul_(0.1).add_(x)).argmax(1)
            o, r, te, tr = pool.step(idx, a.cpu().numpy(), pixels=True)
            pix[it] = torch.as_tensor(o, device=device)
            alive[idx] &= ~(te | tr)
        dt = time.perf_counter() - t0
    pool.close()
    print(f"# GRe-style loop on AtariPool (pixels to the device): m={m}, H={horizon}, {workers} workers: {dt:.1f} s, "
          "resets excluded", flush=True)
    print(f"gre_pong_atari_pool_env_steps_per_s: {m * horizon / dt:.0f}", flush=True)


def main_cuda(a) -> None:
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible to torch")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {os.cpu_count()} CPU cores", flush=True)
    if not a.skip_cnn:
        measure_cuda_cnn(a.m, 20)
    mlps = [("cartpole_mlp", {"arch": "mlp", "in": 4, "hidden": [128, 128], "out": 2}, (4,), 2),
            ("highway_mlp", {"arch": "mlp", "in": 25, "hidden": [256, 256], "out": 5}, (25,), 5)]
    for name, spec, shape, n in mlps:
        measure_cuda_batches(name, spec, shape, n, a.m, 20)
    for name, spec, shape, n in mlps:
        sequential_speedup(name, spec, shape, n, a.m, 1000, 2000, device="cuda")
    if not a.skip_cnn:
        sequential_speedup("nature_cnn", {"arch": "nature_cnn", "in_channels": 4, "out": 6}, (4, 84, 84), 6, a.m, 250,
                           300, device="cuda")
        loact_pong(a.m, 10, 100, "cuda", paper_horizon=500)
        gre_pong(256, 100, "cuda", max(1, (os.cpu_count() or 2) - 1))


def measure_bounds(m: int, n_actions: int, reps: int) -> None:
    """Cost of each confidence bound of ``SmoothedNetwork`` per state (the bound alone, given the m × |A| clipped
    samples that the smoothing produced), in milliseconds: ``bound_cost_<name>_ms``."""
    from crop.smoothing.smoothed import BOUNDS
    from crop.smoothing.stats import per_bound_alpha

    torch.manual_seed(0)
    net = build_network({"arch": "mlp", "in": 4, "hidden": [128, 128], "out": n_actions}).eval()
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
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the GPU lines (see the module docstring) instead of the CPU ones")
    a = ap.parse_args()
    if a.device == "cuda":
        main_cuda(a)
        return
    measure_bounds(a.m, 6, a.reps)
    if a.bounds_only:
        return
    measure("cartpole_mlp", {"arch": "mlp", "in": 4, "hidden": [128, 128], "out": 2}, (4,), 2, a.m, 1000, a.reps)
    measure("highway_mlp", {"arch": "mlp", "in": 25, "hidden": [256, 256], "out": 5}, (25,), 5, a.m, 1000, a.reps)
    cnn = {"arch": "nature_cnn", "in_channels": 4, "out": 6}
    if not a.skip_cnn:
        measure("nature_cnn", cnn, (4, 84, 84), 6, a.m, 250, max(3, a.reps // 10))
    sequential_speedup("cartpole_mlp", {"arch": "mlp", "in": 4, "hidden": [128, 128], "out": 2}, (4,), 2, a.m,
                       1000, 2000)
    sequential_speedup("highway_mlp", {"arch": "mlp", "in": 25, "hidden": [256, 256], "out": 5}, (25,), 5, a.m,
                       1000, 2000)
    if not a.skip_cnn:
        sequential_speedup("nature_cnn", cnn, (4, 84, 84), 6, a.m, 250, 300)
    gre_lockstep("cartpole", "CartPole-v0", {"arch": "mlp", "in": 4, "hidden": [128, 128], "out": 2}, 10000, 200, 50)
    gre_lockstep("highway", "highway-fast-v0", {"arch": "mlp", "in": 25, "hidden": [256, 256], "out": 5}, 50, 10, 10)
    lore_rate("cartpole", "CartPole-v0", {"arch": "mlp", "in": 4, "hidden": [128, 128], "out": 2}, None, a.m, 10, 0.5)
    if not a.skip_cnn:
        # Freeway's paper protocol (H = 200, m = 10,000): per-node cost = Atari step + snapshot (measured here
        # with a small m) + one smoothed step; on a GPU the smoothed step is the CNN's forward at m = 10,000
        # scaled by the GPU/CPU throughput ratio (FLOP rates; no GPU was lent to measure it directly).
        per_node, _ = lore_rate("freeway_small_m", "FreewayNoFrameskip-v4", dict(cnn, out=3), "cleanrl", 16, 6, 0.5)
        flops = 19.3e6 * a.m                      # Nature-CNN forward ≈ 19.3 MFLOP per 4×84×84 sample
        gpu_flops = float(os.environ.get("CROP_GPU_TFLOPS", "20")) * 1e12  # sustained fp32, H100-class
        gpu_step = flops / gpu_flops
        node = per_node + gpu_step
        print(f"# Freeway LoRe estimate: env+search {per_node * 1e3:.2f} ms/node + GPU smoothing {gpu_step * 1e3:.1f} "
              f"ms/state (m={a.m}, {gpu_flops / 1e12:.0f} TFLOP/s assumed) → {3600 / node:.0f} nodes per GPU-hour",
              flush=True)
        print(f"lore_freeway_nodes_per_gpu_hour_estimate: {3600 / node:.0f}", flush=True)


if __name__ == "__main__":
    main()
