"""The LoRe check: LoRe's bound J̲ (Theorem 4) against the local PGD return from LoRe's own initial state.
The bound holds for every path of LoRe's tree; the m-sample attacked policy leaves the tree at a node only by
taking an action the tree excludes, with a chance bounded by LoRe's own certificate there, so the audit walks
the attacked path (:func:`lore_path_bound`) and the p-value α_spent + A is valid.  J̲ is a non-increasing step
function and T_ε ⊆ T_ε', so an ε-attack may be checked against J̲(ε') over the tree of a whole piece of it
(:func:`lore_intervals`, :func:`choose_lore_interval`), chosen from the certifiers' outputs alone."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from crop import columns as cols
from crop.audit.check_inputs import NOT_RECORDED, TOL, planned_horizon, radius_columns, row
from crop.audit.checks_flips import margins_ok, step_flip_bounds
from crop.report.metrics import lore_valid_until
from crop.smoothing.stats import Phi, Phi_inv, normalise

__all__ = ["lore_secured", "lore_path_bound", "lore_path_impossible", "lore_root_bound", "lore_leave_chance",
           "lore_intervals", "choose_lore_interval", "lore_alpha_exhausted", "check_lore_vs_local_attack"]


def lore_secured(c: dict, path: pd.DataFrame, bound: float) -> np.ndarray:
    """Per step of the attacked episode ``path`` (in step order): whether its return before the step, J_t
    (``return_so_far``), already secures LoRe's bound J̲ = ``bound`` whatever follows — J_t plus the lowest
    return of the remaining steps, min(0, r_min·Σ_{k=t}^{H-1} γ^k), is ≥ J̲ (with a rounding margin where
    r_min < 0).  r_min is 0 where LoRe pruned (it does so only with every reward ≥ 0 declared, and checks each
    reward it sees), else the lowest reward LoRe counted (``reward_min`` of
    :func:`crop.audit.check_inputs.chance_inputs`).  From there on the return cannot fall below J̲ unless a
    reward leaves the declared range, so the check cannot fail there.  LoRe smooths
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

def _leave_bounds(c: dict, sigma: float, eps: float, tree_until: float,
                  states: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per LoRe state (rows of lore_states.csv): the bound b on the chance that the m-sample action at an
    ε-perturbation of it is one the tree of every ε'' < ``tree_until`` excludes, and which actions it excludes
    (:func:`lore_path_bound`)."""
    radii = states[radius_columns(states)].to_numpy(float)
    z_l = Phi_inv(normalise(states[cols.SMOOTHED_TOP_LOWER].to_numpy(float), c["v_min"], c["v_max"]))[:, None]
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
    why = margins_ok({**c, "steps": c["attack_steps"]})
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
    why = margins_ok(c)
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
    p = np.where(both & in_tree, 0.0, np.where(beyond, step_flip_bounds(c, sigma, eps, ep0), 1.0))
    note = f"estimated along LoAct episode 0 ({horizon} steps)"
    if c["n_actions"] == 2 and not nested and not beyond.all():
        note += "; LoRe's per-state α exceeds LoAct's, so a step LoAct left uncertified may be one LoRe certified"
    return float(1.0 - np.prod(1.0 - p)), note

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
    family's arithmetic (as :func:`crop.audit.checks.check_monotone`)."""
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
        horizon = planned_horizon(r, chance)
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
        rows_out.append(row("lore_vs_pgd_local", eps, b, float(r[cols.RETURN]), empirical_below=below,
                             episode=int(r[cols.EPISODE]), p_value=p, alpha_spent=a_lore,
                             p_leave=min(1.0, bound_sum), eps_bound=eps_b,
                             tree_until=until if math.isfinite(until) else None,
                             note=f"{note}; J̲(ε' = {eps_b:.4g}) over LoRe's tree for {tree}",
                             min_p=least, off_lore_states=off_tree, impossible=impossible,
                             vacuous=j_min is not None and not b > j_min + TOL))
    return rows_out
