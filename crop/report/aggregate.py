"""Tidy tables and the paper's figures from the per-run result files (reads results only).

Figure families (file names as in the paper's sources):
  {Env}_stepwise_sigma-{σ}        certified radius per time step, mean ± std over episodes (Fig. 1)
  {Clean}_loact_clean             benign return of π̃ vs σ (Fig. 2)
  {Env}_certified_ratio_sigma-{σ} certified ratio η_r vs r (Fig. 5)
  {Env}_global_mean_sigma-{σ}     expectation bound J̲_E (solid) and PGD mean (dashed) vs ε (Fig. 3)
  {Env}_global_median_sigma-{σ}   percentile bound J̲_p (solid) and PGD median (dashed) vs ε (Fig. 3)
  {Env}_adasearch_sigma-{σ}       LoRe bound J̲ (solid) and PGD return from the same s₀ (dashed) vs ε (Fig. 3)
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from crop.config import ALGORITHMS  # noqa: E402
from crop.envs import env_spec  # noqa: E402
from crop.io import atomic_write_bytes, atomic_write_text, read_json  # noqa: E402
from crop.layout import FIGURE_FORMATS, RUN_FILES, figure_stems, table_files  # noqa: E402
from crop.lore import lore_bound_at  # noqa: E402

__all__ = ["aggregate", "load_runs", "ALGO_COLORS", "ALGO_LABELS"]

# One colour per algorithm, the same in every figure.
ALGO_COLORS = dict(zip(ALGORITHMS, sns.color_palette("colorblind", len(ALGORITHMS)).as_hex()))
ALGO_LABELS = {"SA-MDP-PGD": "SA-MDP (PGD)", "SA-MDP-CVX": "SA-MDP (CVX)"}


def _label(algo: str) -> str:
    return ALGO_LABELS.get(algo, algo)


def _parse_run(run: str) -> tuple[str, str, str]:
    parts = Path(run).parts
    if len(parts) != 3 or not parts[2].startswith("sigma-"):
        raise ValueError(f"run {run!r} is not of the form ENV/ALGO/sigma-S")
    return parts[0], parts[1], parts[2][len("sigma-"):]


def load_runs(results: Path, runs) -> dict:
    """Read every result file of every run: {(env, algo, sigma_label): {name: DataFrame | dict}}."""
    out = {}
    for run in runs:
        env, algo, lab = _parse_run(run)
        d = Path(results) / run
        data = {}
        for key, name in RUN_FILES.items():
            f = d / name
            if not f.is_file():
                raise FileNotFoundError(f"missing result file {f}")
            if name.endswith(".json"):
                data[key] = read_json(f)
            elif name.endswith(".npz"):
                with np.load(f, allow_pickle=False) as z:
                    data[key] = {k: z[k] for k in z.files}
            else:
                data[key] = pd.read_csv(f)
        meta = d / "lore.meta.json"
        data["lore_meta"] = read_json(meta) if meta.is_file() else {}
        out[(env, algo, lab)] = data
    return out


def _save(fig, figures_dir: Path, stem: str) -> list[Path]:
    import io

    paths = []
    for fmt in FIGURE_FORMATS:
        buf = io.BytesIO()
        # Fixed metadata keeps reruns byte-identical.
        fig.savefig(buf, format=fmt, bbox_inches="tight", dpi=150,
                    metadata={"CreationDate": None} if fmt == "pdf" else {"Software": None})
        p = figures_dir / f"{stem}.{fmt}"
        atomic_write_bytes(p, buf.getvalue())
        paths.append(p)
    plt.close(fig)
    return paths


def _axes(title: str, xlabel: str, ylabel: str):
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return fig, ax


def _sigma_sorted(labels):
    return sorted(labels, key=float)


def _figures_for_env(env: str, data: dict, figures_dir: Path) -> list[Path]:
    spec = env_spec(env)
    keys = [k for k in data if k[0] == env]
    algos = [a for a in ALGORITHMS if any(k[1] == a for k in keys)]
    sigmas = _sigma_sorted({k[2] for k in keys})
    written = []
    sns.set_theme(style="whitegrid", context="paper")

    # Benign return of the smoothed policy vs σ.
    fig, ax = _axes(f"{spec.paper_name}: benign return of π̃", "σ", "return")
    for a in algos:
        xs, ms, sd = [], [], []
        for lab in sigmas:
            if (env, a, lab) in data:
                r = data[(env, a, lab)]["loact_episodes"]["return"]
                xs.append(float(lab)); ms.append(r.mean()); sd.append(r.std(ddof=0))
        ax.errorbar(xs, ms, yerr=sd, marker="o", capsize=3, color=ALGO_COLORS[a], label=_label(a))
    ax.set_xscale("log")
    ax.legend(fontsize=7)
    written += _save(fig, figures_dir, f"{spec.clean_name}_loact_clean")

    for lab in sigmas:
        present = [a for a in algos if (env, a, lab) in data]
        # Radius per step (uncertified steps count as 0).
        fig, ax = _axes(f"{spec.paper_name}, σ={lab}", "time step t", "certified radius r")
        for a in present:
            st = data[(env, a, lab)]["loact"]
            g = st.groupby("step")["radius"]
            m, s = g.mean(), g.std(ddof=0).fillna(0.0)
            ax.plot(m.index, m.values, color=ALGO_COLORS[a], label=_label(a), lw=1)
            ax.fill_between(m.index, (m - s).values, (m + s).values, color=ALGO_COLORS[a], alpha=0.2, lw=0)
        ax.legend(fontsize=7)
        written += _save(fig, figures_dir, f"{spec.paper_name}_stepwise_sigma-{lab}")

        # Certified ratio.
        fig, ax = _axes(f"{spec.paper_name}, σ={lab}", "radius r", "certified ratio η_r (%)")
        for a in present:
            cr = data[(env, a, lab)]["certified_ratio"]
            g = cr.groupby("r")["eta"]
            m, s = 100 * g.mean(), 100 * g.std(ddof=0).fillna(0.0)
            ax.plot(m.index, m.values, color=ALGO_COLORS[a], label=_label(a), lw=1)
            ax.fill_between(m.index, (m - s).values, (m + s).values, color=ALGO_COLORS[a], alpha=0.2, lw=0)
        ax.legend(fontsize=7)
        written += _save(fig, figures_dir, f"{spec.paper_name}_certified_ratio_sigma-{lab}")

        # Global smoothing: expectation and percentile bounds with PGD dashed.
        for kind, col, stat, ylabel in (("mean", "expectation_bound", "mean", "expectation bound J̲_E"),
                                         ("median", "percentile_bound", "median", "percentile bound J̲_p")):
            fig, ax = _axes(f"{spec.paper_name}, σ={lab}", "ε", ylabel)
            j_lo, j_hi = np.inf, -np.inf
            for a in present:
                gre = data[(env, a, lab)]["gre"]
                j_lo, j_hi = min(j_lo, gre["j_min"].min()), max(j_hi, gre["j_max"].max())
                gre = gre[np.isclose(gre["p"], 0.5)] if kind == "median" else gre.drop_duplicates("eps")
                ax.plot(gre["eps"], gre[col], color=ALGO_COLORS[a], label=_label(a), marker=".")
                att = data[(env, a, lab)]["attack_global"].groupby("eps")["return"].agg(stat)
                ax.plot(att.index, att.values, color=ALGO_COLORS[a], ls="--", lw=1, marker="x", ms=3)
            # The expectation bound falls far below J_min at large ε; show the meaningful range only.
            pad = 0.05 * (j_hi - j_lo)
            ax.set_ylim(j_lo - pad, j_hi + pad)
            ax.set_xlim(left=0)
            ax.legend(fontsize=7, title="solid: certified, dashed: PGD", title_fontsize=6)
            written += _save(fig, figures_dir, f"{spec.paper_name}_global_{kind}_sigma-{lab}")

        # LoRe.
        fig, ax = _axes(f"{spec.paper_name}, σ={lab}", "ε", "certified lower bound J̲")
        xmax = 0.0
        for a in present:
            d = data[(env, a, lab)]
            lore = d["lore"]
            att = d["attack_local"]
            att = att[att["same_start_as_lore"].astype(bool)]
            xmax = max(xmax, float(att["eps"].max()), float(lore["eps"].max()))
            xs = np.append(lore["eps"].to_numpy(), xmax)
            ys = np.append(lore["lower_bound"].to_numpy(), lore["lower_bound"].iloc[-1])
            ax.step(xs, ys, where="post", color=ALGO_COLORS[a], label=_label(a))
            g = att.groupby("eps")["return"].min()
            ax.plot(g.index, g.values, color=ALGO_COLORS[a], ls="--", marker="x", lw=1)
        ax.legend(fontsize=7, title="solid: LoRe, dashed: PGD", title_fontsize=6)
        written += _save(fig, figures_dir, f"{spec.paper_name}_adasearch_sigma-{lab}")
    return written


def _pivot(df: pd.DataFrame, value: str) -> pd.DataFrame:
    t = df.pivot_table(index="algo", columns="sigma", values=value, aggfunc="first")
    t = t.reindex([a for a in ALGORITHMS if a in t.index])
    t.columns = [f"sigma={c}" for c in t.columns]
    return t.reset_index()


def _write_table(df: pd.DataFrame, base: Path, floatfmt=".4g") -> list[Path]:
    csv = base.with_suffix(".csv")
    md = base.with_suffix(".md")
    atomic_write_text(csv, df.to_csv(index=False, lineterminator="\n", float_format="%.10g"))
    atomic_write_text(md, df.to_markdown(index=False, floatfmt=floatfmt, missingval="—") + "\n")
    return [csv, md]


def _tables_for_env(env: str, data: dict, tables_dir: Path, table_eps_factors) -> list[Path]:
    spec = env_spec(env)
    rows, bound_rows = [], []
    for (e, a, lab), d in sorted(data.items(), key=lambda kv: (ALGORITHMS.index(kv[0][1]), float(kv[0][2]))):
        if e != env:
            continue
        st, ep = d["loact"], d["loact_episodes"]
        rows.append({"algo": a, "sigma": float(lab), "mean_radius": st["radius"].mean(),
                     "certified_fraction": st["certified"].mean(), "benign_return": ep["return"].mean(),
                     "benign_return_std": ep["return"].std(ddof=0)})
        sigma = float(lab)
        valid_until = (d["lore_meta"].get("search") or {}).get("valid_until_eps")
        valid_until = math.inf if valid_until is None else float(valid_until)
        gre = d["gre"]
        for f in table_eps_factors:
            eps = f * sigma
            g = gre[np.isclose(gre["eps"], eps)]
            med = g[np.isclose(g["p"], 0.5)]
            ag = d["attack_global"]
            ag = ag[np.isclose(ag["eps"], eps)]["return"]
            al = d["attack_local"]
            al = al[np.isclose(al["eps"], eps) & al["same_start_as_lore"].astype(bool)]["return"]
            bound_rows.append({
                "algo": a, "sigma": sigma, "eps": eps,
                "expectation_bound": float(g["expectation_bound"].iloc[0]) if len(g) else math.nan,
                "percentile_bound_p50": float(med["percentile_bound"].iloc[0]) if len(med) else math.nan,
                "lore_bound": lore_bound_at(d["lore"], eps, valid_until),
                "pgd_global_mean": float(ag.mean()) if len(ag) else math.nan,
                "pgd_global_median": float(ag.median()) if len(ag) else math.nan,
                "pgd_local_return": float(al.min()) if len(al) else math.nan,
            })
    df = pd.DataFrame(rows)
    bounds = pd.DataFrame(bound_rows)
    bounds["gap_mean"] = bounds["pgd_global_mean"] - bounds["expectation_bound"]
    bounds["gap_median"] = bounds["pgd_global_median"] - bounds["percentile_bound_p50"]
    bounds["gap_lore"] = bounds["pgd_local_return"] - bounds["lore_bound"]
    written = []
    mr = _pivot(df, "mean_radius")
    written += _write_table(mr, tables_dir / f"{spec.paper_name}_mean_radius")
    written += _write_table(_pivot(df, "benign_return"), tables_dir / f"{spec.paper_name}_benign_return")
    written += _write_table(bounds, tables_dir / f"{spec.paper_name}_reward_bounds")
    expected = set(table_files(tables_dir, env))
    assert set(written) == expected, (sorted(map(str, written)), sorted(map(str, expected)))
    return written


def aggregate(results: Path, runs, *, table_eps_factors, figures_dir: Path, tables_dir: Path) -> list[Path]:
    data = load_runs(results, runs)
    figures_dir.mkdir(parents=True, exist_ok=True)
    tables_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for env in sorted({k[0] for k in data}):
        written += _figures_for_env(env, data, figures_dir)
        written += _tables_for_env(env, data, tables_dir, table_eps_factors)
        sig = sorted({k[2] for k in data if k[0] == env}, key=float)
        expected = {figures_dir / f"{s}.{fmt}" for s in figure_stems(env, sig) for fmt in FIGURE_FORMATS}
        missing = expected - set(written)
        if missing:
            raise RuntimeError(f"figures not written: {sorted(map(str, missing))}")
    return written
