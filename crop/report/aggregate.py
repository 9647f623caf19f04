"""Tidy tables and the paper's figures from the per-run result files (reads results only).

The file names and families are listed in :mod:`crop.layout`; docs/figures.md describes each for a reader.
In every figure an algorithm has the same colour and marker (:data:`ALGO_COLORS`, :data:`ALGO_MARKERS`, fixed
over all nine algorithms, whichever of them a run has; labels of your own get theirs from
:func:`register_labels`), certified bounds are solid lines and PGD attacks
dashed (drawn above the bounds), shading is ± one standard deviation over episodes, axis labels use the
paper's symbols (:data:`LABELS`).

Tables (per environment; CSV with stable column keys for scripts, Markdown with a caption and reader's
column names, LaTeX with booktabs for papers; an empty cell is ``—`` in Markdown, ``--`` in LaTeX):
  {Env}_mean_radius            mean certified radius, algorithm × σ, uncertified steps count as 0 (headline)
  {Env}_mean_radius_certified  the same over certified steps only (the paper's and the leaderboard's mean)
  {Env}_benign_return          mean benign return of π̃, algorithm × σ
  {Env}_reward_bounds          J̲_E, J̲_p (p = 50 %), J̲ and the PGD returns at the chosen ε
  {Env}_tightness              PGD return − bound for each bound (≥ 0 when sound; small when tight)
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
from matplotlib import patheffects  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from crop.config import ALGORITHMS  # noqa: E402
from crop.envs import env_spec  # noqa: E402
from crop.io import atomic_write_bytes, atomic_write_text  # noqa: E402
from crop.layout import (  # noqa: E402
    FIGURE_FORMATS,
    TABLES,
    aggregate_files,
    figure_families,
    large_sigma_labels,
    main_sigma_labels,
    needs_frames,
    replicate_of,
    series_label,
    split_run_algo,
    table_files,
)
from crop.names import TARGET_NAMES  # noqa: E402
from crop.report.intervals import INTERVAL_METRICS, METHOD_EPISODES, METHOD_REPLICATES, run_interval  # noqa: E402
from crop.report.metrics import (  # noqa: E402
    CONVENTIONS,
    load_replicates,
    load_runs,
    lore_valid_until,
    metric_value,
    per_step_mean_radius,
)

__all__ = ["aggregate", "load_runs", "iter_env_figures", "legend_figure", "env_tables", "latex_table",
           "markdown_table", "load_frames", "gre_curve", "ALGO_COLORS", "ALGO_MARKERS", "ALGO_LABELS", "LABELS",
           "algo_label", "register_labels", "algo_index", "algo_color", "algo_marker"]

# One colour and one marker per algorithm, the same in every figure (fixed over the full list, not the
# algorithms run).  Colours: Paul Tol's "muted" qualitative scheme (https://personal.sron.nl/~pault/), nine
# colours chosen to stay distinct under the common colour-vision deficiencies.  Markers: series that coincide
# (two policies that certify nothing, two returns at the maximum) still show each algorithm, because their
# markers are placed at staggered points (:func:`_markevery`).
ALGO_COLORS = {"StdTrain": "#332288", "GaussAug": "#88ccee", "AdvTrain": "#44aa99", "SA-MDP-PGD": "#117733",
               "SA-MDP-CVX": "#999933", "RadialRL": "#cc6677", "CARRL": "#ddcc77", "NoisyNet": "#882255",
               "GradDQN": "#aa4499"}
ALGO_MARKERS = {"StdTrain": "o", "GaussAug": "s", "AdvTrain": "^", "SA-MDP-PGD": "v", "SA-MDP-CVX": "D",
                "RadialRL": "P", "CARRL": "X", "NoisyNet": "*", "GradDQN": "h"}
assert list(ALGO_COLORS) == list(ALGO_MARKERS) == list(ALGORITHMS)
# Labels of your own (any label outside the nine): the k-th of a run's own labels, in sorted order, takes
# colour k mod 7 (Paul Tol's "vibrant" scheme, none of them in "muted") and marker k mod 6 (none of the
# nine's), so up to 42 labels of your own get distinct (colour, marker) pairs beside the nine.
EXTRA_COLORS = ("#ee7733", "#0077bb", "#33bbee", "#ee3377", "#cc3311", "#009988", "#bbbbbb")
EXTRA_MARKERS = ("p", "<", ">", "d", "H", "8")
_EXTRA: list[str] = []   # the labels of your own seen by this process, in the order they were styled


def register_labels(labels) -> None:
    """Give the labels of your own among ``labels`` their colours and markers (sorted, so the same set of
    labels gets the same styles whatever order the runs are read in)."""
    _EXTRA.extend(sorted(set(labels) - set(ALGORITHMS) - set(_EXTRA)))


def algo_color(algo: str) -> str:
    """The label's colour: the nine's own (:data:`ALGO_COLORS`), else that of its place among your own."""
    if algo in ALGO_COLORS:
        return ALGO_COLORS[algo]
    return EXTRA_COLORS[(algo_index(algo) - len(ALGORITHMS)) % len(EXTRA_COLORS)]


def algo_marker(algo: str) -> str:
    if algo in ALGO_MARKERS:
        return ALGO_MARKERS[algo]
    return EXTRA_MARKERS[(algo_index(algo) - len(ALGORITHMS)) % len(EXTRA_MARKERS)]


def algo_index(algo: str) -> int:
    """The label's place: the nine in the paper's order, then your own labels."""
    if algo in ALGORITHMS:
        return ALGORITHMS.index(algo)
    register_labels([algo])
    return len(ALGORITHMS) + _EXTRA.index(algo)


ALGO_LABELS = {"SA-MDP-PGD": "SA-MDP (PGD)", "SA-MDP-CVX": "SA-MDP (CVX)"}
PERIODIC_FRAMES = 6  # frames shown under the periodic-pattern plot
# Certified bounds are solid, PGD attacks dashed and drawn above them (a white edge keeps each dash visible
# over a solid line of the same colour); line ``gid``s say which is which ("bound:ALGO", "attack:ALGO").
# Coinciding series stay distinguishable: marker sizes shrink along the algorithm list (markers at the same
# point nest), dash patterns start at an offset that depends on the algorithm (coinciding dashed lines
# alternate colours), and error bars are dodged sideways.
BOUND_Z, ATTACK_Z = 2.0, 3.0
ATTACK_STYLE = {"ls": (0, (4, 2)), "lw": 1.4, "zorder": ATTACK_Z,
                "path_effects": [patheffects.Stroke(linewidth=2.8, foreground="white"), patheffects.Normal()]}
# Axis labels in math text (the paper's symbols, no literal underscores).
LABELS = {
    "t": "time step $t$",
    "r": "certified radius $r$",
    "eta": r"certified ratio $\eta_r$ (%)",
    "eps": r"attack $\epsilon$",
    "J_E": r"expectation bound $\underline{J}_{\mathrm{E}}$",
    "J_p": r"percentile bound $\underline{J}_p$ ($p=50\%$)",
    "J": r"absolute lower bound $\underline{J}$",
    "sigma": r"smoothing $\sigma$",
    "return": r"benign return of $\tilde{\pi}$",
}


# A smoothing target other than q (run folder ALGO@TARGET, crop/layout.py) is drawn in its algorithm's colour
# with the target's own marker, and labelled "StdTrain (vote)".
TARGET_MARKERS = {"probs": "p", "vote": "d"}


def algo_label(algo: str) -> str:
    base, target = split_run_algo(algo)
    label = ALGO_LABELS.get(base, base)
    return label if target == "q" else f"{label} ({target})"


def _color(algo: str) -> str:
    """A run folder's algorithm component (ALGO or ALGO@TARGET): its algorithm's colour."""
    return algo_color(split_run_algo(algo)[0])


def _marker(algo: str) -> str:
    base, target = split_run_algo(algo)
    return algo_marker(base) if target == "q" else TARGET_MARKERS[target]


def _rank(algo: str) -> int:
    return algo_index(split_run_algo(algo)[0])


def _series_key(algo: str) -> tuple[int, int]:
    base, target = split_run_algo(algo)
    return algo_index(base), TARGET_NAMES.index(target)


def _series(names) -> list[str]:
    """Run folders' algorithm components in the fixed order: the paper's nine, then labels of your own (sorted),
    each algorithm's other targets after q."""
    names = set(names)
    register_labels(split_run_algo(a)[0] for a in names)
    return sorted(names, key=_series_key)


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


def _math_font(label: str) -> dict:
    """Computer Modern for a bar under J (J̲): DejaVu's italic J descends, so its bar would sit as low as the
    subscript, under it rather than under J."""
    return {"math_fontfamily": "cm"} if r"\underline" in label else {}


def _single(title: str, xlabel: str, ylabel: str):
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel, **_math_font(ylabel))
    return fig, ax


def _grid(nrows: int, ncols: int, w: float = 2.7, h: float = 2.3):
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    return fig, axes


def _markevery(algo: str, n: int):
    """Markers on about eight of ``n`` points, staggered by algorithm so that coinciding series show all."""
    if n <= 12:
        return None
    every = math.ceil(n / 8)
    return ((_rank(algo) % len(ALGORITHMS)) * every // len(ALGORITHMS), every)


def _marker_size(algo: str) -> float:
    return max(5.6 - 0.3 * _rank(algo), 3.2)


def _line_width(algo: str) -> float:
    """Earlier algorithms draw wider lines, so that a later one drawn over the same values leaves an edge."""
    return max(1.9 - 0.09 * _rank(algo), 1.1)


def _bound_line(ax, x, y, algo, *, markevery="auto", **kw):
    """A certified quantity (solid, the algorithm's colour and marker)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    kw.setdefault("lw", _line_width(algo))
    (line,) = ax.plot(x, y, color=_color(algo), marker=_marker(algo), ms=_marker_size(algo), ls="-",
                      zorder=BOUND_Z,
                      markevery=_markevery(algo, len(x)) if markevery == "auto" else markevery,
                      label=algo_label(algo), gid=f"bound:{algo}", **kw)
    return line


def _attack_line(ax, x, y, algo):
    """A PGD attack's return (dashed, above the bounds, no markers to hide it)."""
    style = {**ATTACK_STYLE, "ls": (2.0 * (_rank(algo) % 3), (4, 2))}
    (line,) = ax.plot(np.asarray(x, dtype=float), np.asarray(y, dtype=float), color=_color(algo),
                      label="_nolegend_", gid=f"attack:{algo}", **style)
    return line


def _algo_handles(algos) -> list:
    return [Line2D([], [], color=_color(a), marker=_marker(a), ms=6, lw=1.5, label=algo_label(a))
            for a in algos]


def _style_handles() -> list:
    return [Line2D([], [], color="0.25", lw=1.4, ls="-", label="certified bound (solid)"),
            Line2D([], [], color="0.25", label="PGD attack (dashed)", **ATTACK_STYLE)]


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
               fontsize=8, handlelength=3.2)


def _ylim(ax, lo: float, hi: float, min_span: float) -> None:
    """y-limits around the data [lo, hi] (5 % padding); a flat or nearly flat series gets a window of
    ``min_span`` instead of matplotlib's ± a tiny band that blows noise-free constants up to a slope."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return
    if hi - lo < min_span:
        mid = 0.5 * (lo + hi)
        lo, hi = mid - 0.5 * min_span, mid + 0.5 * min_span
    pad = 0.05 * (hi - lo)
    ax.set_ylim(lo - pad, hi + pad)


def _return_span(lo: float, hi: float) -> float:
    """The smallest y window for returns: ± a tenth of their magnitude, at least 1 (one unit of reward)."""
    return max(1.0, 0.2 * max(abs(lo), abs(hi)))


def _mean_std_band(ax, x, m, s, algo):
    _bound_line(ax, x, m, algo)
    ax.fill_between(x, m - s, m + s, color=_color(algo), alpha=0.15, lw=0, zorder=1)


def _panel_stepwise(ax, runs: dict, sigma: float) -> None:
    """Certified radius per time step: at step t, mean ± std over the episodes still running at t,
    uncertified steps counted as 0 (:func:`crop.report.metrics.per_step_mean_radius`)."""
    top = 0.0
    for a, d in runs.items():
        ps = per_step_mean_radius(d["loact"], "uncertified_zero")
        m, s = ps["mean"].to_numpy(), ps["std"].fillna(0.0).to_numpy()
        _mean_std_band(ax, ps.index.to_numpy(), m, s, a)
        top = max(top, float(np.nanmax(m + s)) if len(m) else 0.0)
    if top <= 0:
        top = 0.1 * sigma  # nothing certified: a radius axis on the scale of σ, the line at r = 0 visible
        if runs:
            ax.text(0.5, 0.5, "no step certified\n(r = 0 at every step)", transform=ax.transAxes, ha="center",
                    va="center", fontsize=8, color="0.35")
    ax.set_ylim(-0.03 * top, 1.05 * top)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def _panel_ratio(ax, runs: dict, sigma: float) -> None:
    """Certified ratio η_r (% of steps certified at radius ≥ r), mean ± std over episodes."""
    for a, d in runs.items():
        g = d["certified_ratio"].groupby("r")["eta"]
        m, s = 100 * g.mean(), 100 * g.std(ddof=0).fillna(0.0)
        _mean_std_band(ax, m.index.to_numpy(), m.to_numpy(), s.to_numpy(), a)
    ax.set_ylim(-3, 103)


def _gre_rows(d: dict, kind: str) -> pd.DataFrame:
    gre = d["gre"]
    rows = gre[np.isclose(gre["p"], 0.5)] if kind == "median" else gre.drop_duplicates("eps")
    return rows.sort_values("eps")


def gre_curve(d: dict, kind: str, x_end: float) -> tuple[np.ndarray, np.ndarray, int]:
    """GRe's bound (``kind`` "mean": J̲_E, Theorem 2; "median": J̲_p at p = 0.5, Theorem 3) of one run over
    [0, ``x_end``]: the rows of ``gre.csv``, then — where the run's ε grid ends before the plot's x range
    (the attack's grid reaches further) — the same bound at larger ε from the same stored returns
    (``gre_returns.csv``, :func:`crop.gre.gre_bounds`, α per point as in gre.csv).  A percentile no order
    statistic certifies is drawn as the trivial bound J_min.  Returns (ε, bound, n) with the first ``n``
    points from gre.csv."""
    col = "expectation_bound" if kind == "mean" else "percentile_bound"
    rows = _gre_rows(d, kind)
    eps, y = rows["eps"].to_numpy(float), rows[col].to_numpy(float)
    n = len(eps)
    last = float(eps.max()) if n else 0.0
    if n and x_end > last * (1 + 1e-9):
        from crop.gre import gre_bounds  # the certifier's own formulas, not a copy

        r0 = rows.iloc[0]
        extra = np.linspace(last, x_end, 17)[1:]
        ext = gre_bounds(d["gre_returns"]["return"].to_numpy(float), sigma=float(r0["sigma"]),
                         horizon=int(r0["horizon"]), alpha=float(r0["alpha"]), eps_grid=extra, percentiles=[0.5],
                         j_min=float(r0["j_min"]), j_max=float(r0["j_max"]))
        eps, y = np.append(eps, extra), np.append(y, ext[col].to_numpy(float))
    if kind == "median" and n:
        y = np.where(np.isnan(y), float(rows["j_min"].iloc[0]), y)
    return eps, y, n


def _panel_global(ax, runs: dict, sigma: float, kind: str) -> None:
    """GRe bound vs ε (solid; markers at the run's own ε grid) and the global PGD mean/median (dashed)."""
    stat = "mean" if kind == "mean" else "median"
    x_end = 0.0
    for d in runs.values():
        x_end = max(x_end, float(d["gre"]["eps"].max()), float(d["attack_global"]["eps"].max()))
    j_lo, j_hi, vacuous_any = np.inf, -np.inf, False
    for a, d in runs.items():
        j_lo, j_hi = min(j_lo, d["gre"]["j_min"].min()), max(j_hi, d["gre"]["j_max"].max())
        eps, y, n = gre_curve(d, kind, x_end)
        # Below J_min a bound says less than the trivial one (vacuous): drawn at J_min, marked ▽.
        j_min = float(d["gre"]["j_min"].min())
        vacuous = y < j_min
        y = np.maximum(y, j_min)
        _bound_line(ax, eps, y, a, markevery=list(range(n)))
        if vacuous.any():
            vacuous_any = True
            ax.plot(eps[vacuous], y[vacuous], ls="none", marker="v", ms=4, mfc="none", mew=0.8,
                    color=_color(a), zorder=3)
        att = d["attack_global"].groupby("eps")["return"].agg(stat)
        _attack_line(ax, att.index, att.to_numpy(), a)
    if np.isfinite(j_lo) and j_hi > j_lo:
        # The expectation bound falls below J_min at large ε (vacuous there); show [J_min, J_max].
        pad = 0.05 * (j_hi - j_lo)
        ax.set_ylim(j_lo - pad, j_hi + pad)
    if vacuous_any:
        ax.text(0.98, 0.1, r"▽ vacuous: below $J_{\min}$, drawn at $J_{\min}$", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=6, color="0.3", zorder=ATTACK_Z + 1,
                # on a white patch: attack lines cross this height, and the note must stay legible over them
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    ax.set_xlim(0, x_end * 1.02 if x_end > 0 else None)


def _panel_adasearch(ax, runs: dict, sigma: float) -> None:
    """LoRe's bound J̲ vs ε (solid step function) and the local PGD return from the same s₀ (dashed)."""
    xmax = 0.0
    for d in runs.values():
        xmax = max(xmax, float(d["attack_local"]["eps"].max()), float(d["lore"]["eps"].max()))
    lo, hi = np.inf, -np.inf
    for a, d in runs.items():
        lore = d["lore"].sort_values("eps")
        end = min(xmax, lore_valid_until(d))
        keep = lore[lore["eps"] <= end]
        xs = np.append(keep["eps"].to_numpy(), end)
        ys = np.append(keep["lower_bound"].to_numpy(), keep["lower_bound"].iloc[-1])
        ax.step(xs, ys, where="post", color=_color(a), label=algo_label(a), lw=_line_width(a), zorder=BOUND_Z,
                marker=_marker(a), ms=_marker_size(a), markevery=list(range(len(keep))), gid=f"bound:{a}")
        att = d["attack_local"]
        g = att[att["same_start_as_lore"].astype(bool)].groupby("eps")["return"].min()
        _attack_line(ax, g.index, g.to_numpy(), a)
        vals = np.concatenate([ys, g.to_numpy(float)])
        lo, hi = min(lo, np.nanmin(vals)), max(hi, np.nanmax(vals))
    _ylim(ax, lo, hi, _return_span(lo, hi))
    ax.set_xlim(0, xmax * 1.02 if xmax > 0 else None)


_PANELS = {
    "stepwise": (_panel_stepwise, LABELS["t"], LABELS["r"]),
    "certified_ratio": (_panel_ratio, "radius $r$", LABELS["eta"]),
    "global_mean": (lambda ax, runs, sigma: _panel_global(ax, runs, sigma, "mean"), LABELS["eps"], LABELS["J_E"]),
    "global_median": (lambda ax, runs, sigma: _panel_global(ax, runs, sigma, "median"), LABELS["eps"],
                      LABELS["J_p"]),
    "adasearch": (_panel_adasearch, LABELS["eps"], LABELS["J"]),
}
_STYLE_KEY = {"global_mean", "global_median", "adasearch"}


def _runs_at(data: dict, env: str, lab: str, algos) -> dict:
    return {a: data[(env, a, lab)] for a in algos if (env, a, lab) in data}


def _single_panel_figure(kind: str, env: str, lab: str, runs: dict):
    draw, xlabel, ylabel = _PANELS[kind]
    fig, ax = _single(f"{env_spec(env).paper_name}, σ={lab}", xlabel, ylabel)
    draw(ax, runs, float(lab))
    _axes_legend(ax, _algo_handles(runs) + (_style_handles() if kind in _STYLE_KEY else []))
    return fig


def _axes_legend(ax, handles: list) -> None:
    """The legend of a one-panel figure: inside when short, to the right of the axes when it would cover
    the data."""
    if len(handles) <= 4:
        ax.legend(handles=handles, fontsize=7, handlelength=3.2)
    else:
        ax.legend(handles=handles, fontsize=7, handlelength=3.2, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  borderaxespad=0.0, frameon=False)


def _grid_figure(env: str, data: dict, algos, rows, labels, row_names=None):
    """One row per panel kind in ``rows``, one column per σ label; one legend above."""
    fig, axes = _grid(len(rows), len(labels))
    for i, kind in enumerate(rows):
        draw, xlabel, ylabel = _PANELS[kind]
        for j, lab in enumerate(labels):
            ax = axes[i][j]
            draw(ax, _runs_at(data, env, lab, algos), float(lab))
            if i == 0:
                ax.set_title(f"σ={lab}", fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                name = row_names[i] if row_names else env_spec(env).paper_name
                ax.set_ylabel(f"{name}\n{ylabel}", fontsize=8, **_math_font(ylabel))
    fig.tight_layout()
    _top_legend(fig, algos, style=any(k in _STYLE_KEY for k in rows))
    return fig


def _thin_tick_labels(ax) -> None:
    """Blank the x tick labels that would overlap a kept one (horizontal labels, never rotated)."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    last = None
    for label in ax.get_xticklabels():
        if not label.get_text():
            continue
        box = label.get_window_extent(renderer)
        if last is not None and box.x0 < last.x1 + 3:
            label.set_text("")
            label.set_visible(False)
        else:
            last = box


def _clean_figure(env: str, data: dict, algos, labels):
    fig, ax = _single(f"{env_spec(env).paper_name}: benign return of the smoothed policy", LABELS["sigma"],
                      LABELS["return"])
    lo, hi = np.inf, -np.inf
    for i, a in enumerate(algos):
        xs, ms, below, above = [], [], [], []
        for lab in labels:
            if (env, a, lab) in data:  # the mean (over replicates where there are several) and its 95 % interval
                iv = run_interval(data[(env, a, lab)], "benign_return")
                xs.append(float(lab))
                ms.append(iv["value"])
                below.append(0.0 if math.isnan(iv["lo"]) else iv["value"] - iv["lo"])
                above.append(0.0 if math.isnan(iv["hi"]) else iv["hi"] - iv["value"])
        ms, below, above = (np.asarray(x, dtype=float) for x in (ms, below, above))
        # Dodged sideways (a few hundredths of a decade per algorithm) so that equal returns do not hide
        # each other; the σ ticks stay at the true σ.
        dodge = 10.0 ** (0.025 * (i - 0.5 * (len(algos) - 1)))
        ax.errorbar(np.asarray(xs) * dodge, ms, yerr=[below, above], marker=_marker(a), ms=_marker_size(a),
                    capsize=3, color=_color(a), lw=_line_width(a), label=algo_label(a), zorder=BOUND_Z)
        if len(ms):
            lo, hi = min(lo, float(np.min(ms - below))), max(hi, float(np.max(ms + above)))
    _ylim(ax, lo, hi, _return_span(lo, hi))
    ax.set_xscale("log")
    # Ticks at the σ run, written as the paper writes σ (0.001, 0.5, 4), not as powers of ten; labels that
    # would collide are left out rather than rotated.
    ax.set_xticks([float(lab) for lab in labels], [f"{float(lab):g}" for lab in labels], fontsize=7)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    _axes_legend(ax, _algo_handles(algos))
    _thin_tick_labels(ax)
    return fig


def legend_figure(algos, title: str | None = None):
    """The legend strip alone: one colour and marker per algorithm, and the line-style key."""
    handles, ncol = _legend_columns(_algo_handles(algos) + _style_handles())
    fig = plt.figure(figsize=(0.1, 0.1))
    fig.legend(handles=handles, loc="center", ncol=ncol, frameon=False, fontsize=9, handlelength=3.2,
               title=title, title_fontsize=9)
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
    ax.plot(window.index, window.to_numpy(), color=_color(algo), lw=1.2, label=algo_label(algo))
    ax.set_xlim(lo, max(hi, lo + 1))
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel(LABELS["t"], fontsize=8)
    ax.set_ylabel(LABELS["r"], fontsize=8)
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
    algos = _series(k[1] for k in keys)
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
    yield fam["legend"][0], legend_figure(algos, title=spec.paper_name)
    if fam["large_sigma"]:
        large = large_sigma_labels(env, labels)
        yield fam["large_sigma"][0], _grid_figure(env, data, algos, ["stepwise", "adasearch"], large,
                                                  row_names=["(a)", "(b)"])
    for stem in fam["periodic"]:
        lab, algo = stem[len(f"{spec.paper_name}_periodic_sigma-"):].split("_", 1)
        yield stem, _periodic_figure(env, algo, lab, data[(env, algo, lab)])


# --------------------------------------------------------------------------------------------- tables

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
    "pgd_local_minus_lore_bound": "PGD local − J̲",
}
_LATEX_HEADERS = {
    "algo": "Algorithm", "sigma": r"$\sigma$", "eps": r"$\epsilon$",
    "expectation_bound": r"$\underline{J}_E$", "percentile_bound_p50": r"$\underline{J}_{p}$ ($p=50\%$)",
    "lore_bound": r"$\underline{J}$ (LoRe)", "pgd_global_mean": "PGD mean", "pgd_global_median": "PGD median",
    "pgd_local_return": "PGD local",
    "pgd_mean_minus_expectation_bound": r"PGD mean $-\,\underline{J}_E$",
    "pgd_median_minus_percentile_bound": r"PGD median $-\,\underline{J}_p$",
    "pgd_local_minus_lore_bound": r"PGD local $-\,\underline{J}$",
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
    lines = [f"% {caption}", "% Written by `crop aggregate`; needs \\usepackage{booktabs}.",
             f"\\begin{{tabular}}{{{align}}}", r"\toprule",
             " & ".join(_tex_header(c) for c in df.columns) + r" \\", r"\midrule"]
    for i, row in enumerate(df.itertuples(index=False)):
        lines.append(" & ".join(_tex_cell(c, v) + (r"$^\dagger$" if c in marks and marks[c][i] else "")
                                for c, v in zip(df.columns, row)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)


def _pivot(df: pd.DataFrame, value: str) -> pd.DataFrame:
    t = df.pivot_table(index="algo", columns="sigma", values=value, aggfunc="first", dropna=False)
    t = t.reindex(_series(t.index))
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
    cols = [c for c in df.columns if not c.endswith(INTERVAL_COLUMNS)]
    if len(cols) == len(df.columns):
        return df
    out = df[cols].copy()
    for c in cols:
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
    if "algo" in out:
        out["algo"] = out["algo"].map(algo_label)
    out = out.astype(object).where(out.notna(), None)  # tabulate prints missingval for None only
    for col, mark in marks.items():
        out[col] = [v if v is None else f"{v:.4g}" + (" †" if m else "") for v, m in zip(out[col], mark)]
    out.columns = [_md_header(c) for c in df.columns]
    align = ["right" if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) else "left"
             for c in df.columns]  # numbers right, also in a column that is all empty cells
    return f"{caption}\n\n" + out.to_markdown(index=False, floatfmt=".4g", missingval="—", colalign=align) + "\n"


def _write_table(df: pd.DataFrame, base: Path, caption: str) -> list[Path]:
    paths = {fmt: base.with_name(f"{base.name}.{fmt}") for fmt in ("csv", "md", "tex")}
    atomic_write_text(paths["csv"], df.to_csv(index=False, lineterminator="\n", float_format="%.10g"))
    atomic_write_text(paths["md"], markdown_table(_merged(df), caption))
    atomic_write_text(paths["tex"], latex_table(_merged(df), caption))
    return list(paths.values())


def _eps(factor: float, sigma: float) -> float:
    """ε = factor·σ without binary noise (0.05·0.1 is 0.005, not 0.005000000000000001)."""
    return float(f"{factor * sigma:.12g}")


def env_tables(env: str, data: dict, table_eps_factors) -> dict[str, tuple[pd.DataFrame, str]]:
    """{table name: (DataFrame, caption)} for ``env`` (names as in :data:`crop.layout.TABLES`)."""
    spec = env_spec(env)
    rows, bound_rows = [], []
    for (e, a, lab), d in sorted(data.items(), key=lambda kv: (_series_key(kv[0][1]), float(kv[0][2]))):
        if e != env:
            continue
        ep = d["loact_episodes"]
        row = {"algo": a, "sigma": float(lab), "mean_radius": metric_value(d, "mean_radius"),
               "mean_radius_certified": metric_value(d, "mean_radius_certified"),
               "certified_fraction": metric_value(d, "certified_fraction"),
               "benign_return": metric_value(d, "benign_return"),
               "benign_return_std": float(ep["return"].std(ddof=0))}
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
            # Theorem 2's linear bound falls below J_min at large ε: vacuous, reported as J_min (marked †)
            raw_eb = vals["expectation_bound"]
            j_min = float(d["gre"]["j_min"].iloc[0]) if "gre" in d and len(d["gre"]) else -math.inf
            vals["expectation_bound"] = max(raw_eb, j_min) if not math.isnan(raw_eb) else raw_eb
            bound_rows.append({"algo": a, "sigma": sigma, "eps": eps, "expectation_bound": vals["expectation_bound"],
                               "percentile_bound_p50": vals["percentile_bound_p50"], "lore_bound": vals["lore_bound"],
                               "pgd_global_mean": vals["pgd_global_mean"],
                               "pgd_global_median": vals["pgd_global_median"],
                               "pgd_local_return": vals["pgd_local_return"], "expectation_bound_raw": raw_eb})
    df = pd.DataFrame(rows)
    counts = [1 + len(d.get("replicates") or []) for (e, _, _), d in data.items() if e == env]
    reps = max(counts, default=1)
    bounds = pd.DataFrame(bound_rows)
    tight = bounds[["algo", "sigma", "eps"]].copy()  # against the bounds as reported (vacuous ones: J_min)
    for col, (attack, bound) in TIGHTNESS_COLUMNS.items():
        tight[col] = bounds[attack] - bounds[bound]
    p = spec.paper_name
    conv0, conv1 = CONVENTIONS["uncertified_zero"], CONVENTIONS["certified_only"]
    ci = (f"; [lo, hi]: 95 % confidence interval, {METHOD_REPLICATES} ({reps} replicates; the value is their mean, "
          "sd their standard deviation)" if reps > 1 else f"; [lo, hi]: 95 % confidence interval, {METHOD_EPISODES}")
    if reps > 1 and min(counts) == 1:
        ci = ci[:-1] + f"; a run without replicates: {METHOD_EPISODES})"
    out = {
        "mean_radius": (_pivot_interval(df, "mean_radius", reps > 1),
                        f"{p}: mean certified radius of LoAct (Theorem 1) over all steps, {conv0} (this project's "
                        f"headline; the paper's convention, {conv1}, is in {p}_mean_radius_certified){ci}"),
        "mean_radius_certified": (_pivot_interval(df, "mean_radius_certified", reps > 1),
                                  f"{p}: mean certified radius of LoAct (Theorem 1), {conv1} (the paper's and the "
                                  f"CROP leaderboard's convention; empty where no step was certified; {conv0} is "
                                  f"in {p}_mean_radius){ci}"),
        "certified_fraction": (_pivot_interval(df, "certified_fraction", reps > 1),
                               f"{p}: share of LoAct's steps certified (radius > 0){ci}"),
        "benign_return": (_pivot_interval(df, "benign_return", reps > 1),
                          f"{p}: mean benign return of the smoothed policy over LoAct's clean episodes{ci}"),
        "reward_bounds": (bounds, f"{p}: certified reward bounds J̲ᴇ (Theorem 2), J̲ₚ (p = 50 %, Theorem 3), "
                                  "J̲ (LoRe, Theorem 4) and the PGD returns at ε = f·σ; empty: not computed at "
                                  "that ε; †: vacuous, J̲ᴇ fell below the trivial bound J_min (the least return "
                                  "possible) and is shown as J_min (its value: expectation_bound_raw in the CSV)"),
        "tightness": (tight, f"{p}: PGD return minus certified bound (≥ 0 when the bound holds, small when it is "
                             "tight); empty: no attack or no bound at that ε"),
    }
    assert tuple(out) == TABLES
    return out


def _tables_for_env(env: str, data: dict, tables_dir: Path, table_eps_factors) -> list[Path]:
    spec = env_spec(env)
    written = []
    for name, (df, caption) in env_tables(env, data, table_eps_factors).items():
        if "algo" in df:  # rows of another smoothing target: "StdTrain (vote)" (q's rows unchanged)
            df = df.assign(algo=df["algo"].map(series_label))
        written += _write_table(df, tables_dir / f"{spec.paper_name}_{name}", caption)
    expected = set(table_files(tables_dir, env))
    assert set(written) == expected, (sorted(map(str, written)), sorted(map(str, expected)))
    return written


def aggregate(results: Path, runs, *, table_eps_factors, figures_dir: Path, tables_dir: Path) -> list[Path]:
    """Write every figure and table of :func:`crop.layout.aggregate_files` for ``runs``, and nothing else.
    Replicate folders among ``runs`` (``ENV/ALGO/sigma-S/rep-K``, config ``replicates``) are read beside
    their run: the tables then show the mean over replicates and its interval."""
    reps = [r for r in runs if replicate_of(r)]
    data = load_runs(results, [r for r in runs if not replicate_of(r)])
    register_labels(split_run_algo(k[1])[0] for k in data)  # labels of your own: colours in a fixed order
    for key, found in load_replicates(results, reps).items():
        if key not in data:
            raise FileNotFoundError(f"replicates of {'/'.join(key)} without the run itself")
        data[key]["replicates"] = found
    figures_dir, tables_dir = Path(figures_dir), Path(tables_dir)
    envs = sorted({k[0] for k in data})
    plan = {}
    for env in envs:
        plan[env] = (_series(k[1] for k in data if k[0] == env),
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
    expected = set(aggregate_files(figures_dir, tables_dir, plan))
    if set(written) != expected or len(written) != len(expected):
        raise RuntimeError(f"aggregate wrote {sorted(map(str, set(written) - expected))} beyond the layout and "
                           f"missed {sorted(map(str, expected - set(written)))}")
    return written
