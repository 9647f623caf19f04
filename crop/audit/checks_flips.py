"""The LoAct check: a flip at an attacked step the attack's own certificate (Theorem 1) certified beyond ε.
Lemma 3 and Hoeffding bound each step's chance of a flip (:func:`flip_probability_bound`); the flips are tested
against those bounds and α by a mixture of Ville supermartingales (:func:`ville_flip_p`), valid whatever the
attacker does (docs/audit.md, "A sequential test of the flips")."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from crop import columns as cols
from crop.audit.check_inputs import planned_horizon, row
from crop.smoothing.stats import Phi, Phi_inv, normalise

__all__ = ["flip_probability_bound", "margins_ok", "step_flip_bounds", "ville_flip_p", "ville_min_p",
           "check_certified_steps_not_flipped", "VILLE_LAMBDAS"]


def flip_probability_bound(top_lower, others_upper_max, v_min: float, v_max: float, sigma: float,
                           eps: float, m: int, n_actions: int) -> np.ndarray:
    """Upper bound on P[the m-sample smoothed action at s + δ is not a₁], for every ‖δ‖₂ ≤ ε, given that the
    clean state's bounds L(a₁) = ``top_lower`` and max_{a≠a₁} U(a) = ``others_upper_max`` hold.

    Lemma 3 (Φ⁻¹ of the normalised clipped smoothed Q moves by at most ‖δ‖/σ) bounds the true gap at s + δ
    below by Δ = w·(Φ(Φ⁻¹(p_L) − ε/σ) − Φ(Φ⁻¹(p_U) + ε/σ)); Hoeffding on the m differences of clipped
    samples (each in [−w, w]) and a union over the |A| − 1 other actions give (|A| − 1)·exp(−mΔ²/(2w²)).
    Where Δ ≤ 0 (ε reaches the radius) the bound is 1."""
    w = float(v_max - v_min)
    pl, pu = normalise(top_lower, v_min, v_max), normalise(others_upper_max, v_min, v_max)
    with np.errstate(invalid="ignore"):
        gap = w * (Phi(Phi_inv(pl) - eps / sigma) - Phi(Phi_inv(pu) + eps / sigma))
    gap = np.where(np.isnan(gap), 0.0, np.maximum(gap, 0.0))
    return np.minimum(1.0, (n_actions - 1) * np.exp(-m * gap ** 2 / (2.0 * w ** 2)))

def margins_ok(c: dict) -> str:
    """Why the chance of a flip cannot be estimated ('' when it can)."""
    if c["steps"] is None:
        return "no loact.csv: no recorded margins"
    if not {cols.SMOOTHED_TOP_LOWER, cols.SMOOTHED_OTHERS_UPPER_MAX} <= set(c["steps"].columns):
        return f"loact.csv lacks {cols.SMOOTHED_TOP_LOWER} / {cols.SMOOTHED_OTHERS_UPPER_MAX}"
    if c["n_actions"] is None:
        return "no network output size: the checkpoint's model.json (net_spec) is missing or names none"
    if c["v_min"] is None or c["v_max"] is None or not c["v_max"] > c["v_min"]:
        return "no V range recorded"
    if c["m"] is None or c["alpha"] is None:
        return "attack_local.meta.json lacks the attack's m or alpha"
    return ""

def step_flip_bounds(c: dict, sigma: float, eps: float, steps: pd.DataFrame) -> np.ndarray:
    return flip_probability_bound(steps[cols.SMOOTHED_TOP_LOWER], steps[cols.SMOOTHED_OTHERS_UPPER_MAX],
                                  c["v_min"], c["v_max"], sigma, eps, int(c["m"]), c["n_actions"])

#: The mixture of Ville supermartingales a flip count is tested with: λ with e^λ = 2, 4, …, 2²⁰, equal weights
#: (fixed in advance, so the mixture is itself a supermartingale).
VILLE_LAMBDAS = math.log(2.0) * np.arange(1, 21)

def _log_mixture(log_factors: np.ndarray) -> np.ndarray:
    """log of the equal-weight mixture over λ of the products of ``log_factors`` (shape (λ, time)), at every
    time: log Σ_k w_k Π_{s ≤ t} φ_s(λ_k)."""
    cum = np.cumsum(log_factors, axis=1)
    top = cum.max(axis=0)
    return top + np.log(np.exp(cum - top).mean(axis=0))

def ville_flip_p(t: np.ndarray, counted: np.ndarray, flipped: np.ndarray, bound: np.ndarray,
                 alpha: float) -> float:
    """p-value of the flips at attacked steps (docs/audit.md, "A sequential test of the flips"): one row per
    attacked step — its time ``t`` (the lockstep step: every row of step t is decided after the certificates of
    step t and before step t + 1), whether it counts (certified beyond ε by the attack's own clean certificate),
    whether the attacked action differs from a₁ (``flipped``), and the flip bound under valid clean bounds
    (:func:`flip_probability_bound`).  With u = e^λ − 1, every step contributes 1/(1 + α·u) and a counted step
    also e^{λX}/(1 + b·u); their product is a nonnegative supermartingale under valid certificates, whatever
    the attacker does, and so is the mixture over :data:`VILLE_LAMBDAS`; by Ville's inequality
    P[sup_t M_t ≥ 1/c] ≤ c, and the p-value is 1/sup_t M_t (at most 1)."""
    if not len(t):
        return 1.0
    u = np.expm1(VILLE_LAMBDAS)[:, None]
    x = (counted & flipped).astype(float)[None, :]
    logs = -np.log1p(alpha * u) + np.where(counted[None, :], VILLE_LAMBDAS[:, None] * x
                                           - np.log1p(np.minimum(bound, 1.0)[None, :] * u), 0.0)
    times, at = np.unique(t, return_inverse=True)
    per_time = np.zeros((len(VILLE_LAMBDAS), len(times)))
    np.add.at(per_time, (slice(None), at), logs)
    return float(min(1.0, math.exp(-max(0.0, _log_mixture(per_time).max()))))

def ville_min_p(steps: int, alpha: float) -> float:
    """The smallest p-value :func:`ville_flip_p` can give over ``steps`` planned attacked steps (every one
    certified beyond ε, flipped, with flip bound 0): fixed before the attack ran."""
    if steps <= 0:
        return 1.0
    per_step = VILLE_LAMBDAS - np.log1p(alpha * np.expm1(VILLE_LAMBDAS))
    return float(min(1.0, math.exp(-_log_mixture(per_step[:, None] * np.ones((1, steps))).max())))

def check_certified_steps_not_flipped(attack: pd.DataFrame, chance: dict, sigma: float) -> list[dict]:
    """The attack's own certificates (Theorem 1, at every attacked step's clean state) against its attacked
    actions at each ε: the steps certified beyond ε whose action the attack flipped, tested sequentially
    against each step's flip bound (:func:`ville_flip_p`, valid whatever the attacker does).  ``min_p`` is
    fixed by the planned steps (horizon × episodes); a row at an ε beyond which LoAct certified no step is
    ``vacuous`` (the certificates claim nothing there; decided from LoAct's outputs, not the attack's).  A row
    whose attack certified no attacked step beyond ε (its own per-step records: nothing counted, so p = 1 and it
    cannot fail) is marked ``nothing_counted``: it stays in the family (its membership was fixed before the
    attack) and is reported ``vacuous``, never ``ok``."""
    rows_out = []
    loact, steps = chance.get("steps"), chance.get("attack_steps")
    for eps, g in attack.groupby(cols.EPS):
        horizons = [planned_horizon(r, chance) for _, r in g.iterrows()]
        flips, n = int(g[cols.FLIPS_CERTIFIED].sum()), sum(h or 0 for h in horizons)
        why = ("no attack_local_steps.csv: the attacked steps are not recorded" if steps is None
               else margins_ok({**chance, "steps": steps})) or ("no planned horizon recorded" if None in horizons
                                                                  else "")
        alpha = float(chance.get("alpha") or 1.0)
        if why:
            p, counted, note = 1.0, 0, f"unassessed ({why})"
        else:
            s = steps[np.isclose(steps[cols.EPS], float(eps))]
            count = (s[cols.CERTIFIED].astype(bool) & (s[cols.RADIUS] > float(eps))).to_numpy()
            flip = (s[cols.ACTION] != s[cols.CLEAN_ACTION]).to_numpy()
            bound = np.asarray(step_flip_bounds(chance, sigma, float(eps), s), float) if len(s) else np.zeros(0)
            p = ville_flip_p(s[cols.STEP].to_numpy(), count, flip, bound, alpha)
            counted = int(count.sum())
            note = (f"{counted} attacked steps certified beyond eps, flip bounds summing to "
                    f"{float(bound[count].sum()):.3g} (plus alpha per step)")
        empty = loact is not None and cols.RADIUS in loact.columns and not (
            loact[cols.CERTIFIED].astype(bool) & (loact[cols.RADIUS] > float(eps))).any()
        rows_out.append(row("loact_certified_steps_not_flipped", float(eps), 0, flips, empirical_below=flips > 0,
                             episodes=len(g), steps=n, counted=counted, p_value=p, note=note,
                             min_p=1.0 if why else ville_min_p(n, alpha), vacuous=bool(empty),
                             nothing_counted=not why and counted == 0))
    return rows_out
