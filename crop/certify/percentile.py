"""LoAct for continuous actions: a certified interval of the percentile-smoothed action, per action dimension.

Percentile smoothing (Chiang, Curry, Abdelkader, Kumar, Dickerson & Goldstein, "Detection as Regression:
Certified Object Detection by Median Smoothing", NeurIPS 2020).  For one action dimension f(s) of the actor
and Δ ∼ N(0, σ²I), the p-th percentile of the smoothed action is

    h_p(s) = sup{ y : P[f(s + Δ) ≤ y] ≤ p }.

Their Theorem 1: for every ‖δ‖₂ ≤ ε,

    h_p̲(s) ≤ h_p(s + δ) ≤ h_p̄(s),    p̲ = Φ(Φ⁻¹(p) − ε/σ),  p̄ = Φ(Φ⁻¹(p) + ε/σ)

(for each y, s ↦ Φ⁻¹(P[f(s + Δ) ≤ y]) is 1/σ-Lipschitz, Salman et al. 2019).  Both ends are estimated from
the m sorted samples X_(1) ≤ … ≤ X_(m) of f(s + Δ) by order statistics with exact binomial bounds:

* lower: X_(k), k the largest index with P[Bin(m, p̲) ≤ k − 1] ≤ α_each; then X_(k) ≤ h_p̲(s) with
  probability ≥ 1 − α_each (X_(k) > h_p̲ needs fewer than k samples ≤ h_p̲, each of which is one with
  probability F(h_p̲) ≥ p̲ by right-continuity of the CDF F);
* upper: X_(k′), k′ the smallest index with P[Bin(m, p̄) ≥ k′] ≤ α_each; then X_(k′) ≥ h_p̄(s) with
  probability ≥ 1 − α_each (X_(k′) < h_p̄ needs k′ samples < h_p̄, each with probability F(h_p̄⁻) ≤ p̄).

Where no index qualifies the end is the action bound itself (h_p lies in [low, high], as every action does).
One state's 2·d·G one-sided bounds (two ends, d dimensions, the G points of the ε grid) each hold at
α_each = α_state / (2·d·G), so by Boole's inequality all hold together with probability ≥ 1 − α_state, and
the interval at ε = 0 holds the clean smoothed action too.  The certified radius of a dimension is the
largest ε of the grid whose interval is at most the tolerance wide: the smoothed action then moves by at
most the tolerance under any ‖δ‖₂ ≤ ε (both h_p(s) and h_p(s + δ) lie in the interval).  A dimension, and
a step, counts as *certified* only where that radius is > 0, as a discrete action's: an interval within the
tolerance at ε = 0 alone says where the clean smoothed action lies, not that any perturbation leaves it there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from crop import columns as cols
from crop.schema import default_of
from crop.smoothing import stats
from crop.smoothing.engine import check_noise
from crop.smoothing.smoothed import NonFiniteOutputError

__all__ = ["EPS_FACTORS", "PercentileSettings", "order_indices", "action_intervals", "smoothed_action",
           "run_loact_continuous", "step_ratio"]

#: The ε grid of the certified intervals, as multiples of σ (G = 7 points; ε = 0 is the clean action).
EPS_FACTORS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
#: Default tolerance: this fraction of each dimension's range [low, high].
DEFAULT_TOLERANCE = 0.05


def order_indices(m: int, p: float, eps_over_sigma: float, alpha_each: float) -> tuple[int | None, int | None]:
    """(k, k′): the 1-based order statistics of m samples bounding h_p̲ from below and h_p̄ from above, each
    with probability ≥ 1 − ``alpha_each`` (None where no index qualifies)."""
    z = float(stats.Phi_inv(p))
    p_lo, p_hi = float(stats.Phi(z - eps_over_sigma)), float(stats.Phi(z + eps_over_sigma))
    k_lo = stats.percentile_order_index(m, p_lo, alpha_each)
    # P[Bin(m, p̄) ≥ k′] = P[Bin(m, 1 − p̄) ≤ m − k′]: the lower index of the mirrored samples
    j = stats.percentile_order_index(m, 1.0 - p_hi, alpha_each) if p_hi < 1.0 else None
    return k_lo, (None if j is None else m - j + 1)


def action_intervals(samples: np.ndarray, low, high, eps_factors, p: float, alpha_each: float):
    """Certified intervals of the p-th percentile action per dimension and ε: (lower, upper), each of shape
    (d, G), from ``samples`` (m × d, the actor's actions at s + Δ)."""
    x = np.sort(np.asarray(samples, dtype=np.float64), axis=0)
    m, d = x.shape
    lower = np.empty((d, len(eps_factors)))
    upper = np.empty((d, len(eps_factors)))
    for g, f in enumerate(eps_factors):
        k_lo, k_hi = order_indices(m, p, float(f), alpha_each)
        lower[:, g] = x[k_lo - 1] if k_lo is not None else np.asarray(low, dtype=np.float64)
        upper[:, g] = x[k_hi - 1] if k_hi is not None else np.asarray(high, dtype=np.float64)
    return lower, upper


def smoothed_action(samples: np.ndarray, p: float) -> np.ndarray:
    """The empirical h_p per dimension, the action π̃ plays: sup{y : F_m(y) ≤ p} of the samples' CDF F_m, i.e.
    X_(⌊pm⌋+1) (the upper sample p-quantile; the estimate of the h_p the intervals certify)."""
    x = np.sort(np.asarray(samples), axis=0)
    return x[min(math.floor(p * len(x)) + 1, len(x)) - 1]


def _radius(lower: np.ndarray, upper: np.ndarray, eps_grid: np.ndarray, tolerance: np.ndarray) -> np.ndarray:
    """Per dimension the largest ε of the grid whose interval is at most ``tolerance`` wide (the widths grow
    with ε); −1 where even ε = 0's is wider; 0 where only ε = 0's is within it (neither is certified)."""
    ok = (upper - lower) <= tolerance[:, None]
    # the widths are nondecreasing in ε, but take the longest prefix that holds to stay exact regardless
    prefix = np.cumprod(ok, axis=1).astype(bool)
    n = prefix.sum(1)
    return np.where(n > 0, eps_grid[np.maximum(n - 1, 0)], -1.0)


@dataclass(frozen=True)
class PercentileSettings:
    """LoAct of a continuous actor: ``episodes`` episodes of at most ``horizon`` steps (episode i reset with
    ``episode_seeds[i]``), the ``p``-th percentile of ``m`` actions at s + Δ, Δ ∼ N(0, σ²I) from the stream of
    ``seed`` (``chunk`` states per forward), certified over the ε grid ``eps_factors``·σ with all of a state's
    bounds together at ``alpha_state``; a dimension's radius is the largest ε whose interval is at most
    ``tolerance`` wide (one value or one per dimension; default: :data:`DEFAULT_TOLERANCE` of its range), and
    it counts as certified where that radius is > 0."""

    sigma: float
    m: int
    episodes: int
    horizon: int
    episode_seeds: tuple
    alpha_state: float
    tolerance: object = None
    p: float = 0.5
    eps_factors: tuple = EPS_FACTORS
    seed: int = 0
    chunk: int = default_of("chunk")
    reward_clip: tuple | None = None

    def __post_init__(self):
        check_noise(self.sigma, self.m)
        if not 0.0 < self.p < 1.0:
            raise ValueError(f"percentile p must be in (0, 1), got {self.p}")
        object.__setattr__(self, "episode_seeds", tuple(self.episode_seeds))
        object.__setattr__(self, "eps_factors", tuple(self.eps_factors))


@torch.inference_mode()
def run_loact_continuous(env_id: str, net, settings: PercentileSettings, *, profile: str | None = None,
                         progress: bool | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Roll the percentile-smoothed policy π̃(s) = h_p(s) (per dimension, estimated by the sample percentile
    of m fresh draws) on clean observations and certify every step (:class:`PercentileSettings`); episodes in
    lockstep, one forward of B·m noisy states per step.  Returns (one row per step and action dimension, one row
    per episode, info).  With ``settings.reward_clip`` = (low, high) every step's reward is clipped to it before
    it enters the benign return (and the ``reward`` column), as GRe's returns are."""
    from crop.envs import make_env, to_obs
    from crop.progress import pbar

    sigma, m, episodes, horizon, p = settings.sigma, settings.m, settings.episodes, settings.horizon, settings.p
    episode_seeds, tolerance, chunk = settings.episode_seeds, settings.tolerance, settings.chunk
    low, high = net.low.cpu().numpy().astype(np.float64), net.high.cpu().numpy().astype(np.float64)
    d = low.size
    tol = (DEFAULT_TOLERANCE * (high - low) if tolerance is None
           else np.broadcast_to(np.asarray(tolerance, dtype=np.float64), (d,)).copy())
    eps_factors = np.asarray(settings.eps_factors, dtype=np.float64)
    eps_grid = eps_factors * sigma
    alpha_each = settings.alpha_state / (2 * d * len(eps_factors))
    gen = torch.Generator().manual_seed(int(settings.seed))
    envs = [make_env(env_id, profile) for _ in range(episodes)]
    obs = [to_obs(e.reset(seed=int(episode_seeds[i]))[0]) for i, e in enumerate(envs)]
    ret, steps, live = np.zeros(episodes), np.zeros(episodes, dtype=int), list(range(episodes))
    rows = []
    for t in pbar(range(horizon), desc=f"LoAct (percentile) σ={sigma:g}", progress=progress):
        if not live:
            break
        x = torch.as_tensor(np.stack([obs[i] for i in live]))
        noisy = (x.unsqueeze(1) + sigma * torch.randn((len(live), m, *x.shape[1:]), generator=gen)).flatten(0, 1)
        acts = torch.cat([net(noisy[s:s + chunk]) for s in range(0, len(noisy), chunk)])
        if not torch.isfinite(acts).all():
            raise NonFiniteOutputError(f"the actor returned NaN or inf at step {t}")
        acts = acts.reshape(len(live), m, d).numpy()
        ended = []
        for j, ep in enumerate(live):
            lower, upper = action_intervals(acts[j], low, high, eps_factors, p, alpha_each)
            radius = _radius(lower, upper, eps_grid, tol)
            action = smoothed_action(acts[j], p).astype(np.float32)
            o, r, term, trunc, _ = envs[ep].step(action)
            if settings.reward_clip is not None:
                r = min(max(float(r), settings.reward_clip[0]), settings.reward_clip[1])
            for k in range(d):
                row = {cols.EPISODE: ep, cols.STEP: t, "dim": k, cols.ACTION: float(action[k]),
                       cols.CERTIFIED: bool(radius[k] > 0), cols.RADIUS: float(max(radius[k], 0.0)),
                       "tolerance": float(tol[k]), "reward": float(r)}
                for g, f in enumerate(eps_factors):
                    row[f"lower_e{f:g}"], row[f"upper_e{f:g}"] = float(lower[k, g]), float(upper[k, g])
                rows.append(row)
            obs[ep], ret[ep], steps[ep] = to_obs(o), ret[ep] + float(r), t + 1
            if term or trunc:
                ended.append(ep)
        live = [ep for ep in live if ep not in ended]
    for e in envs:
        e.close()
    table = pd.DataFrame(rows)
    per_step = step_ratio(table)
    eps_rows = [{cols.EPISODE: ep, cols.RETURN: float(ret[ep]), cols.STEPS: int(steps[ep]),
                 "mean_radius": float(g[cols.RADIUS].mean()), "certified_fraction": float(g[cols.CERTIFIED].mean())}
                for ep, g in per_step.groupby(cols.EPISODE)]
    info = {"percentile": p, "eps_factors": [float(f) for f in eps_factors], "tolerance": [float(v) for v in tol],
            "per_bound_alpha": alpha_each}
    return table, pd.DataFrame(eps_rows), info


def step_ratio(table: pd.DataFrame) -> pd.DataFrame:
    """One row per step: certified when every dimension is, radius the smallest over the dimensions (the
    whole action vector stays within its tolerances up to it)."""
    g = table.groupby([cols.EPISODE, cols.STEP], sort=True)
    out = g.agg(**{cols.CERTIFIED: (cols.CERTIFIED, "all"), cols.RADIUS: (cols.RADIUS, "min")}).reset_index()
    out.loc[~out[cols.CERTIFIED], cols.RADIUS] = 0.0
    return out
