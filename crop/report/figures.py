"""The paper's figures, per environment, from the runs' result files (reads results only).

The file names and families are listed in :mod:`crop.workflow.layout` (:func:`crop.workflow.layout.figure_families`);
docs/figures.md describes each for a reader.  Colours, markers, line styles and legends:
:mod:`crop.report.style`.  In every figure certified bounds are solid lines and PGD attacks dashed (drawn
above the bounds), shading is ± one standard deviation over episodes, axis labels use the paper's symbols.
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
from matplotlib.lines import Line2D  # noqa: E402

from crop import columns as cols  # noqa: E402
from crop.envs import env_spec  # noqa: E402
from crop.io import atomic_write_bytes, load_npz  # noqa: E402
from crop.report.clips import clip_text  # noqa: E402
from crop.report.intervals import run_interval  # noqa: E402
from crop.report.metrics import per_step_mean_radius  # noqa: E402
from crop.report.return_panels import (  # noqa: E402
    gre_curve,
    merge_vacuous,
    panel_adasearch,
    panel_global,
    return_span,
    set_ylim,
)
from crop.report.style import (  # noqa: E402
    BOUND_Z,
    LABELS,
    algo_handles,
    axes_legend,
    bound_line,
    figure_label,
    legend_columns,
    line_width,
    marker_size,
    math_font,
    register_auto_choices,
    series_color,
    series_marker,
    series_order,
    style_handles,
    top_legend,
)
from crop.workflow.layout import FIGURE_FORMATS, figure_families, large_sigma_labels, main_sigma_labels  # noqa: E402

__all__ = ["iter_env_figures", "lore_skip", "save_figure",
           "legend_figure", "load_frames", "gre_curve", "PERIODIC_FRAMES"]

PERIODIC_FRAMES = 6  # frames shown under the periodic-pattern plot


def load_frames(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``frames`` (uint8 [T, H, W, 3] or [T, H, W]) and ``steps`` (int [T]) of a ``frames.npz``."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: missing — the LoAct stage writes the game frames of episode 0 for "
                                "Atari runs; the periodic-pattern figure needs them")
    with load_npz(path) as z:
        if "frames" not in z or "steps" not in z:
            raise ValueError(f"{path}: needs arrays 'frames' and 'steps', has {sorted(z.files)}")
        frames, steps = np.asarray(z["frames"]), np.asarray(z["steps"]).astype(int).ravel()
    if frames.ndim not in (3, 4) or len(frames) != len(steps) or len(steps) == 0:
        raise ValueError(f"{path}: frames {frames.shape} and steps {steps.shape} do not match (T ≥ 1 frames)")
    if frames.ndim == 4 and frames.shape[-1] != 3:
        raise ValueError(f"{path}: frames must be RGB [T, H, W, 3], got {frames.shape}")
    return frames, steps


# --------------------------------------------------------------------------------------------- drawing

def save_figure(fig, figures_dir: Path, stem: str) -> list[Path]:
    """Write ``fig`` as ``figures_dir/stem`` in every format of :data:`crop.workflow.layout.FIGURE_FORMATS`, then
    close it."""
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
    ax.set_ylabel(ylabel, **math_font(ylabel))
    return fig, ax


def _grid(nrows: int, ncols: int, w: float = 2.7, h: float = 2.3):
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    return fig, axes


def _mean_std_band(ax, x, m, s, algo, **kw):
    bound_line(ax, x, m, algo, **kw)
    ax.fill_between(x, m - s, m + s, color=series_color(algo), alpha=0.15, lw=0, zorder=1)


def smoothing_window(horizon: int) -> int:
    """Steps in the stepwise figure's running mean: odd, about a fiftieth of the horizon (9 of 200), 1 (none)
    under 50 steps.  Per-step radii jump from step to step; over a few steps their level reads at a glance."""
    return 2 * (max(int(horizon), 0) // 50) + 1


def _horizon(runs: dict) -> int:
    """LoAct's horizon (its recorded setting), else the longest episode among ``runs``."""
    h = [int(d["loact_settings"]["horizon"]) for d in runs.values() if (d.get("loact_settings") or {}).get("horizon")]
    longest = [int(d["loact"][cols.STEP].max()) + 1 for d in runs.values() if len(d["loact"])]
    return max(h + longest + [0])


def _episode_ends(steps: pd.DataFrame, horizon: int) -> np.ndarray:
    """The last step of every episode that ended before ``horizon`` (the pole fell, the game was lost)."""
    last = steps.groupby(cols.EPISODE)[cols.STEP].max().to_numpy(int)
    return np.sort(last[last + 1 < horizon])


def _panel_stepwise(ax, runs: dict, sigma: float) -> list:
    """Certified radius per time step: at step t, mean ± std over the episodes still running at t,
    uncertified steps counted as 0 (:func:`crop.report.metrics.per_step_mean_radius`), as a running mean over
    :func:`smoothing_window` steps, one thin line per series (``loact.csv`` keeps every step).  A short vertical bar on
    the line marks where an episode ended before the horizon: from there on the mean is over fewer episodes,
    and the line ends with the last one.  Returns legend entries."""
    top, horizon = 0.0, _horizon(runs)
    w = smoothing_window(horizon)
    ended = False
    for a, d in runs.items():
        ps = per_step_mean_radius(d["loact"], "uncertified_zero")
        t, m = ps.index.to_numpy(), ps["mean"]
        s = ps["std"].fillna(0.0)
        m, s = (v.rolling(w, center=True, min_periods=1).mean().to_numpy() for v in (m, s))
        _mean_std_band(ax, t, m, s, a, lw=0.65 * line_width(a), ms=0.8 * marker_size(a))
        ends = _episode_ends(d["loact"], horizon)
        if len(ends):
            ended = True
            ax.plot(ends, np.interp(ends, t, m), ls="none", marker="|", ms=9, mew=1.4, color=series_color(a),
                    zorder=BOUND_Z + 1, gid=f"episode-over:{a}")
        top = max(top, float(np.nanmax(m + s)) if len(m) else 0.0)
    if top <= 0:
        top = 0.1 * sigma  # nothing certified: a radius axis on the scale of σ, the line at r = 0 visible
        if runs:
            ax.text(0.5, 0.5, "no step certified\n(r = 0 at every step)", transform=ax.transAxes, ha="center",
                    va="center", fontsize=8, color="0.35")
    ax.set_ylim(-0.03 * top, 1.05 * top)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    notes = []
    if w > 1:
        notes.append(Line2D([], [], color="0.25", lw=1.1, label=f"line and band: running mean over {w} steps"))
    if ended:
        notes.append(Line2D([], [], ls="none", marker="|", ms=9, mew=1.4, color="0.25",
                            label=f"episode over before the horizon H = {horizon}"))
    return notes


def _panel_ratio(ax, runs: dict, sigma: float) -> list:
    """Certified ratio η_r (% of steps certified at radius ≥ r), mean ± std over episodes.  The x-axis ends a
    little past the largest radius any series certifies (LoAct's grid reaches 4σ, far beyond most radii)."""
    last, grid = 0.0, []
    for a, d in runs.items():
        g = d["certified_ratio"].groupby(cols.R)[cols.ETA]
        m, s = 100 * g.mean(), 100 * g.std(ddof=0).fillna(0.0)
        _mean_std_band(ax, m.index.to_numpy(), m.to_numpy(), s.to_numpy(), a)
        r = m.index.to_numpy(float)
        grid = r if len(r) > len(grid) else grid
        if ((m + s).to_numpy() > 0).any():
            last = max(last, float(r[(m + s).to_numpy() > 0].max()))
    ax.set_ylim(-3, 103)
    if len(grid) > 1:
        step = float(np.min(np.diff(np.sort(grid))))
        end = min(float(grid.max()), max(last * 1.15, last + 2 * step, 0.1 * sigma))
        ax.set_xlim(-0.02 * end, end)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(nbins=4))   # radii like 0.0025: few, wide labels
    return []


_PANELS = {
    "stepwise": (lambda ax, runs, sigma, env: _panel_stepwise(ax, runs, sigma), LABELS["t"], LABELS["r"]),
    "certified_ratio": (lambda ax, runs, sigma, env: _panel_ratio(ax, runs, sigma), "radius $r$", LABELS["eta"]),
    "global_mean": (lambda ax, runs, sigma, env: panel_global(ax, runs, sigma, "mean"), LABELS["eps"],
                    LABELS["J_E"]),
    "global_median": (lambda ax, runs, sigma, env: panel_global(ax, runs, sigma, "median"), LABELS["eps"],
                      LABELS["J_p"]),
    "adasearch": (panel_adasearch, LABELS["eps"], LABELS["J"]),
}
_STYLE_KEY = {"global_mean", "global_median", "adasearch"}
#: The panels whose returns a run's reward clip applies to (GRe, the global attack; LoRe's never clip).
_CLIPPED = {"global_mean", "global_median"}


def _clip_label(label: str, runs) -> str:
    """``label`` with "(rewards clipped to [a, b])" under it where a run among ``runs`` (dicts of
    :func:`crop.report.metrics.load_runs`) clipped its rewards: its returns and bounds are of those."""
    text = clip_text(d.get("reward_clip") for d in runs)
    return f"{label}\n({text})" if text else label


def _runs_at(data: dict, env: str, lab: str, algos) -> dict:
    return {a: data[(env, a, lab)] for a in algos if (env, a, lab) in data}


def _single_panel_figure(kind: str, env: str, lab: str, runs: dict):
    draw, xlabel, ylabel = _PANELS[kind]
    if kind in _CLIPPED:
        ylabel = _clip_label(ylabel, runs.values())
    fig, ax = _single(f"{env_spec(env).paper_name}, σ={lab}", xlabel, ylabel)
    notes = draw(ax, runs, float(lab), env)
    axes_legend(ax, algo_handles(runs) + (style_handles() if kind in _STYLE_KEY else []) + notes)
    return fig


def _unique(handles: list) -> list:
    """Legend entries, each label once (panels of one row say the same), the vacuous points' one entry."""
    seen: dict[str, object] = {}
    for h in merge_vacuous(handles):
        seen.setdefault(h.get_label(), h)
    return list(seen.values())


def _grid_figure(env: str, data: dict, algos, rows, labels, row_names=None):
    """One row per panel kind in ``rows``, one column per σ label; one legend above, with what the panels
    have to say (their legend entries)."""
    fig, axes = _grid(len(rows), len(labels))
    notes = []
    for i, kind in enumerate(rows):
        draw, xlabel, ylabel = _PANELS[kind]
        if kind in _CLIPPED:
            ylabel = _clip_label(ylabel, [d for lab in labels for d in _runs_at(data, env, lab, algos).values()])
        for j, lab in enumerate(labels):
            ax = axes[i][j]
            notes += draw(ax, _runs_at(data, env, lab, algos), float(lab), env)
            if i == 0:
                ax.set_title(f"σ={lab}", fontsize=9)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                name = row_names[i] if row_names else env_spec(env).paper_name
                ax.set_ylabel(f"{name}\n{ylabel}", fontsize=8, **math_font(ylabel))
    fig.tight_layout()
    top_legend(fig, algos, style=any(k in _STYLE_KEY for k in rows), notes=_unique(notes))
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
                      _clip_label(LABELS["return"], [d for lab in labels
                                                     for d in _runs_at(data, env, lab, algos).values()]))
    lo, hi = np.inf, -np.inf
    clipped = set()   # the [J_min, J_max] a bar was clipped to (crop.report.intervals), said in the figure
    for i, a in enumerate(algos):
        xs, ms, below, above = [], [], [], []
        for lab in labels:
            if (env, a, lab) in data:  # the mean (over replicates where there are several) and its 95 % interval
                iv = run_interval(data[(env, a, lab)], "benign_return")
                j = data[(env, a, lab)].get("benign_range", (-math.inf, math.inf))
                if iv["lo"] == j[0] or iv["hi"] == j[1]:
                    clipped.add(tuple(j))
                xs.append(float(lab))
                ms.append(iv["value"])
                below.append(0.0 if math.isnan(iv["lo"]) else iv["value"] - iv["lo"])
                above.append(0.0 if math.isnan(iv["hi"]) else iv["hi"] - iv["value"])
        ms, below, above = (np.asarray(x, dtype=float) for x in (ms, below, above))
        # Dodged sideways (a few hundredths of a decade per algorithm) so that equal returns do not hide
        # each other; the σ ticks stay at the true σ.
        dodge = 10.0 ** (0.025 * (i - 0.5 * (len(algos) - 1)))
        ax.errorbar(np.asarray(xs) * dodge, ms, yerr=[below, above], marker=series_marker(a), ms=marker_size(a),
                    capsize=3, color=series_color(a), lw=line_width(a), label=figure_label(a), zorder=BOUND_Z)
        if len(ms):
            lo, hi = min(lo, float(np.min(ms - below))), max(hi, float(np.max(ms + above)))
    set_ylim(ax, lo, hi, return_span(lo, hi))
    if clipped:
        ranges = ", ".join(f"[{a:g}, {b:g}]" for a, b in sorted(clipped))
        # under the axis label, where no bar can run into it
        ax.annotate(f"error bars clipped to the possible returns $[J_{{\\min}}, J_{{\\max}}]$ = {ranges}",
                    xy=(0.5, 0.0), xycoords="axes fraction", xytext=(0, -36), textcoords="offset points",
                    ha="center", va="top", fontsize=7, color="0.3")
    ax.set_xscale("log")
    # Ticks at the σ run, written as the paper writes σ (0.001, 0.5, 4), not as powers of ten; labels that
    # would collide are left out rather than rotated.
    ax.set_xticks([float(lab) for lab in labels], [f"{float(lab):g}" for lab in labels], fontsize=7)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes_legend(ax, algo_handles(algos))
    _thin_tick_labels(ax)
    return fig


def legend_figure(algos, title: str | None = None):
    """The legend strip alone: one colour and marker per algorithm, and the line-style key."""
    handles, ncol = legend_columns(algo_handles(algos) + style_handles())
    fig = plt.figure(figsize=(0.1, 0.1))
    fig.legend(handles=handles, loc="center", ncol=ncol, frameon=False, fontsize=9, handlelength=3.2,
               title=title, title_fontsize=9)
    return fig


def _periodic_figure(env: str, algo: str, lab: str, run: dict):
    """Certified radius over the window of recorded steps (episode 0), with the frames at marked steps."""
    frames, steps = load_frames(run["frames_path"])
    st = run["loact"]
    ep0 = st[st[cols.EPISODE] == st[cols.EPISODE].min()].set_index(cols.STEP)[cols.RADIUS]
    lo, hi = int(steps.min()), int(steps.max())
    window = ep0[(ep0.index >= lo) & (ep0.index <= hi)]
    k = min(PERIODIC_FRAMES, len(steps))
    picks = np.unique(np.linspace(0, len(steps) - 1, k).round().astype(int))
    fig = plt.figure(figsize=(1.7 * max(len(picks), 3), 4.6))
    gs = fig.add_gridspec(2, len(picks), height_ratios=[1.0, 1.25], hspace=0.35)
    ax = fig.add_subplot(gs[0, :])
    ax.plot(window.index, window.to_numpy(), color=series_color(algo), lw=1.2, label=figure_label(algo))
    ax.set_xlim(lo, max(hi, lo + 1))
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel(LABELS["t"], fontsize=8)
    ax.set_ylabel(LABELS["r"], fontsize=8)
    ax.set_title(f"{env_spec(env).paper_name}, {figure_label(algo)}, σ={lab}: LoAct episode 0, steps {lo}–{hi}",
                 fontsize=9, pad=14)
    ax.tick_params(labelsize=7)
    for n, i in enumerate(picks):
        t = int(steps[i])
        letter = chr(ord("a") + n)
        ax.axvline(t, color="0.3", ls=":", lw=0.8)
        # above the frame, not over the curve: a letter inside the axes can cover a peak of the radius
        ax.annotate(letter, (t, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8, annotation_clip=False)
        fa = fig.add_subplot(gs[1, n])
        fa.imshow(frames[i], cmap="gray" if frames.ndim == 3 else None, interpolation="nearest")
        r = ep0.get(t, math.nan)
        fa.set_title(f"({letter}) t={t}\nr={r:.3g}", fontsize=7)
        fa.axis("off")
    return fig


def lore_skip(env: str, data: dict) -> tuple[str, ...]:
    """``("lore",)`` where no run of ``env`` among ``data`` has LoRe's bound (its config's ``skip``, or
    continuous actions): :func:`crop.workflow.layout.figure_families` then draws no adasearch figure."""
    return () if any("lore" in d for k, d in data.items() if k[0] == env) else ("lore",)


def iter_env_figures(env: str, data: dict):
    """Yield (stem, Figure) for every figure of ``env`` in :func:`crop.workflow.layout.figure_families`."""
    register_auto_choices(env, data)
    keys = [k for k in data if k[0] == env]
    algos = series_order(k[1] for k in keys)
    labels = sorted({k[2] for k in keys}, key=float)
    fam = figure_families(env, labels, algos, lore_skip(env, data))
    main = main_sigma_labels(env, labels)
    spec = env_spec(env)
    lore = bool(fam["adasearch"])   # none where no run has LoRe (continuous actions, or skip: lore)
    for kind in ("stepwise", "certified_ratio", "global_mean", "global_median", "adasearch"):
        for lab in labels if fam[kind] else []:
            stem = f"{spec.paper_name}_{kind}_sigma-{lab}"
            assert stem in fam[kind], stem
            yield stem, _single_panel_figure(kind, env, lab, _runs_at(data, env, lab, algos))
    yield f"{spec.paper_name}_stepwise", _grid_figure(env, data, algos, ["stepwise"], main)
    yield f"{spec.paper_name}_certified_ratio", _grid_figure(env, data, algos, ["certified_ratio"], main)
    yield fam["all_bounds"][0], _grid_figure(env, data, algos,
                                             ["global_mean", "global_median", *(["adasearch"] if lore else [])],
                                             main, row_names=["(Global)", "(Global)", *(["(Local)"] if lore else [])])
    yield fam["loact_clean"][0], _clean_figure(env, data, algos, labels)
    yield fam["legend"][0], legend_figure(algos, title=spec.paper_name)
    if fam["large_sigma"]:
        large = large_sigma_labels(env, labels)
        yield fam["large_sigma"][0], _grid_figure(env, data, algos, ["stepwise", *(["adasearch"] if lore else [])],
                                                  large, row_names=["(a)", "(b)"][:1 + lore])
    for stem in fam["periodic"]:
        lab, algo = stem[len(f"{spec.paper_name}_periodic_sigma-"):].split("_", 1)
        yield stem, _periodic_figure(env, algo, lab, data[(env, algo, lab)])


