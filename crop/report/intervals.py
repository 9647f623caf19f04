"""Confidence intervals of the reproduced LoAct numbers: how uncertain a run's mean radius, certified fraction
and benign return are, so that a table shows "value [lo, hi]" and a reproduction verdict can follow from it.

Two sources of spread, two intervals:

* **over episodes** (one run): the delete-one-episode **jackknife** standard error with a **Student-t**
  quantile on k − 1 degrees of freedom (k episodes): ``θ̂ ± t_{k−1, 1−a/2} · se_jack``, with
  ``se_jack² = (k−1)/k · Σ_i (θ̂_(i) − θ̄_(·))²`` (Efron & Stein 1981; Efron & Tibshirani 1993, ch. 11).
  The episodes are the independent units (steps within an episode are not), and every statistic here is a
  smooth function of per-episode sums, which the jackknife handles without resampling (deterministic, no
  seed).  For the plain mean of per-episode values (the benign return; the mean radius and certified fraction
  when every episode has the same length) the jackknife standard error is exactly s/√k, so the interval is
  the textbook t-interval, exact for normal episodes and close to nominal otherwise;
* **over replicates** (config ``replicates: N ≥ 2``): the t-interval over the N replicates' values
  (each replicate has its own V range, initial states and noise, so this interval also holds the V-range
  procedure's own variance): ``mean ± t_{N−1, 1−a/2} · sd/√N``.  The value shown is then the mean over
  replicates and ``sd`` their standard deviation (ddof = 1).

An interval is clipped to the metric's natural range (radii ≥ 0, a fraction in [0, 1], a benign return in
[J_min, J_max], the returns possible over LoAct's episodes: :func:`benign_return_range`); the true value lies
in that range, so clipping only adds coverage.  With one episode (or one replicate) there is no interval (NaN).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as st

from crop import columns as cols

__all__ = ["INTERVAL_METRICS", "METHOD_EPISODES", "METHOD_REPLICATES", "t_interval", "jackknife_interval",
           "episode_interval", "replicate_interval", "run_interval", "benign_return_range", "DEFAULT_LEVEL"]

DEFAULT_LEVEL = 0.95
INTERVAL_METRICS = ("mean_radius", "mean_radius_certified", "certified_fraction", "benign_return")
METHOD_EPISODES = "jackknife-t over episodes"
METHOD_REPLICATES = "t over replicates"
_RANGE = {"mean_radius": (0.0, math.inf), "mean_radius_certified": (0.0, math.inf),
          "certified_fraction": (0.0, 1.0), "benign_return": (-math.inf, math.inf)}


def t_interval(values, level: float = DEFAULT_LEVEL) -> tuple[float, float, float]:
    """(mean, lo, hi) of the Student-t interval for the mean of independent ``values``."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = float(st.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half


def jackknife_interval(estimate: float, leave_one_out, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """(lo, hi): ``estimate`` ± t_{k−1}·se_jack from the k leave-one-out estimates."""
    loo = np.asarray(leave_one_out, dtype=float)
    k = loo.size
    if k < 2 or math.isnan(estimate) or np.isnan(loo).any():
        return math.nan, math.nan
    se = math.sqrt((k - 1) / k * float(((loo - loo.mean()) ** 2).sum()))
    half = float(st.t.ppf(0.5 + level / 2, k - 1)) * se
    return estimate - half, estimate + half


def benign_return_range(env: str, episodes: pd.DataFrame, settings: dict | None = None) -> tuple[float, float]:
    """[J_min, J_max] that every benign (undiscounted) return of LoAct's ``episodes`` lies in: the environment's
    reward range over the longest episode's steps (crop.envs EnvSpec.return_range, γ = 1; an episode of fewer
    steps lies in it too, the range growing with the horizon).  The reward facts are the environment's own, else
    those ``settings`` give (the run's GRe settings: reward_range, return_range); (-inf, inf) where neither
    knows them."""
    from crop.envs import MissingFactError, UnknownEnvError, env_spec

    settings = settings or {}
    rewards = {"range": settings.get("reward_range"), "return_range": settings.get("return_range")}
    steps = episodes[cols.STEPS] if cols.STEPS in episodes else None
    if steps is None or not len(steps):
        return -math.inf, math.inf
    try:
        return env_spec(env, rewards).return_range(int(steps.max()), 1.0)
    except (MissingFactError, UnknownEnvError, ValueError):
        return -math.inf, math.inf


def _clip(metric: str, lo: float, hi: float, run: dict | None = None, value: float = math.nan) -> tuple[float, float]:
    a, b = _RANGE[metric]
    if metric == "benign_return":
        j_min, j_max = (run or {}).get("benign_range", (a, b))
        if not value < j_min and not value > j_max:   # a mean outside it: the reward facts are false, no clip
            a, b = j_min, j_max
    return (lo if math.isnan(lo) else max(lo, a)), (hi if math.isnan(hi) else min(hi, b))


def _step_arrays(steps: pd.DataFrame):
    """Per (episode, step) matrices: radius (0 where uncertified), certified, present."""
    ep = pd.factorize(steps[cols.EPISODE], sort=True)[0]
    t = steps[cols.STEP].to_numpy(int)
    t = t - t.min() if t.size else t
    k, n_t = (ep.max() + 1, t.max() + 1) if t.size else (0, 0)
    cert = steps[cols.CERTIFIED].astype(bool).to_numpy()
    rad = np.where(cert, steps[cols.RADIUS].to_numpy(float), 0.0)
    r, c, p = np.zeros((k, n_t)), np.zeros((k, n_t)), np.zeros((k, n_t), bool)
    r[ep, t], c[ep, t], p[ep, t] = rad, cert, True
    return r, c, p


def _certified_only(r, c, p, keep) -> float:
    """The paper's convention (:func:`crop.report.metrics.mean_radius`, certified_only) on episodes ``keep``."""
    s, n, present = r[keep].sum(0), c[keep].sum(0), p[keep].any(0)
    if not n.any():
        return math.nan
    per = np.where(n > 0, s / np.maximum(n, 1), 0.0)
    return float(per[present].mean())


def episode_interval(run: dict, metric: str, level: float = DEFAULT_LEVEL) -> tuple[float, float, float]:
    """(value, lo, hi) of ``metric`` (one of :data:`INTERVAL_METRICS`) of one run, the interval by the
    jackknife over its episodes (module docstring).  ``run`` holds ``loact`` (per step) and, for the benign
    return, ``loact_episodes`` and ``benign_range`` ([J_min, J_max], :func:`benign_return_range`; none: not
    clipped)."""
    if metric == "benign_return":
        x = run["loact_episodes"][cols.RETURN].to_numpy(float)
        v, lo, hi = t_interval(x, level)  # the jackknife of a mean is the t-interval
        return (v, *_clip(metric, lo, hi, run, v))
    r, c, p = _step_arrays(run["loact"])
    k = r.shape[0]
    if metric == "certified_fraction":
        num, den = c.sum(1), p.sum(1)
    elif metric == "mean_radius":
        num, den = r.sum(1), p.sum(1)
    elif metric == "mean_radius_certified":
        full = np.ones(k, bool)
        v = _certified_only(r, c, p, full)
        loo = [_certified_only(r, c, p, np.arange(k) != i) for i in range(k)]
        if not math.isnan(v):  # an episode set that certifies nothing counts 0, as the leaderboard's curves do
            loo = [0.0 if math.isnan(x) else x for x in loo]
        return (v, *_clip(metric, *jackknife_interval(v, loo, level)))
    else:
        raise KeyError(f"no interval for metric {metric!r}; known: {INTERVAL_METRICS}")
    if den.sum() == 0:
        return math.nan, math.nan, math.nan
    v = float(num.sum() / den.sum())
    loo = (num.sum() - num) / np.maximum(den.sum() - den, 1)
    return (v, *_clip(metric, *jackknife_interval(v, loo, level)))


def replicate_interval(values, metric: str, level: float = DEFAULT_LEVEL, run: dict | None = None) -> dict:
    """{value (the mean), lo, hi, sd, replicates} of one metric over replicates (``run``: where the benign
    return's range is, :func:`episode_interval`)."""
    x = np.asarray(values, dtype=float)
    v, lo, hi = t_interval(x, level)
    lo, hi = _clip(metric, lo, hi, run, v)
    sd = float(np.nanstd(x, ddof=1)) if np.sum(~np.isnan(x)) > 1 else math.nan
    return {"value": v, "lo": lo, "hi": hi, "sd": sd, "replicates": int(np.sum(~np.isnan(x)))}


def run_interval(run: dict, metric: str, level: float = DEFAULT_LEVEL) -> dict:
    """{value, lo, hi, sd, replicates, method} of ``metric`` for one run: over replicates when the run has
    more than one (``run["replicates"]``: the other replicates' data, replicate 0 being ``run`` itself), else
    over its episodes."""
    reps = run.get("replicates") or []
    if reps:
        vals = [episode_interval(d, metric, level)[0] for d in [run, *reps]]
        return {**replicate_interval(vals, metric, level, run), "method": METHOD_REPLICATES}
    v, lo, hi = episode_interval(run, metric, level)
    return {"value": v, "lo": lo, "hi": hi, "sd": math.nan, "replicates": 1, "method": METHOD_EPISODES}
