"""Estimation of V_min, V_max (Appendix B.1, "Estimation of the Algorithm Parameters V_min, V_max").

The paper: "sampling the trajectories and calculating the Q values associated with the state-action pairs
along these trajectories".  We roll the smoothed policy (argmax of the *unclipped* Monte-Carlo mean of
Q(s + Δ), m samples per state, as the authors' code does) for a few episodes and read the range off the
Q-values met on the way, by one of three methods:

* ``smoothed`` (the paper's, the default): min/max of the smoothed Q̃(s, a) = mean_i Q(s + Δ_i, a) over all
  actions a and visited states s — the values the certifiers actually average, so the clip is tight.
* ``samples``: min/max of every single noisy output Q(s + Δ_i, a) — the widest range, so clipping never
  changes a sample on the visited states, but on CROP's highway network 10–40× wider than ``smoothed``,
  and a wide range shrinks every radius (r scales with Φ⁻¹ of Q̃ rescaled to [0, 1]).
* ``quantile``: for each visited state and action the q and 1−q quantiles of the m noisy outputs, and the
  smallest / largest of those — in between: at most a fraction q of each state's samples is clipped per side.

Why every method is sound: the certifiers smooth the *clipped* network clip(Q, V_min, V_max), a function with
values in [V_min, V_max]; Theorem 1's Lipschitz argument (Lemma 3) holds for any bounded function and any
fixed range, and the certified policy is defined with that clip.  What soundness needs is only that the range
is fixed *before* the certification noise is drawn, independently of it: this stage uses its own noise
stream (its stage seed) and its own initial states (seeds labelled ``qrange-episode``).  A narrow range
biases Q̃ towards the clip (more samples clipped), a wide one loosens the radii; neither invalidates a
certificate.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from crop.certify.pilot import PilotSettings, pilot_states, run_pilot
from crop.envs import make_env, to_obs
from crop.names import network_name
from crop.progress import pbar
from crop.schema import default_of
from crop.smoothing.engine import Engine, block_plan, check_noise, resolve_device
from crop.smoothing.smoothed import NonFiniteOutputError

__all__ = ["QRangeSettings", "estimate_qrange", "load_qrange", "check_qrange_run", "METHODS"]

METHODS = ("smoothed", "samples", "quantile")


class _Extremes:
    """Running min/max of the values a method reads off each state's m × |A| noisy outputs."""

    def __init__(self, method: str, quantile: float | None):
        self.method, self.q = method, quantile
        self.v_min, self.v_max = np.inf, -np.inf

    def add(self, mean: np.ndarray, lo: float, hi: float, samples: np.ndarray | None) -> None:
        if self.method == "smoothed":
            lo, hi = float(mean.min()), float(mean.max())
        elif self.method == "quantile":
            qs = np.quantile(samples, [self.q, 1.0 - self.q], axis=0)   # per action
            lo, hi = float(qs[0].min()), float(qs[1].max())
        self.v_min, self.v_max = min(self.v_min, lo), max(self.v_max, hi)


#: Noise for up to this many floats (~16 MB) is drawn in one call, as in :class:`crop.smoothing.engine.Engine`.
NOISE_BLOCK_FLOATS = Engine.NOISE_BLOCK_FLOATS


@dataclass(frozen=True)
class QRangeSettings:
    """How the V range is estimated: ``episodes`` rollouts of the unclipped smoothed policy (≤ ``horizon``
    steps, episode i reset with ``episode_seeds[i]``), ``m`` samples of N(0, σ²I) noise per state from one
    generator seeded with ``seed``, ``chunk`` states per forward on ``device``; ``method`` as in the module
    docstring (``quantile``: its q, in (0, 0.5))."""

    sigma: float
    m: int
    episodes: int
    horizon: int
    episode_seeds: tuple
    seed: int
    chunk: int = default_of("chunk")
    device: object = default_of("device")
    method: str = default_of("environment.qrange.method")
    quantile: float | None = None

    def __post_init__(self):
        check_noise(self.sigma, self.m)
        if self.method not in METHODS:
            raise ValueError(f"unknown V-range method {self.method!r}; known: {list(METHODS)}")
        if self.method == "quantile" and not (self.quantile is not None and 0 < self.quantile < 0.5):
            raise ValueError(f"the quantile method needs 0 < quantile < 0.5, got {self.quantile}")
        object.__setattr__(self, "episode_seeds", tuple(self.episode_seeds))


@torch.inference_mode()
def estimate_qrange(env_id: str, net: torch.nn.Module, settings: QRangeSettings, *, profile: str | None = None,
                    progress: bool | None = None, pilot: PilotSettings | None = None) -> dict:
    """V range of ``net`` under N(0, σ²I) noise along ``episodes`` rollouts of the unclipped smoothed
    policy (≤ ``horizon`` steps, m noise samples per state); ``settings``: :class:`QRangeSettings`.

    The episodes run in lockstep: step t of every live episode (in episode order) is smoothed together, B
    states × m samples in as few launches as the block allows.  **Noise stream layout** (one generator
    seeded with ``seed``): time step after time step, the live states' B·m samples are drawn state-major (the
    m samples of the first live episode's state, then the next's, …) in blocks of R = max(chunk,
    2²²/obs_size) rows, each one ``torch.randn((rows, *obs_shape))`` call: ⌊R/m⌋ whole states per block when
    R ≥ m, otherwise pieces of ≤ R samples of one state.  The network sees ``chunk`` rows at a time on the CPU
    (the whole block on CUDA).  The noise stream and the actions taken do not depend on ``method``: the three
    methods visit the same states.

    ``pilot`` (``target: auto``, :mod:`crop.certify.pilot`): after the V range, the same generator goes on to
    the pilot on up to :data:`crop.certify.pilot.MAX_PILOT_STATES` of the visited states (evenly spaced in
    visit order), with ``q`` clipped to the V range just estimated; the result gains ``target_choice``.  The
    pilot's draws come after every V-range draw, so the V range is the same with or without it.
    """
    sigma, m, episodes, horizon = settings.sigma, settings.m, settings.episodes, settings.horizon
    episode_seeds, seed, chunk = settings.episode_seeds, settings.seed, settings.chunk
    method, quantile, device = settings.method, settings.quantile, settings.device
    dev = resolve_device(device)
    net = net.to(dev).eval()
    g = torch.Generator(device=dev)
    g.manual_seed(int(seed))
    ext = _Extremes(method, quantile)
    states, visited = 0, []
    bar = pbar(total=episodes * horizon, desc=f"qrange σ={sigma:g}", progress=progress)
    envs = [make_env(env_id, profile) for _ in range(episodes)]
    obs = [to_obs(env.reset(seed=int(episode_seeds[ep]))[0]) for ep, env in enumerate(envs)]
    returns, live = [0.0] * episodes, list(range(episodes))
    for t in range(horizon):
        if not live:
            break
        x = torch.as_tensor(np.stack([obs[ep] for ep in live]), device=dev)
        if pilot is not None:
            visited += [o.copy() for o in x.cpu().numpy()]
        shape, n = tuple(x.shape[1:]), len(live)
        rows = max(int(chunk), NOISE_BLOCK_FLOATS // max(int(np.prod(shape)), 1))
        step = rows if dev.type == "cuda" else int(chunk)
        total, lo, hi = None, np.full(n, np.inf), np.full(n, -np.inf)
        kept = [[] for _ in range(n)]
        for s0, k, _, c in block_plan(n, m, rows):
            noisy = torch.randn((k * c, *shape), generator=g, device=dev).mul_(sigma)
            noisy.view(k, c, *shape).add_(x[s0:s0 + k].unsqueeze(1))
            q = torch.cat([net(noisy[i:i + step]) for i in range(0, k * c, step)])
            if not torch.isfinite(q).all():
                b = s0 + int(torch.nonzero(~torch.isfinite(q).view(k, -1).all(1))[0])
                raise NonFiniteOutputError(f"the {network_name(net)} returned NaN or inf at episode {live[b]} step {t}")
            q3 = q.view(k, c, -1)
            if total is None:
                total = torch.zeros((n, q3.shape[-1]), dtype=torch.float64, device=dev)
            total[s0:s0 + k] += q3.sum(1, dtype=torch.float64)
            lo[s0:s0 + k] = np.minimum(lo[s0:s0 + k], q3.amin((1, 2)).cpu().numpy())
            hi[s0:s0 + k] = np.maximum(hi[s0:s0 + k], q3.amax((1, 2)).cpu().numpy())
            if method == "quantile":
                for j, part in enumerate(q3.to(torch.float64).cpu().numpy()):
                    kept[s0 + j].append(part)
        means = (total / m).cpu().numpy()
        actions = torch.argmax(total, 1).tolist()
        for b in range(n):
            ext.add(means[b], float(lo[b]), float(hi[b]), np.concatenate(kept[b]) if kept[b] else None)
        states += n
        still = []
        for b, ep in enumerate(live):
            o, reward, terminated, truncated, _ = envs[ep].step(int(actions[b]))
            obs[ep] = to_obs(o)
            returns[ep] += float(reward)
            if terminated or truncated:
                bar.update(horizon - t)  # the episode's remaining steps
            else:
                bar.update(1)
                still.append(ep)
        live = still
    for env in envs:
        env.close()
    bar.close()
    if not ext.v_max > ext.v_min and (pilot is None or "q" in pilot.targets):
        raise ValueError(f"degenerate Q range [{ext.v_min}, {ext.v_max}] ({method}): the values are constant")
    res = {"v_min": ext.v_min, "v_max": ext.v_max, "method": method,
           "quantile": quantile if method == "quantile" else None, "states": states,
           "samples_per_state": m, "episodes": episodes, "returns": returns}
    if pilot is not None:
        v_range = (ext.v_min, ext.v_max) if "q" in pilot.targets else None
        chosen = np.stack([visited[i] for i in pilot_states(len(visited))])
        res["target_choice"] = {**run_pilot(net, chosen, g, replace(pilot, v_range=v_range)), "pilot_seed": int(seed),
                                "stream": "the qrange stage's generator (seed pilot_seed), after its V-range draws"}
    return res


def load_qrange(path, env: str, algo: str, sigma: float) -> tuple[float, float]:
    """``(v_min, v_max)`` of a qrange.json, verified to be for ``env``/``algo``/``sigma`` and a proper range;
    raises :class:`crop.io.InputError` (bad input, before any work)."""
    from crop.io import InputError, read_json

    q = read_json(path)
    check_qrange_run(path, q, env, algo, sigma)
    v_min, v_max = q.get("v_min"), q.get("v_max")
    if not (isinstance(v_min, (int, float)) and isinstance(v_max, (int, float)) and v_max > v_min):
        raise InputError(f"{path}: invalid Q range [{v_min}, {v_max}]")
    return float(v_min), float(v_max)


def check_qrange_run(path, q: dict, env: str, algo: str, sigma: float) -> None:
    """Refuse (:class:`crop.io.InputError`, one line) a qrange.json ``q`` made for another env/algo/σ."""
    import math

    from crop.io import InputError

    s = q.get("sigma")
    if q.get("env") != env or q.get("algo") != algo or not (isinstance(s, (int, float)) and math.isclose(s, sigma)):
        raise InputError(f"{path}: Q range was estimated for {q.get('env')}/{q.get('algo')}/σ={q.get('sigma')}, "
                         f"not {env}/{algo}/σ={sigma}")
