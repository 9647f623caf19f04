"""The panels of returns and return bounds against the attack ε (:mod:`crop.report.figures` lays them out):
GRe's J̲_E and J̲_p with the global PGD attack, LoRe's J̲ with the local one.

A bound at or below J_min (the least return possible) says no more than the trivial bound: it is *vacuous*.
The return axis is fitted to what claims something — the non-vacuous bounds and the attacks' returns — so a
J_min far below them (Pendulum-v1's −3255 under bounds of −276 and attacks of −125) cannot squash those
together; J_min joins the axis only where it lies close to them.  Every vacuous point of every GRe panel is a
hollow ▽ at J_min, or at the axis' lower edge where J_min is off it, and the legend says which.  What a panel
has to say beyond its curves (vacuous points, identical curves drawn once, a truncated LoRe search) it returns
as legend entries (:class:`matplotlib.lines.Line2D` handles), never as text over the data.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from crop import columns as cols
from crop.report.metrics import lore_valid_until, spec_fact
from crop.report.style import (
    BOUND_Z,
    attack_line,
    bound_line,
    figure_label,
    line_width,
    marker_size,
    series_color,
    series_marker,
)

__all__ = ["gre_curve", "panel_global", "panel_adasearch", "set_ylim", "return_span", "note_handle",
           "merge_vacuous", "lore_j_min", "VACUOUS_TOL", "VACUOUS_MARKER"]

#: A bound within this of J_min claims nothing (the audit's tolerance, crop.audit.checks.TOL).
VACUOUS_TOL = 1e-9
#: Vacuous points: hollow ▽ (SA-MDP (PGD)'s ▼ is filled).
VACUOUS_MARKER = {"marker": "v", "mfc": "white", "mew": 1.0, "ls": "none"}
#: J_min joins the return axis where it lies within this share of the claims' span below them (J_max above):
#: the claims then keep at least half the axis.
_NEAR = 1.0


def note_handle(label: str) -> Line2D:
    """A legend entry that is only words (no line, no marker)."""
    return Line2D([], [], ls="none", marker="none", label=label)


def set_ylim(ax, lo: float, hi: float, min_span: float) -> None:
    """y-limits around the data [lo, hi] (5 % padding); a flat or nearly flat series gets a window of
    ``min_span`` instead of matplotlib's ± a tiny band that blows noise-free constants up to a slope."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return
    if hi - lo < min_span:
        mid = 0.5 * (lo + hi)
        lo, hi = mid - 0.5 * min_span, mid + 0.5 * min_span
    pad = 0.05 * (hi - lo)
    ax.set_ylim(lo - pad, hi + pad)


def return_span(lo: float, hi: float) -> float:
    """The smallest y window for returns: ± a tenth of their magnitude, at least 1 (one unit of reward)."""
    return max(1.0, 0.2 * max(abs(lo), abs(hi)))


def _fit_returns(ax, claims: list, j_min: float, j_max: float) -> bool:
    """Fit the return axis to ``claims`` (the values that say something), with J_min and J_max where they lie
    near them; True where J_min is on the axis."""
    vals = np.concatenate([np.asarray(c, dtype=float).ravel() for c in claims]) if claims else np.array([])
    vals = vals[np.isfinite(vals)]
    lo, hi = (float(vals.min()), float(vals.max())) if len(vals) else (j_min, j_max)
    span = max(hi - lo, return_span(lo, hi))
    if np.isfinite(j_min) and j_min >= lo - _NEAR * span:
        lo = min(lo, j_min)
    if np.isfinite(j_max) and j_max <= hi + _NEAR * span:
        hi = max(hi, j_max)
    set_ylim(ax, lo, hi, return_span(lo, hi))
    return bool(np.isfinite(j_min) and ax.get_ylim()[0] <= j_min)


class _VacuousNote(Line2D):
    """The legend entry of a panel's vacuous points, with the J_min they are measured against and whether they
    are drawn at it (``on_axis``) or at the lower edge: :func:`merge_vacuous` makes the entries of several
    panels one."""

    def __init__(self, j_mins, on_axis):
        self.j_mins, self.on_axis = tuple(sorted(set(j_mins))), tuple(sorted(set(on_axis)))
        where = {(True,): r"drawn at $J_{\min}$", (False,): "drawn at the lower edge"}.get(
            self.on_axis, r"drawn at $J_{\min}$, or at the lower edge where $J_{\min}$ is off the axis")
        values = " or ".join(f"{j:.5g}" for j in self.j_mins)
        super().__init__([], [], color="0.25", ms=5, **VACUOUS_MARKER,
                         label=rf"vacuous bound (≤ $J_{{\min}}$ = {values}): {where}", gid="vacuous")


def _vacuous_handle(j_min: float, on_axis: bool) -> Line2D:
    return _VacuousNote([j_min], [on_axis])


def merge_vacuous(handles: list) -> list:
    """``handles`` with their vacuous-point entries (one per panel that has such points) made one, where the
    first of them was: a figure's legend says what ▽ means once."""
    notes = [h for h in handles if isinstance(h, _VacuousNote)]
    if len(notes) <= 1:
        return list(handles)
    merged = _VacuousNote([j for h in notes for j in h.j_mins], [o for h in notes for o in h.on_axis])
    first = handles.index(notes[0])
    rest = [h for h in handles if not isinstance(h, _VacuousNote)]
    return rest[:first] + [merged] + rest[first:]


def _draw_vacuous(ax, vacuous_at: list, edge: float) -> None:
    """Each series' vacuous points (``vacuous_at``: (algorithm, ε values)) as hollow ▽ at ``edge``: on the
    edge, not clipped by it, above the curves, sized as the series' markers (coinciding points nest)."""
    for a, x in vacuous_at:
        ax.plot(x, np.full(len(x), edge), color=series_color(a), ms=marker_size(a), clip_on=False,
                zorder=BOUND_Z + 2, gid=f"vacuous:{a}", **VACUOUS_MARKER)


def _gre_rows(d: dict, kind: str) -> pd.DataFrame:
    gre = d["gre"]
    rows = gre[np.isclose(gre[cols.P], 0.5)] if kind == "median" else gre.drop_duplicates(cols.EPS)
    return rows.sort_values(cols.EPS)


def gre_curve(d: dict, kind: str, x_end: float) -> tuple[np.ndarray, np.ndarray, int]:
    """GRe's bound (``kind`` "mean": J̲_E, Theorem 2; "median": J̲_p at p = 0.5, Theorem 3) of one run over
    [0, ``x_end``]: the rows of ``gre.csv``, then — where the run's ε grid ends before the plot's x range
    (the attack's grid reaches further) — the same bound at larger ε from the same stored returns
    (``gre_returns.csv``, :func:`crop.certify.gre.gre_bounds`, α per point as in gre.csv).  A percentile no order
    statistic certifies is drawn as the trivial bound J_min.  Returns (ε, bound, n) with the first ``n``
    points from gre.csv."""
    col = cols.EXPECTATION_BOUND if kind == "mean" else cols.PERCENTILE_BOUND
    rows = _gre_rows(d, kind)
    eps, y = rows[cols.EPS].to_numpy(float), rows[col].to_numpy(float)
    n = len(eps)
    last = float(eps.max()) if n else 0.0
    if n and x_end > last * (1 + 1e-9):
        from crop.certify.gre import gre_bounds  # the certifier's own formulas, not a copy

        r0 = rows.iloc[0]
        extra = np.linspace(last, x_end, 17)[1:]
        ext = gre_bounds(d["gre_returns"][cols.RETURN].to_numpy(float), sigma=float(r0[cols.SIGMA]),
                         horizon=int(r0[cols.HORIZON]), alpha=float(r0[cols.ALPHA]), eps_grid=extra, percentiles=[0.5],
                         j_min=float(r0[cols.J_MIN]), j_max=float(r0[cols.J_MAX]))
        eps, y = np.append(eps, extra), np.append(y, ext[col].to_numpy(float))
    if kind == "median" and n:
        y = np.where(np.isnan(y), float(rows[cols.J_MIN].iloc[0]), y)
    return eps, y, n


def panel_global(ax, runs: dict, sigma: float, kind: str) -> list:
    """GRe bound vs ε (solid; markers at the run's own ε grid) and the global PGD mean/median (dashed); the
    return axis fitted to the non-vacuous bounds and the attacks (:func:`_fit_returns`), each vacuous point a
    hollow ▽ (J̲_E below J_min, J̲_p at J_min or certified by no order statistic).  Returns legend entries."""
    stat = "mean" if kind == "mean" else "median"
    x_end = 0.0
    for d in runs.values():
        x_end = max(x_end, float(d["gre"][cols.EPS].max()), float(d["attack_global"][cols.EPS].max()))
    j_lo, j_hi = np.inf, -np.inf
    drawn: dict[tuple, str] = {}   # a curve (bound and attack) → the series that drew it
    notes, claims, vacuous_at = [], [], []
    for a, d in runs.items():
        j_lo, j_hi = min(j_lo, d["gre"][cols.J_MIN].min()), max(j_hi, d["gre"][cols.J_MAX].max())
        eps, y, n = gre_curve(d, kind, x_end)
        att = d["attack_global"].groupby(cols.EPS)[cols.RETURN].agg(stat)
        # Targets of one label share GRe's σ-randomized policy: identical curves are drawn once, and named.
        key = tuple(np.asarray(v, dtype=float).tobytes() for v in (eps, y, att.index, att.to_numpy()))
        if key in drawn:
            notes.append(note_handle(f"{figure_label(a)}: the same curves as {figure_label(drawn[key])}"))
            continue
        drawn[key] = a
        j_min = float(d["gre"][cols.J_MIN].min())
        vacuous = ~(y > j_min + VACUOUS_TOL)
        y = np.maximum(y, j_min)   # the trivial bound where the certificate says less
        bound_line(ax, eps, y, a, markevery=list(range(n)))
        attack_line(ax, att.index, att.to_numpy(), a)
        claims += [y[~vacuous], att.to_numpy(float)]
        if vacuous.any():
            vacuous_at.append((a, eps[vacuous]))
    on_axis = _fit_returns(ax, claims, float(j_lo), float(j_hi))
    edge = float(j_lo) if on_axis else ax.get_ylim()[0]
    _draw_vacuous(ax, vacuous_at, edge)
    ax.set_xlim(0, x_end * 1.02 if x_end > 0 else None)
    return ([_vacuous_handle(float(j_lo), on_axis)] if vacuous_at else []) + notes


def lore_j_min(d: dict, env: str) -> float:
    """The least return over LoRe's horizon (its ``settings``' horizon and γ; the audit's J_min for LoRe,
    crop.audit.checks); −∞ where the run records no horizon or ``env`` is unknown."""
    ls = (d.get("lore_meta") or {}).get("settings") or {}
    rng = spec_fact(env, "return_range", int(ls["horizon"]), float(ls.get("gamma", 1.0))) if ls.get("horizon") else None
    return float(rng[0]) if rng else -np.inf


def panel_adasearch(ax, runs: dict, sigma: float, env: str) -> list:
    """LoRe's bound J̲ vs ε (solid step function) and the local PGD return from the same s₀ (dashed); the
    return axis fitted as GRe's (:func:`_fit_returns`; J_min considered only where a point is vacuous), each
    vacuous point (J̲ at J_min, :func:`lore_j_min`) a hollow ▽ as in GRe's panels.  Never drawn for
    continuous-action agents, which have neither (crop.workflow.layout.has_lore).  Returns legend entries:
    the vacuous points, and the algorithms whose bounded search spent its node budget (lore.max_nodes), a
    bound ≤ the full search's, still sound."""
    xmax = 0.0
    for d in runs.values():
        xmax = max(xmax, float(d["attack_local"][cols.EPS].max()) if "attack_local" in d else 0.0,
                   float(d["lore"][cols.EPS].max()))
    j_lo = np.inf
    claims, vacuous_at = [], []
    for a, d in runs.items():
        lore = d["lore"].sort_values(cols.EPS)
        end = min(xmax, lore_valid_until(d))
        keep = lore[lore[cols.EPS] <= end]
        j_min = lore_j_min(d, env)
        j_lo = min(j_lo, j_min)
        ys = np.maximum(keep[cols.LOWER_BOUND].to_numpy(float), j_min)   # the trivial bound where J̲ says less
        vacuous = ~(ys > j_min + VACUOUS_TOL)
        xs, ys = np.append(keep[cols.EPS].to_numpy(float), end), np.append(ys, ys[-1])
        ax.step(xs, ys, where="post", color=series_color(a), label=figure_label(a), lw=line_width(a), zorder=BOUND_Z,
                marker=series_marker(a), ms=marker_size(a), markevery=list(range(len(keep))), gid=f"bound:{a}")
        claims.append(ys[:-1][~vacuous])
        if "attack_local" in d:   # none where the config skips the local attack
            att = d["attack_local"]
            g = att[att[cols.SAME_START_AS_LORE].astype(bool)].groupby(cols.EPS)[cols.RETURN].min()
            attack_line(ax, g.index, g.to_numpy(), a)
            claims.append(g.to_numpy(float))
        if vacuous.any():
            vacuous_at.append((a, xs[:-1][vacuous]))
    # J_min joins the axis only for a vacuous point to sit at: without one LoRe's axis is its claims'
    on_axis = _fit_returns(ax, claims, float(j_lo) if vacuous_at else -np.inf, np.inf)
    _draw_vacuous(ax, vacuous_at, float(j_lo) if on_axis else ax.get_ylim()[0])
    ax.set_xlim(0, xmax * 1.02 if xmax > 0 else None)
    notes = [_vacuous_handle(float(j_lo), on_axis)] if vacuous_at else []
    truncated = [figure_label(a) for a, d in runs.items() if (d.get("lore_meta") or {}).get("truncated")]
    if truncated:
        handle = note_handle("truncated search (node budget): " + ", ".join(truncated))
        handle.set_gid("lore-truncated")
        notes.append(handle)
    return notes
