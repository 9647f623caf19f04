"""Soundness checks of one run: does an attack beat a certificate by more than chance allows?  Each check is
one function over the run's result files and returns its rows (``check``, ``eps``, ``bound``, ``observed``,
``violation``, and its evidence); :func:`run_checks` runs those whose files the run has.  Whether a
chance-based row (one with a ``p_value``) is a violation is decided over the audit's families
(:func:`crop.audit.verdict.classify`), not here: its ``violation`` is False until then.  A raw failure
(``empirical_below``) within what chance allows is listed but is not a violation.

* **a bound rising with ε** (J̲_E, J̲_p, J̲): deterministic, always a violation;
* **GRe** percentile bound J̲_p above the attacked p-quantile, and expectation bound above the attacked mean:
  these bounds are about the *distribution* of returns; p-values P[Bin(n, p) ≥ #returns below J̲_p] and
  Hoeffding's exp(−2n·shortfall²/(J_max − J_min)²);
* **a flip at a certified attacked step** (``loact_certified_steps_not_flipped``, per run and ε;
  :mod:`crop.audit.checks_flips`).  The local attack records every attacked step (attack_local_steps.csv): its
  clean state's certificate (Theorem 1, the attack's own per-state α) and the attacked action.  If the clean
  bounds L(a₁) (``smoothed_top_lower``) and max U(a) (``smoothed_others_upper_max``) hold, Lemma 3 (σΦ⁻¹ of the
  clipped smoothed Q is 1-Lipschitz) gives, for ‖δ‖ ≤ ε,
  Q̃(s+δ, a₁) − Q̃(s+δ, a) ≥ Δ = w·(Φ(Φ⁻¹(p_L) − ε/σ) − Φ(Φ⁻¹(p_U) + ε/σ)), p = (bound − V_min)/w, and by
  Hoeffding the m-sample argmax is not a₁ with probability ≤ (|A| − 1)·exp(−m·Δ²/(2w²))
  (:func:`flip_probability_bound`).  The flips at the steps certified beyond ε are tested against these
  per-step bounds and α by a mixture of Ville supermartingales (:func:`ville_flip_p`), valid whatever the
  attacker does;
* **LoRe bound above the local PGD return** from LoRe's own initial state (:mod:`crop.audit.checks_lore`). LoRe's
  bound (Theorem 4) holds for every path of its tree; the exact smoothed policy stays in the tree when LoRe's
  certificates hold (probability ≥ 1 − α_spent, from LoRe's meta file); the m-sample attacked policy leaves it at a
  node only by taking an action the tree excludes, with probability ≤ b(node) from LoRe's own certificate there
  (lore_states.csv).  The audit walks the attacked path (:func:`lore_path_bound`): A = Σ b over its steps up to
  where it left or its return so far secured J̲ (:func:`lore_secured`), and the p-value α_spent + A is valid (a
  predictable compensator bound).  J̲ is a non-increasing step function and T_ε ⊆ T_ε' for ε ≤ ε', so an ε-attack
  may be checked against J̲(ε') over the tree of a whole piece [ε_j, ε_{j+1}) of it (:func:`lore_intervals`), where
  an action is excluded only when its radius is ≥ ε_{j+1}; the piece is chosen from the certifiers' outputs alone
  (:func:`choose_lore_interval`, an estimate along LoAct's clean episode), never the attacked return; the row
  records ε' (``eps_bound``) and ε_{j+1} (``tree_until``).

A check's ``min_p`` is the smallest p-value its data could give (every attacked return at J_min, every
attacked step flipped), fixed by the sample sizes and bounds before the attack ran; Tarone's restriction
(:func:`crop.audit.verdict.tarone_holm`) leaves out the checks whose ``min_p`` cannot reach significance, and
:func:`untestable_reason` says why and what would make one testable.  What the checks read from the run's
files, and the row each returns: :mod:`crop.audit.check_inputs`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from crop import columns as cols
from crop.audit.check_inputs import TOL, chance_inputs, row
from crop.audit.checks_flips import (
    check_certified_steps_not_flipped,
    flip_probability_bound,
    ville_flip_p,
    ville_min_p,
)
from crop.audit.checks_lore import (
    check_lore_vs_local_attack,
    choose_lore_interval,
    lore_alpha_exhausted,
    lore_intervals,
    lore_leave_chance,
    lore_path_bound,
    lore_root_bound,
)
from crop.io import meta_path, read_json
from crop.report.clips import clip_text, reward_clips
from crop.report.metrics import parse_run, read_lore_meta, spec_fact
from crop.report.records import read_table
from crop.workflow.layout import RUN_FILES, base_run, checkpoint_record, replicate_of, split_run_algo

__all__ = ["run_checks", "check_gre_vs_global_attack", "check_monotone", "check_lore_vs_local_attack",
           "check_certified_steps_not_flipped", "flip_probability_bound", "ville_flip_p",
           "ville_min_p", "lore_path_bound", "lore_root_bound",
           "lore_leave_chance", "lore_intervals", "choose_lore_interval", "lore_alpha_exhausted",
           "untestable_reason", "TOL"]


def _hoeffding_p(shortfall: float, n: int, width: float) -> float:
    """P[mean of n returns in an interval of ``width`` falls ``shortfall`` below its expectation] ≤ this."""
    if shortfall <= 0 or n == 0:
        return 1.0
    return float(math.exp(-2.0 * n * shortfall ** 2 / max(width, 1e-300) ** 2))

def _binom_p(n_below: int, n: int, p: float) -> float:
    """P[Bin(n, p) ≥ n_below]: how surprising n_below events of probability ≤ p each are among n."""
    if n_below <= 0:
        return 1.0
    return float(st.binom.sf(n_below - 1, n, min(max(p, 0.0), 1.0))) if n else 1.0

def _monotone(xs, ys) -> list[tuple[float, float, float]]:
    """(ε, bound, next bound) wherever a bound rises with ε."""
    pairs = [(x, y) for x, y in sorted(zip(xs, ys)) if not (isinstance(y, float) and math.isnan(y))]
    return [(a[0], a[1], b[1]) for a, b in zip(pairs, pairs[1:]) if b[1] > a[1] + TOL]

def check_gre_vs_global_attack(gre: pd.DataFrame, attack: pd.DataFrame) -> list[dict]:
    """GRe's bounds against the global PGD returns at each ε both have: the expectation bound J̲_E
    (Theorem 2) against the attacked mean (Hoeffding), each certified percentile bound J̲_p (Theorem 3)
    against the attacked p-quantile (P[Bin(n, p) ≥ #returns below J̲_p])."""
    rows_out = []
    for eps, g in attack.groupby(cols.EPS):
        rows = gre[np.isclose(gre[cols.EPS], eps)]
        if rows.empty:
            continue
        ret = g[cols.RETURN].to_numpy()
        eb = float(rows[cols.EXPECTATION_BOUND].iloc[0])
        width = float(rows[cols.J_MAX].iloc[0] - rows[cols.J_MIN].iloc[0])
        j_min = float(rows[cols.J_MIN].iloc[0])
        rows_out.append(row("gre_expectation_vs_pgd_mean", float(eps), eb, float(ret.mean()),
                             empirical_below=bool(ret.mean() < eb - TOL), episodes=len(ret),
                             p_value=_hoeffding_p(eb - ret.mean(), len(ret), width),
                             min_p=_hoeffding_p(eb - j_min, len(ret), width), shortfall_max=eb - j_min, width=width,
                             vacuous=not eb > j_min + TOL))
        for _, r in rows.iterrows():
            if not bool(r[cols.PERCENTILE_CERTIFIED]):
                continue
            pb, p = float(r[cols.PERCENTILE_BOUND]), float(r[cols.P])
            q = float(np.quantile(ret, p, method="inverted_cdf"))
            below = int((ret < pb - TOL).sum())
            rows_out.append(row(f"gre_percentile_p{p:g}_vs_pgd", float(eps), pb, q,
                                 empirical_below=bool(q < pb - TOL), attacked_below=below, episodes=len(ret),
                                 p_value=_binom_p(below, len(ret), p),
                                 min_p=_binom_p(len(ret), len(ret), p) if pb > j_min + TOL else 1.0, p=p,
                                 vacuous=not pb > j_min + TOL))
    return rows_out

def check_monotone(check: str, eps, bounds) -> list[dict]:
    """A certified bound may only fall as ε grows (J̲_E, J̲_p, J̲): every rise is a violation, no chance
    involved."""
    return [row(check, e, b, nb, True) for e, b, nb in _monotone(eps, bounds)]

def run_checks(results: Path, run: str, stages: list[str]) -> list[dict]:
    """Every check whose files the run folder has (``stages``: the stages it holds in full), each row with
    the run's env, algo, σ (and replicate)."""
    d = Path(results) / run
    env, algo, lab = parse_run(run)
    sigma = float(lab)
    key = {"env": env, "algo": algo, "sigma": sigma}
    if replicate_of(run):
        key["replicate"] = replicate_of(run)

    def table(stage):
        return read_table(d / RUN_FILES[stage]) if stage in stages else None

    gre, attack_global, attack_local, lore = table("gre"), table("attack_global"), table("attack_local"), table("lore")
    rows = []
    if gre is not None:
        if attack_global is not None:
            rows += _same_rewards(check_gre_vs_global_attack(gre, attack_global), reward_clips(d))
        for p, g in gre.groupby(cols.P):
            rows += check_monotone(f"gre_percentile_p{p:g}_monotone", g[cols.EPS],
                                   g[cols.PERCENTILE_BOUND].astype(float))
        rows += check_monotone("gre_expectation_monotone", gre[cols.EPS], gre[cols.EXPECTATION_BOUND])
    chance = chance_inputs(d, env, _network_actions(results, run)) if attack_local is not None else None
    if lore is not None:
        if attack_local is not None:
            lmeta = read_lore_meta(d)
            ls = lmeta.get("settings") or {}
            j_min = (spec_fact(env, "return_range", int(ls["horizon"]), float(ls.get("gamma", 1.0)))
                     or (None,))[0] if ls.get("horizon") else None
            rows += check_lore_vs_local_attack(lore, lmeta, attack_local, chance, sigma, j_min)
        rows += check_monotone("lore_monotone", lore[cols.EPS], lore[cols.LOWER_BOUND])
    if attack_local is not None:
        rows += check_certified_steps_not_flipped(attack_local, chance, sigma)
    seeds = {s: _stage_seed(d, s) for s in ("attack_global", "attack_local")}
    return [{**key, **r, "attack_seed": seeds["attack_global" if r["check"].startswith("gre_") else "attack_local"]}
            for r in rows]

def _network_actions(results: Path, run: str) -> int | None:
    """The number of outputs of the run's smoothed network (its checkpoint's ``model.json``), the actions the
    smoothed policy can take: a flip bound sums over all of them but one, so it is read from the network, never
    from the environment's action count (a network may have more outputs than the game's minimal set).  None
    where the record is missing or names no output size."""
    from crop.models import CheckpointError, n_actions

    env, algo, _ = parse_run(base_run(run))
    f = checkpoint_record(results, env, split_run_algo(algo)[0])
    try:
        return n_actions(read_json(f)["net_spec"]) if f.is_file() else None
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None

def _same_rewards(rows: list[dict], clips: dict) -> list[dict]:
    """GRe's rows as they are where GRe and the global attack ran on the same rewards (both the environment's
    own, or both clipped to one range); otherwise untestable: a bound on the clipped return says nothing of an
    unclipped one (nor the reverse), so neither a shortfall nor its absence is evidence (p = 1, with why)."""
    gre, attack = clips.get("gre"), clips.get("attack_global")
    if gre == attack:
        return rows
    own = "the environment's own rewards"
    note = (f"GRe's bound is of {clip_text([gre]) or own}, the global attack's returns of "
            f"{clip_text([attack]) or own}: returns of different rewards")
    return [{**r, "p_value": 1.0, "min_p": 1.0, "empirical_below": False, "reward_mismatch": note} for r in rows]

def _stage_seed(d: Path, key: str):
    """The seed a stage's file records (its meta file), or None."""
    f = meta_path(d / RUN_FILES[key])
    return read_json(f).get("seed") if f.is_file() else None

def untestable_reason(item: dict, alpha: float, k: int) -> tuple[str, str]:
    """(why a check cannot reach significance in a family of k, what would make it testable)."""
    level = alpha / max(k, 1)
    c = item["check"]
    if item.get("reward_mismatch"):
        return item["reward_mismatch"], "rerun GRe and the global attack with one rewards.clip"
    if c == "lore_vs_pgd_local" and lore_alpha_exhausted(item.get("alpha_spent", 0.0)):
        return (f"LoRe's tree spent α = {item['alpha_spent']:.3g} ≥ 1: its bound has no joint meaning",
                "alpha_mode: family (the whole tree at α)")
    if c == "lore_vs_pgd_local" and item.get("off_lore_states"):
        return (f"the attacked path could not fail (p = 1 whatever its return): {item.get('note')}",
                "a local attack that replays LoRe's environment and records each step's return so far "
                "(attack_local_steps.csv's return_so_far: rerun the attack)")
    if c == "lore_vs_pgd_local" and item["min_p"] >= 1.0:
        note = item.get("note") or "unassessed"
        if note.startswith("unassessed"):
            return (f"the attacked path cannot be bounded against LoRe's tree: {note}",
                    "a local attack and a LoRe search that record their states (attack_local_steps.csv, "
                    "lore_states.csv) over LoRe's horizon")
        # Fixed by the certifiers' outputs before the attack: α spent plus the leave bound at s₀ reaches 1.
        return (f"its smallest p-value is 1 at ε = {item['eps']:.4g}: α spent ({item['alpha_spent']:.3g}) plus "
                "the chance that an attacked episode leaves LoRe's tree at its first state reaches 1, "
                "whatever the attack",
                "a tighter certificate at LoRe's first state (more noise samples: lore.m) or less α spent "
                "(alpha_mode: family)")
    if c == "lore_vs_pgd_local":
        return (f"a single attacked return: smallest p = α spent + the leave bound at s₀ = {item['min_p']:.3g} > "
                f"α/K = {level:.3g}",
                "alpha_mode: family or a smaller alpha for LoRe")
    if c == "gre_expectation_vs_pgd_mean":
        if not item["shortfall_max"] > 0:
            return "the bound is at or below J_min: no attacked mean can fall below it", "a tighter bound"
        need = math.ceil(math.log(1 / level) * item["width"] ** 2 / (2 * max(item["shortfall_max"], 1e-300) ** 2))
        return (f"{item['episodes']} attacked episodes: smallest p {item['min_p']:.3g} > α/K = {level:.3g}",
                f"attack.global_episodes ≥ {need}")
    if c.startswith("gre_percentile"):
        p = float(item.get("p", 0.5))
        if item["min_p"] >= 1.0:
            return "the bound is at J_min: no return can fall below it", "a tighter bound (more GRe samples)"
        need = math.ceil(math.log(level) / math.log(p))
        return (f"{item['episodes']} attacked episodes: smallest p = p^n = {item['min_p']:.3g} > α/K = "
                f"{level:.3g}", f"attack.global_episodes ≥ {need}")
    if c == "loact_certified_steps_not_flipped":
        if item["min_p"] >= 1.0:
            return item.get("note") or "the flips could not be bounded", "a local attack that records its steps"
        return (f"{item.get('steps')} planned attacked steps: smallest p {item['min_p']:.3g} > α/K = {level:.3g}",
                "attack.local_episodes larger")
    return f"smallest p {item['min_p']:.3g} > α/K = {level:.3g}", ""
