"""The reproduction report: how a run compares with a reference (by default the paper's published numbers),
in plain words and one figure per environment.  Written by ``crop audit --reference …`` next to audit.md:

* ``reproduction.md``: per environment, which rows agree, which differ and by how much (ratio reproduced /
  published), the trend over σ, and what is known about why (the notes of ``../shared/reference/README.md``
  for the paper's numbers);
* ``reproduction_{Env}.png``: the reproduced (solid, with its confidence interval as error bars) and published
  (dashed) value per (algorithm, σ): LoAct mean radius in the reference's convention (log scale) and benign
  return.

Input: the ``reference`` block of the audit (:func:`crop.audit.reference.reference_summary`).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from crop.envs import env_spec
from crop.io import atomic_write_text
from crop.report.clips import clip_text
from crop.report.markdown import md_code, pipe_table

__all__ = ["write_reproduction", "figure_name", "KNOWN", "GENERAL_NOTES"]

GENERAL_NOTES = [
    "The published mean radius averages certified steps only: the leaderboard's per-step curves drop "
    "uncertified steps. It is compared here in the same convention (`mean_radius_certified`: per step the mean "
    "over the episodes certified there, then the mean over steps); the project's headline `mean_radius` counts "
    "an uncertified step as 0 and has no published counterpart.",
    "The published bound curves are read at the run's ε (linear interpolation for GRe, the step function for "
    "LoRe); the published attack curves only at their own ε.",
]
KNOWN = {  # what is known about the published numbers, per environment (../shared/reference/README.md)
    "highway-fast-v0": [
        "CROP's published StdTrain network (`highway-fast_nat.pth`) reproduces the leaderboard row labelled "
        "**RadialRL** (benign return and radius pattern), not the row labelled StdTrain: compare a StdTrain run "
        "on that network with the RadialRL row (table below).",
        "At σ ≤ 0.1 the published highway radii are 6–13× larger than any reproduction on that network, in "
        "highway-env 1.4 (the authors' era) and 1.12: treat the small-σ rows as not reproducible, not as a "
        "target. At σ ≥ 0.5 reproductions land in the published range.",
    ],
    "CartPole-v0": [
        "The authors did not publish their CartPole networks: a run with locally trained policies can match the "
        "shape of the results (trends over σ, ordering of methods), not the values.",
    ],
    "PongNoFrameskip-v4": [
        "The published Pong networks are not all available (StdTrain and SA-MDP come from SA-DQN's release, "
        "RadialRL from RADIAL-RL's, the others were not published): locally trained policies can match trends, "
        "not values.",
    ],
    "FreewayNoFrameskip-v4": [
        "The published Freeway networks are not all available (StdTrain and SA-MDP come from SA-DQN's release, "
        "RadialRL from RADIAL-RL's, the others were not published): locally trained policies can match trends, "
        "not values.",
    ],
}
RADIUS_METRICS = ("mean_radius_certified", "mean_radius")


def figure_name(env: str) -> str:
    return f"reproduction_{env_spec(env).paper_name}.png"


def _fmt(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}g}"


def _radius_metric(df: pd.DataFrame) -> str:
    """The mean-radius convention the reference uses (the paper's when it has both or neither)."""
    has = set(df.loc[df["reference"].notna(), "metric"])
    return next((m for m in RADIUS_METRICS if m in has), RADIUS_METRICS[0])


def _figure(df: pd.DataFrame, env: str, radius_metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_algos = sorted(set(df.loc[df["reproduced"].notna(), "algo"]))
    algos = run_algos or sorted(set(df["algo"]))
    from crop.report.style import figure_label, series_color, series_marker, series_order

    # the colour and marker of each algorithm (and target: ALGO@TARGET) in every other figure of the project
    series_order(algos)
    colors = {a: series_color(a) for a in algos}
    markers = {a: series_marker(a) for a in algos}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    convention = "certified steps only" if radius_metric == "mean_radius_certified" else "uncertified = 0"
    for ax, metric, title in ((axes[0], radius_metric, f"LoAct mean radius, {convention} (log scale)"),
                              (axes[1], "benign_return", "benign return")):
        sub = df[df["metric"] == metric]
        for a in algos:
            g = sub[sub["algo"] == a].sort_values("sigma")
            for col, style, label in (("reference", dict(ls="--", marker=markers[a], mfc="none"), "published"),
                                      ("reproduced", dict(ls="-", marker=markers[a]), "reproduced")):
                v = g[["sigma", col, "interval_lo", "interval_hi"]].dropna(subset=[col])
                if metric == radius_metric:
                    v = v[v[col] > 0]  # log scale: zero radii are not drawn
                if not len(v):
                    continue
                ax.plot(v["sigma"], v[col], color=colors[a], label=f"{figure_label(a)} ({label})", **style)
                if col == "reproduced" and v["interval_lo"].notna().any():  # the confidence interval
                    lo = (v[col] - v["interval_lo"]).clip(lower=0).fillna(0)
                    hi = (v["interval_hi"] - v[col]).clip(lower=0).fillna(0)
                    if metric == radius_metric:  # log scale: a lower end at 0 is drawn to a tenth of the value
                        lo = np.minimum(lo, 0.9 * v[col])
                    ax.errorbar(v["sigma"], v[col], yerr=[lo, hi], fmt="none", ecolor=colors[a], capsize=3)
        ax.set_xscale("log")
        if metric == radius_metric and ax.lines:
            ax.set_yscale("log")
        ax.set_xlabel("σ")
        ax.set_title(title, fontsize=10)
        if not ax.lines:
            ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
    handles, labels = axes[0].get_legend_handles_labels()
    h2, l2 = axes[1].get_legend_handles_labels()
    seen = dict(zip(labels + l2, handles + h2))
    if seen:
        fig.legend(seen.values(), seen.keys(), loc="outside right upper", fontsize=7)
    fig.suptitle(f"{env}: reproduced (solid) vs published (dashed)", fontsize=11)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def _with_interval(r) -> str:
    """"value [lo, hi]" (and the replicates' sd where there are several)."""
    text = _fmt(r.reproduced, 4)
    if not (pd.isna(r.interval_lo) or pd.isna(r.interval_hi)):
        text += f" [{_fmt(r.interval_lo, 4)}, {_fmt(r.interval_hi, 4)}]"
    if not pd.isna(r.sd_replicates):
        text += f" (sd {_fmt(r.sd_replicates, 2)})"
    return text


def _agrees(r, published: float, tolerances: dict) -> tuple[bool, float]:
    """The audit's rule (:func:`crop.audit.reference.agreement`, with the audit's tolerances: file, flags,
    defaults) for a published value from another row; returns (agrees, distance outside the interval)."""
    from crop.audit.reference import agreement, tolerance_for

    lo = r.reproduced if pd.isna(r.interval_lo) else min(r.reproduced, r.interval_lo)
    hi = r.reproduced if pd.isna(r.interval_hi) else max(r.reproduced, r.interval_hi)
    ok, outside, _ = agreement(lo, hi, published, tolerances.get(r.metric) or tolerance_for(r.metric))
    return ok, outside


def _env_section(df: pd.DataFrame, env: str, paper: bool, fig: str, tolerances: dict) -> list[str]:
    lines = [f"## {env}", ""]
    ran = df[df["verdict"].isin(["match", "differs"]) | (df["verdict"] == "not_in_reference")
             | df["note"].str.startswith("stage") | df["note"].str.startswith("eps")]
    compared = df[df["verdict"].isin(["match", "differs"])]
    absent_runs = df[(df["verdict"] == "missing") & df["note"].str.startswith("run not")]
    if paper:
        lines += [f"- {n}" for n in KNOWN.get(env, [])] + [""]
    absent = sorted(set(df["algo"]) - set(df.loc[df["reference"].notna() | (df["verdict"] != "not_in_reference"),
                                                 "algo"]))
    if absent:  # labels of your own, or an environment the reference lacks: nothing to compare them with
        where = "the paper" if paper else "the reference"
        lines += [f"Not in {where}: {', '.join(md_code(a) for a in absent)} — "
                  f"{'this environment is' if len(absent) == len(set(df['algo'])) else 'these labels are'} not in "
                  f"{where}; their values are listed, not compared.", ""]
    lines += [f"![{env}]({fig})", ""]
    clipped = df[df["reward_clip"].notna() & (df["verdict"] != "missing")]
    if len(clipped):   # returns of clipped rewards (rewards.clip): not the game's own return
        lines += [f"Returns of clipped rewards: {', '.join(f'`{m}`' for m in sorted(set(clipped['metric'])))} of "
                  f"{', '.join(md_code(a) for a in sorted(set(clipped['algo'])))} are reproduced from "
                  f"{clip_text(clipped['reward_clip'])} (`rewards.clip`), not the environment's own rewards; a "
                  "published return of the game is not the same quantity.", ""]
    if compared.empty:
        lines += [f"No value of this run could be compared: {len(ran)} values of the run, "
                  f"{len(absent_runs)} reference values for runs not in the results.", ""]
    else:
        n_ok, n_bad = int((compared["verdict"] == "match").sum()), int((compared["verdict"] == "differs").sum())
        lines += [f"Of {len(compared)} values compared, **{n_ok} agree** within tolerance and **{n_bad} differ**. "
                  f"{len(absent_runs)} reference values belong to runs not in these results.", ""]
        per = []
        for metric, g in compared.groupby("metric"):
            ok, bad = int((g["verdict"] == "match").sum()), g[g["verdict"] == "differs"]
            per.append({"metric": metric, "agree": ok, "differ": len(bad),
                        "ratio of differing rows (min–median–max)":
                            "—" if bad["ratio"].dropna().empty else
                            " – ".join(_fmt(x, 2) for x in bad["ratio"].dropna().quantile([0, 0.5, 1]))})
        lines += [pipe_table(per, ["metric", "agree", "differ", "ratio of differing rows (min–median–max)"], pad=False),
                  ""]
    radius_metric = _radius_metric(df)
    key = df[df["metric"].isin([radius_metric, "benign_return"]) & df["reproduced"].notna()]
    if len(key):
        lines += [f"LoAct mean radius (`{radius_metric}`) and benign return, per algorithm and σ:", ""]
        rows = [{"algo": r.algo, "σ": _fmt(r.sigma), "metric": r.metric, "published": _fmt(r.reference),
                 "reproduced [interval]": _with_interval(r), "replicates": _fmt(r.replicates),
                 "ratio": _fmt(r.ratio, 2), "outside the interval": _fmt(r.outside),
                 "verdict": {"match": "agrees", "differs": "differs",
                             "not_in_reference": "not in the paper" if paper else "not in the reference"}
                 .get(r.verdict, r.verdict)}
                for r in key.sort_values(["metric", "algo", "sigma"]).itertuples()]
        lines += [pipe_table(rows, ["algo", "σ", "metric", "published", "reproduced [interval]", "replicates",
                                    "ratio", "outside the interval", "verdict"], pad=False), ""]
        trend = []
        for a, g in key[key["metric"] == radius_metric].dropna(subset=["reference"]).groupby("algo"):
            if len(g) >= 3 and g["reference"].nunique() > 1 and g["reproduced"].nunique() > 1:
                rho = st.spearmanr(g["reference"], g["reproduced"]).statistic
                up_pub = np.sign(st.spearmanr(g["sigma"], g["reference"]).statistic)
                up_rep = np.sign(st.spearmanr(g["sigma"], g["reproduced"]).statistic)
                trend.append({"algo": a, "σ values": len(g), "Spearman ρ (reproduced vs published)": _fmt(rho, 2),
                              "direction over σ": "same" if up_pub == up_rep else "opposite"})
        if trend:
            lines += ["Trend of the mean radius over σ (rank correlation; values may differ where trends agree):", ""]
            lines += [pipe_table(trend, ["algo", "σ values", "Spearman ρ (reproduced vs published)",
                                         "direction over σ"], pad=False), ""]
    other = compared[~compared["metric"].isin([radius_metric, "benign_return"]) & (compared["verdict"] == "differs")]
    if len(other):
        log_ratio = np.log(other["ratio"].where(other["ratio"] > 0).astype(float))
        other = other.assign(score=np.abs(log_ratio).fillna(np.inf))  # a sign change counts as the largest
        rows = [{"algo": r.algo, "σ": _fmt(r.sigma), "metric": r.metric, "ε": _fmt(r.eps),
                 "published": _fmt(r.reference), "reproduced": _fmt(r.reproduced), "ratio": _fmt(r.ratio, 2)}
                for r in other.sort_values("score", ascending=False).head(10).itertuples()]
        lines += ["Largest differences among the bounds and attacks:", ""]
        lines += [pipe_table(rows, ["algo", "σ", "metric", "ε", "published", "reproduced", "ratio"], pad=False), ""]
    if paper and env == "highway-fast-v0":
        mine = df[(df["algo"] == "StdTrain") & df["metric"].isin([radius_metric, "benign_return"])
                  & df["reproduced"].notna()]
        pub = df[(df["algo"] == "RadialRL") & df["reference"].notna()].set_index(["metric", "sigma"])["reference"]
        rows = []
        for r in mine.sort_values(["metric", "sigma"]).itertuples():
            ref = pub.get((r.metric, r.sigma))
            if ref is not None:
                agrees, outside = _agrees(r, float(ref), tolerances)
                rows.append({"σ": _fmt(r.sigma), "metric": r.metric, "published (RadialRL row)": _fmt(ref),
                             "reproduced (StdTrain) [interval]": _with_interval(r),
                             "ratio": _fmt(r.reproduced / ref if ref else None, 2),
                             "outside the interval": _fmt(outside), "verdict": "agrees" if agrees else "differs"})
        if rows:
            lines += ["The StdTrain run against the published row labelled RadialRL (see above), by the same rule:",
                      ""]
            lines += [pipe_table(rows, ["σ", "metric", "published (RadialRL row)", "reproduced (StdTrain) [interval]",
                                        "ratio", "outside the interval", "verdict"], pad=False), ""]
    return lines


def write_reproduction(ref_block: dict, out_dir: Path, envs) -> dict:
    """Write ``reproduction.md`` and ``reproduction_{Env}.png`` for every environment in ``envs`` (those of
    the audited runs) into ``out_dir``; returns {"md": path, "figures": [paths]}."""
    from crop.reference import PAPER_REFERENCE_NAME

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paper = str(ref_block.get("name")) == PAPER_REFERENCE_NAME
    df = pd.DataFrame(ref_block["comparisons"], columns=["env", "algo", "sigma", "metric", "eps", "reference",
                                                         "reproduced", "ratio", "verdict", "note", "interval_lo",
                                                         "interval_hi", "replicates", "sd_replicates", "outside",
                                                         "allowed", "abs_tol", "rel_tol", "interval_method",
                                                         "reward_clip"])
    df["note"] = df["note"].fillna("").astype(str)
    for c in ("reference", "reproduced", "ratio", "sigma", "eps", "interval_lo", "interval_hi", "replicates",
              "sd_replicates", "outside", "allowed", "abs_tol", "rel_tol"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    c = ref_block["counts"]
    lines = ["# Reproduction report", "",
             f"Reference: {md_code(ref_block['name'])}"
             + (" — the CROP paper's published numbers (Wu et al., ICLR 2022), from the leaderboard's data"
                if paper else "") + f" ({md_code(ref_block['file'])}).", "",
             "A published value **agrees** when it lies inside the reproduction's confidence interval (at 1 − α "
             "of the audit: over replicates where the run has several, else over its episodes; bounds and "
             "attacks have no interval), widened on each side by the metric's tolerance; otherwise it "
             "**differs**, with the ratio reproduced / published and how far outside the interval it lies "
             "(docs/audit.md).", "",
             f"Overall: **{c['match']} values agree**, **{c['differs']} differ**, {c['missing']} "
             f"reference values are not in this run (their run or stage is absent, or the ε is off its grid), and "
             f"{ref_block['not_in_reference']} values of the run have no reference counterpart. Tolerances per "
             "metric and every row: audit.md and audit.json.", ""]
    if paper:
        lines += [f"- {n}" for n in GENERAL_NOTES] + [""]
    figures = []
    for env in sorted(envs):
        fig = out_dir / figure_name(env)
        sub = df[df["env"] == env]
        _figure(sub, env, _radius_metric(sub), fig)
        figures.append(str(fig))
        lines += _env_section(sub, env, paper, fig.name, ref_block.get("tolerances") or {})
    md = out_dir / "reproduction.md"
    atomic_write_text(md, "\n".join(lines))
    return {"md": str(md), "figures": figures}
