"""How the report draws each algorithm: one colour, marker and label per algorithm in every figure, and the
line, marker and legend helpers the panels share (:mod:`crop.report.figures`).

The nine algorithms (:data:`crop.workflow.config.ALGORITHMS`) have fixed colours and markers (:data:`ALGO_COLORS`,
:data:`ALGO_MARKERS`), whichever of them a run has; labels of your own get theirs from
:func:`register_labels`.  Certified bounds are solid lines, PGD attacks dashed and drawn above them; axis
labels use the paper's symbols (:data:`LABELS`).  A run folder's algorithm component may name a smoothing
target other than q (``ALGO@TARGET``, :mod:`crop.workflow.layout`): it takes the target's marker and the label
"ALGO (target)"; the first target of an algorithm in a figure takes the algorithm's colour, each further one a
colour of its own (:func:`series_order`), so that ``MyPPO (probs)`` and ``MyPPO (vote)`` differ by colour as
well as by marker.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib import patheffects
from matplotlib.lines import Line2D

from crop.names import AUTO_TARGET, TARGET_NAMES
from crop.workflow.config import ALGORITHMS
from crop.workflow.layout import ACTION_TARGET, series_label, split_run_algo

__all__ = ["ALGO_COLORS", "ALGO_MARKERS", "ALGO_LABELS", "EXTRA_COLORS", "EXTRA_MARKERS", "LABELS",
           "TARGET_MARKERS", "BOUND_Z", "ATTACK_Z", "ATTACK_STYLE", "register_labels", "register_auto_choices",
           "algo_color",
           "algo_marker", "algo_index", "algo_label", "figure_label", "series_color", "series_marker", "series_key",
           "series_order", "math_font", "marker_size", "line_width", "bound_line", "attack_line", "algo_handles",
           "style_handles", "legend_columns", "top_legend", "axes_legend"]

# One colour and one marker per algorithm, the same in every figure (fixed over the full list, not the
# algorithms run).  Colours: Paul Tol's "muted" qualitative scheme (https://personal.sron.nl/~pault/), nine
# colours chosen to stay distinct under the common colour-vision deficiencies.  Markers: series that coincide
# (two policies that certify nothing, two returns at the maximum) still show each algorithm, because their
# markers are placed at staggered points (:func:`_markevery`).
# Both in the order of crop.workflow.config.ALGORITHMS (StdTrain #332288 "o", GaussAug #88ccee "s", …).
ALGO_COLORS = dict(zip(ALGORITHMS, ("#332288", "#88ccee", "#44aa99", "#117733", "#999933", "#cc6677", "#ddcc77",
                                    "#882255", "#aa4499"), strict=True))
ALGO_MARKERS = dict(zip(ALGORITHMS, ("o", "s", "^", "v", "D", "P", "X", "*", "h"), strict=True))
# Labels of your own (any label outside the nine): the k-th of a run's own labels, in sorted order, takes
# colour k mod 7 (Paul Tol's "vibrant" scheme, none of them in "muted") and marker k mod 6 (none of the
# nine's), so up to 42 labels of your own get distinct (colour, marker) pairs beside the nine.
EXTRA_COLORS = ("#ee7733", "#0077bb", "#33bbee", "#ee3377", "#cc3311", "#009988", "#bbbbbb")
EXTRA_MARKERS = ("p", "<", ">", "d", "H", "8")
_EXTRA: list[str] = []   # the labels of your own seen by this process, in the order they were styled
_OWN_COLOUR: set[str] = set()   # series ALGO@TARGET coloured as labels of their own (series_order)


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


# A smoothing target other than q (run folder ALGO@TARGET, crop/workflow/layout.py) is drawn in its algorithm's colour
# with the target's own marker, and labelled "StdTrain (vote)"; a continuous-action agent's (action, its only
# target) keeps its algorithm's marker and is labelled "MySAC (action)".
TARGET_MARKERS = {"probs": "p", "vote": "d", AUTO_TARGET: "h"}

#: ``target: auto``'s choices of the environment being drawn or tabulated: ALGO@auto and its table name
#: "ALGO (auto)" → {σ: the chosen target} (:func:`register_auto_choices`), so its label says which target each
#: number is of.
_AUTO_CHOICES: dict[str, dict[float, str]] = {}


def register_auto_choices(env: str, data: dict) -> None:
    """Read the target each auto run of ``env`` used (LoAct's recorded ``target``) from ``data``
    (:func:`crop.report.metrics.load_runs`) for :func:`algo_label`; the previous environment's are forgotten."""
    _AUTO_CHOICES.clear()
    for (e, algo, lab), d in data.items():
        chosen = (d.get("loact_settings") or {}).get("target")
        # a received folder's recorded target reaches a label only as one of the names crop knows
        if e == env and split_run_algo(algo)[1] == AUTO_TARGET and chosen in TARGET_NAMES:
            choices = _AUTO_CHOICES.setdefault(algo, {})
            choices[float(lab)] = str(chosen)
            _AUTO_CHOICES[series_label(algo)] = choices


def algo_label(algo: str, sigma: float | None = None) -> str:
    """An algorithm's display name: "StdTrain", "StdTrain (vote)"; an auto run's with the target it chose,
    "StdTrain (auto: vote)" (at ``sigma``, or where one target was chosen at every σ), else per σ
    "StdTrain (auto: q at σ 0.01; vote at σ 0.05, 0.1)"."""
    base, target = split_run_algo(algo)
    label = ALGO_LABELS.get(base, base)
    if algo in _AUTO_CHOICES and target != AUTO_TARGET:   # the tables' name of an auto run, "ALGO (auto)"
        label = label.removesuffix(f" ({AUTO_TARGET})")
    elif target != AUTO_TARGET:
        return label if target == "q" else f"{label} ({target})"
    chosen = _AUTO_CHOICES.get(algo, {})
    if sigma is not None and float(sigma) in chosen:
        return f"{label} (auto: {chosen[float(sigma)]})"
    if len(set(chosen.values())) == 1:
        return f"{label} (auto: {next(iter(chosen.values()))})"
    by_target = {t: ", ".join(f"{s:g}" for s in sorted(x for x, c in chosen.items() if c == t))
                 for t in sorted(set(chosen.values()), key=TARGET_NAMES.index)}
    return f"{label} (auto: {'; '.join(f'{t} at σ {s}' for t, s in by_target.items())})" if chosen \
        else f"{label} (auto)"


def figure_label(algo: str, sigma: float | None = None) -> str:
    """:func:`algo_label` as a figure writes it: one line, each ``$`` escaped, so a received name is text and
    never mathtext (an odd ``$`` would make matplotlib fail to draw)."""
    from crop.report.markdown import printable

    return printable(algo_label(algo, sigma)).replace("$", r"\$")


def series_color(algo: str) -> str:
    """A run folder's algorithm component (ALGO or ALGO@TARGET): its algorithm's colour, or its own where it
    is a further target of an algorithm (:func:`series_order`)."""
    return algo_color(algo if algo in _OWN_COLOUR else split_run_algo(algo)[0])


def series_marker(algo: str) -> str:
    base, target = split_run_algo(algo)
    return TARGET_MARKERS.get(target) or algo_marker(base)


def _rank(algo: str) -> int:
    return algo_index(split_run_algo(algo)[0])


#: The order of a label's targets: the discrete ones, then a continuous-action agent's (its only one).
_TARGETS = (*TARGET_NAMES, AUTO_TARGET, ACTION_TARGET)


def series_key(algo: str) -> tuple[int, int]:
    base, target = split_run_algo(algo)
    return algo_index(base), _TARGETS.index(target)


def series_order(names) -> list[str]:
    """Run folders' algorithm components in the fixed order: the paper's nine, then labels of your own (sorted),
    each algorithm's other targets after q.  Where one algorithm has several targets among ``names``, each one
    after its first takes a colour of its own (a slot after the labels of your own, Paul Tol's "vibrant"
    scheme beside the nine's "muted": distinct under the common colour-vision deficiencies), so that two
    targets of one label never share a colour."""
    names = set(names)
    groups: dict[str, list[str]] = {}
    for a in names:
        groups.setdefault(split_run_algo(a)[0], []).append(a)
    register_labels(groups)
    further = [a for group in groups.values()
               for a in sorted(group, key=lambda x: _TARGETS.index(split_run_algo(x)[1]))[1:]]
    register_labels(further)
    _OWN_COLOUR.update(further)
    return sorted(names, key=series_key)


def math_font(label: str) -> dict:
    """Computer Modern for a bar under J (J̲): DejaVu's italic J descends, so its bar would sit as low as the
    subscript, under it rather than under J."""
    return {"math_fontfamily": "cm"} if r"\underline" in label else {}


def _markevery(algo: str, n: int):
    """Markers on about eight of ``n`` points, staggered by algorithm so that coinciding series show all."""
    if n <= 12:
        return None
    every = math.ceil(n / 8)
    return ((_rank(algo) % len(ALGORITHMS)) * every // len(ALGORITHMS), every)


def marker_size(algo: str) -> float:
    return max(5.6 - 0.3 * _rank(algo), 3.2)


def line_width(algo: str) -> float:
    """Earlier algorithms draw wider lines, so that a later one drawn over the same values leaves an edge."""
    return max(1.9 - 0.09 * _rank(algo), 1.1)


def bound_line(ax, x, y, algo, *, markevery="auto", **kw):
    """A certified quantity (solid, the algorithm's colour and marker)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    kw.setdefault("lw", line_width(algo))
    kw.setdefault("ms", marker_size(algo))
    (line,) = ax.plot(x, y, color=series_color(algo), marker=series_marker(algo), ls="-",
                      zorder=BOUND_Z,
                      markevery=_markevery(algo, len(x)) if markevery == "auto" else markevery,
                      label=figure_label(algo), gid=f"bound:{algo}", **kw)
    return line


def attack_line(ax, x, y, algo):
    """A PGD attack's return (dashed, above the bounds, no markers to hide it)."""
    style = {**ATTACK_STYLE, "ls": (2.0 * (_rank(algo) % 3), (4, 2))}
    (line,) = ax.plot(np.asarray(x, dtype=float), np.asarray(y, dtype=float), color=series_color(algo),
                      label="_nolegend_", gid=f"attack:{algo}", **style)
    return line


def algo_handles(algos) -> list:
    return [Line2D([], [], color=series_color(a), marker=series_marker(a), ms=6, lw=1.5, label=figure_label(a))
            for a in algos]


def style_handles() -> list:
    return [Line2D([], [], color="0.25", lw=1.4, ls="-", label="certified bound (solid)"),
            Line2D([], [], color="0.25", label="PGD attack (dashed)", **ATTACK_STYLE)]


def legend_columns(handles: list) -> tuple[list, int]:
    """Handles reordered so that a legend (filled column by column) reads row by row, and its columns."""
    n = len(handles)
    ncol = n if n <= 7 else math.ceil(n / math.ceil(n / 6))
    nrows = math.ceil(n / ncol)
    order = [r * ncol + c for c in range(ncol) for r in range(nrows) if r * ncol + c < n]
    return [handles[i] for i in order], ncol


def top_legend(fig, algos, style: bool = False, notes: list | None = None) -> None:
    """The legend above a multi-panel figure (the algorithms, the line-style key) and ``notes`` under it (what
    the panels have to say, one entry each): outside every axes, so that no note covers data."""
    handles, ncol = legend_columns(algo_handles(algos) + (style_handles() if style else []))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol, frameon=False, fontsize=8,
               handlelength=3.2)
    if notes:   # under the panels, one entry a line
        fig.legend(handles=notes, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=1, frameon=False, fontsize=7,
                   handlelength=3.2)


def axes_legend(ax, handles: list) -> None:
    """The legend of a one-panel figure, to the right of the axes: inside, a legend can cover the data."""
    ax.legend(handles=handles, fontsize=7, handlelength=3.2, loc="upper left", bbox_to_anchor=(1.02, 1.0),
              borderaxespad=0.0, frameon=False)
