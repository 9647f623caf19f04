"""The tables, per environment, from the runs' result files (reads results only).

Each table is written as CSV (stable column keys for scripts), Markdown (a caption and reader's column names)
and LaTeX (booktabs, for papers); an empty cell is ``—`` in Markdown, ``--`` in LaTeX.  The names are those
of :data:`crop.workflow.layout.TABLES`:

  {Env}_mean_radius            mean certified radius, algorithm × σ, uncertified steps count as 0 (headline)
  {Env}_mean_radius_certified  the same over certified steps only (the paper's and the leaderboard's mean)
  {Env}_certified_fraction     share of LoAct's steps certified, algorithm × σ
  {Env}_benign_return          mean benign return of π̃, algorithm × σ
  {Env}_reward_bounds          J̲_E, J̲_p (p = 50 %), J̲ and the PGD returns at the chosen ε
  {Env}_tightness              PGD return − bound for each bound (≥ 0 when sound; small when tight)

The algorithm × σ tables show each value with its 95 % confidence interval (:mod:`crop.report.intervals`):
one cell "value [lo, hi]" in Markdown and LaTeX, columns ``sigma=S lo``/``hi``/``sd`` beside it in the CSV.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from crop import columns as cols
from crop.envs import env_spec
from crop.io import atomic_write_text
from crop.report.clips import clip_text
from crop.report.intervals import INTERVAL_METRICS, METHOD_EPISODES, METHOD_REPLICATES, run_interval
from crop.report.markdown import pipe_table, printable
from crop.report.metrics import CONVENTIONS, metric_value
from crop.report.style import algo_label, register_auto_choices, series_key, series_order
from crop.workflow.layout import ACTION_TARGET, TABLES, series_label, split_run_algo, table_files

__all__ = ["env_tables", "env_table_texts", "write_env_tables", "latex_table", "markdown_table", "TIGHTNESS_COLUMNS",
           "INTERVAL_COLUMNS"]


# Column keys of the CSV tables (stable names for scripts) and what a reader is shown for them in Markdown and
# LaTeX.  ``sigma=S`` columns are the σ of an algorithm × σ table.
TIGHTNESS_COLUMNS = {"pgd_mean_minus_expectation_bound": ("pgd_global_mean", "expectation_bound"),
                     "pgd_median_minus_percentile_bound": ("pgd_global_median", "percentile_bound_p50"),
                     "pgd_local_minus_lore_bound": ("pgd_local_return", "lore_bound")}
_MD_HEADERS = {
    "algo": "algorithm", "sigma": "σ", "eps": "ε",
    "expectation_bound": "expectation bound J̲ᴇ", "percentile_bound_p50": "percentile bound J̲ₚ (p = 50 %)",
    "lore_bound": "LoRe bound J̲", "pgd_global_mean": "PGD global: mean return",
    "pgd_global_median": "PGD global: median return", "pgd_local_return": "PGD local: return from LoRe's s₀",
    "pgd_mean_minus_expectation_bound": "PGD mean − J̲ᴇ",
    "pgd_median_minus_percentile_bound": "PGD median − J̲ₚ",
    "pgd_local_minus_lore_bound": "PGD local − J̲", "lore_truncated": "LoRe truncated",
}
_LATEX_HEADERS = {
    "algo": "Algorithm", "sigma": r"$\sigma$", "eps": r"$\epsilon$",
    "expectation_bound": r"$\underline{J}_E$", "percentile_bound_p50": r"$\underline{J}_{p}$ ($p=50\%$)",
    "lore_bound": r"$\underline{J}$ (LoRe)", "pgd_global_mean": "PGD mean", "pgd_global_median": "PGD median",
    "pgd_local_return": "PGD local",
    "pgd_mean_minus_expectation_bound": r"PGD mean $-\,\underline{J}_E$",
    "pgd_median_minus_percentile_bound": r"PGD median $-\,\underline{J}_p$",
    "pgd_local_minus_lore_bound": r"PGD local $-\,\underline{J}$", "lore_truncated": "LoRe truncated",
}
_TEX_ESCAPE = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
               "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "<": r"\textless{}",
               ">": r"\textgreater{}", "|": r"\textbar{}"}


def _tex_escape(text: str) -> str:
    """A received name or value as LaTeX text: one line (control characters as their escapes, then shown), each
    character LaTeX reads as markup as the command that prints it."""
    return "".join(_TEX_ESCAPE.get(ch, ch) for ch in printable(text))


def _tex_header(col: str) -> str:
    if col in _LATEX_HEADERS:
        return _LATEX_HEADERS[col]
    if col.startswith("sigma="):
        return rf"$\sigma={_tex_escape(col[len('sigma='):])}$"
    return _tex_escape(col)


def _tex_cell(col: str, v) -> str:
    if col == "algo":
        return _tex_escape(algo_label(str(v)))
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return "--" if math.isnan(v) else f"{float(v):.4g}"
    return _tex_escape(v)


def _vacuous_marks(df: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """A table for reading: each column ``X_raw`` (a bound as computed, kept in the CSV) dropped, and the cells
    of ``X`` where it was raised to the trivial bound J_min (vacuous) marked {X: [bool per row]}."""
    raw = [c for c in df.columns if c.endswith("_raw") and c[:-len("_raw")] in df.columns]
    marks = {c[:-len("_raw")]: (df[c] < df[c[:-len("_raw")]]).tolist() for c in raw}
    return df.drop(columns=raw), marks


def latex_table(df: pd.DataFrame, caption: str) -> str:
    """A booktabs ``tabular`` (\\toprule/\\midrule/\\bottomrule) of ``df``: text left, numbers right, NaN
    as --; ``\\input`` it inside a ``table`` environment (needs ``\\usepackage{booktabs}``)."""
    df, marks = _vacuous_marks(df)
    align = "".join("r" if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
                    else "l" for c in df.columns)
    lines = [f"% {printable(caption)}", "% Written by `crop aggregate`; needs \\usepackage{booktabs}.",
             f"\\begin{{tabular}}{{{align}}}", r"\toprule",
             " & ".join(_tex_header(c) for c in df.columns) + r" \\", r"\midrule"]
    for i, row in enumerate(df.itertuples(index=False)):
        lines.append(" & ".join(_tex_cell(c, v) + (r"$^\dagger$" if c in marks and marks[c][i] else "")
                                for c, v in zip(df.columns, row)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)


def _pivot(df: pd.DataFrame, value: str) -> pd.DataFrame:
    t = df.pivot_table(index="algo", columns="sigma", values=value, aggfunc="first", dropna=False)
    t = t.reindex(series_order(t.index))
    t.columns = [f"sigma={c}" for c in t.columns]
    return t.reset_index()


INTERVAL_COLUMNS = (" lo", " hi", " sd")  # CSV columns beside each sigma=S column of an interval table


def _pivot_interval(df: pd.DataFrame, value: str, replicates: bool = False) -> pd.DataFrame:
    """:func:`_pivot` of ``value`` with its interval beside each σ column (``sigma=S lo``, ``sigma=S hi``,
    and ``sigma=S sd`` over replicates); Markdown and LaTeX show one cell "value [lo, hi]" (:func:`_merged`)."""
    t = _pivot(df, value)
    parts = {suffix: _pivot(df, f"{value}_{suffix.strip()}") for suffix in INTERVAL_COLUMNS}
    out = t[["algo"]].copy()
    for c in t.columns[1:]:
        out[c] = t[c]
        for suffix, part in parts.items():
            if suffix != " sd" or replicates:
                out[c + suffix] = part[c]
    return out


def _merged(df: pd.DataFrame) -> pd.DataFrame:
    """An interval table for reading: each σ column as "value [lo, hi]" (", sd s" over replicates)."""
    shown = [c for c in df.columns if not c.endswith(INTERVAL_COLUMNS)]
    if len(shown) == len(df.columns):
        return df
    out = df[shown].copy()
    for c in shown:
        if f"{c} lo" not in df:
            continue

        def cell(i, c=c):
            v, lo, hi = df[c].iloc[i], df[f"{c} lo"].iloc[i], df[f"{c} hi"].iloc[i]
            if pd.isna(v):
                return None
            text = f"{v:.4g}" + ("" if pd.isna(lo) or pd.isna(hi) else f" [{lo:.4g}, {hi:.4g}]")
            sd = df[f"{c} sd"].iloc[i] if f"{c} sd" in df else math.nan
            return text + ("" if pd.isna(sd) else f", sd {sd:.2g}")

        out[c] = [cell(i) for i in range(len(df))]
    return out


def _md_header(col: str) -> str:
    if col in _MD_HEADERS:
        return _MD_HEADERS[col]
    if col.startswith("sigma="):
        return f"σ = {col[len('sigma='):]}"
    return col


def markdown_table(df: pd.DataFrame, caption: str) -> str:
    """``df`` as a Markdown table for reading: the caption above, column names a reader understands, display
    names of the algorithms, 4 significant digits and — for an empty cell (never ``nan``)."""
    df, marks = _vacuous_marks(df)
    out = df.copy()
    if "algo" in out:   # a row per σ names the target an auto run chose there
        out["algo"] = [algo_label(a, s) for a, s in zip(out["algo"], out["sigma"])] if "sigma" in out \
            else out["algo"].map(algo_label)
    out = out.astype(object).where(out.notna(), None)  # tabulate prints missingval for None only
    for col, mark in marks.items():
        out[col] = [v if v is None else f"{v:.4g}" + (" †" if m else "") for v, m in zip(out[col], mark)]
    out.columns = [_md_header(c) for c in df.columns]
    align = ["right" if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) else "left"
             for c in df.columns]  # numbers right, also in a column that is all empty cells
    return f"{caption}\n\n" + pipe_table(out, floatfmt=".4g", colalign=align) + "\n"


def _table_texts(df: pd.DataFrame, stem: str, caption: str) -> dict[str, str]:
    """``{file name: text}`` of one table in every format of :data:`crop.workflow.layout.TABLE_FORMATS`."""
    return {f"{stem}.csv": df.to_csv(index=False, lineterminator="\n", float_format="%.10g"),
            f"{stem}.md": markdown_table(_merged(df), caption),
            f"{stem}.tex": latex_table(_merged(df), caption)}


def _eps(factor: float, sigma: float) -> float:
    """ε = factor·σ without binary noise (0.05·0.1 is 0.005, not 0.005000000000000001)."""
    return float(f"{factor * sigma:.12g}")


def _expectation_bound_raw(run: dict, eps: float, clipped: float) -> float:
    """Theorem 2's J̲_E at ``eps`` as computed (gre.csv's ``expectation_bound_raw``), ``clipped`` where gre.csv
    has no such row."""
    gre = run.get("gre")
    if gre is None or cols.EXPECTATION_BOUND_RAW not in gre or math.isnan(clipped):
        return clipped
    g = gre[np.isclose(gre[cols.EPS], eps, rtol=1e-9, atol=1e-12)]
    return float(g[cols.EXPECTATION_BOUND_RAW].iloc[0]) if len(g) else clipped


def _lore_truncated_at(meta: dict, eps: float) -> bool:
    """A bounded LoRe search spent its node budget and its bound at ``eps`` is not the full search's: ε at or
    above the ε it stopped at (``exact_below_eps``; every ε where a run records no such ε)."""
    if not meta.get("truncated"):
        return False
    exact_below = meta.get("exact_below_eps")
    return exact_below is None or eps >= exact_below


def env_tables(env: str, data: dict, table_eps_factors) -> dict[str, tuple[pd.DataFrame, str]]:
    """{table name: (DataFrame, caption)} for ``env`` (names as in :data:`crop.workflow.layout.TABLES`)."""
    spec = env_spec(env)
    rows, bound_rows = [], []
    for (e, a, lab), d in sorted(data.items(), key=lambda kv: (series_key(kv[0][1]), float(kv[0][2]))):
        if e != env:
            continue
        ep = d["loact_episodes"]
        row = {"algo": a, "sigma": float(lab), "mean_radius": metric_value(d, "mean_radius"),
               "mean_radius_certified": metric_value(d, "mean_radius_certified"),
               "certified_fraction": metric_value(d, "certified_fraction"),
               "benign_return": metric_value(d, "benign_return"),
               "benign_return_std": float(ep[cols.RETURN].std(ddof=0))}
        for m in INTERVAL_METRICS:  # the confidence interval (crop.report.intervals), beside the value
            iv = run_interval(d, m)
            if d.get("replicates"):
                row[m] = iv["value"]  # the mean over replicates
            row.update({f"{m}_lo": iv["lo"], f"{m}_hi": iv["hi"], f"{m}_sd": iv["sd"]})
        rows.append(row)
        sigma = float(lab)
        for f in table_eps_factors:
            eps = _eps(f, sigma)
            vals = {m: metric_value(d, m, eps) for m in ("expectation_bound", "percentile_bound", "lore_bound",
                                                         "pgd_global_mean", "pgd_global_median",
                                                         "pgd_local_return")}
            vals = {m: math.nan if v is None else v for m, v in vals.items()}
            vals["percentile_bound_p50"] = vals.pop("percentile_bound")
            # Theorem 2's linear bound falls below J_min at large ε: vacuous, reported as J_min (marked †), as
            # gre.csv's expectation_bound holds it (expectation_bound_raw: the formula's value)
            raw_eb = _expectation_bound_raw(d, eps, vals["expectation_bound"])
            j_min = float(d["gre"][cols.J_MIN].iloc[0]) if "gre" in d and len(d["gre"]) else -math.inf
            vals["expectation_bound"] = max(raw_eb, j_min) if not math.isnan(raw_eb) else raw_eb
            bound_rows.append({"algo": a, "sigma": sigma, "eps": eps, "expectation_bound": vals["expectation_bound"],
                               "percentile_bound_p50": vals["percentile_bound_p50"], "lore_bound": vals["lore_bound"],
                               "pgd_global_mean": vals["pgd_global_mean"],
                               "pgd_global_median": vals["pgd_global_median"],
                               "pgd_local_return": vals["pgd_local_return"], "expectation_bound_raw": raw_eb,
                               "lore_truncated": _lore_truncated_at(d.get("lore_meta") or {}, eps)})
    df = pd.DataFrame(rows)
    counts = [1 + len(d.get("replicates") or []) for (e, _, _), d in data.items() if e == env]
    reps = max(counts, default=1)
    bounds = pd.DataFrame(bound_rows)
    # A bounded LoRe search that spent its node budget (lore.max_nodes): its column says which rows; only then.
    truncated = bool(len(bounds)) and bool(bounds["lore_truncated"].any())
    if len(bounds) and not truncated:
        bounds = bounds.drop(columns="lore_truncated")
    tight = bounds[["algo", "sigma", "eps"]].copy()  # against the bounds as reported (vacuous ones: J_min)
    for col, (attack, bound) in TIGHTNESS_COLUMNS.items():
        tight[col] = bounds[attack] - bounds[bound]
    p = spec.paper_name
    conv0, conv1 = CONVENTIONS["uncertified_zero"], CONVENTIONS["certified_only"]
    ci = (f"; [lo, hi]: 95 % confidence interval, {METHOD_REPLICATES} ({reps} replicates; the value is their mean, "
          "sd their standard deviation)" if reps > 1 else f"; [lo, hi]: 95 % confidence interval, {METHOD_EPISODES}")
    if reps > 1 and min(counts) == 1:
        ci = ci[:-1] + f"; a run without replicates: {METHOD_EPISODES})"
    # A continuous-action agent's rows ("MySAC (action)") hold another certificate than Theorem 1's: say which.
    actors = [series_label(a) for (e, a, _) in data if e == env and split_run_algo(a)[1] == ACTION_TARGET]
    act = (f"; {', '.join(sorted(set(actors)))}: a continuous-action agent's LoAct, percentile (median) smoothing "
           "per action dimension (Chiang et al. 2020, Theorem 1), a step counted certified when every dimension "
           "stays within its tolerance, at the smallest radius over the dimensions (as its certified_ratio.csv)"
           if actors else "")
    # Runs whose rewards were clipped (rewards.clip): their returns and bounds are of the clipped rewards.
    clipped = clip_text(d.get("reward_clip") for (e, _, _), d in data.items() if e == env)
    clip = (f"; every return and bound is a return ({clipped}: rewards.clip), not the environment's own"
            if clipped else "")
    out = {
        "mean_radius": (_pivot_interval(df, "mean_radius", reps > 1),
                        f"{p}: mean certified radius of LoAct (Theorem 1) over all steps, {conv0} (this project's "
                        f"headline; the paper's convention, {conv1}, is in {p}_mean_radius_certified){ci}{act}"),
        "mean_radius_certified": (_pivot_interval(df, "mean_radius_certified", reps > 1),
                                  f"{p}: mean certified radius of LoAct (Theorem 1), {conv1} (the paper's and the "
                                  f"CROP leaderboard's convention; empty where no step was certified; {conv0} is "
                                  f"in {p}_mean_radius){ci}{act}"),
        "certified_fraction": (_pivot_interval(df, "certified_fraction", reps > 1),
                               f"{p}: share of LoAct's steps certified (radius > 0){ci}{act}"),
        "benign_return": (_pivot_interval(df, "benign_return", reps > 1),
                          f"{p}: mean benign return of the smoothed policy over LoAct's clean episodes{ci}; "
                          "an interval is clipped to [J_min, J_max], the least and the most return possible over "
                          "LoAct's episodes (where the reward range is known), which only adds coverage" + clip),
        "reward_bounds": (bounds, f"{p}: certified reward bounds J̲ᴇ (Theorem 2), J̲ₚ (p = 50 %, Theorem 3), "
                                  "J̲ (LoRe, Theorem 4) and the PGD returns at ε = f·σ; empty: not computed at "
                                  "that ε; †: vacuous, J̲ᴇ fell below the trivial bound J_min (the least return "
                                  "possible) and is shown as J_min (its value: expectation_bound_raw in the CSV)"
                                  + ("; LoRe truncated: the search spent its node budget (lore.max_nodes) at an ε "
                                     "at or below this row's, and its unexpanded subtrees count their worst case, "
                                     "so J̲ is ≤ the full search's (rows not marked: the full search's J̲)"
                                     if truncated else "")
                                  + ("; no J̲ or local PGD for a continuous-action agent (LoRe's tree branches "
                                     "over a finite set of actions)" if actors else "") + clip),
        "tightness": (tight, f"{p}: PGD return minus certified bound (≥ 0 when the bound holds, small when it is "
                             "tight); empty: no attack or no bound at that ε" + clip),
    }
    assert tuple(out) == TABLES
    return out


def env_table_texts(env: str, data: dict, table_eps_factors) -> dict[str, str]:
    """``{file name: text}`` of every table file of ``env``: what :func:`write_env_tables` writes, and what the
    audit recomputes from the runs' files to compare with a received folder's tables byte for byte
    (:mod:`crop.audit.agreement`)."""
    spec = env_spec(env)
    texts: dict[str, str] = {}
    register_auto_choices(env, data)
    for name, (df, caption) in env_tables(env, data, table_eps_factors).items():
        if "algo" in df:  # rows of another smoothing target: "StdTrain (vote)" (q's rows keep the plain name)
            df = df.assign(algo=df["algo"].map(series_label))
        texts.update(_table_texts(df, f"{spec.paper_name}_{name}", caption))
    return texts


def write_env_tables(env: str, data: dict, tables_dir: Path, table_eps_factors) -> list[Path]:
    written = []
    for name, text in env_table_texts(env, data, table_eps_factors).items():
        atomic_write_text(tables_dir / name, text)
        written.append(tables_dir / name)
    expected = set(table_files(tables_dir, env))
    assert set(written) == expected, (sorted(map(str, written)), sorted(map(str, expected)))
    return written
