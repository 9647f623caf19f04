"""Compare reproduced results with a reference table, metric by metric, within tolerances.

Reference CSV (``#`` starts a comment line), one value per row::

    env,algo,sigma,metric,eps,value[,convention,source]
    CartPole-v0,StdTrain,0.1,benign_return,,200
    CartPole-v0,StdTrain,0.1,percentile_bound,0.005,180

``env`` is the environment id (``CartPole-v0``, ``highway-fast-v0``, ``PongNoFrameskip-v4``,
``FreewayNoFrameskip-v4``), ``algo`` an algorithm slug (``StdTrain``, ``SA-MDP-PGD``, …), ``metric`` one of
:data:`crop.report.metrics.METRICS` (or ``percentile_bound_p<P>``) or ``mean_radius_certified`` (below),
``eps`` the attack ε (absolute, not a multiple of σ) for the metrics that have one and empty for the others,
``value`` the reference number — empty meaning "no value" (e.g. no percentile bound certified).  Optional
columns: ``convention`` (a ``mean_radius`` row with convention ``certified_only`` is compared as
``mean_radius_certified``) and ``source`` (where the number comes from; carried into the report).

``--reference paper`` (config ``audit.reference: paper``) reads the paper's published numbers,
``crop/reference/crop-paper.csv`` (built by :mod:`crop.reference.build`).

Averaging conventions of the LoAct mean radius — the same on both sides of every comparison:

* ``mean_radius`` (this project's headline): the mean over every step of every episode, an uncertified step
  counting as radius 0;
* ``mean_radius_certified`` (the paper's): at each time step t the mean radius over the episodes whose step
  t was certified (0 when none was), then the mean of these per-step values over t — how the leaderboard's
  per-step curves (which drop uncertified steps) become one number per (env, algo, σ).

Verdicts, per row: **match** (agrees: the reference value lies in the reproduction's confidence interval —
:mod:`crop.report.intervals`, over replicates where the run has them, else over its episodes; a single point
for bounds and attacks — widened on each side by max(abs, rel·|reference|)), **differs** (with ``ratio`` =
reproduced / reference and ``outside``, the distance beyond the unwidened interval), **missing** (not in
the run: the run, or its stage, is absent, the ε is not on its grid, or beyond LoRe's searched range) and
**not_in_reference** (a value the run has that the reference lacks; listed, never a failure).  An empty
reference value matches only an empty (NaN) reproduced value.  The audit compares every stage a run has, so
a partial run (LoAct only, GRe only, …) is compared for what it computed.

A reference is untrusted input: a file that is not UTF-8, a value that is not a number, not finite or of
magnitude > 1e300 (:data:`ABSURD`), and every other malformed row is refused with one line naming the row
and column before any comparison (:class:`ReferenceError`).

Tolerances, per metric, each of ``abs`` and ``rel`` resolved separately, first found wins:
``--abs-tol`` / ``--rel-tol`` on the command line (all metrics) > the tolerances file's entry for the
metric (``percentile_bound_p<P>`` falls back to ``percentile_bound``, ``mean_radius_certified`` to
``mean_radius``) > its ``default`` entry > :data:`DEFAULT_TOLERANCES` for the metric >
``DEFAULT_TOLERANCES["default"]``.  The tolerances file is YAML or JSON::

    default: {abs: 0.0, rel: 0.05}
    mean_radius: {rel: 0.1}
    benign_return: {abs: 2.0}

The built-in defaults allow for the Monte-Carlo spread between reproductions with other seeds or hardware
(returns and bounds within one reward unit or 5 %, radii within 10 %, the certified fraction within 0.05);
to demand an exact reproduction (same seeds and platform give byte-identical files) pass
``--abs-tol 0 --rel-tol 1e-9``.
"""
from __future__ import annotations

import io
import math
import re
from pathlib import Path

import pandas as pd
import yaml

from crop import columns as cols
from crop.envs import ENV_SPECS
from crop.io import CappedError, ReceivedFileError, read_received_bytes, sha256_file
from crop.reference import resolve_reference
from crop.report.clips import clip_text
from crop.report.intervals import INTERVAL_METRICS, run_interval
from crop.report.metrics import is_metric as _is_project_metric
from crop.report.metrics import lore_valid_until, mean_radius, metric_clip, metric_has_eps, metric_value
from crop.schema import load_bounded_yaml, load_schema
from crop.workflow.config import ALGORITHMS

__all__ = ["ReferenceError", "DEFAULT_TOLERANCES", "REFERENCE_COLUMNS", "VERDICTS", "load_reference",
           "load_tolerances", "tolerance_for", "compare_reference", "reference_summary", "resolve_reference",
           "reference_metric_value", "mean_radius_certified", "is_reference_metric"]

REFERENCE_COLUMNS = ["env", "algo", "sigma", "metric", "eps", "value"]
OPTIONAL_COLUMNS = ["convention", "source"]
VERDICTS = ("match", "differs", "missing", "not_in_reference")
CERTIFIED_ONLY = "mean_radius_certified"
# Which stage's data a metric needs (a partial run without it has the row "missing").
_NEEDS = {"mean_radius": "loact", "certified_fraction": "loact", CERTIFIED_ONLY: "loact",
          "benign_return": "loact_episodes", "expectation_bound": "gre", "percentile_bound": "gre",
          "lore_bound": "lore", "pgd_global_mean": "attack_global", "pgd_global_median": "attack_global",
          "pgd_local_return": "attack_local"}

DEFAULT_TOLERANCES = {
    "default": {"abs": 0.0, "rel": 0.05},
    "mean_radius": {"abs": 0.0, "rel": 0.10},
    "certified_fraction": {"abs": 0.05, "rel": 0.0},
    "benign_return": {"abs": 1.0, "rel": 0.05},
    "expectation_bound": {"abs": 1.0, "rel": 0.05},
    "percentile_bound": {"abs": 1.0, "rel": 0.05},
    "lore_bound": {"abs": 1.0, "rel": 0.05},
    "pgd_global_mean": {"abs": 1.0, "rel": 0.10},
    "pgd_global_median": {"abs": 1.0, "rel": 0.10},
    "pgd_local_return": {"abs": 1.0, "rel": 0.10},
}


ABSURD = 1e300  # a reference value beyond this magnitude is refused (it would make any tolerance infinite)


class ReferenceError(CappedError):
    """A malformed reference table or tolerances file (one line, capped)."""


def is_reference_metric(name: str) -> bool:
    return name == CERTIFIED_ONLY or _is_project_metric(name)


def _family(metric: str) -> str:
    if metric.startswith("percentile_bound"):
        return "percentile_bound"
    return "mean_radius" if metric == CERTIFIED_ONLY else metric


def load_reference(path) -> pd.DataFrame:
    """Read and check a reference CSV (or ``"paper"``); raises :class:`ReferenceError` naming the first bad
    row.  Returns the columns env, algo, sigma, metric (a ``certified_only`` mean radius renamed to
    ``mean_radius_certified``), eps, value, convention, source."""
    path = resolve_reference(path)
    try:
        raw = read_received_bytes(path, kind="table")
        raw.decode("utf-8")
    except (OSError, ReceivedFileError) as exc:
        raise ReferenceError(f"{path}: cannot read the reference table: {exc}") from None
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ReferenceError(f"{path}: line {line}: not UTF-8 text (byte {exc.start}); a reference is a UTF-8 "
                             "CSV") from None
    try:
        df = pd.read_csv(io.BytesIO(raw), comment="#", dtype=str, skipinitialspace=True, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise ReferenceError(f"{path}: cannot read the reference table: {' '.join(str(exc).split())}") from None
    df.columns = [c.strip() for c in df.columns]
    missing = [c for c in REFERENCE_COLUMNS if c not in df.columns]
    if missing:
        raise ReferenceError(f"{path}: missing column(s) {missing}; a reference has columns {REFERENCE_COLUMNS}")
    for c in OPTIONAL_COLUMNS:
        if c not in df.columns:
            df[c] = ""
    df = df[REFERENCE_COLUMNS + OPTIONAL_COLUMNS].copy()
    df[OPTIONAL_COLUMNS] = df[OPTIONAL_COLUMNS].fillna("").astype(str)
    for c in ("env", "algo", "metric"):
        df[c] = df[c].astype(str).str.strip()
    for c in ("sigma", "eps", "value"):
        text = df[c].astype(str).str.strip()
        num = pd.to_numeric(text.where(text != "", None), errors="coerce").astype(float)
        for i, (t, v) in enumerate(zip(text, num)):
            where = f"{path}: data row {i + 1}, column {c!r}"
            if t == "":
                if c == "sigma":
                    raise ReferenceError(f"{where}: empty; sigma must be a number > 0")
                continue  # empty: no ε / no value
            if math.isnan(v):
                if c == "value" and t.lower() == "nan":
                    continue  # an explicit "no value"
                raise ReferenceError(f"{where}: {t!r} is not a number (empty allowed for eps/value)")
            if not math.isfinite(v) or abs(v) > ABSURD:
                raise ReferenceError(f"{where}: {t!r} is not a finite number of magnitude <= {ABSURD:g}")
        df[c] = num
    certified_only = (df["metric"] == "mean_radius") & (df["convention"].str.strip() == "certified_only")
    df.loc[certified_only, "metric"] = CERTIFIED_ONLY
    known_env, known_algo = set(ENV_SPECS), set(ALGORITHMS)
    defs = load_schema()["$defs"]
    for i, r in enumerate(df.itertuples(index=False)):
        where = f"{path}: data row {i + 1}"
        # the paper's names, or names of your own as a config writes them (your own reference table)
        if r.env not in known_env and not _registered_env(r.env, defs):
            raise ReferenceError(f"{where}: unknown env {r.env!r}; known: {sorted(ENV_SPECS)} or a registered "
                                 "Gymnasium id")
        if r.algo not in known_algo and not re.fullmatch(defs["label"]["pattern"], str(r.algo)):
            raise ReferenceError(f"{where}: unknown algo {r.algo!r}; known: {ALGORITHMS} or a label of your own")
        if not isinstance(r.metric, str) or not is_reference_metric(r.metric):
            raise ReferenceError(f"{where}: unknown metric {r.metric!r} (see crop.report.metrics.METRICS, "
                                 f"or {CERTIFIED_ONLY})")
        if not (r.sigma > 0):
            raise ReferenceError(f"{where}: sigma must be > 0, got {r.sigma}")
        has_eps = not math.isnan(r.eps)
        if metric_has_eps(r.metric) and not (has_eps and r.eps >= 0):
            raise ReferenceError(f"{where}: metric {r.metric} needs an eps >= 0")
        if not metric_has_eps(r.metric) and has_eps:
            raise ReferenceError(f"{where}: metric {r.metric} has no eps; leave the column empty")
    dup = df.index[df.duplicated(subset=["env", "algo", "sigma", "metric", "eps"])]
    if len(dup):
        raise ReferenceError(f"{path}: data row {dup[0] + 1} repeats an earlier (env, algo, sigma, metric, eps)")
    return df.reset_index(drop=True)


def _registered_env(env, defs: dict) -> bool:
    """Whether ``env`` is an environment id crop can make (a reference of your own may name yours)."""
    from crop.envs import UnknownEnvError, env_family

    if not isinstance(env, str) or not re.fullmatch(defs["env_id"]["pattern"], env):
        return False
    try:
        env_family(env)
    except UnknownEnvError:
        return False
    return True


def load_tolerances(path) -> dict:
    """Read a tolerances file (YAML or JSON): {metric or "default": {"abs": x, "rel": y}}."""
    path = Path(path)
    try:
        tol = load_bounded_yaml(read_received_bytes(path, kind="text").decode("utf-8"), str(path),
                                ReferenceError) or {}
    except UnicodeDecodeError as exc:
        raise ReferenceError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except (OSError, ReceivedFileError, yaml.YAMLError) as exc:
        raise ReferenceError(f"{path}: cannot read the tolerances: {exc}") from None
    if not isinstance(tol, dict):
        raise ReferenceError(f"{path}: tolerances must be a mapping of metric -> {{abs, rel}}")
    for name, entry in tol.items():
        if name != "default" and not is_reference_metric(str(name)):
            raise ReferenceError(f"{path}: unknown metric {name!r} (or 'default')")
        if not isinstance(entry, dict) or not entry or set(entry) - {"abs", "rel"}:
            raise ReferenceError(f"{path}: {name}: give a mapping with 'abs' and/or 'rel'")
        for k, v in entry.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v >= 0) or not v <= ABSURD:
                raise ReferenceError(f"{path}: {name}.{k}: must be a finite number >= 0, got {v!r}")
    return {str(k): {kk: float(vv) for kk, vv in v.items()} for k, v in tol.items()}


def tolerance_for(metric: str, file_tol: dict | None = None, abs_tol: float | None = None,
                  rel_tol: float | None = None) -> dict:
    """{"abs", "rel"} for ``metric`` by the precedence in the module docstring."""
    family = _family(metric)
    file_tol = file_tol or {}
    chain = [{"abs": abs_tol, "rel": rel_tol}, file_tol.get(metric, {}), file_tol.get(family, {}),
             file_tol.get("default", {}), DEFAULT_TOLERANCES.get(metric, {}), DEFAULT_TOLERANCES.get(family, {}),
             DEFAULT_TOLERANCES["default"]]
    out = {}
    for k in ("abs", "rel"):
        out[k] = next(float(src[k]) for src in chain if src.get(k) is not None)
    return out


def agreement(lo: float, hi: float, published: float, tol: dict) -> tuple[bool, float, float]:
    """The rule of agreement (docs/audit.md, "Agree or differ"), the one place it lives: a published value
    agrees when it lies inside the reproduction's interval [lo, hi] (the value itself where it has none)
    widened on each side by allowed = max(abs, rel·|published|) of the metric's tolerance ``tol``.
    Returns (agrees, how far outside [lo, hi] it lies, allowed)."""
    allowed = max(tol["abs"], tol["rel"] * abs(published))
    outside = max(lo - published, published - hi, 0.0)
    return outside <= allowed * (1 + 1e-12) + 1e-15, outside, allowed


def mean_radius_certified(steps: pd.DataFrame) -> float:
    """The paper's convention (:func:`crop.report.metrics.mean_radius`, ``certified_only``), with 0 for a run
    that certified no step (the published curves are 0 at such steps)."""
    v = mean_radius(steps, "certified_only")
    return 0.0 if math.isnan(v) and len(steps) else v


def reference_metric_value(run: dict, metric: str, eps: float | None = None) -> float | None:
    """:func:`crop.report.metrics.metric_value`, plus ``mean_radius_certified``; None when the run did not
    compute the value (its stage absent, or the ε off its grid)."""
    if _NEEDS[_family(metric)] not in run:
        return None
    if metric == CERTIFIED_ONLY:
        return mean_radius_certified(run["loact"])
    return metric_value(run, metric, eps)


def _norm(metric: str) -> str:
    """``percentile_bound_p0.5`` is ``percentile_bound``."""
    if metric.startswith("percentile_bound_p") and math.isclose(float(metric[len("percentile_bound_p"):]), 0.5):
        return "percentile_bound"
    return metric


def _eps_key(eps) -> float | None:
    return None if eps is None or (isinstance(eps, float) and math.isnan(eps)) else float(f"{float(eps):.9g}")


def run_rows(run: dict) -> list[tuple[str, float | None]]:
    """Every (metric, ε) a run has computed, for the rows the reference lacks."""
    out = []
    if "loact" in run:
        out += [("mean_radius", None), (CERTIFIED_ONLY, None), ("certified_fraction", None)]
    if "loact_episodes" in run:
        out.append(("benign_return", None))
    if "gre" in run:
        g = run["gre"]
        for e in sorted(g[cols.EPS].unique()):
            out.append(("expectation_bound", float(e)))
        for (p, e), _ in g.groupby([cols.P, cols.EPS]):
            out.append(("percentile_bound" if math.isclose(p, 0.5) else f"percentile_bound_p{p:g}", float(e)))
    if "lore" in run:
        vu = lore_valid_until(run)
        out += [("lore_bound", float(e)) for e in sorted(run["lore"][cols.EPS].unique()) if e < vu]
    if "attack_global" in run:
        for e in sorted(run["attack_global"][cols.EPS].unique()):
            out += [("pgd_global_mean", float(e)), ("pgd_global_median", float(e))]
    if "attack_local" in run:
        al = run["attack_local"]
        from_lore_start = al[al[cols.SAME_START_AS_LORE].astype(bool)]
        out += [("pgd_local_return", float(e)) for e in sorted(from_lore_start[cols.EPS].unique())]
    return out


def _find_run(data: dict, env: str, algo: str, sigma: float):
    for (e, a, lab), d in data.items():
        if e == env and a == algo and math.isclose(float(lab), sigma, rel_tol=1e-9, abs_tol=1e-15):
            return d
    return None


def _interval(run: dict, metric: str, level: float) -> dict | None:
    """The reproduced value's interval (:func:`crop.report.intervals.run_interval`) for the metrics that have
    one, None for the others."""
    if metric not in INTERVAL_METRICS or "loact" not in run or "loact_episodes" not in run:
        return None
    return run_interval(run, metric, level)


def compare_reference(ref: pd.DataFrame, data: dict, file_tol: dict | None = None, abs_tol: float | None = None,
                      rel_tol: float | None = None, level: float = 0.95) -> list[dict]:
    """One verdict per reference row (in the reference's order), then one ``not_in_reference`` row per value
    the runs have that the reference lacks; ``data`` as from :func:`crop.report.metrics.load_runs` (``partial``).

    The rule (docs/audit.md): a row *agrees* when the published value lies in the reproduction's interval at
    ``level`` (over replicates where the run has them, else over its episodes), widened on each side by the
    metric's tolerance max(abs, rel·|published|); a metric without an interval (bounds, attacks) has the
    one-point interval of its value.  Otherwise it *differs*, with ``ratio`` and ``outside`` (how far the
    published value lies beyond the unwidened interval; ``outside_halfwidths`` in units of its half-width)."""
    rows, seen = [], set()
    for r in ref.itertuples(index=False):
        tol = tolerance_for(r.metric, file_tol, abs_tol, rel_tol)
        eps = None if math.isnan(r.eps) else float(r.eps)
        ref_v = float(r.value)
        row = {"env": r.env, "algo": r.algo, "sigma": float(r.sigma), "metric": r.metric, "eps": eps,
               "reference": None if math.isnan(ref_v) else ref_v, "reproduced": None, "delta": None, "ratio": None,
               "abs_tol": tol["abs"], "rel_tol": tol["rel"], "allowed": None, "verdict": "missing", "note": "",
               "source": getattr(r, "source", "")}
        run = _find_run(data, r.env, r.algo, float(r.sigma))
        if run is None:
            row["note"] = "run not in the audited results (absent, or not audited for an integrity problem)"
            rows.append(row)
            continue
        seen.add((id(run), _norm(r.metric), _eps_key(eps)))
        stage = _NEEDS[_family(r.metric)]
        got = reference_metric_value(run, r.metric, eps)
        if got is None:
            row["note"] = (f"stage {stage.replace('_episodes', '')} not in this run" if stage not in run else
                           "eps not computed by this run (off its grid or beyond LoRe's searched range)")
            rows.append(row)
            continue
        iv = _interval(run, r.metric, level)
        if iv is not None and not math.isnan(iv["value"]):
            got = iv["value"]  # the mean over replicates where there are several (replicate 0 alone otherwise)
        row["reproduced"] = None if math.isnan(got) else got
        if iv is not None:
            row.update(interval_lo=None if math.isnan(iv["lo"]) else iv["lo"],
                       interval_hi=None if math.isnan(iv["hi"]) else iv["hi"], interval_method=iv["method"],
                       replicates=iv["replicates"], sd_replicates=None if math.isnan(iv["sd"]) else iv["sd"])
        if not math.isnan(ref_v) and not math.isfinite(ref_v):  # refused at load; never agrees
            row.update(verdict="differs", note="the reference value is not finite")
        elif math.isnan(ref_v) or math.isnan(got):
            same = math.isnan(ref_v) and math.isnan(got)
            row["verdict"] = "match" if same else "differs"
            row["note"] = "" if same else "one of the two has no value (e.g. no percentile bound certified)"
        else:
            delta = got - ref_v
            lo, hi = got, got
            if iv is not None and not (math.isnan(iv["lo"]) or math.isnan(iv["hi"])):
                lo, hi = min(lo, iv["lo"]), max(hi, iv["hi"])
            ok, outside, allowed = agreement(lo, hi, ref_v, tol)
            half = (hi - lo) / 2
            row.update(delta=delta, allowed=allowed, verdict="match" if ok else "differs",
                       ratio=got / ref_v if ref_v != 0 else None, outside=outside,
                       outside_halfwidths=outside / half if half > 0 else None)
        rows.append(_mark_clip(row, run))
    for (env, algo, lab), run in sorted(data.items()):
        for metric, eps in run_rows(run):
            if (id(run), _norm(metric), _eps_key(eps)) in seen:
                continue
            got = reference_metric_value(run, metric, eps)
            row = {"env": env, "algo": algo, "sigma": float(lab), "metric": metric, "eps": eps,
                   "reference": None, "reproduced": None if got is None or math.isnan(got) else got,
                   "delta": None, "ratio": None, "abs_tol": None, "rel_tol": None, "allowed": None,
                   "verdict": "not_in_reference", "note": "the reference has no such value", "source": ""}
            iv = _interval(run, metric, level)
            if iv is not None:
                row.update(reproduced=None if math.isnan(iv["value"]) else iv["value"],
                           interval_lo=None if math.isnan(iv["lo"]) else iv["lo"],
                           interval_hi=None if math.isnan(iv["hi"]) else iv["hi"], interval_method=iv["method"],
                           replicates=iv["replicates"], sd_replicates=None if math.isnan(iv["sd"]) else iv["sd"])
            rows.append(_mark_clip(row, run))
    return rows


def _mark_clip(row: dict, run: dict) -> dict:
    """A row whose reproduced value is a return (or a bound on one) of clipped rewards (``rewards.clip``) says
    so, in ``reward_clip`` and its note: the reference's number is then set beside the return of the clipped
    rewards, not the environment's own.  Radii and certified fractions are no returns and are never marked."""
    clip = metric_clip(run, row["metric"])
    if clip is not None:
        text = f"reproduced from {clip_text([clip])} (rewards.clip), not the environment's own rewards"
        row.update(reward_clip=list(clip), note=f"{row['note']}; {text}" if row["note"] else text)
    return row


def reference_summary(path, rows: list[dict], file_tol: dict | None, tol_path, abs_tol, rel_tol) -> dict:
    """The audit's ``reference`` block.  ``counts`` has the verdicts about reference rows (match, differs,
    missing); ``not_in_reference`` counts the run's values the reference lacks."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("match", "differs", "missing")}
    metrics = sorted({r["metric"] for r in rows if r["verdict"] != "not_in_reference"})
    file = resolve_reference(path)
    return {"file": str(file), "name": str(path), "sha256": sha256_file(file),
            "tolerances_file": None if tol_path is None else str(tol_path),
            "tolerances": {m: tolerance_for(m, file_tol, abs_tol, rel_tol) for m in metrics},
            "counts": counts, "not_in_reference": sum(r["verdict"] == "not_in_reference" for r in rows),
            "rows": len(rows), "comparisons": rows}
