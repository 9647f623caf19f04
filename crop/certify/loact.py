"""LoAct — local smoothing for certifying per-state action (Algorithm 1, Theorem 1; Theorem 4's radii).

For a state s with smoothed estimate Q̃(s, ·) and simultaneous bounds L(a) ≤ Q̃(s, a) ≤ U(a):

    r(a) = σ/2 · ( Φ⁻¹((L(a₁) − V_min)/(V_max − V_min)) − Φ⁻¹((U(a) − V_min)/(V_max − V_min)) )

for each a ≠ a₁ (a₁ the top action).  By the 1-Lipschitz property of σΦ⁻¹(Q̃) (Lemma 3 of the appendix), the
smoothed policy can take a under a perturbation δ only if ‖δ‖₂ ≥ r(a).  Theorem 1's radius is the smallest
of these, and it certifies only if the lower bound of the top action exceeds the upper bound of *every*
other action — not just the runner-up.  Theorem 4's r^k are the same numbers sorted.

The same radius holds for the smoothing targets bounded in [0, 1] (action probabilities, greedy-action vote;
:mod:`crop.smoothing.smoothed`) with [V_min, V_max] = [0, 1]: the adapted Theorem 1 of that module's docstring.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from crop import columns as cols
from crop.envs import make_env, to_obs
from crop.progress import pbar
from crop.schema import default_of
from crop.smoothing import stats
from crop.smoothing.smoothed import Estimate, SmoothedNetwork

__all__ = ["Certificate", "LoActSettings", "certify_estimate", "certify_state", "run_loact", "certified_ratio"]


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
    p_lower, p_upper = stats.normalise(est.lower[a1], v_min, v_max), stats.normalise(est.upper, v_min, v_max)
    with np.errstate(invalid="ignore"):
        gaps = 0.5 * sigma * (stats.Phi_inv(p_lower) - stats.Phi_inv(p_upper))
    gaps = np.where(np.isnan(gaps), -np.inf, gaps)  # inf − inf: bounds cannot separate the actions
    others = np.arange(len(gaps)) != a1
    certified = bool(np.all(gaps[others] > 0.0))
    radius = float(np.min(gaps[others])) if certified else 0.0
    radii = np.maximum(gaps, 0.0)
    radii[a1] = 0.0
    return Certificate(action=a1, certified=certified, radius=radius, radii=radii, estimate=est)


def certify_state(smoother: SmoothedNetwork, obs, index=None, alpha: float | None = None) -> Certificate:
    """Algorithm 1 for one state: fresh noise, clip, mean, bounds, radius.  ``alpha`` overrides the
    smoother's per-state miscoverage for this state (LoRe's ``alpha_mode: family`` schedule)."""
    est = smoother.estimate(obs, index=index) if alpha is None else smoother.estimate(obs, index=index, alpha=alpha)
    return certify_estimate(est, smoother.sigma, smoother.v_min, smoother.v_max)


@dataclass(frozen=True)
class LoActSettings:
    """How LoAct rolls the smoothed policy: ``episodes`` episodes of at most ``horizon`` steps, episode i reset
    with ``episode_seeds[i]``; for Atari the raw screens of episode 0 at steps start ≤ t < end
    (``frames_window``) when frames are asked for.  ``lockstep`` (default): the episodes run side by side and
    step t of every live episode is smoothed in one :meth:`SmoothedNetwork.estimate_batch` call (episodes in index
    order), so B episodes cost one launch per step; ``lockstep=False`` smooths one state per call, episode
    after episode.  ``pipeline`` (default: on a GPU): the episodes run as two halves, each in lockstep, whose
    calls alternate — while the card smooths one half's states, the other half's environments step on the CPU.
    All give every state m fresh draws; they consume the noise stream in different orders, so their numbers
    differ draw by draw, not in distribution."""

    episodes: int
    horizon: int
    episode_seeds: tuple
    frames_window: tuple[int, int] = default_of("environment.loact.frames")
    lockstep: bool = True
    pipeline: bool | None = None

    def __post_init__(self):
        if int(self.episodes) < 1 or int(self.horizon) < 0:
            raise ValueError(f"need episodes >= 1 and horizon >= 0, got {self.episodes}, {self.horizon}")
        if len(self.episode_seeds) < int(self.episodes):
            raise ValueError(f"{len(self.episode_seeds)} episode seeds for {self.episodes} episodes")
        for name, value in (("episodes", int(self.episodes)), ("horizon", int(self.horizon)),
                            ("episode_seeds", tuple(self.episode_seeds)),
                            ("frames_window", tuple(self.frames_window))):
            object.__setattr__(self, name, value)


def run_loact(env_id: str, smoother: SmoothedNetwork, settings: LoActSettings, *, profile: str | None = None,
              progress: bool | None = None, frames: list | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Roll the locally smoothed policy π̃ on clean observations and certify every step (Algorithm 1 per step),
    as ``settings`` (:class:`LoActSettings`) says.

    Returns (per-step table, per-episode table), rows ordered by (episode, step).  Uncertified steps have
    radius 0 and *count* in every mean radius (the published numbers skipped them).  For Atari, when
    ``frames`` is a list, the raw RGB screen of episode 0 at each step t of ``settings.frames_window`` is
    appended as (step, frame).
    """
    episodes, horizon = settings.episodes, settings.horizon
    bar = pbar(total=episodes * horizon, desc=f"LoAct σ={smoother.sigma:g}", progress=progress)
    groups = [list(range(episodes))] if settings.lockstep else [[ep] for ep in range(episodes)]
    pipeline = settings.pipeline
    if pipeline is None:
        pipeline = smoother.device.type == "cuda"
    rows, eps_rows = [], []
    for group in groups:
        halves = [group[:(len(group) + 1) // 2], group[(len(group) + 1) // 2:]] if pipeline and len(group) > 1 \
            else [group]
        r, e = _run_group(env_id, smoother, settings, group, halves, profile, bar, frames)
        rows += r
        eps_rows += e
    bar.close()
    rows.sort(key=lambda r: (r[cols.EPISODE], r[cols.STEP]))
    eps_rows.sort(key=lambda r: r[cols.EPISODE])
    return pd.DataFrame(rows), pd.DataFrame(eps_rows)


def _run_group(env_id, smoother, settings, group, halves, profile, bar, frames):
    """The episodes of ``group`` in lockstep: one batched smoothing call per time step for each of
    ``halves`` (one half: the whole group), the halves' calls alternating (submitted before the other
    half's environments step, so the device and the environments work at the same time)."""
    horizon, frames_window = settings.horizon, settings.frames_window
    envs = {ep: make_env(env_id, profile) for ep in group}
    obs = {ep: envs[ep].reset(seed=int(settings.episode_seeds[ep]))[0] for ep in group}
    ret = dict.fromkeys(group, 0.0)
    steps = dict.fromkeys(group, 0)
    rows = []

    def submit(live, t):
        if 0 in live and frames is not None and frames_window[0] <= t < frames_window[1]:
            ale = getattr(envs[0].unwrapped, "ale", None)
            if ale is not None:
                frames.append((t, ale.getScreenRGB().copy()))
        batch = np.stack([to_obs(obs[ep]) for ep in live])
        return smoother.submit(batch, indices=[f"episode {ep} step {t}" for ep in live])

    # per half: (live episodes, time step, submitted call or None when the half is done)
    state = [[list(h), 0, submit(list(h), 0) if horizon > 0 else None] for h in halves]
    while any(s[2] is not None for s in state):
        for s in state:
            live, t, pending = s
            if pending is None:
                continue
            ended = []
            for ep, est in zip(live, pending.result()):
                cert = certify_estimate(est, smoother.sigma, smoother.v_min, smoother.v_max)
                runner = np.where(np.arange(len(est.mean)) != cert.action, est.mean, -np.inf)
                obs[ep], reward, terminated, truncated, _ = envs[ep].step(cert.action)
                ret[ep] += float(reward)
                steps[ep] = t + 1
                rows.append({
                    cols.EPISODE: ep, cols.STEP: t, cols.ACTION: cert.action, cols.CERTIFIED: cert.certified,
                    cols.RADIUS: cert.radius, "reward": float(reward),
                    cols.SMOOTHED_TOP: float(est.mean[cert.action]), cols.SMOOTHED_RUNNER_UP: float(runner.max()),
                    cols.SMOOTHED_TOP_LOWER: float(est.lower[cert.action]),
                    cols.SMOOTHED_OTHERS_UPPER_MAX: float(np.max(np.delete(est.upper, cert.action))),
                })
                if terminated or truncated:
                    ended.append(ep)
                    bar.update(horizon - t)   # this step and the ones it will never take
                else:
                    bar.update(1)
            live = [ep for ep in live if ep not in ended]
            s[0], s[1] = live, t + 1
            s[2] = submit(live, t + 1) if live and t + 1 < horizon else None
    eps_rows, of_episode = [], {ep: [] for ep in group}
    for r in rows:   # each episode's rows in step order, in one pass (a filter per episode is quadratic)
        of_episode[r[cols.EPISODE]].append(r)
    for ep in group:
        radii = np.array([r[cols.RADIUS] for r in of_episode[ep]])
        eps_rows.append({cols.EPISODE: ep, cols.RETURN: ret[ep], cols.STEPS: steps[ep],
                         "mean_radius": float(radii.mean()),
                         "certified_fraction": float(np.mean([r[cols.CERTIFIED] for r in of_episode[ep]]))})
        envs[ep].close()
    return rows, eps_rows


def certified_ratio(steps: pd.DataFrame, r_grid) -> pd.DataFrame:
    """η_r = (1/H) Σ_t 1{certified_t and r_t ≥ r} per episode (Section 6.1), H the episode's length."""
    out = []
    for ep, g in steps.groupby(cols.EPISODE):
        rad = np.where(g[cols.CERTIFIED].to_numpy(bool), g[cols.RADIUS].to_numpy(float), -np.inf)
        for r in r_grid:
            out.append({cols.R: float(r), cols.EPISODE: int(ep), cols.ETA: float(np.mean(rad >= r))})
    return pd.DataFrame(out)
