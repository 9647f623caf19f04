"""Soundness checks of one run: does an attack beat a certificate by more than chance allows?  Each check is
one function over the run's result files and returns its rows (``check``, ``eps``, ``bound``, ``observed``,
``violation``, and its evidence); :func:`run_checks` runs those whose files the run has.  Whether a
chance-based row (one with a ``p_value``) is a violation is decided over the audit's families
(:func:`crop.report.audit.classify`), not here: its ``violation`` is False until then.  A raw failure
(``empirical_below``) within what chance allows is listed but is not a violation.

* **a bound rising with ε** (J̲_E, J̲_p, J̲): deterministic, always a violation;
* **GRe** percentile bound J̲_p above the attacked p-quantile, and expectation bound above the attacked mean:
  these bounds are about the *distribution* of returns; p-values P[Bin(n, p) ≥ #returns below J̲_p] and
  Hoeffding's exp(−2n·shortfall²/(J_max − J_min)²);
* **a flip at a certified attacked step** (``loact_certified_steps_not_flipped``, per run and ε).  The local
  attack records every attacked step (attack_local_steps.csv): its clean state's certificate (Theorem 1, the
  attack's own per-state α) and the attacked action.  If the clean bounds L(a₁) (``q_top_lower``) and max U(a)
  (``q_others_upper_max``) hold, Lemma 3 (σΦ⁻¹ of the clipped smoothed Q is 1-Lipschitz) gives, for ‖δ‖ ≤ ε,
  Q̃(s+δ, a₁) − Q̃(s+δ, a) ≥ Δ = w·(Φ(Φ⁻¹(p_L) − ε/σ) − Φ(Φ⁻¹(p_U) + ε/σ)), p = (bound − V_min)/w, and by
  Hoeffding the m-sample argmax is not a₁ with probability ≤ (|A| − 1)·exp(−m·Δ²/(2w²))
  (:func:`flip_probability_bound`).  The flips at the steps certified beyond ε are tested against these
  per-step bounds and α by a mixture of Ville supermartingales (:func:`ville_flip_p`), valid whatever the
  attacker does;
* **LoRe bound above the local PGD return** from LoRe's own initial state.  LoRe's bound (Theorem 4) holds for
  every path of its tree; the exact smoothed policy stays in the tree when LoRe's certificates hold
  (probability ≥ 1 − α_spent, from LoRe's meta file); the m-sample attacked policy leaves it at a node only by
  taking an action the tree excludes, with probability ≤ b(node) from LoRe's own certificate there
  (lore_states.csv).  The audit walks the attacked path (:func:`lore_path_bound`): A = Σ b over its steps up
  to where it left or its return so far secured J̲ (:func:`lore_secured`), and the p-value α_spent + A is valid
  (a predictable compensator bound).  J̲ is a
  non-increasing step function and T_ε ⊆ T_ε' for ε ≤ ε', so an ε-attack may be checked against J̲(ε') over the
  tree of a whole piece [ε_j, ε_{j+1}) of it (:func:`lore_intervals`), where an action is excluded only when
  its radius is ≥ ε_{j+1}; the piece is chosen from the certifiers' outputs alone (:func:`choose_lore_interval`,
  an estimate along LoAct's clean episode), never the attacked return; the row records ε' (``eps_bound``) and
  ε_{j+1} (``tree_until``).

A check's ``min_p`` is the smallest p-value its data could give (every attacked return at J_min, every
attacked step flipped), fixed by the sample sizes and bounds before the attack ran; Tarone's restriction
(:func:`crop.report.audit.tarone_holm`) leaves out the checks whose ``min_p`` cannot reach significance, and
:func:`untestable_reason` says why and what would make one testable.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from crop import columns as cols
from crop.envs import env_spec
from crop.io import meta_path, read_json
from crop.report.metrics import clip_text, lore_valid_until, parse_run, read_lore_meta, reward_clips
from crop.smoothing.stats import Phi, Phi_inv, normalise
from crop.workflow.layout import RUN_FILES, base_run, checkpoint_record, replicate_of, split_run_algo

__all__ = ["run_checks", "check_gre_vs_global_attack", "check_monotone", "check_lore_vs_local_attack",
           "check_certified_steps_not_flipped", "flip_probability_bound", "ville_flip_p",
           "ville_min_p", "lore_path_bound", "lore_root_bound",
           "lore_leave_chance", "lore_intervals", "choose_lore_interval", "lore_alpha_exhausted",
           "untestable_reason", "TOL"]

TOL = 1e-9


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


def flip_probability_bound(q_top_lower, q_others_upper_max, v_min: float, v_max: float, sigma: float,
                           eps: float, m: int, n_actions: int) -> np.ndarray:
    """Upper bound on P[the m-sample smoothed action at s + δ is not a₁], for every ‖δ‖₂ ≤ ε, given that the
    clean state's bounds L(a₁) = ``q_top_lower`` and max_{a≠a₁} U(a) = ``q_others_upper_max`` hold.

    Lemma 3 (Φ⁻¹ of the normalised clipped smoothed Q moves by at most ‖δ‖/σ) bounds the true gap at s + δ
    below by Δ = w·(Φ(Φ⁻¹(p_L) − ε/σ) − Φ(Φ⁻¹(p_U) + ε/σ)); Hoeffding on the m differences of clipped
    samples (each in [−w, w]) and a union over the |A| − 1 other actions give (|A| − 1)·exp(−mΔ²/(2w²)).
    Where Δ ≤ 0 (ε reaches the radius) the bound is 1."""
    w = float(v_max - v_min)
    pl, pu = normalise(q_top_lower, v_min, v_max), normalise(q_others_upper_max, v_min, v_max)
    with np.errstate(invalid="ignore"):
        gap = w * (Phi(Phi_inv(pl) - eps / sigma) - Phi(Phi_inv(pu) + eps / sigma))
    gap = np.where(np.isnan(gap), 0.0, np.maximum(gap, 0.0))
    return np.minimum(1.0, (n_actions - 1) * np.exp(-m * gap ** 2 / (2.0 * w ** 2)))


NOT_RECORDED = "not recorded"


def _chance_inputs(d: Path, env: str, n_actions: int | None = None) -> dict:
    """What the chance estimates need, from the run's files; missing entries are None.  ``n_actions``: the
    smoothed network's outputs (:func:`_network_actions`), the actions a flip can go to."""
    def meta(key):
        f = meta_path(d / RUN_FILES[key])
        return read_json(f) if f.is_file() else {}

    lm, am, lo = meta("loact"), meta("attack_local"), meta("lore")
    q = read_json(d / RUN_FILES["qrange"]) if (d / RUN_FILES["qrange"]).is_file() else {}
    v_min = lm.get("v_min", q.get("v_min"))
    v_max = lm.get("v_max", q.get("v_max"))
    a_set = am.get("settings") or {}
    def table(key):
        return pd.read_csv(d / RUN_FILES[key]) if (d / RUN_FILES[key]).is_file() else None

    lore_states = table("lore_states")
    if lore_states is not None:
        # LoRe wrote one radius column per output of the smoother it used: never count fewer (model.json is not
        # hashed; an edited or missing record must not shrink a flip bound).
        n_actions = max(n_actions or 0, len(_radius_columns(lore_states))) or None
    return {"steps": table("loact"), "attack_steps": table("attack_local_steps"), "lore_states": lore_states,
            "lore_horizon": (lo.get("settings") or {}).get("horizon"),
            # what makes the attacked return and LoRe's bound compare like for like (a replay of one game)
            "attack_gamma": a_set.get("gamma", NOT_RECORDED), "lore_gamma": (lo.get("settings") or {}).get(
                "gamma", NOT_RECORDED), "attack_reward_modification": am.get("reward_modification", NOT_RECORDED),
            "lore_reward_modification": (lo.get("search") or {}).get("reward_modification", NOT_RECORDED),
            "lore_pruning": (lo.get("search") or {}).get("pruning"), "reward_min": _reward_min(env, lo),
            "v_min": v_min, "v_max": v_max, "m": a_set.get("m"), "horizon": a_set.get("horizon"),
            "alpha": am.get("per_state_alpha", a_set.get("alpha")), "n_actions": n_actions,
            "loact_alpha": lm.get("per_state_alpha"), "lore_alpha": _lore_largest_state_alpha(lo)}


def _reward_min(env: str, lmeta: dict) -> float | None:
    """The lowest reward per step LoRe counted, for unmodified rewards: the lower end of the reward range its
    run declared (``settings.reward_range``, the config's ``rewards.range``), else the environment's own; None
    where unknown or where LoRe modified the rewards."""
    if (lmeta.get("search") or {}).get("reward_modification") is not None:
        return None
    declared = (lmeta.get("settings") or {}).get("reward_range")
    rr = declared if isinstance(declared, (list, tuple)) and len(declared) == 2 else _spec_fact(env, "reward_range")
    try:
        return float(rr[0]) if rr is not None else None
    except (TypeError, ValueError):
        return None


def _lore_largest_state_alpha(lmeta: dict):
    """The largest per-state α LoRe used (its first state's under alpha_mode family), or None."""
    search = lmeta.get("search") or {}
    for a in (search.get("per_state_alpha_first"), search.get("per_state_alpha"),
              (lmeta.get("settings") or {}).get("alpha")):
        if a is not None:
            return float(a)
    return None


def _spec_fact(env: str, fact: str, *args):
    """A fact of ``env``'s spec (an attribute, or a method called with ``args``); None when the id names no
    environment this process knows — an id read from a results folder never imports a module
    (:func:`crop.envs.env_spec` refuses ``module:Id`` ids the user's config did not give)."""
    try:
        value = getattr(env_spec(env), fact)
        return value(*args) if args else value
    except (ValueError, KeyError):
        return None


def _margins_ok(c: dict) -> str:
    """Why the chance of a flip cannot be estimated ('' when it can)."""
    if c["steps"] is None:
        return "no loact.csv: no recorded margins"
    if not {cols.Q_TOP_LOWER, cols.Q_OTHERS_UPPER_MAX} <= set(c["steps"].columns):
        return "loact.csv lacks q_top_lower / q_others_upper_max"
    if c["n_actions"] is None:
        return "no network output size: the checkpoint's model.json (net_spec) is missing or names none"
    if c["v_min"] is None or c["v_max"] is None or not c["v_max"] > c["v_min"]:
        return "no V range recorded"
    if c["m"] is None or c["alpha"] is None:
        return "attack_local.meta.json lacks the attack's m or alpha"
    return ""


def _step_flip_bounds(c: dict, sigma: float, eps: float, steps: pd.DataFrame) -> np.ndarray:
    return flip_probability_bound(steps[cols.Q_TOP_LOWER], steps[cols.Q_OTHERS_UPPER_MAX], c["v_min"],
                                  c["v_max"], sigma, eps, int(c["m"]), c["n_actions"])


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


def lore_secured(c: dict, path: pd.DataFrame, bound: float) -> np.ndarray:
    """Per step of the attacked episode ``path`` (in step order): whether its return before the step, J_t
    (``return_so_far``), already secures LoRe's bound J̲ = ``bound`` whatever follows — J_t plus the lowest
    return of the remaining steps, min(0, r_min·Σ_{k=t}^{H-1} γ^k), is ≥ J̲ (with a rounding margin where
    r_min < 0).  r_min is 0 where LoRe pruned (it does so only with every reward ≥ 0 declared, and checks each
    reward it sees), else the lowest reward LoRe counted (:func:`_reward_min`).  From there on the return cannot
    fall below J̲ unless a reward leaves the declared range, so the check cannot fail there.  LoRe smooths
    neither a pruned node (J_t ≥ J̲) nor an open node of a truncated search (J_t plus its worst case ≥ J̲): an
    attacked path that reaches one is secured there."""
    n = len(path)
    if cols.RETURN_SO_FAR not in path.columns or c.get("lore_horizon") is None:
        return np.zeros(n, bool)
    r_min = 0.0 if c.get("lore_pruning") is True else c.get("reward_min")
    gamma = c.get("lore_gamma")
    if r_min is None or not isinstance(gamma, (int, float)):
        return np.zeros(n, bool)
    horizon, t = int(c["lore_horizon"]), path[cols.STEP].to_numpy(int)
    so_far = path[cols.RETURN_SO_FAR].to_numpy(float)
    if float(r_min) >= 0.0:
        # Rounding to the CSV's digits is monotone: J_t ≥ J̲ before it stays so after, and rewards ≥ 0 add.
        return so_far >= bound
    weight = np.array([sum(float(gamma) ** k for k in range(int(s), horizon)) for s in t], np.float64)
    # The worst case is one product here and a sum of H products in LoRe, both rounded to the CSV's digits:
    # a margin of (H + 2)·1e-9 relative covers both, so a step is never called secured that is not.
    slack = 1e-9 * (horizon + 2) * np.maximum(1.0, np.maximum(np.abs(so_far), abs(float(bound))))
    return so_far + float(r_min) * weight >= bound + slack


def lore_path_bound(c: dict, sigma: float, eps: float, tree_until: float,
                    path: pd.DataFrame, bound: float = math.inf) -> tuple[float, str]:
    """(A, note): the sum, along the attacked episode ``path`` (its rows of attack_local_steps.csv, in step
    order) up to the step where its return so far secures J̲ = ``bound`` (:func:`lore_secured`; that step
    excluded) or up to and including the step where it leaves LoRe's tree of every ε'' < ``tree_until``, of the bound
    b_t on the chance that the m-sample action leaves there — at the LoRe state of the step's observation
    (lore_states.csv), b_t = Σ over the actions a the tree excludes (r(a) ≥ ``tree_until``) of
    exp(−m·Δ_a²/(2w²)), Δ_a = w·(Φ(z_L − ε/σ) − Φ(z_L − (2r(a) − ε)/σ)), z_L = Φ⁻¹(p_L) (Lemma 3 and
    Hoeffding, as :func:`flip_probability_bound`, with U(a) from r(a)).  b_t depends on the path up to step t
    only (predictable), so P[the episode leaves and A ≤ a] ≤ a under valid LoRe certificates (docs/audit.md).
    A return below J̲ needs an episode that left the tree before its return so far secured J̲, so only those
    steps count.  inf where a step's state is not among LoRe's certified states before the episode left or
    secured J̲ (a node LoRe never reached: a faulty search or another environment)."""
    states = c["lore_states"].drop_duplicates(cols.OBS_DIGEST)
    path = path.sort_values(cols.STEP)
    secured = lore_secured(c, path, bound)
    if states.empty and len(path):
        return math.inf, "LoRe recorded no certified state"
    at = pd.Index(states[cols.OBS_DIGEST]).get_indexer(path[cols.OBS_DIGEST])
    missing = at < 0
    b, out = _leave_bounds(c, sigma, eps, tree_until, states.iloc[np.where(missing, 0, at)])
    out &= ~missing[:, None]
    b = np.where(missing, 0.0, b)
    action = path[cols.ACTION].to_numpy(int)
    left = out[np.arange(len(path)), np.clip(action, 0, out.shape[1] - 1)]
    stop = np.flatnonzero(missing | left | secured)
    steps = path[cols.STEP].to_numpy(int)
    if not len(stop):
        return float(b.sum()), STAYED
    k = int(stop[0])
    if secured[k]:
        return float(b[:k].sum()), f"{SECURED} at attacked step {steps[k]}"
    if missing[k]:
        return math.inf, f"attacked step {steps[k]}'s state is {OFF_STATES}"
    return float(b[: k + 1].sum()), f"left LoRe's tree at attacked step {steps[k]}"


STAYED, OFF_STATES = "stayed in LoRe's tree", "not among LoRe's certified states"
SECURED = "its return so far secured J̲"


def lore_path_impossible(path: pd.DataFrame, note: str, length: int, horizon: int) -> str:
    """Why a return below J̲ along this attacked path is impossible for a correct search whatever the noise ('' when
    it is not): J̲ is the least return over every path of LoRe's tree (Theorem 4, Algorithm 3), so a path that
    stayed in the tree over all the ``length`` steps its episode took (each recorded, to LoRe's ``horizon`` or a
    terminal state) returns at least J̲; a path that reached, still in the tree and before its return secured J̲
    (:func:`lore_secured`), a state LoRe did not certify reached no node of a correct search (pruned and open
    nodes are secured); only a faulty search or a replay that differs explains either, not a certificate's
    chance.  A path whose return secured J̲ and still ended below it met a reward below the declared range.
    Valid only where the attack replays LoRe's game (the same horizon, γ and reward modification:
    :func:`_path_ok`)."""
    if OFF_STATES in note:
        return f"the attacked path reached a state LoRe neither certified nor left open to a lower return ({note})"
    if SECURED in note:
        return f"{note}, yet the return fell below it: a reward below the declared range (rewards.range)"
    whole = (len(path) == length <= horizon
             and np.array_equal(np.sort(path[cols.STEP].to_numpy(int)), np.arange(length)))
    if note == STAYED and whole:
        end = "LoRe's horizon" if length == horizon else "a terminal state"
        return f"the attacked path stayed in LoRe's tree to {end}"
    return ""


def _radius_columns(states: pd.DataFrame) -> list[str]:
    """lore_states.csv's ``radius_a`` columns in action order: one per output of the smoothed network, which
    may be fewer than the environment's actions (a policy trained on a reduced action set)."""
    n = sum(1 for name in states.columns if re.fullmatch(rf"{cols.RADIUS}_\d+", str(name)))
    return [f"{cols.RADIUS}_{a}" for a in range(n)]


def _leave_bounds(c: dict, sigma: float, eps: float, tree_until: float,
                  states: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per LoRe state (rows of lore_states.csv): the bound b on the chance that the m-sample action at an
    ε-perturbation of it is one the tree of every ε'' < ``tree_until`` excludes, and which actions it excludes
    (:func:`lore_path_bound`)."""
    radii = states[_radius_columns(states)].to_numpy(float)
    z_l = Phi_inv(normalise(states[cols.Q_TOP_LOWER].to_numpy(float), c["v_min"], c["v_max"]))[:, None]
    w, m = float(c["v_max"] - c["v_min"]), int(c["m"])
    out = radii >= tree_until
    with np.errstate(invalid="ignore"):
        gap = w * (Phi(z_l - eps / sigma) - Phi(z_l - (2 * radii - eps) / sigma))
    gap = np.where(np.isnan(gap), 0.0, np.maximum(gap, 0.0))
    return np.minimum(1.0, np.where(out, np.exp(-m * gap ** 2 / (2 * w ** 2)), 0.0).sum(axis=1)), out


def lore_root_bound(c: dict, sigma: float, eps: float, tree_until: float) -> float:
    """The leave bound b at LoRe's initial state s₀ (its state of depth 0): every attacked episode from s₀
    starts there, so its sum A is at least this, and a LoRe check's smallest p-value is α_spent + this — fixed
    by the certifiers' outputs and the attack's settings before the attack ran."""
    root = c["lore_states"][c["lore_states"][cols.STEP] == 0]
    return float(_leave_bounds(c, sigma, eps, tree_until, root.head(1))[0][0]) if len(root) else 0.0


def _starts_at_s0(c: dict, path: pd.DataFrame) -> bool:
    """The attacked episode's first state is LoRe's initial state (the same observation digest)."""
    root = c["lore_states"][c["lore_states"][cols.STEP] == 0][cols.OBS_DIGEST]
    first = path[path[cols.STEP] == 0][cols.OBS_DIGEST]
    return len(root) == 1 and len(first) == 1 and root.iloc[0] == first.iloc[0]


def _path_ok(c: dict, horizon: int | None) -> str:
    """Why the attacked path cannot be checked against LoRe's states ('' when it can)."""
    if c.get("attack_steps") is None or c.get("lore_states") is None:
        return "no attack_local_steps.csv or lore_states.csv: the attacked path's states are not recorded"
    why = _margins_ok({**c, "steps": c["attack_steps"]})
    if why:
        return why
    if horizon is None or (c.get("lore_horizon") is not None and horizon != int(c["lore_horizon"])):
        return f"the attacked horizon {horizon} differs from LoRe's {c.get('lore_horizon')}"
    for name in ("gamma", "reward_modification"):
        attack, lore = c.get(f"attack_{name}"), c.get(f"lore_{name}")
        if NOT_RECORDED in (attack, lore) or attack != lore:
            return f"the attack's {name} ({attack}) differs from LoRe's ({lore}): not a replay of LoRe's game"
    return ""


def lore_leave_chance(c: dict, sigma: float, eps: float, horizon: int,
                      tree_until: float | None = None) -> tuple[float, str]:
    """(P[the ε-attacked episode leaves LoRe's tree] estimated along LoAct episode 0's first ``horizon``
    steps, note); see the module docstring.  The tree is T_ε, or with ``tree_until`` (> ε) the larger tree of
    every ε'' < ``tree_until`` (Theorem 4: an action stays out only where its radius is ≥ ``tree_until``): a
    two-action step whose radius lies below it keeps both actions, so leaving there is impossible.  The flip
    bound of a step certified beyond ε uses the attack's own ε either way (its perturbation)."""
    why = _margins_ok(c)
    if why:
        return 1.0, f"unassessed ({why})"
    s = c["steps"]
    ep0 = s[s[cols.EPISODE] == s[cols.EPISODE].min()].sort_values(cols.STEP).head(horizon)
    if len(ep0) < horizon:
        return 1.0, f"LoAct episode 0 has {len(ep0)} < {horizon} steps"
    certified, radius = ep0[cols.CERTIFIED].astype(bool).to_numpy(), ep0[cols.RADIUS].to_numpy(float)
    beyond = certified & (radius > eps)
    in_tree = ~beyond if tree_until is None else ~certified | (radius < tree_until)
    # A step LoAct did not certify beyond the tree's radius keeps both actions of a two-action game in LoRe's
    # tree only if LoRe certifies no more than LoAct does: its per-state α no larger than LoAct's (wider bounds).
    nested = (c.get("lore_alpha") is not None and c.get("loact_alpha") is not None
              and c["lore_alpha"] <= c["loact_alpha"])
    both = c["n_actions"] == 2 and nested
    p = np.where(both & in_tree, 0.0, np.where(beyond, _step_flip_bounds(c, sigma, eps, ep0), 1.0))
    note = f"estimated along LoAct episode 0 ({horizon} steps)"
    if c["n_actions"] == 2 and not nested and not beyond.all():
        note += "; LoRe's per-state α exceeds LoAct's, so a step LoAct left uncertified may be one LoRe certified"
    return float(1.0 - np.prod(1.0 - p)), note


def _planned_horizon(r, chance: dict | None) -> int | None:
    """The attacked episode's planned length (its ``horizon`` column, else the attack's recorded setting)."""
    if cols.HORIZON in r.index and not pd.isna(r[cols.HORIZON]):
        return int(r[cols.HORIZON])
    h = (chance or {}).get("horizon")
    return int(h) if h is not None else None


def lore_intervals(lore: pd.DataFrame, eps: float, valid_until: float = math.inf) -> list[tuple]:
    """(ε', J̲(ε'), tree_until) for each piece of LoRe's step function from the one holding ε on: ε' = max(ε,
    ε_j), J̲_j, and ε_{j+1} (``valid_until`` for the last piece; inf when the search ended).  J̲_j bounds the
    return of every trajectory in LoRe's tree for every ε'' < ε_{j+1} (Theorem 4; the bound is recorded only
    where it changes)."""
    t = lore.sort_values(cols.EPS)
    e, b = t[cols.EPS].to_numpy(float), t[cols.LOWER_BOUND].to_numpy(float)
    if not len(e) or e[0] > eps or eps >= valid_until:
        return []
    ends = [*e[1:], valid_until]
    return [(max(eps, float(e[k])), float(b[k]), float(ends[k])) for k in range(len(e)) if ends[k] > eps]


def choose_lore_interval(pieces: list[tuple], c: dict, sigma: float, eps: float, horizon: int, alpha_spent: float,
                         j_min: float | None = None) -> tuple:
    """The piece of LoRe's step function an ε-attack is checked against, among the first (the tightest bound,
    from the one holding ε on) and those beyond it whose bound claims something: the first whose tree the
    m-sample attacked policy leaves within LoRe's ``horizon`` with estimated chance (along LoAct's episode 0)
    ≤ ``alpha_spent`` and whose leave bound at s₀ (:func:`lore_root_bound`, which every attacked path pays) is
    ≤ ``alpha_spent``; else the first whose leave bound at s₀ is; else the first.  J̲ is non-increasing and
    T_ε ⊆ T_ε', so under valid certificates the ε-attacked smoothed policy's return is ≥ J̲(ε) ≥ J̲(ε'); the
    choice reads the certifiers' outputs only (LoRe's table, α and states, LoAct's margins, the attack's
    settings), never the attacked returns, so the check stays valid."""
    ok = [k for k in range(len(pieces)) if k == 0 or j_min is None or pieces[k][1] > j_min + TOL]
    ok = ok[:next((i for i, k in enumerate(ok) if k != i), len(ok))]   # up to the first bound that claims nothing
    root = (lambda until: 0.0) if _path_ok(c, horizon) else (lambda until: lore_root_bound(c, sigma, eps, until))
    for k in ok:
        until = pieces[k][2]
        if root(until) <= alpha_spent and lore_leave_chance(c, sigma, eps, horizon, until)[0] <= alpha_spent:
            return pieces[k]
    return next((pieces[k] for k in ok if root(pieces[k][2]) <= alpha_spent), pieces[0])


def _lore_alpha(lmeta: dict) -> float:
    """The α LoRe's search spent (union over its smoothed states); 1 when not recorded."""
    search = lmeta.get("search") or {}
    if search.get("alpha_spent") is not None:
        return float(search["alpha_spent"])
    a, n = (lmeta.get("settings") or {}).get("alpha"), search.get("distinct_states_smoothed")
    return float(a) * int(n) if a is not None and n is not None else 1.0


def _row(check: str, eps: float, bound, observed, violation: bool = False, **evidence) -> dict:
    return {"check": check, "eps": eps, "bound": bound, "observed": observed, "violation": bool(violation),
            **evidence}


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
        rows_out.append(_row("gre_expectation_vs_pgd_mean", float(eps), eb, float(ret.mean()),
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
            rows_out.append(_row(f"gre_percentile_p{p:g}_vs_pgd", float(eps), pb, q,
                                 empirical_below=bool(q < pb - TOL), attacked_below=below, episodes=len(ret),
                                 p_value=_binom_p(below, len(ret), p),
                                 min_p=_binom_p(len(ret), len(ret), p) if pb > j_min + TOL else 1.0, p=p,
                                 vacuous=not pb > j_min + TOL))
    return rows_out


def check_monotone(check: str, eps, bounds) -> list[dict]:
    """A certified bound may only fall as ε grows (J̲_E, J̲_p, J̲): every rise is a violation, no chance
    involved."""
    return [_row(check, e, b, nb, True) for e, b, nb in _monotone(eps, bounds)]


def lore_alpha_exhausted(alpha_spent: float) -> bool:
    """A LoRe tree that spent α ≥ 1 (usual under ``alpha_mode: state``: N smoothed states at α each) has no
    joint guarantee: its bound claims nothing the audit could test."""
    return alpha_spent >= 1.0


def check_lore_vs_local_attack(lore: pd.DataFrame, lore_meta: dict, attack: pd.DataFrame, chance: dict,
                               sigma: float, j_min: float | None = None) -> list[dict]:
    """LoRe's bound J̲ (Theorem 4) against the local PGD return from LoRe's own initial state at each ε, against
    J̲(ε') of the piece :func:`choose_lore_interval` picks (from the certifiers' outputs alone).  p-value
    α_spent + A when the return is below that bound, A the sum of the leave bounds along the attacked path up to
    where it left (:func:`lore_path_bound`); 1 otherwise.  Its smallest value (``min_p``) is α_spent plus the
    leave bound at s₀ (:func:`lore_root_bound`).  The walk stops where the return so far secures J̲
    (:func:`lore_secured`: the pruned and open nodes LoRe never smoothed lie there).  A path that reaches a state
    not among LoRe's certified states before it leaves or secures J̲ (a replay that differs, or a path without
    ``return_so_far``) has p = 1 whatever its return: ``off_lore_states``, reported untestable with why (it
    stays in the family, fixed before the attack).  A bound
    at ``j_min`` (the lowest return over LoRe's horizon) claims nothing: ``vacuous``.  A return below J̲ that no
    noise explains (:func:`lore_path_impossible`: the path stayed in the tree throughout, or reached a state LoRe
    did not certify while in it) is named in ``impossible``: a violation with no chance involved, outside Tarone's
    family's arithmetic (as :func:`check_monotone`)."""
    valid_until = lore_valid_until({"lore_meta": lore_meta})
    a_lore = _lore_alpha(lore_meta)
    steps = chance.get("attack_steps")
    rows_out = []
    for _, r in attack[attack[cols.SAME_START_AS_LORE].astype(bool)].iterrows():
        eps = float(r[cols.EPS])
        pieces = lore_intervals(lore, eps, valid_until)
        if not pieces:
            continue
        # The piece from the certifiers' outputs and the planned horizon (a setting), never the attacked outcome.
        horizon = _planned_horizon(r, chance)
        eps_b, b, until = (pieces[0] if horizon is None else
                           choose_lore_interval(pieces, chance, sigma, eps, horizon, a_lore, j_min))
        why = _path_ok(chance, horizon)
        path = None if why else steps[np.isclose(steps[cols.EPS], eps) & (steps[cols.EPISODE] == r[cols.EPISODE])]
        if not why and not _starts_at_s0(chance, path):
            # s₀ is the seeded reset's, free of any noise: a mismatch is a fact of the setup, not an outcome
            why = "the attacked episode does not start at LoRe's s₀ (another environment, seed or profile)"
        off_tree, impossible = False, ""
        if why:
            bound_sum, note, least = math.inf, f"unassessed ({why})", 1.0
        else:
            bound_sum, note = lore_path_bound(chance, sigma, eps, until, path, b)
            least = min(1.0, a_lore + lore_root_bound(chance, sigma, eps, until))
            # The path reached a state LoRe did not certify while still in its tree: p = 1 whatever the return.
            off_tree = math.isinf(bound_sum)
        below = float(r[cols.RETURN]) < b - TOL
        if below and not why:
            length = int(r[cols.STEPS]) if cols.STEPS in r.index and not pd.isna(r[cols.STEPS]) else -1
            impossible = lore_path_impossible(path, note, length, horizon)
            off_tree = off_tree and not impossible
        tree = f"ε < {until:.4g}" if math.isfinite(until) else "every ε (the whole search)"
        p = min(1.0, a_lore + bound_sum) if below else 1.0
        rows_out.append(_row("lore_vs_pgd_local", eps, b, float(r[cols.RETURN]), empirical_below=below,
                             episode=int(r[cols.EPISODE]), p_value=p, alpha_spent=a_lore,
                             p_leave=min(1.0, bound_sum), eps_bound=eps_b,
                             tree_until=until if math.isfinite(until) else None,
                             note=f"{note}; J̲(ε' = {eps_b:.4g}) over LoRe's tree for {tree}",
                             min_p=least, off_lore_states=off_tree, impossible=impossible,
                             vacuous=j_min is not None and not b > j_min + TOL))
    return rows_out


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
        horizons = [_planned_horizon(r, chance) for _, r in g.iterrows()]
        flips, n = int(g[cols.FLIPS_CERTIFIED].sum()), sum(h or 0 for h in horizons)
        why = ("no attack_local_steps.csv: the attacked steps are not recorded" if steps is None
               else _margins_ok({**chance, "steps": steps})) or ("no planned horizon recorded" if None in horizons
                                                                  else "")
        alpha = float(chance.get("alpha") or 1.0)
        if why:
            p, counted, note = 1.0, 0, f"unassessed ({why})"
        else:
            s = steps[np.isclose(steps[cols.EPS], float(eps))]
            count = (s[cols.CERTIFIED].astype(bool) & (s[cols.RADIUS] > float(eps))).to_numpy()
            flip = (s[cols.ACTION] != s[cols.CLEAN_ACTION]).to_numpy()
            bound = np.asarray(_step_flip_bounds(chance, sigma, float(eps), s), float) if len(s) else np.zeros(0)
            p = ville_flip_p(s[cols.STEP].to_numpy(), count, flip, bound, alpha)
            counted = int(count.sum())
            note = (f"{counted} attacked steps certified beyond eps, flip bounds summing to "
                    f"{float(bound[count].sum()):.3g} (plus alpha per step)")
        empty = loact is not None and cols.RADIUS in loact.columns and not (
            loact[cols.CERTIFIED].astype(bool) & (loact[cols.RADIUS] > float(eps))).any()
        rows_out.append(_row("loact_certified_steps_not_flipped", float(eps), 0, flips, empirical_below=flips > 0,
                             episodes=len(g), steps=n, counted=counted, p_value=p, note=note,
                             min_p=1.0 if why else ville_min_p(n, alpha), vacuous=bool(empty),
                             nothing_counted=not why and counted == 0))
    return rows_out


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
        return pd.read_csv(d / RUN_FILES[stage]) if stage in stages else None

    gre, attack_global, attack_local, lore = table("gre"), table("attack_global"), table("attack_local"), table("lore")
    rows = []
    if gre is not None:
        if attack_global is not None:
            rows += _same_rewards(check_gre_vs_global_attack(gre, attack_global), reward_clips(d))
        for p, g in gre.groupby(cols.P):
            rows += check_monotone(f"gre_percentile_p{p:g}_monotone", g[cols.EPS],
                                   g[cols.PERCENTILE_BOUND].astype(float))
        rows += check_monotone("gre_expectation_monotone", gre[cols.EPS], gre[cols.EXPECTATION_BOUND])
    chance = _chance_inputs(d, env, _network_actions(results, run)) if attack_local is not None else None
    if lore is not None:
        if attack_local is not None:
            lmeta = read_lore_meta(d)
            ls = lmeta.get("settings") or {}
            j_min = (_spec_fact(env, "return_range", int(ls["horizon"]), float(ls.get("gamma", 1.0)))
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


