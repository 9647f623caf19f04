"""Scalar metrics of one run, by name: what the tables print and what a reference table is compared with.

A *metric* is one number per (env, algo, σ) — or per (env, algo, σ, ε) for the reward bounds and the
attacks.  The names are those of the reference CSV (``env, algo, sigma, metric, eps, value``) read by
``crop audit --reference``:

=====================  ===  ===========================================================================
metric                 ε    value
=====================  ===  ===========================================================================
mean_radius            —    LoAct: mean certified radius over every step of every episode (Theorem 1;
                            uncertified steps count as 0 — this project's headline)
mean_radius_certified  —    LoAct: mean certified radius over the certified steps only (the paper's and
                            the CROP leaderboard's convention); NaN when no step is certified
certified_fraction     —    LoAct: share of steps certified (radius > 0)
benign_return          —    LoAct: mean return of the smoothed policy π̃ over its clean episodes
expectation_bound      ε    GRe: expectation bound J̲_E (Theorem 2)
percentile_bound       ε    GRe: percentile bound J̲_p at p = 0.5, the paper's (Theorem 3);
                            ``percentile_bound_p<P>`` (e.g. ``percentile_bound_p0.9``) for another p
lore_bound             ε    LoRe: absolute lower bound J̲ (Theorem 4, Algorithm 3) from LoAct
                            episode 0's initial state
pgd_global_mean        ε    mean return of the σ-randomized policy under global ℓ2 PGD
pgd_global_median      ε    median of the same returns
pgd_local_return       ε    lowest return of π̃ under local PGD from LoRe's initial state
=====================  ===  ===========================================================================

The two averaging conventions of a mean radius (:data:`CONVENTIONS`, :func:`mean_radius`) differ only in
what an uncertified step contributes: radius 0 to a mean over all steps ("uncertified = 0", the headline:
a policy that certifies 1 % of its steps at radius 0.1 has mean radius 0.001), or nothing ("certified steps
only", the paper's: the same policy has mean radius 0.1).  Per-step curves (:func:`per_step_mean_radius`)
average, at step t, over the episodes still running at t, in either convention.

A metric is *unavailable* (``None``) when the run did not compute it — an ε off the run's grid, or beyond
LoRe's searched range; it is NaN when the run computed "no value" (a percentile bound no order statistic
certifies).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from crop import columns as cols
from crop.certify.lore import lore_bound_at
from crop.io import meta_path, read_json
from crop.report.clips import clip_text, reward_clips
from crop.report.intervals import benign_return_range
from crop.report.records import read_table
from crop.workflow.layout import (
    ACTION_TARGET,
    FRAMES_FILE,
    REPLICATE_PREFIX,
    RUN_FILES,
    absent_skippable,
    replicate_of,
    run_files,
    run_target,
)

__all__ = ["load_runs", "read_lore_meta", "RETURN_METRICS",
           "metric_clip", "spec_fact",
           "REPLICATE_TABLES", "parse_run", "METRICS", "EPS_METRICS", "metric_value",
           "is_metric", "metric_has_eps", "lore_valid_until", "CONVENTIONS", "mean_radius", "per_step_mean_radius"]

# The two averaging conventions of a mean certified radius: key -> what a reader is told.
CONVENTIONS = {
    "uncertified_zero": "uncertified = 0",
    "certified_only": "certified steps only",
}

METRICS = {
    "mean_radius": "LoAct mean certified radius (uncertified steps count as 0)",
    "mean_radius_certified": "LoAct mean certified radius over certified steps only (the paper's convention)",
    "certified_fraction": "LoAct share of certified steps",
    "benign_return": "mean return of the smoothed policy over LoAct's clean episodes",
    "expectation_bound": "GRe expectation bound J_E at eps (Theorem 2)",
    "percentile_bound": "GRe percentile bound J_p, p = 0.5, at eps (Theorem 3)",
    "lore_bound": "LoRe absolute lower bound J at eps (Theorem 4)",
    "pgd_global_mean": "mean return under global PGD at eps",
    "pgd_global_median": "median return under global PGD at eps",
    "pgd_local_return": "lowest return under local PGD from LoRe's initial state at eps",
}
EPS_METRICS = {"expectation_bound", "percentile_bound", "lore_bound", "pgd_global_mean", "pgd_global_median",
               "pgd_local_return"}
_PERCENTILE = re.compile(r"^percentile_bound_p(0?\.\d+|1(\.0*)?|0)$")


def spec_fact(env: str, fact: str, *args):
    """A fact of ``env``'s spec (an attribute, or a method called with ``args``); None when the id names no
    environment this process knows — an id read from a results folder never imports a module
    (:func:`crop.envs.env_spec` refuses ``module:Id`` ids the user's config did not give)."""
    from crop.envs import env_spec

    try:
        value = getattr(env_spec(env), fact)
        return value(*args) if args else value
    except (ValueError, KeyError):
        return None


def parse_run(run: str) -> tuple[str, str, str]:
    """(env, algo, sigma label) of a run folder ``ENV/ALGO/sigma-S`` (ENV may hold one ``/``, as
    ``ALE/Breakout-v5``), or of its replicate folder ``ENV/ALGO/sigma-S/rep-K``
    (:func:`crop.workflow.layout.replicate_of` tells which replicate)."""
    parts = Path(run).parts
    if parts and parts[-1].startswith(REPLICATE_PREFIX) and parts[-1][len(REPLICATE_PREFIX):].isdigit():
        parts = parts[:-1]
    if len(parts) not in (3, 4) or not parts[-1].startswith("sigma-"):
        raise ValueError(f"run {run!r} is not of the form ENV/ALGO/sigma-S[/rep-K]")
    return "/".join(parts[:-2]), parts[-2], parts[-1][len("sigma-"):]


def namespaced_env(first: str, second: str) -> bool:
    """Whether folders ``first/second`` are one namespaced environment id (``ALE/Breakout-v5``), whose run
    folders ``first/second/ALGO/sigma-S`` lie one level deeper than the others'."""
    from crop.envs import _registration

    return "/" not in first and _registration(f"{first}/{second}") is not None


def run_depth(run_dir) -> int:
    """How many folders a run folder path (ending in ENV/ALGO/sigma-S) spans: 4 for a namespaced ENV."""
    parts = Path(run_dir).parts
    return 4 if len(parts) >= 4 and namespaced_env(parts[-4], parts[-3]) else 3


def read_lore_meta(run_dir: Path) -> dict:
    """LoRe's meta file in a run folder (its settings and ``search`` record); {} when there is none."""
    meta = meta_path(Path(run_dir) / RUN_FILES["lore"])
    return read_json(meta) if meta.is_file() else {}


#: The metrics whose values are returns or bounds on returns, by the stage of
#: :data:`crop.report.clips.RETURN_STAGES` whose reward clip they are of (``percentile_bound_p<P>`` as
#: ``percentile_bound``).  LoAct's radii and certified fraction are not returns, and LoRe's bound and the local
#: attack's return are of the environment's own rewards.
RETURN_METRICS = {"benign_return": "loact", "expectation_bound": "gre", "percentile_bound": "gre",
                  "pgd_global_mean": "attack_global", "pgd_global_median": "attack_global"}


def metric_clip(run: dict, metric: str) -> tuple[float, float] | None:
    """The reward clip ``metric``'s value of ``run`` (a dict of :func:`load_runs`) is a return of; None where
    the rewards are the environment's own or the metric is no return (a radius, a fraction)."""
    stage = RETURN_METRICS.get("percentile_bound" if metric.startswith("percentile_bound") else metric)
    return (run.get("reward_clips") or {}).get(stage) if stage else None


def _one_clip(run_dir: Path, strict: bool, clips: dict | None = None) -> tuple[float, float] | None:
    """The reward clip all the run's return stages share (``clips``: its :func:`reward_clips`, read when not
    given); with ``strict`` (figures, tables) a run whose stages differ is refused: its bounds and returns are
    of different rewards and no figure may set them side by side (the audit, not strict, reports the
    comparisons untestable instead)."""
    clips = reward_clips(run_dir) if clips is None else clips
    if strict and len(set(clips.values())) > 1:
        from crop.report.integrity import IntegrityError

        raise IntegrityError(f"{run_dir}: its returns are of different rewards ("
                             + ", ".join(f"{k}: {clip_text([c]) or 'unclipped'}" for k, c in clips.items())
                             + "); rerun its stages with one rewards.clip")
    return next((c for c in clips.values() if c is not None), None)


#: The files of a replicate folder ``ENV/ALGO/sigma-S/rep-K`` that the report reads.
REPLICATE_TABLES = ("loact", "loact_episodes")


def _read_files(run_dir: Path, files: dict, required: bool) -> dict:
    data = {}
    for key, name in files.items():
        f = run_dir / name
        if not f.is_file():
            if required:
                raise FileNotFoundError(f"missing result file {f}")
            continue
        if name != FRAMES_FILE:  # frames.npz: read on demand by the Pong figure
            data[key] = read_json(f) if name.endswith(".json") else read_table(f)
    return data


def _per_step(data: dict) -> None:
    """A continuous-action agent's LoAct (one row per step and action dimension) as one row per step, as its
    certified_ratio.csv counts it (:func:`crop.certify.percentile.step_ratio`: certified when every dimension is, at
    the smallest radius over the dimensions), so that every radius, fraction and curve of the report is per
    step like a discrete agent's; the per-dimension table stays under ``loact_dims``."""
    if "loact" in data:
        from crop.certify.percentile import step_ratio

        data["loact_dims"] = data["loact"]
        data["loact"] = step_ratio(data["loact"])


def load_runs(results: Path, runs, *, partial: bool = False) -> dict:
    """Read the result files of ``runs``: {(env, algo, sigma_label): {name: DataFrame | dict}}, with
    ``lore_meta`` (:func:`read_lore_meta`), ``reward_clip`` (the clip its return stages share),
    ``reward_clips`` (per stage, :func:`reward_clips`), ``gre_settings`` and ``loact_settings`` (the settings
    their metadata record) and ``frames_path`` (``frames.npz``, not read here).  Replicate
    folders among ``runs`` (``ENV/ALGO/sigma-S/rep-K``, config ``replicates``) are read beside their run:
    ``replicates``, their :data:`REPLICATE_TABLES` in index order.

    By default (the figures and tables) every file of a run is required and integrity checked first, never
    plotting a truncated or edited intermediate; so are a replicate's tables, and a replicate without its run
    is an error.  With ``partial`` (the audit, which checks integrity itself) each run has the files it has
    (an absent stage is an absent key), and a replicate without its run's LoAct or its own tables is left
    out."""
    from crop.report.integrity import IntegrityError, check_integrity

    results = Path(results)
    out, replicates = {}, {}
    for run in sorted(runs, key=lambda r: bool(replicate_of(r))):  # the runs first, in their order
        d = results / run
        problems = [] if partial else check_integrity(d, only_present=bool(replicate_of(run)))
        if problems:
            raise IntegrityError("; ".join(f"{p['file']}: {p['problem']}" for p in problems))
        if replicate_of(run):
            found = _read_files(d, {k: RUN_FILES[k] for k in REPLICATE_TABLES}, required=not partial)
            if run_target(run) == ACTION_TARGET:
                _per_step(found)
            replicates.setdefault(parse_run(run), []).append((replicate_of(run), found))
            continue
        # a stage the run went without (its config's skip) is absent, as a continuous-action run's LoRe
        data = _read_files(d, run_files(run_target(run), absent_skippable(d)), required=not partial)
        if run_target(run) == ACTION_TARGET:
            _per_step(data)
        data["lore_meta"] = read_lore_meta(d)
        data["reward_clips"] = reward_clips(d)
        data["reward_clip"] = _one_clip(d, strict=not partial, clips=data["reward_clips"])
        data["frames_path"] = d / FRAMES_FILE
        gre_meta = meta_path(d / RUN_FILES["gre"])   # the reward facts GRe was given (an environment's own)
        data["gre_settings"] = (read_json(gre_meta).get("settings") or {}) if gre_meta.is_file() else {}
        loact_meta = meta_path(d / RUN_FILES["loact"])   # the horizon LoAct's episodes could reach
        data["loact_settings"] = (read_json(loact_meta).get("settings") or {}) if loact_meta.is_file() else {}
        out[parse_run(run)] = data
    for key, found in replicates.items():
        if key not in out and not partial:
            raise FileNotFoundError(f"replicates of {'/'.join(key)} without the run itself")
        if key in out and "loact" in out[key]:
            out[key]["replicates"] = [r for _, r in sorted(found, key=lambda kv: kv[0])
                                      if set(REPLICATE_TABLES) <= set(r)]
    for (env, _, _), data in out.items():   # [J_min, J_max] of the benign returns, replicates' episodes included
        if "loact_episodes" in data:
            episodes = pd.concat([data["loact_episodes"], *[r["loact_episodes"] for r in data.get("replicates", [])]])
            data["benign_range"] = benign_return_range(env, episodes, data["gre_settings"])
    return out


def is_metric(name: str) -> bool:
    return name in METRICS or bool(_PERCENTILE.match(name))


def metric_has_eps(name: str) -> bool:
    return name in EPS_METRICS or bool(_PERCENTILE.match(name))


def _close(a, b) -> np.ndarray:
    return np.isclose(np.asarray(a, dtype=float), float(b), rtol=1e-9, atol=1e-12)


def lore_valid_until(run: dict) -> float:
    v = ((run.get("lore_meta") or {}).get("search") or {}).get("valid_until_eps")
    return math.inf if v is None else float(v)


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown averaging convention {convention!r}; known: {sorted(CONVENTIONS)}")


def _radii(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(radius, certified) of LoAct's per-step table; an uncertified step's radius is 0 whatever is stored."""
    certified = steps[cols.CERTIFIED].astype(bool).to_numpy()
    return np.where(certified, steps[cols.RADIUS].to_numpy(dtype=float), 0.0), certified


def mean_radius(steps: pd.DataFrame, convention: str = "uncertified_zero") -> float:
    """Mean certified radius (Theorem 1) of LoAct's per-step table ``steps`` (columns ``episode``, ``step``,
    ``radius``, ``certified``).

    ``uncertified_zero`` (the headline): over every step of every episode, an uncertified step counting 0.
    ``certified_only`` (the paper's): the mean over time steps of the per-step curve the paper plots — at step
    t the mean radius over the episodes certified at t (0 at a step where none is, as the published curves
    show) — so a reproduction compares like for like with the leaderboard's numbers; NaN when no step of any
    episode is certified."""
    _check_convention(convention)
    radius, certified = _radii(steps)
    if convention == "uncertified_zero":
        return float(radius.mean()) if radius.size else math.nan
    if not certified.any():
        return math.nan
    per_step = pd.Series(np.where(certified, radius, np.nan)).groupby(steps[cols.STEP].to_numpy(int)).mean()
    return float(per_step.fillna(0.0).mean())


def per_step_mean_radius(steps: pd.DataFrame, convention: str = "uncertified_zero") -> pd.DataFrame:
    """Per time step t: the mean and standard deviation (ddof = 0) of the certified radius over the episodes
    still running at t (an episode that ended before t contributes nothing, not a 0), as the paper's Fig. 1.

    Columns ``mean``, ``std``, ``running`` (episodes that reached t) and ``averaged`` (episodes in the mean:
    all running ones for ``uncertified_zero``, those certified at t for ``certified_only``; the mean is NaN
    where that is 0); indexed by ``step``."""
    _check_convention(convention)
    radius, certified = _radii(steps)
    df = pd.DataFrame({cols.STEP: steps[cols.STEP].to_numpy(int), cols.RADIUS: radius, cols.CERTIFIED: certified})
    running = df.groupby(cols.STEP).size()
    used = df if convention == "uncertified_zero" else df[df[cols.CERTIFIED]]
    g = used.groupby(cols.STEP)[cols.RADIUS]
    out = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=0)}).reindex(running.index)
    out["running"] = running
    out["averaged"] = used.groupby(cols.STEP).size().reindex(running.index, fill_value=0)
    return out


def metric_value(run: dict, metric: str, eps: float | None = None) -> float | None:
    """``metric`` of one run (``run``: the DataFrames of :func:`load_runs`).

    Returns None when the run did not compute it (see the module docstring), NaN for "no value".
    """
    if not is_metric(metric):
        raise KeyError(f"unknown metric {metric!r}; known: {sorted(METRICS)} and percentile_bound_p<P>")
    if metric_has_eps(metric) and eps is None:
        raise ValueError(f"metric {metric} needs an eps")
    if metric == "mean_radius":
        return mean_radius(run["loact"], "uncertified_zero")
    if metric == "mean_radius_certified":
        return mean_radius(run["loact"], "certified_only")
    if metric == "certified_fraction":
        return float(run["loact"][cols.CERTIFIED].astype(bool).mean())
    if metric == "benign_return":
        return float(run["loact_episodes"][cols.RETURN].mean())
    eps = float(eps)
    if metric == "expectation_bound":
        g = run["gre"][_close(run["gre"][cols.EPS], eps)]
        return float(g[cols.EXPECTATION_BOUND].iloc[0]) if len(g) else None
    if metric.startswith("percentile_bound"):
        p = 0.5 if metric == "percentile_bound" else float(metric[len("percentile_bound_p"):])
        gre = run["gre"]
        g = gre[_close(gre[cols.EPS], eps) & _close(gre[cols.P], p)]
        if not len(g):
            return None
        v = g[cols.PERCENTILE_BOUND].iloc[0]
        return math.nan if pd.isna(v) else float(v)
    if metric in ("lore_bound", "pgd_local_return") and ("lore" if metric == "lore_bound" else "attack_local") \
            not in run:   # a continuous-action agent's run: no LoRe, no local attack (crop.workflow.layout.run_stages)
        return None
    if metric == "lore_bound":
        v = lore_bound_at(run["lore"], eps, lore_valid_until(run))
        return None if math.isnan(v) else float(v)
    if metric in ("pgd_global_mean", "pgd_global_median"):
        ag = run["attack_global"]
        r = ag[_close(ag[cols.EPS], eps)][cols.RETURN]
        if not len(r):
            return None
        return float(r.mean() if metric == "pgd_global_mean" else r.median())
    if metric == "pgd_local_return":
        al = run["attack_local"]
        r = al[_close(al[cols.EPS], eps) & al[cols.SAME_START_AS_LORE].astype(bool)][cols.RETURN]
        return float(r.min()) if len(r) else None
    raise AssertionError(metric)
