"""GRe — global smoothing for certifying the cumulative reward (Algorithm 2, Theorems 2 and 3).

Step 1 samples m σ-randomized trajectories (Definition 3: at every step the policy acts on s_t + Δ_t with
one fresh Δ_t ∼ N(0, σ²I)); the policy is a Q-network's greedy action or, for a continuous (Box) action
space, the actor's deterministic action (:mod:`crop.models.actor`) — the bounds below need only the return to
lie in [J_min, J_max], whatever the actions are.  All m trajectories advance in lockstep, one batched
forward per time step.
Step 2 turns the m returns into
  * the expectation bound J̲_E = F̃ − Δ_conf − (J_max − J_min)/σ·√(2/π)·ε√H            (Theorem 2;
    Δ_conf = (J_max − J_min)·sqrt(ln(1/α)/(2m)), Hoeffding): column ``expectation_bound`` holds
    max(J̲_E, J_min) — below J_min (large ε) it says no more than the trivial bound J_min on every return,
    and is *vacuous* — and ``expectation_bound_raw`` the value of the formula, below J_min or not; the
    tables and figures show the first,
  * the CDF-based expectation bound of Kumar, Levine & Feizi (ICLR 2022, "Policy smoothing for provably
    robust RL"), from the same m returns (column ``cdf_expectation_bound``,
    :func:`crop.smoothing.stats.cdf_expectation_bound`):
        J̲_CDF = J_min + Σ_i (F_(i) − F_(i−1)) · Φ(Φ⁻¹(max(0, (m − i + 1)/m − ε_DKW)) − ε√H/σ),
    F_(0) = J_min ≤ F_(1) ≤ … ≤ F_(m) the sorted returns and ε_DKW = sqrt(ln(1/α)/(2m)) the one-sided
    DKW band (Massart's constant) — a lower bound on the same quantity E[J_ε(π′)] as J̲_E, built from the
    whole empirical distribution instead of its mean and a Lipschitz constant; at ε = 0 (α ≤ 1/2) it is
    never below J̲_E and for ε > 0 it is usually far tighter; and
  * the percentile bound J̲_p = k-th smallest return, k the largest index with
    P[Bin(m, p′) ≤ k − 1] ≤ α and p′ = Φ(Φ⁻¹(p) − ε√H/σ)                                (Theorem 3),
    computed with the exact binomial CDF; no bound at all when no k qualifies.
Each number is a separate statement holding with probability ≥ 1 − α.  As the paper notes (Appendix C),
the guarantee is for perturbations fixed in advance, not for an adaptive attacker (Kumar et al. prove their
bound also against adaptive attackers for their setting; we claim only what CROP claims).
"""
from __future__ import annotations

import contextlib
import math
import signal
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from crop import columns as cols
from crop.certify import gre_resume
from crop.certify.gre_resume import GReResume
from crop.envs import make_env_pool
from crop.io import derive_seed, sigterm_noted
from crop.names import network_name
from crop.progress import pbar
from crop.schema import default_of
from crop.smoothing import stats
from crop.smoothing.engine import check_noise, resolve_device
from crop.smoothing.smoothed import NonFiniteOutputError

__all__ = ["GReSettings", "sample_randomized_returns", "gre_bounds", "TrajectoryNoise", "vacuity_reason",
           "vacuity_floor"]


@dataclass(frozen=True)
class GReSettings:
    """Step 1 of Algorithm 2: ``m`` σ-randomized trajectories of at most ``horizon`` steps, rewards discounted by
    ``gamma``; trajectory i starts from the environment reset with seed ``env_seed + i`` and draws its noise
    from its own stream of ``seed`` (:class:`TrajectoryNoise`).  ``batch`` trajectories (all m when None) are
    stepped in lockstep at a time, their environments spread over ``workers`` processes, ``chunk`` states per
    forward on ``device``; ``reward_clip`` = (low, high): every step's reward is clipped to it before it is added
    (the returns are then those of the clipped rewards)."""

    sigma: float
    m: int
    horizon: int
    gamma: float
    seed: int
    env_seed: int
    chunk: int = default_of("chunk")
    device: object = default_of("device")
    workers: int = 1
    batch: int | None = default_of("environment.gre.batch")
    reward_clip: tuple[float, float] | None = None

    def __post_init__(self):
        check_noise(self.sigma, self.m)


@torch.inference_mode()
def sample_randomized_returns(env_id: str, net: torch.nn.Module, settings: GReSettings, *,
                              profile: str | None = None, progress: bool | None = None,
                              resume: GReResume | None = None) -> np.ndarray:
    """Returns of m σ-randomized trajectories (:class:`GReSettings`) of length ≤ ``horizon``, stepped in lockstep
    blocks of ``batch`` trajectories with the environments spread over ``workers`` processes.

    Trajectory i starts from the environment reset with seed ``env_seed + i`` (CartPole: from
    :func:`crop.envs.vector.cartpole_initial_states` of that seed) and draws its noise Δ_t from
    its own stream (:class:`TrajectoryNoise`), so its return depends on neither ``batch``, ``workers``,
    ``chunk`` nor the other trajectories (nor on m: the first m returns of a larger run are these).  A
    continuous actor's actions are floats: across block layouts its returns agree up to the rounding of a
    batched forward (for a given layout they are byte-reproducible).

    With ``resume`` (:mod:`crop.certify.gre_resume`) the returns of the finished blocks are saved after each
    block, and a rerun of the same run continues after the last saved block; SIGTERM (a cluster's wall-time
    kill) ends the block in flight at its next step, one line says how many trajectories are saved, and the
    process exits with status 143."""
    dev = resolve_device(settings.device)
    net = net.to(dev).eval()
    m = int(settings.m)
    returns = np.empty(m, dtype=np.float64)
    batch = _block(settings)
    start, key = 0, None
    if resume is not None:
        key = gre_resume.resume_key(env_id, profile, settings, net, dev)
        saved = gre_resume.load(resume, key, m, batch)
        if saved is not None:
            start = saved.size
            returns[:start] = saved
            print(f"GRe: resumed {start} of {m} trajectories from {resume.path}", file=sys.stderr)
        if start == m:
            return returns
    noted: list[int] = []
    with sigterm_noted(noted.append) if resume is not None else contextlib.nullcontext():
        done = start
        # One environment per slot, made once: blocks of `batch` trajectories bound the memory of the copies
        # (Atari: ~2.6 MB each), and each block resets the slots with its trajectories' seeds (making an Atari
        # environment loads its ROM: 0.2 s).
        pool = make_env_pool(env_id, batch, profile, workers=settings.workers)
        try:
            for b0 in range(start, m, batch):
                n = min(batch, m - b0)
                returns[b0:b0 + n] = _lockstep(pool, net, dev, settings, b0, n, progress, noted)
                done = b0 + n
                if resume is not None:
                    gre_resume.save(resume.path, key, returns[:done])
        except Exception:
            if resume is None or not _terminated(pool, noted):
                raise
        finally:
            pool.close()
        if noted and done < m:
            print(f"GRe: {signal.Signals(noted[0]).name}: {done} of {m} trajectories saved to {resume.path}; "
                  "the same command resumes it", file=sys.stderr)
            raise SystemExit(128 + noted[0])
    return returns


class TrajectoryNoise:
    """Standard normal noise for GRe's trajectories b0, …, b0 + n − 1, independent of how they are blocked.

    Trajectories are grouped in fixed groups of ``group`` consecutive indices (a number that depends only on
    the observation size); group g owns a generator seeded from (``seed``, g) that draws one (group, *shape)
    array per time step, and trajectory i takes row i mod group of its group's t-th draw.  A group whose
    trajectories have all finished stops drawing: nothing that still runs depends on it.  Definition 3's
    fresh Δ_t ∼ N(0, I) (times σ) per trajectory and step, reproducible to the byte for any block layout.
    """

    #: floats per group draw: CartPole 4,096 trajectories a group, highway 655, Atari 1.
    GROUP_FLOATS = 1 << 14

    def __init__(self, seed: int, b0: int, n: int, shape: tuple, device):
        self.shape, self.device, self.b0 = tuple(shape), device, int(b0)
        self.group = max(1, self.GROUP_FLOATS // max(1, int(np.prod(self.shape))))
        self.first = self.b0 // self.group
        last = (self.b0 + n - 1) // self.group
        self.generators = []
        for g in range(self.first, last + 1):
            gen = torch.Generator(device=device)
            gen.manual_seed(derive_seed(seed, "gre-trajectory-noise", g))
            self.generators.append(gen)

    def step(self, idx: np.ndarray) -> torch.Tensor:
        """This time step's noise for the block's trajectories ``idx`` (local indices, those still running);
        call once per time step."""
        i = np.asarray(idx, dtype=np.int64) + self.b0
        out = torch.empty((len(i), *self.shape), dtype=torch.float32, device=self.device)
        if self.group == 1:   # a generator per trajectory (Atari): its draw goes straight into its row
            for k, j in enumerate(i.tolist()):
                out[k].normal_(generator=self.generators[j - self.first])
            return out
        groups = i // self.group
        for g in np.unique(groups):
            z = torch.randn((self.group, *self.shape), generator=self.generators[g - self.first],
                            device=self.device)
            sel = np.nonzero(groups == g)[0]
            out[torch.as_tensor(sel, device=self.device)] = z[torch.as_tensor(i[sel] - g * self.group,
                                                                              device=self.device)]
        return out


def _block(settings: GReSettings) -> int:
    """Trajectories stepped together: ``batch``, all m when None."""
    m = int(settings.m)
    return m if settings.batch is None else max(1, min(int(settings.batch), m))


def _terminated(pool, noted: list) -> bool:
    """Whether the run is being stopped: SIGTERM noted here, or a worker of ``pool`` ended by it (a cluster signals
    every process of the job, and a worker's end may reach this process before the signal does)."""
    for p in () if noted else getattr(pool, "procs", ()):
        p.join(timeout=0.5)   # a worker that has ended is reaped at once
        if p.exitcode == -signal.SIGTERM:
            noted.append(signal.SIGTERM)
            break
    return bool(noted)


class _Stopped(Exception):
    """A block given up on SIGTERM (its trajectories are sampled again by the rerun)."""


#: Trajectories a half must hold for a block to be split into double-buffered halves: below it the second forward
#: call and message per step cost more than the overlap saves on a loaded machine (docs/speed.md).
HALF_MIN = 16

#: Devices on which GRe moves an Atari pool's pixels (not floats) to the network (tests add "cpu").
PIXELS_ON = ("cuda",)


def _lockstep(pool, net, dev, settings: GReSettings, b0, m, progress, noted=()):
    """The m trajectories b0, …, b0 + m − 1 of ``settings`` in lockstep on the first m environments of
    ``pool``: one batched forward per time step; given up at the next step once ``noted`` holds a signal.  A
    seeded reset restores all of an environment's state (tests/test_gre.py), so a reused environment starts its
    trajectory as a new one would.

    Where the pool steps in worker processes and the block has 2 × :data:`HALF_MIN` trajectories or more, it runs
    as two halves, double-buffered: while the workers
    step one half, this process draws the other half's noise and runs its forward.  Each half draws from its
    own :class:`TrajectoryNoise` over its trajectories, which gives every trajectory the noise a single
    one over the block would (the streams do not depend on the blocking), so the returns do not change."""
    sigma, horizon, gamma, chunk = settings.sigma, settings.horizon, settings.gamma, settings.chunk
    seed, env_seed, reward_clip = settings.seed, settings.env_seed, settings.reward_clip
    # Atari on a GPU: the pool's stored pixels (uint8: a quarter of the bytes) go to the device and become the
    # network's input there, by ToFloat's own expression (the same float32 product as the pool's to_float).
    pixels = dev.type in PIXELS_ON and hasattr(pool, "scale")
    # environment k of the pool: seed env_seed + b0 + k
    obs = pool.reset(int(env_seed) + b0, m, pixels=True) if pixels else pool.reset(int(env_seed) + b0, m)
    cuts = [0, m // 2, m] if m >= 2 * HALF_MIN and pool.in_processes else [0, m]
    halves = [(lo, hi, TrajectoryNoise(seed, b0 + lo, hi - lo, obs.shape[1:], dev)) for lo, hi in zip(cuts, cuts[1:])]
    alive = np.ones(m, dtype=bool)
    returns = np.zeros(m, dtype=np.float64)
    discount = [1.0] * len(halves)   # γ^t of each half's step in flight
    flight = [None] * len(halves)    # (trajectories, collect) of each half's step in flight
    out_shape = (int(net.low.numel()),) if getattr(net, "continuous", False) else None
    step_kw = {"pixels": True} if pixels else {}

    def act(idx, local, noise, t):
        """π(s + Δ) of the trajectories ``idx`` (``local`` in ``noise``'s) at step t: a Q-network's greedy action
        (or a policy network's logits'), a continuous actor's output."""
        if pixels:
            x = torch.as_tensor(obs[idx], device=dev).to(torch.float32) * pool.scale
        else:
            x = torch.as_tensor(np.asarray(obs[idx], dtype=np.float32), device=dev)
        noisy = noise.step(local).mul_(sigma).add_(x)
        actions = torch.empty((len(idx), *(out_shape or ())), dtype=torch.float32 if out_shape else torch.int64,
                              device=dev)
        for s in range(0, len(idx), chunk):
            q = net(noisy[s:s + chunk])
            if not torch.isfinite(q).all():
                raise NonFiniteOutputError(f"the {network_name(net)} returned NaN or inf at step {t} (trajectories "
                                      f"{b0 + idx[s]}…)")
            actions[s:s + chunk] = q if out_shape else q.argmax(1)
        return actions.cpu().numpy()

    def settle(k):
        """Takes in half k's step in flight."""
        idx, collect = flight[k]
        flight[k] = None
        o, reward, terminated, truncated = collect()
        obs[idx] = o
        reward = np.asarray(reward, dtype=np.float64)
        returns[idx] += discount[k] * (reward if reward_clip is None else np.clip(reward, *reward_clip))
        alive[idx] &= ~(np.asarray(terminated) | np.asarray(truncated))
        discount[k] *= gamma

    batch = _block(settings)
    blocks = f" block {b0 // batch + 1}/{-(-settings.m // batch)}" if batch < settings.m else ""
    for t in pbar(range(horizon), desc=f"GRe σ={sigma:g}{blocks}", progress=progress):
        if noted:
            raise _Stopped
        for k, (lo, hi, noise) in enumerate(halves):
            if flight[k] is not None:
                settle(k)
            idx = lo + np.nonzero(alive[lo:hi])[0]   # finished trajectories are not stepped again
            if idx.size:
                flight[k] = (idx, pool.step_async(idx, act(idx, idx - lo, noise, t), **step_kw))
        if all(f is None for f in flight):
            break
    for k in range(len(halves)):
        if flight[k] is not None:
            settle(k)
    return returns


def gre_bounds(returns: np.ndarray, *, sigma: float, horizon: int, alpha: float, eps_grid, percentiles,
               j_min: float, j_max: float) -> pd.DataFrame:
    """Expectation bounds (Theorem 2's J̲_E, clipped to J_min and raw, and the CDF-based J̲_CDF, never below
    J_min) and percentile bounds over a grid of ε (one row per (ε, p); the expectation bounds do not depend
    on p and repeat)."""
    returns = np.asarray(returns, dtype=np.float64)
    m = returns.size
    if returns.min() < j_min - 1e-9 or returns.max() > j_max + 1e-9:
        raise ValueError(f"returns outside [J_min, J_max] = [{j_min}, {j_max}]: "
                         f"[{returns.min()}, {returns.max()}]; the expectation bound would be unsound")
    ordered = np.sort(returns)
    mean = float(returns.mean())
    eps_grid = [float(e) for e in eps_grid]
    cdf_bounds = stats.cdf_expectation_bound(returns, j_min, j_max, alpha, sigma, np.array(eps_grid), horizon)
    rows = []
    for eps, cdf_bound in zip(eps_grid, cdf_bounds):
        e_bound = stats.expectation_bound(mean, j_min, j_max, m, alpha, sigma, float(eps), horizon)
        for p in percentiles:
            p_prime = stats.percentile_p_prime(float(p), float(eps), horizon, sigma)
            k = stats.percentile_order_index(m, p_prime, alpha)
            rows.append({
                cols.EPS: float(eps), cols.P: float(p), cols.EXPECTATION_BOUND: max(e_bound, j_min),
                cols.EXPECTATION_BOUND_RAW: e_bound,
                "cdf_expectation_bound": float(cdf_bound),
                cols.PERCENTILE_BOUND: float(ordered[k - 1]) if k is not None else math.nan,
                cols.PERCENTILE_CERTIFIED: k is not None, "k": k if k is not None else pd.NA,
                "p_prime": p_prime, "m": m, cols.HORIZON: horizon, cols.ALPHA: alpha, cols.SIGMA: sigma,
                "mean_return": mean, "median_return": float(np.median(returns)),
                cols.J_MIN: j_min, cols.J_MAX: j_max,
            })
    return pd.DataFrame(rows)


#: A bound within this fraction of |J_min| (at least this much) of J_min says nothing more than J_min: vacuous.
VACUOUS_TOL = 1e-9


def vacuity_floor(j_min: float) -> float:
    """The largest value that says nothing more than ``j_min`` (:data:`VACUOUS_TOL`): a bound or return at
    most this is vacuous."""
    return j_min + VACUOUS_TOL * max(1.0, abs(j_min))


def _above(bound: float, j_min: float) -> bool:
    return bool(bound == bound and bound > vacuity_floor(j_min))


def vacuity_reason(returns, bounds: pd.DataFrame, obs_low=None, obs_high=None) -> str | None:
    """Why no GRe bound (J̲_E, J̲_CDF, J̲_p of :func:`gre_bounds`' table ``bounds``) at an ε > 0 is above J_min,
    from the m σ-randomized ``returns`` themselves; None when one is, or the grid has no ε > 0.

    Every bound is at most the returns it bounds: where all m returns are J_min, no m and no horizon lifts one
    (only a smaller σ or a more noise-robust agent can; ``obs_low``/``obs_high``, the observation space's
    bounds, put σ beside the narrowest finite range).  Otherwise the CDF bound's limit as m → ∞ (DKW's band
    → 0, the same empirical returns) at the smallest ε > 0 says whether more paths (``--m``) would lift it, or
    whether ε√H/σ itself pushes every return's survival probability to nothing (then a shorter horizon or
    a smaller ε)."""
    first = bounds.iloc[0]
    j_min, sigma, horizon, m = float(first[cols.J_MIN]), float(first[cols.SIGMA]), int(first[cols.HORIZON]), \
        int(first["m"])
    positive = bounds[bounds[cols.EPS] > 0]
    if positive.empty or any(_above(float(r[c]), j_min) for _, r in positive.iterrows()
                             for c in (cols.EXPECTATION_BOUND, "cdf_expectation_bound", cols.PERCENTILE_BOUND)):
        return None
    x = np.sort(np.asarray(returns, dtype=np.float64))
    above = float(np.mean(x > vacuity_floor(j_min)))
    if above == 0.0:
        why = (f"no GRe bound is above J_min = {j_min:g} at any eps, and no m or horizon can lift one: all {m} "
               f"sigma-randomized paths returned J_min over the first {horizon} steps, and a bound is at most "
               "the returns it bounds; a smaller sigma (or an agent robust to this noise) can")
        if obs_low is not None and obs_high is not None:
            width = np.asarray(obs_high, np.float64).ravel() - np.asarray(obs_low, np.float64).ravel()
            finite = np.flatnonzero(np.isfinite(width) & (width > 0))
            if finite.size:
                d = int(finite[np.argmin(width[finite])])
                why += f" (sigma {sigma:g} is {sigma / width[d]:.0%} of observation {d}'s range {width[d]:.4g})"
        return why
    eps = float(positive[cols.EPS].min())
    widths = np.diff(np.concatenate([[j_min], x]))
    surv = (x.size - np.arange(x.size)) / x.size
    limit = j_min + float(stats.Phi(stats.Phi_inv(surv) - eps * math.sqrt(horizon) / sigma) @ widths)
    if _above(limit, j_min) and limit - j_min >= 1e-3 * (float(first[cols.J_MAX]) - j_min):
        band = stats.dkw_margin(m, float(first[cols.ALPHA]))
        return (f"no GRe bound at eps > 0 is above J_min = {j_min:g} with m = {m}: {above:.1%} of the paths "
                f"returned more than J_min, too few beside DKW's band {band:.3g} at this m; more paths (--m) lift "
                f"the CDF bound at eps {eps:g} towards {limit:.4g}, its limit as m grows")
    return (f"no GRe bound at eps > 0 is above J_min = {j_min:g}, and more paths would not help: {above:.1%} of "
            f"the {m} paths returned more than J_min, and at eps {eps:g} the shift eps*sqrt(H)/sigma = "
            f"{eps * math.sqrt(horizon) / sigma:.3g} (H = {horizon} steps) leaves the CDF bound at most J_min + "
            f"{limit - j_min:.3g} even as m grows; a smaller sigma, a shorter --horizon or a smaller eps can")
