"""Compare reproduced results with a reference table, metric by metric, within tolerances.

Reference CSV (``#`` starts a comment line), one value per row::

    env,algo,sigma,metric,eps,value
    CartPole-v0,StdTrain,0.1,benign_return,,200
    CartPole-v0,StdTrain,0.1,percentile_bound,0.005,180

``env`` is the environment id (``CartPole-v0``, ``highway-fast-v0``, ``PongNoFrameskip-v4``,
``FreewayNoFrameskip-v4``), ``algo`` an algorithm slug (``StdTrain``, ``SA-MDP-PGD``, …), ``metric`` one of
:data:`crop.report.metrics.METRICS` (or ``percentile_bound_p<P>``), ``eps`` the attack ε (absolute, not a
multiple of σ) for the metrics that have one and empty for the others, ``value`` the reference number —
empty meaning "no value" (e.g. no percentile bound certified).

Verdicts: **match** (|reproduced − reference| ≤ max(abs, rel·|reference|)), **differs**, **missing** (the
results folder has no such value: the run is absent, the ε is not on its grid, or beyond LoRe's searched
range).  An empty reference value matches only an empty (NaN) reproduced value.

Tolerances, per metric, each of ``abs`` and ``rel`` resolved separately, first found wins:
``--abs-tol`` / ``--rel-tol`` on the command line (all metrics) > the tolerances file's entry for the
metric (``percentile_bound_p<P>`` falls back to ``percentile_bound``) > its ``default`` entry >
:data:`DEFAULT_TOLERANCES` for the metric > ``DEFAULT_TOLERANCES["default"]``.  The tolerances file is YAML
or JSON::

    default: {abs: 0.0, rel: 0.05}
    mean_radius: {rel: 0.1}
    benign_return: {abs: 2.0}

The built-in defaults allow for the Monte-Carlo spread between reproductions with other seeds or hardware
(returns and bounds within one reward unit or 5 %, radii within 10 %, the certified fraction within 0.05);
to demand an exact reproduction (same seeds and platform give byte-identical files) pass
``--abs-tol 0 --rel-tol 1e-9``.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import yaml

from crop.config import ALGORITHMS
from crop.envs import ENV_SPECS
from crop.io import sha256_file
from crop.report.metrics import is_metric, metric_has_eps, metric_value

__all__ = ["ReferenceError", "DEFAULT_TOLERANCES", "REFERENCE_COLUMNS", "load_reference", "load_tolerances",
           "tolerance_for", "compare_reference", "reference_summary"]

REFERENCE_COLUMNS = ["env", "algo", "sigma", "metric", "eps", "value"]

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


class ReferenceError(ValueError):
    """A malformed reference table or tolerances file."""


def load_reference(path) -> pd.DataFrame:
    """Read and check a reference CSV; raises :class:`ReferenceError` naming the first bad row."""
    path = Path(path)
    try:
        df = pd.read_csv(path, comment="#", dtype={"env": str, "algo": str, "metric": str},
                         skipinitialspace=True)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ReferenceError(f"{path}: cannot read the reference table: {exc}") from None
    df.columns = [c.strip() for c in df.columns]
    missing = [c for c in REFERENCE_COLUMNS if c not in df.columns]
    if missing:
        raise ReferenceError(f"{path}: missing column(s) {missing}; a reference has columns {REFERENCE_COLUMNS}")
    df = df[REFERENCE_COLUMNS].copy()
    for c in ("sigma", "eps", "value"):
        try:
            df[c] = pd.to_numeric(df[c], errors="raise").astype(float)
        except (ValueError, TypeError):
            raise ReferenceError(f"{path}: column {c!r} must be numeric (empty allowed for eps/value)") from None
    for i, r in df.iterrows():
        where = f"{path}: data row {i + 1}"
        if r["env"] not in ENV_SPECS:
            raise ReferenceError(f"{where}: unknown env {r['env']!r}; known: {sorted(ENV_SPECS)}")
        if r["algo"] not in ALGORITHMS:
            raise ReferenceError(f"{where}: unknown algo {r['algo']!r}; known: {ALGORITHMS}")
        if not isinstance(r["metric"], str) or not is_metric(r["metric"]):
            raise ReferenceError(f"{where}: unknown metric {r['metric']!r} (see crop.report.metrics.METRICS)")
        if not (r["sigma"] > 0):
            raise ReferenceError(f"{where}: sigma must be > 0, got {r['sigma']}")
        has_eps = not math.isnan(r["eps"])
        if metric_has_eps(r["metric"]) and not (has_eps and r["eps"] >= 0):
            raise ReferenceError(f"{where}: metric {r['metric']} needs an eps >= 0")
        if not metric_has_eps(r["metric"]) and has_eps:
            raise ReferenceError(f"{where}: metric {r['metric']} has no eps; leave the column empty")
    dup = df.index[df.duplicated(subset=["env", "algo", "sigma", "metric", "eps"])]
    if len(dup):
        raise ReferenceError(f"{path}: data row {dup[0] + 1} repeats an earlier (env, algo, sigma, metric, eps)")
    return df.reset_index(drop=True)


def load_tolerances(path) -> dict:
    """Read a tolerances file (YAML or JSON): {metric or "default": {"abs": x, "rel": y}}."""
    path = Path(path)
    try:
        tol = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ReferenceError(f"{path}: cannot read the tolerances: {exc}") from None
    if not isinstance(tol, dict):
        raise ReferenceError(f"{path}: tolerances must be a mapping of metric -> {{abs, rel}}")
    for name, entry in tol.items():
        if name != "default" and not is_metric(str(name)):
            raise ReferenceError(f"{path}: unknown metric {name!r} (or 'default')")
        if not isinstance(entry, dict) or not entry or set(entry) - {"abs", "rel"}:
            raise ReferenceError(f"{path}: {name}: give a mapping with 'abs' and/or 'rel'")
        for k, v in entry.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v >= 0) or math.isinf(v):
                raise ReferenceError(f"{path}: {name}.{k}: must be a finite number >= 0, got {v!r}")
    return {str(k): {kk: float(vv) for kk, vv in v.items()} for k, v in tol.items()}


def tolerance_for(metric: str, file_tol: dict | None = None, abs_tol: float | None = None,
                  rel_tol: float | None = None) -> dict:
    """{"abs", "rel"} for ``metric`` by the precedence in the module docstring."""
    family = "percentile_bound" if metric.startswith("percentile_bound") else metric
    file_tol = file_tol or {}
    chain = [{"abs": abs_tol, "rel": rel_tol}, file_tol.get(metric, {}), file_tol.get(family, {}),
             file_tol.get("default", {}), DEFAULT_TOLERANCES.get(metric, {}), DEFAULT_TOLERANCES.get(family, {}),
             DEFAULT_TOLERANCES["default"]]
    out = {}
    for k in ("abs", "rel"):
        out[k] = next(float(src[k]) for src in chain if src.get(k) is not None)
    return out


def _find_run(data: dict, env: str, algo: str, sigma: float):
    for (e, a, lab), d in data.items():
        if e == env and a == algo and math.isclose(float(lab), sigma, rel_tol=1e-9, abs_tol=1e-15):
            return d
    return None


def compare_reference(ref: pd.DataFrame, data: dict, file_tol: dict | None = None, abs_tol: float | None = None,
                      rel_tol: float | None = None) -> list[dict]:
    """One verdict per reference row; ``data`` as from :func:`crop.report.metrics.load_runs`."""
    rows = []
    for r in ref.itertuples(index=False):
        tol = tolerance_for(r.metric, file_tol, abs_tol, rel_tol)
        eps = None if math.isnan(r.eps) else float(r.eps)
        ref_v = float(r.value)
        row = {"env": r.env, "algo": r.algo, "sigma": float(r.sigma), "metric": r.metric, "eps": eps,
               "reference": None if math.isnan(ref_v) else ref_v, "reproduced": None, "delta": None,
               "abs_tol": tol["abs"], "rel_tol": tol["rel"], "allowed": None, "verdict": "missing", "note": ""}
        run = _find_run(data, r.env, r.algo, float(r.sigma))
        if run is None:
            row["note"] = "run not in the audited results (absent, or not audited for an integrity problem)"
            rows.append(row)
            continue
        got = metric_value(run, r.metric, eps)
        if got is None:
            row["note"] = "eps not computed by this run (off its grid or beyond LoRe's searched range)"
            rows.append(row)
            continue
        row["reproduced"] = None if math.isnan(got) else got
        if math.isnan(ref_v) or math.isnan(got):
            same = math.isnan(ref_v) and math.isnan(got)
            row["verdict"] = "match" if same else "differs"
            row["note"] = "" if same else "one of the two has no value (e.g. no percentile bound certified)"
        else:
            allowed = max(tol["abs"], tol["rel"] * abs(ref_v))
            delta = got - ref_v
            ok = abs(delta) <= allowed * (1 + 1e-12)
            row.update(delta=delta, allowed=allowed, verdict="match" if ok else "differs")
        rows.append(row)
    return rows


def reference_summary(path, rows: list[dict], file_tol: dict | None, tol_path, abs_tol, rel_tol) -> dict:
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("match", "differs", "missing")}
    metrics = sorted({r["metric"] for r in rows})
    return {"file": str(path), "sha256": sha256_file(path),
            "tolerances_file": None if tol_path is None else str(tol_path),
            "tolerances": {m: tolerance_for(m, file_tol, abs_tol, rel_tol) for m in metrics},
            "counts": counts, "rows": len(rows), "comparisons": rows}
