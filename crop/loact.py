"""LoAct — local smoothing for certifying per-state action (Algorithm 1, Theorem 1; Theorem 4's radii).

For a state s with smoothed estimate Q̃(s, ·) and simultaneous bounds L(a) ≤ Q̃(s, a) ≤ U(a):

    r(a) = σ/2 · ( Φ⁻¹((L(a₁) − V_min)/(V_max − V_min)) − Φ⁻¹((U(a) − V_min)/(V_max − V_min)) )

for each a ≠ a₁ (a₁ the top action).  By the 1-Lipschitz property of σΦ⁻¹(Q̃) (Lemma 3 of the appendix), the
smoothed policy can take a under a perturbation δ only if ‖δ‖₂ ≥ r(a).  Theorem 1's radius is the smallest
of these, and it certifies only if the lower bound of the top action exceeds the upper bound of *every*
other action — not just the runner-up.  Theorem 4's r^k are the same numbers sorted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from crop.progress import pbar

from crop import stats
from crop.envs import make_env, to_obs
from crop.smoothing import Estimate, SmoothedQ

__all__ = ["Certificate", "certify_estimate", "certify_state", "run_loact", "certified_ratio"]


@dataclass
class Certificate:
    action: int          # the smoothed policy's action a₁
    certified: bool
    radius: float        # Theorem 1 radius; 0 when not certified
    radii: np.ndarray    # per action: the perturbation the policy needs to possibly take it (0 for a₁ and
                         # for actions the bounds cannot separate from a₁)
    estimate: Estimate


def certify_estimate(est: Estimate, sigma: float, v_min: float, v_max: float) -> Certificate:
    a1 = est.action
    width = v_max - v_min
    p_lower = np.clip((est.lower[a1] - v_min) / width, 0.0, 1.0)
    p_upper = np.clip((est.upper - v_min) / width, 0.0, 1.0)
    with np.errstate(invalid="ignore"):
        gaps = 0.5 * sigma * (stats.Phi_inv(p_lower) - stats.Phi_inv(p_upper))
    gaps = np.where(np.isnan(gaps), -np.inf, gaps)  # inf − inf: bounds cannot separate the actions
    others = np.arange(len(gaps)) != a1
    certified = bool(np.all(gaps[others] > 0.0))
    radius = float(np.min(gaps[others])) if certified else 0.0
    radii = np.maximum(gaps, 0.0)
    radii[a1] = 0.0
    return Certificate(action=a1, certified=certified, radius=radius, radii=radii, estimate=est)


def certify_state(smoother: SmoothedQ, obs, index=None, alpha: float | None = None) -> Certificate:
    """Algorithm 1 for one state: fresh noise, clip, mean, bounds, radius.  ``alpha`` overrides the
    smoother's per-state miscoverage for this state (LoRe's ``alpha_mode: family`` schedule)."""
    est = smoother.estimate(obs, index=index) if alpha is None else smoother.estimate(obs, index=index, alpha=alpha)
    return certify_estimate(est, smoother.sigma, smoother.v_min, smoother.v_max)


def run_loact(env_id: str, smoother: SmoothedQ, episodes: int, horizon: int, episode_seeds,
              profile: str | None = None, progress: bool | None = None, frames: list | None = None,
              frames_window: tuple[int, int] = (0, 200)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Roll the locally smoothed policy π̃ on clean observations and certify every step.

    Returns (per-step table, per-episode table).  Uncertified steps have radius 0 and *count* in every
    mean radius (the published numbers skipped them).  For Atari, when ``frames`` is a list, the raw RGB
    screen of episode 0 at each step t with start ≤ t < end (``frames_window``) is appended as (step, frame).
    """
    rows, eps_rows = [], []
    bar = pbar(total=episodes * horizon, desc=f"LoAct σ={smoother.sigma:g}", progress=progress)
    for ep in range(episodes):
        env = make_env(env_id, profile)
        obs, _ = env.reset(seed=int(episode_seeds[ep]))
        ret, t = 0.0, 0
        ale = getattr(env.unwrapped, "ale", None)
        for t in range(horizon):
            if frames is not None and ep == 0 and ale is not None and frames_window[0] <= t < frames_window[1]:
                frames.append((t, ale.getScreenRGB().copy()))
            cert = certify_state(smoother, to_obs(obs), index=f"episode {ep} step {t}")
            e = cert.estimate
            runner = np.where(np.arange(len(e.mean)) != cert.action, e.mean, -np.inf)
            obs, reward, terminated, truncated, _ = env.step(cert.action)
            ret += float(reward)
            rows.append({
                "episode": ep, "step": t, "action": cert.action, "certified": cert.certified,
                "radius": cert.radius, "reward": float(reward), "q_top": float(e.mean[cert.action]),
                "q_runner_up": float(runner.max()), "q_top_lower": float(e.lower[cert.action]),
                "q_others_upper_max": float(np.max(np.delete(e.upper, cert.action))),
            })
            bar.update(1)
            if terminated or truncated:
                break
        steps = t + 1
        bar.update(horizon - steps)
        ep_rows = [r for r in rows if r["episode"] == ep]
        radii = np.array([r["radius"] for r in ep_rows])
        eps_rows.append({"episode": ep, "return": ret, "steps": steps,
                         "mean_radius": float(radii.mean()),
                         "certified_fraction": float(np.mean([r["certified"] for r in ep_rows]))})
        env.close()
    bar.close()
    return pd.DataFrame(rows), pd.DataFrame(eps_rows)


def certified_ratio(steps: pd.DataFrame, r_grid) -> pd.DataFrame:
    """η_r = (1/H) Σ_t 1{certified_t and r_t ≥ r} per episode (Section 6.1), H the episode's length."""
    out = []
    for ep, g in steps.groupby("episode"):
        rad = np.where(g["certified"].to_numpy(bool), g["radius"].to_numpy(float), -np.inf)
        for r in r_grid:
            out.append({"r": float(r), "episode": int(ep), "eta": float(np.mean(rad >= r))})
    return pd.DataFrame(out)
