"""Tidy tables and the paper's figures from the per-run result files (reads results only).

The file names and families are listed in :mod:`crop.layout`.  In every figure an algorithm has the same
colour (:data:`ALGO_COLORS`, fixed over all nine algorithms, whichever of them a run has), certified
bounds are solid lines and PGD attacks dashed, shading is ± one standard deviation over episodes.

Tables (per environment; CSV for scripts, Markdown for reading, LaTeX with booktabs for papers):
  {Env}_mean_radius     mean certified radius, algorithm × σ (uncertified steps count as 0)
  {Env}_benign_return   mean benign return of π̃, algorithm × σ
  {Env}_reward_bounds   J̲_E, J̲_p (p = 50 %), J̲ and the PGD returns at the chosen ε (and their gaps)
  {Env}_tightness       PGD return − bound for each bound (≥ 0 when sound; small when tight)
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from crop.config import ALGORITHMS  # noqa: E402
from crop.envs import env_spec  # noqa: E402
from crop.io import atomic_write_bytes, atomic_write_text  # noqa: E402
from crop.layout import (FIGURE_FORMATS, GLOBAL_FIGURES, TABLES,  # noqa: E402
                         aggregate_files, figure_families, large_sigma_labels, main_sigma_labels, needs_frames,
                         table_files)
from crop.report.metrics import load_runs, lore_valid_until, metric_value  # noqa: E402

__all__ = ["aggregate", "load_runs", "iter_env_figures", "legend_figure", "env_tables", "latex_table",
           "load_frames", "ALGO_COLORS", "ALGO_LABELS", "algo_label"]

# One colour per algorithm, the same in every figure (fixed over the full list, not the algorithms run).
ALGO_COLORS = dict(zip(ALGORITHMS, sns.color_palette("colorblind", len(ALGORITHMS)).as_hex()))
ALGO_LABELS = {"SA-MDP-PGD": "SA-MDP (PGD)", "SA-MDP-CVX": "SA-MDP (CVX)"}
PERIODIC_FRAMES = 6  # frames shown under the periodic-pattern plot


def algo_label(algo: str) -> str:
    return ALGO_LABELS.get(algo, algo)


def load_frames(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``frames`` (uint8 [T, H, W, 3] or [T, H, W]) and ``steps`` (int [T]) of a ``frames.npz``."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: missing — the LoAct stage writes the game frames of episode 0 for "
                                "Atari runs; the periodic-pattern figure needs them")
    with np.load(path) as z:
        if "frames" not in z or "steps" not in z:
            raise ValueError(f"{path}: needs arrays 'frames' and 'steps', has {sorted(z.files)}")
        frames, steps = np.asarray(z["frames"]), np.asarray(z["steps"]).astype(int).ravel()
    if frames.ndim not in (3, 4) or len(frames) != len(steps) or len(steps) == 0:
        raise ValueError(f"{path}: frames {frames.shape} and steps {steps.shape} do not match (T ≥ 1 frames)")
    if frames.ndim == 4 and frames.shape[-1] != 3:
        raise ValueError(f"{path}: frames must be RGB [T, H, W, 3], got {frames.shape}")
    return frames, steps


# --------------------------------------------------------------------------------------------- drawing

def _save(fig, figures_dir: Path, stem: str) -> list[Path]:
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


def _single(title: str, xlabel: str, ylabel: str):
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return fig, ax


def _grid(nrows: int, ncols: int, w: float = 2.7, h: float = 2.3):
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    return fig, axes


def _algo_handles(algos) -> list:
    return [Line2D([], [], color=ALGO_COLORS[a], lw=2, label=algo_label(a)) for a in algos]


def _style_handles() -> list:
    return [Line2D([], [], color="0.2", lw=1.5, ls="-", label="certified bound"),
            Line2D([], [], color="0.2", lw=1, ls="--", marker="x", ms=4, label="PGD attack")]


def _legend_columns(handles: list) -> tuple[list, int]:
    """Handles reordered so that a legend (filled column by column) reads row by row, and its columns."""
    n = len(handles)
    ncol = n if n <= 7 else math.ceil(n / math.ceil(n / 6))
    nrows = math.ceil(n / ncol)
    order = [r * ncol + c for c in range(ncol) for r in range(nrows) if r * ncol + c < n]
    return [handles[i] for i in order], ncol


def _top_legend(fig, algos, style: bool = False) -> None:
    handles, ncol = _legend_columns(_algo_handles(algos) + (_style_handles() if style else []))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol, frameon=False,
               fontsize=8)


def _mean_std_band(ax, x, m, s, algo):
    ax.plot(x, m, color=ALGO_COLORS[algo], label=algo_label(algo), lw=1)
    ax.fill_between(x, m - s, m + s, color=ALGO_COLORS[algo], alpha=0.2, lw=0)


def _panel_stepwise(ax, runs: dict) -> None:
    """Certified radius per time step, mean ± std over episodes (uncertified steps count as 0)."""
    for a, d in runs.items():
        g = d["loact"].groupby("step")["radius"]
        m, s = g.mean(), g.std(ddof=0).fillna(0.0)
        _mean_std_band(ax, m.index.to_numpy(), m.to_numpy(), s.to_numpy(), a)
    top = ax.get_ylim()[1]
    ax.set_ylim(-0.02 * top, top)  # a line at r = 0 stays visible above the axis
    if all(not (d["loact"]["radius"] > 0).any() for d in runs.values()):
        ax.text(0.5, 0.5, "no step certified\n(r = 0 at every step)", transform=ax.transAxes, ha="center",
                va="center", fontsize=8, color="0.35")


def _panel_ratio(ax, runs: dict) -> None:
    """Certified ratio η_r (% of steps certified at radius ≥ r), mean ± std over episodes."""
    for a, d in runs.items():
        g = d["certified_ratio"].groupby("r")["eta"]
        m, s = 100 * g.mean(), 100 * g.std(ddof=0).fillna(0.0)
        _mean_std_band(ax, m.index.to_numpy(), m.to_numpy(), s.to_numpy(), a)
    ax.set_ylim(-2, 102)


def _panel_global(ax, runs: dict, kind: str) -> None:
    """GRe bound vs ε (solid) and the global PGD mean/median return (dashed)."""
    col, stat = ("expectation_bound", "mean") if kind == "mean" else ("percentile_bound", "median")
    j_lo, j_hi = np.inf, -np.inf
    for a, d in runs.items():
        gre = d["gre"]
        j_lo, j_hi = min(j_lo, gre["j_min"].min()), max(j_hi, gre["j_max"].max())
        gre = gre[np.isclose(gre["p"], 0.5)] if kind == "median" else gre.drop_duplicates("eps")
        ax.plot(gre["eps"], gre[col], color=ALGO_COLORS[a], label=algo_label(a), marker=".", ms=4, lw=1.2)
        att = d["attack_global"].groupby("eps")["return"].agg(stat)
        ax.plot(att.index, att.to_numpy(), color=ALGO_COLORS[a], ls="--", lw=1, marker="x", ms=3)
    if np.isfinite(j_lo) and j_hi > j_lo:
        # The expectation bound falls far below J_min at large ε; show the meaningful range only.
        pad = 0.05 * (j_hi - j_lo)
        ax.set_ylim(j_lo - pad, j_hi + pad)
    ax.set_xlim(left=0)


def _panel_adasearch(ax, runs: dict) -> None:
    """LoRe's bound J̲ vs ε (solid step function) and the local PGD return from the same s₀ (dashed)."""
    xmax = 0.0
    for d in runs.values():
        att = d["attack_local"]
        xmax = max(xmax, float(att["eps"].max()), float(d["lore"]["eps"].max()))
    for a, d in runs.items():
        lore = d["lore"].sort_values("eps")
        end = min(xmax, lore_valid_until(d))
        keep = lore[lore["eps"] <= end]
        xs = np.append(keep["eps"].to_numpy(), end)
        ys = np.append(keep["lower_bound"].to_numpy(), keep["lower_bound"].iloc[-1])
        ax.step(xs, ys, where="post", color=ALGO_COLORS[a], label=algo_label(a), lw=1.2)
        att = d["attack_local"]
        g = att[att["same_start_as_lore"].astype(bool)].groupby("eps")["return"].min()
        ax.plot(g.index, g.to_numpy(), color=ALGO_COLORS[a], ls="--", marker="x", ms=3, lw=1)
    ax.set_xlim(left=0)


_PANELS = {
    "stepwise": (_panel_stepwise, "time step t", "certified radius r"),
    "certified_ratio": (_panel_ratio, "radius r", "certified ratio η_r (%)"),
    "global_mean": (lambda ax, runs: _panel_global(ax, runs, "mean"), "attack ε", "expectation bound J̲_E"),
    "global_median": (lambda ax, runs: _panel_global(ax, runs, "median"), "attack ε",
                      "percentile bound J̲_p (p=50%)"),
    "adasearch": (_panel_adasearch, "attack ε", "absolute lower bound J̲"),
}
_STYLE_KEY = {"global_mean", "global_median", "adasearch"}


def _runs_at(data: dict, env: str, lab: str, algos) -> dict:
    return {a: data[(env, a, lab)] for a in algos if (env, a, lab) in data}


def _single_panel_figure(kind: str, env: str, lab: str, runs: dict):
    draw, xlabel, ylabel = _PANELS[kind]
    fig, ax = _single(f"{env_spec(env).paper_name}, σ={lab}", xlabel, ylabel)
    draw(ax, runs)
    ax.legend(fontsize=7, title="solid: certified, dashed: PGD" if kind in _STYLE_KEY else None,
              title_fontsize=6)
    return fig


def _grid_figure(env: str, data: dict, algos, rows, labels, row_names=None):
    """One row per panel kind in ``rows``, one column per σ label; one legend above."""
    fig, axes = _grid(len(rows), len(labels))
    for i, kind in enumerate(rows):
        draw, xlabel, ylabel = _PANELS[kind]
        for j, lab in enumerate(labels):
            ax = axes[i][j]
            draw(ax, _runs_at(data, env, lab, algos))
            if i == 0:
                ax.set_title(f"σ={lab}", fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                name = row_names[i] if row_names else env_spec(env).paper_name
                ax.set_ylabel(f"{name}\n{ylabel}", fontsize=8)
    fig.tight_layout()
    _top_legend(fig, algos, style=any(k in _STYLE_KEY for k in rows))
    return fig


def _clean_figure(env: str, data: dict, algos, labels):
    fig, ax = _single(f"{env_spec(env).paper_name}: benign return of π̃", "σ", "return")
    for a in algos:
        xs, ms, sd = [], [], []
        for lab in labels:
            if (env, a, lab) in data:
                r = data[(env, a, lab)]["loact_episodes"]["return"]
                xs.append(float(lab))
                ms.append(r.mean())
                sd.append(r.std(ddof=0))
        ax.errorbar(xs, ms, yerr=sd, marker="o", ms=4, capsize=3, color=ALGO_COLORS[a], label=algo_label(a))
    ax.set_xscale("log")
    # Ticks at the σ run, written as the paper writes σ (0.001, 0.5, 4), not as powers of ten.
    ax.set_xticks([float(lab) for lab in labels], [f"{float(lab):g}" for lab in labels], rotation=45, fontsize=7)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    return fig


def legend_figure(algos):
    """The legend strip alone: one colour per algorithm, and the line-style key."""
    handles, ncol = _legend_columns(_algo_handles(algos) + _style_handles())
    fig = plt.figure(figsize=(0.1, 0.1))
    fig.legend(handles=handles, loc="center", ncol=ncol, frameon=False, fontsize=9)
    return fig


def _periodic_figure(env: str, algo: str, lab: str, run: dict):
    """Certified radius over the window of recorded steps (episode 0), with the frames at marked steps."""
    frames, steps = load_frames(run["frames_path"])
    st = run["loact"]
    ep0 = st[st["episode"] == st["episode"].min()].set_index("step")["radius"]
    lo, hi = int(steps.min()), int(steps.max())
    window = ep0[(ep0.index >= lo) & (ep0.index <= hi)]
    k = min(PERIODIC_FRAMES, len(steps))
    picks = np.unique(np.linspace(0, len(steps) - 1, k).round().astype(int))
    fig = plt.figure(figsize=(1.7 * max(len(picks), 3), 4.6))
    gs = fig.add_gridspec(2, len(picks), height_ratios=[1.0, 1.25], hspace=0.35)
    ax = fig.add_subplot(gs[0, :])
    ax.plot(window.index, window.to_numpy(), color=ALGO_COLORS[algo], lw=1.2, label=algo_label(algo))
    ax.set_xlim(lo, max(hi, lo + 1))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time step t", fontsize=8)
    ax.set_ylabel("certified radius r", fontsize=8)
    ax.set_title(f"{env_spec(env).paper_name}, {algo_label(algo)}, σ={lab}: LoAct episode 0, steps {lo}–{hi}",
                 fontsize=9)
    ax.tick_params(labelsize=7)
    for n, i in enumerate(picks):
        t = int(steps[i])
        letter = chr(ord("a") + n)
        ax.axvline(t, color="0.3", ls=":", lw=0.8)
        ax.annotate(letter, (t, 0.97), xycoords=("data", "axes fraction"), ha="center", va="top", fontsize=8,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
        fa = fig.add_subplot(gs[1, n])
        fa.imshow(frames[i], cmap="gray" if frames.ndim == 3 else None, interpolation="nearest")
        r = ep0.get(t, math.nan)
        fa.set_title(f"({letter}) t={t}\nr={r:.3g}", fontsize=7)
        fa.axis("off")
    return fig


def iter_env_figures(env: str, data: dict):
    """Yield (stem, Figure) for every figure of ``env`` in :func:`crop.layout.figure_families`."""
    keys = [k for k in data if k[0] == env]
    algos = [a for a in ALGORITHMS if any(k[1] == a for k in keys)]
    labels = sorted({k[2] for k in keys}, key=float)
    fam = figure_families(env, labels, algos)
    main = main_sigma_labels(env, labels)
    spec = env_spec(env)
    for kind in ("stepwise", "certified_ratio", "global_mean", "global_median", "adasearch"):
        for lab in labels:
            stem = f"{spec.paper_name}_{kind}_sigma-{lab}"
            assert stem in fam[kind], stem
            yield stem, _single_panel_figure(kind, env, lab, _runs_at(data, env, lab, algos))
    yield f"{spec.paper_name}_stepwise", _grid_figure(env, data, algos, ["stepwise"], main)
    yield f"{spec.paper_name}_certified_ratio", _grid_figure(env, data, algos, ["certified_ratio"], main)
    yield fam["all_bounds"][0], _grid_figure(env, data, algos, ["global_mean", "global_median", "adasearch"],
                                             main, row_names=["(Global)", "(Global)", "(Local)"])
    yield fam["loact_clean"][0], _clean_figure(env, data, algos, labels)
    yield fam["legend"][0], legend_figure(algos)
    if fam["large_sigma"]:
        large = large_sigma_labels(env, labels)
        yield fam["large_sigma"][0], _grid_figure(env, data, algos, ["stepwise", "adasearch"], large,
                                                  row_names=["(a)", "(b)"])
    for stem in fam["periodic"]:
        lab, algo = stem[len(f"{spec.paper_name}_periodic_sigma-"):].split("_", 1)
        yield stem, _periodic_figure(env, algo, lab, data[(env, algo, lab)])


# --------------------------------------------------------------------------------------------- tables

_LATEX_HEADERS = {
    "algo": "Algorithm", "sigma": r"$\sigma$", "eps": r"$\epsilon$",
    "expectation_bound": r"$\underline{J}_E$", "percentile_bound_p50": r"$\underline{J}_{p}$ ($p=50\%$)",
    "lore_bound": r"$\underline{J}$ (LoRe)", "pgd_global_mean": "PGD mean", "pgd_global_median": "PGD median",
    "pgd_local_return": "PGD local",
    "gap_mean": r"PGD mean $-\,\underline{J}_E$", "gap_median": r"PGD median $-\,\underline{J}_p$",
    "gap_lore": r"PGD local $-\,\underline{J}$",
}
_TEX_ESCAPE = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
               "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex_escape(text: str) -> str:
    return "".join(_TEX_ESCAPE.get(ch, ch) for ch in str(text))


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


def latex_table(df: pd.DataFrame, caption: str) -> str:
    """A booktabs ``tabular`` (\\toprule/\\midrule/\\bottomrule) of ``df``: text left, numbers right, NaN
    as --; ``\\input`` it inside a ``table`` environment (needs ``\\usepackage{booktabs}``)."""
    align = "".join("r" if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
                    else "l" for c in df.columns)
    lines = [f"% {caption}", "% Written by `crop aggregate`; needs \\usepackage{booktabs}.",
             f"\\begin{{tabular}}{{{align}}}", r"\toprule",
             " & ".join(_tex_header(c) for c in df.columns) + r" \\", r"\midrule"]
    for row in df.itertuples(index=False):
        lines.append(" & ".join(_tex_cell(c, v) for c, v in zip(df.columns, row)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)


def _pivot(df: pd.DataFrame, value: str) -> pd.DataFrame:
    t = df.pivot_table(index="algo", columns="sigma", values=value, aggfunc="first", dropna=False)
    t = t.reindex([a for a in ALGORITHMS if a in t.index])
    t.columns = [f"sigma={c}" for c in t.columns]
    return t.reset_index()


def _write_table(df: pd.DataFrame, base: Path, caption: str) -> list[Path]:
    paths = {fmt: base.with_name(f"{base.name}.{fmt}") for fmt in ("csv", "md", "tex")}
    atomic_write_text(paths["csv"], df.to_csv(index=False, lineterminator="\n", float_format="%.10g"))
    atomic_write_text(paths["md"], df.to_markdown(index=False, floatfmt=".4g", missingval="—") + "\n")
    atomic_write_text(paths["tex"], latex_table(df, caption))
    return list(paths.values())


def env_tables(env: str, data: dict, table_eps_factors) -> dict[str, tuple[pd.DataFrame, str]]:
    """{table name: (DataFrame, caption)} for ``env`` (names as in :data:`crop.layout.TABLES`)."""
    spec = env_spec(env)
    rows, bound_rows = [], []
    for (e, a, lab), d in sorted(data.items(), key=lambda kv: (ALGORITHMS.index(kv[0][1]), float(kv[0][2]))):
        if e != env:
            continue
        ep = d["loact_episodes"]
        rows.append({"algo": a, "sigma": float(lab), "mean_radius": metric_value(d, "mean_radius"),
                     "certified_fraction": metric_value(d, "certified_fraction"),
                     "benign_return": metric_value(d, "benign_return"),
                     "benign_return_std": float(ep["return"].std(ddof=0))})
        sigma = float(lab)
        for f in table_eps_factors:
            eps = f * sigma
            vals = {m: metric_value(d, m, eps) for m in ("expectation_bound", "percentile_bound", "lore_bound",
                                                         "pgd_global_mean", "pgd_global_median",
                                                         "pgd_local_return")}
            vals = {m: math.nan if v is None else v for m, v in vals.items()}
            vals["percentile_bound_p50"] = vals.pop("percentile_bound")
            bound_rows.append({"algo": a, "sigma": sigma, "eps": eps, "expectation_bound": vals["expectation_bound"],
                               "percentile_bound_p50": vals["percentile_bound_p50"], "lore_bound": vals["lore_bound"],
                               "pgd_global_mean": vals["pgd_global_mean"],
                               "pgd_global_median": vals["pgd_global_median"],
                               "pgd_local_return": vals["pgd_local_return"]})
    df = pd.DataFrame(rows)
    bounds = pd.DataFrame(bound_rows)
    bounds["gap_mean"] = bounds["pgd_global_mean"] - bounds["expectation_bound"]
    bounds["gap_median"] = bounds["pgd_global_median"] - bounds["percentile_bound_p50"]
    bounds["gap_lore"] = bounds["pgd_local_return"] - bounds["lore_bound"]
    tight = bounds[["algo", "sigma", "eps", "gap_mean", "gap_median", "gap_lore"]]
    p = spec.paper_name
    out = {
        "mean_radius": (_pivot(df, "mean_radius"),
                        f"{p}: mean certified radius of LoAct (Theorem 1), uncertified steps counted as 0"),
        "benign_return": (_pivot(df, "benign_return"),
                          f"{p}: mean benign return of the smoothed policy over LoAct's clean episodes"),
        "reward_bounds": (bounds, f"{p}: certified reward bounds J_E (Thm 2), J_p (p=50%, Thm 3), J (LoRe, "
                                  "Thm 4) and PGD returns at the chosen eps"),
        "tightness": (tight, f"{p}: PGD return minus certified bound (>= 0 when sound, small when tight)"),
    }
    assert tuple(out) == TABLES
    return out


def _tables_for_env(env: str, data: dict, tables_dir: Path, table_eps_factors) -> list[Path]:
    spec = env_spec(env)
    written = []
    for name, (df, caption) in env_tables(env, data, table_eps_factors).items():
        written += _write_table(df, tables_dir / f"{spec.paper_name}_{name}", caption)
    expected = set(table_files(tables_dir, env))
    assert set(written) == expected, (sorted(map(str, written)), sorted(map(str, expected)))
    return written


def aggregate(results: Path, runs, *, table_eps_factors, figures_dir: Path, tables_dir: Path) -> list[Path]:
    """Write every figure and table of :func:`crop.layout.aggregate_files` for ``runs``, and nothing else."""
    data = load_runs(results, runs)
    figures_dir, tables_dir = Path(figures_dir), Path(tables_dir)
    envs = sorted({k[0] for k in data})
    plan = {}
    for env in envs:
        plan[env] = ([a for a in ALGORITHMS if any(k[:2] == (env, a) for k in data)],
                     sorted({k[2] for k in data if k[0] == env}, key=float))
        for (e, _algo, _lab), d in data.items():
            if e == env and needs_frames(env) and not d["frames_path"].is_file():
                raise FileNotFoundError(f"{d['frames_path']}: missing (the Pong periodic-pattern figure needs "
                                        "the frames LoAct records for Atari runs)")
    figures_dir.mkdir(parents=True, exist_ok=True)
    tables_dir.mkdir(parents=True, exist_ok=True)
    sns.set_theme(style="whitegrid", context="paper")
    written = []
    for env in envs:
        for stem, fig in iter_env_figures(env, data):
            written += _save(fig, figures_dir, stem)
        written += _tables_for_env(env, data, tables_dir, table_eps_factors)
    all_algos = [a for a in ALGORITHMS if any(a in algos for algos, _ in plan.values())]
    assert GLOBAL_FIGURES == ("legend",)
    written += _save(legend_figure(all_algos), figures_dir, "legend")
    expected = set(aggregate_files(figures_dir, tables_dir, plan))
    if set(written) != expected or len(written) != len(expected):
        raise RuntimeError(f"aggregate wrote {sorted(map(str, set(written) - expected))} beyond the layout and "
                           f"missed {sorted(map(str, expected - set(written)))}")
    return written
