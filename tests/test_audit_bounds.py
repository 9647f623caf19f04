"""The audit's tests along the attacked path, through the audit's own code (the checks and ``classify``):
LoRe's bound against the sum of the leave bounds along the path the attack took (lore_states.csv and
attack_local_steps.csv), and the flips at certified attacked steps against each step's flip bound by a Ville
supermartingale.  Each holds its level on sound data drawn at the worst a valid certificate allows (false
alarms at most α, within binomial slack) and flags a planted violation at rate at least 1 − α."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sst

from crop.audit.audit import classify, verdict_of
from crop.audit.checks import (
    check_certified_steps_not_flipped,
    check_lore_vs_local_attack,
    flip_probability_bound,
    lore_path_bound,
    ville_flip_p,
    ville_min_p,
)
from crop.smoothing.stats import Phi, Phi_inv

SIGMA, M, H, ALPHA = 0.1, 100, 10, 0.05
P_L = 0.6            # normalised L(a₁) of every state
A_SPENT = 1e-3       # LoRe's α spent
TREE_UNTIL = 0.003   # the end of J̲(0)'s piece: an action with radius ≥ this is out of its tree
# LoRe radii of the other action: a near tie just beyond the piece (leave bound ≈ 1), a middling and a far one.
RADII = np.array([0.003, 0.02, 0.05])


def _leave_bound(r: float, eps: float = 0.0) -> float:
    z = Phi_inv(P_L)
    gap = Phi(z - eps / SIGMA) - Phi(z - (2 * r - eps) / SIGMA)
    return float(min(1.0, math.exp(-M * max(gap, 0.0) ** 2 / 2)))


def _lore_chance(states: pd.DataFrame, steps: pd.DataFrame) -> dict:
    return {"steps": None, "attack_steps": steps, "lore_states": states, "v_min": 0.0, "v_max": 1.0, "m": M,
            "alpha": 1e-3, "n_actions": 2, "horizon": H, "lore_horizon": H}


LORE = pd.DataFrame({"eps": [0.0, TREE_UNTIL], "lower_bound": [H - 0.5, 0.0]})   # J_min from TREE_UNTIL on


def _lore_units(rng, units: int, planted: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``units`` attacked episodes from s₀ (one per run), each through its own LoRe states.  Sound units are
    drawn at the worst a valid LoRe allows: the episode leaves the tree at step t with probability exactly its
    leave bound b_t and then ends below J̲; with probability α_spent LoRe's certificates failed and it leaves
    at a random step, whatever b_t, and ends below J̲ (a path that stays in the tree is one of the tree's: its
    return is at least J̲ whatever the certificates).  A planted unit (a broken bound) ends below J̲ staying in the
    tree, through far states."""
    states, steps, attack = [], [], []
    for u in range(units):
        radii = RADII[rng.integers(0, 3, H)] if not planted[u] else np.full(H, RADII[-1])
        radii[0] = RADII[-1]   # s₀, the same state for every unit (LoRe's initial state)
        b = np.array([_leave_bound(r) for r in radii])
        leave = rng.random(H) < b
        if rng.random() < A_SPENT:
            leave[rng.integers(0, H)] = True
        t_out = int(np.argmax(leave)) if leave.any() and not planted[u] else H
        below = planted[u] or t_out < H
        digests = ["s0"] + [f"u{u}s{t}" for t in range(1, H)]
        states.append(pd.DataFrame({"obs_digest": digests, "step": range(H), "smoothed_top_lower": P_L, "radius_0": 0.0,
                                    "radius_1": radii}))
        n = min(t_out + 1, H)
        steps.append(pd.DataFrame({"eps": 0.0, "episode": u, "step": range(n), "obs_digest": digests[:n],
                                   "clean_action": 0, "action": [0] * (n - 1) + [1 if t_out < H else 0],
                                   "certified": True, "radius": 0.0, "smoothed_top_lower": P_L,
                                   "smoothed_others_upper_max": 0.5}))
        attack.append({"eps": 0.0, "episode": u, "return": H - 1.0 if below else float(H), "steps": n,
                       "flips_certified": 0, "same_start_as_lore": True, "horizon": H})
    return pd.concat(states).drop_duplicates("obs_digest"), pd.concat(steps), pd.DataFrame(attack)


def _one_step(radius: float, state: str, action: int, ret: float, lore: pd.DataFrame = LORE) -> dict:
    """The LoRe row of a one-step attacked episode from s₀ (LoRe's state ``s0``, the other action's radius
    ``radius``) that starts at ``state``, takes ``action`` and returns ``ret``."""
    states = pd.DataFrame({"obs_digest": ["s0"], "step": [0], "smoothed_top_lower": P_L, "radius_0": 0.0,
                           "radius_1": [radius]})
    path = pd.DataFrame({"eps": 0.0, "episode": 0, "step": [0], "obs_digest": [state], "action": [action],
                         "clean_action": 0, "certified": True, "radius": 0.0, "smoothed_top_lower": P_L,
                         "smoothed_others_upper_max": 0.5})
    attack = pd.DataFrame({"eps": [0.0], "episode": 0, "return": ret, "steps": 1, "flips_certified": 0,
                           "same_start_as_lore": True, "horizon": H})
    row, = check_lore_vs_local_attack(lore, {"search": {"alpha_spent": A_SPENT}}, attack,
                                      _lore_chance(states, path), SIGMA, j_min=0.0)
    return row


def _audit_fails(rows: list[dict]) -> bool:
    items = [{**r, "env": "CartPole-v0", "algo": f"A{u}", "sigma": SIGMA, "attack_seed": u}
             for u, r in enumerate(rows)]
    out, pooled, _ = classify(items, ALPHA)
    return any(i["status"] == "violation" for i in out + pooled)


def test_lore_path_bound_sums_the_leave_bounds_up_to_where_the_path_left():
    """A = Σ b_t up to and including the step where the attacked action is one LoRe's tree excludes; inf where
    a step's state is not among LoRe's (a replay that differs, a pruned or unexpanded node)."""
    radii = np.array([0.05, 0.02, 0.003, 0.05])
    states = pd.DataFrame({"obs_digest": list("abcd"), "smoothed_top_lower": P_L, "radius_0": 0.0, "radius_1": radii})
    path = pd.DataFrame({"step": range(4), "obs_digest": list("abcd"), "action": [0, 0, 1, 0]})
    c = _lore_chance(states, path)
    a, note = lore_path_bound(c, SIGMA, 0.0, TREE_UNTIL, path)
    assert a == pytest.approx(sum(_leave_bound(r) for r in radii[:3])) and "step 2" in note
    a, note = lore_path_bound(c, SIGMA, 0.0, 0.04, path)   # the tree of every ε'' < 0.04 keeps 0.003 and 0.02
    assert a == pytest.approx(2 * _leave_bound(0.05)) and note == "stayed in LoRe's tree"
    assert lore_path_bound(c, SIGMA, 0.0, math.inf, path)[0] == 0.0   # the whole search: nothing to leave
    a, note = lore_path_bound(c, SIGMA, 0.0, TREE_UNTIL, path.assign(obs_digest=list("abxd")))
    assert a == math.inf and "not among LoRe's" in note


@pytest.mark.slow
def test_lore_check_holds_its_level_on_sound_paths():
    """200 sound folders of 108 runs drawn at the bounds: the audit FAILs at most α of them (binomial slack)."""
    rng, draws, units, fails = np.random.default_rng(3), 200, 108, 0
    for _ in range(draws):
        states, steps, attack = _lore_units(rng, units, np.zeros(units, bool))
        rows = check_lore_vs_local_attack(LORE, {"search": {"alpha_spent": A_SPENT}}, attack,
                                          _lore_chance(states, steps), SIGMA, j_min=0.0)
        assert len(rows) == units and all(r["min_p"] == pytest.approx(A_SPENT + _leave_bound(RADII[-1])) for r in rows)
        fails += _audit_fails(rows)
    assert fails <= sst.binom.ppf(0.999, draws, ALPHA), fails


@pytest.mark.slow
def test_lore_check_flags_a_broken_bound_where_the_path_stays_in_the_tree():
    """A LoRe bound broken in a random quarter of 108 runs (their attacked returns below J̲ along paths that
    never leave the tree) FAILs through the pooled count in at least 1 − α of 100 draws; on a path through
    near ties (leave bound ≈ 1) the same return is no evidence (p = 1)."""
    rng, draws, units, caught = np.random.default_rng(4), 100, 108, 0
    for _ in range(draws):
        planted = rng.random(units) < 0.25
        states, steps, attack = _lore_units(rng, units, planted)
        rows = check_lore_vs_local_attack(LORE, {"search": {"alpha_spent": A_SPENT}}, attack,
                                          _lore_chance(states, steps), SIGMA, j_min=0.0)
        caught += _audit_fails(rows)
    assert caught >= (1 - ALPHA) * draws, caught
    row = _one_step(TREE_UNTIL, "s0", 1, 0.0)   # leaves at s₀'s near tie
    assert row["empirical_below"] and row["p_value"] > 0.9 and row["min_p"] > 0.9   # it could not have failed
    assert not row["impossible"]


def _flip_unit(rng, eps: float, episodes: int, rate_planted: float | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run's attacked steps at ε: each certified beyond ε with probability 0.8, 10 % of those near a tie
    (radius 1.01·ε: flip bound ≈ 1), the rest beyond; a counted step flips with probability α + its flip bound
    (the worst a valid certificate allows), or ``rate_planted`` (a broken certificate)."""
    n = episodes * H
    counted = rng.random(n) < 0.8
    radius = np.where(rng.random(n) < 0.1, 1.01 * eps + 1e-4, rng.uniform(eps + 0.02, eps + 0.1, n))
    upper = Phi(Phi_inv(P_L) - 2 * radius / SIGMA)
    bound = flip_probability_bound(P_L, upper, 0.0, 1.0, SIGMA, eps, M, 2)
    chance = np.minimum(1.0, 1e-3 + bound) if rate_planted is None else np.full(n, rate_planted)
    flip = np.where(counted, rng.random(n) < chance, rng.random(n) < 0.5)
    steps = pd.DataFrame({"eps": eps, "episode": np.repeat(np.arange(episodes), H), "step": np.tile(np.arange(H),
                          episodes), "clean_action": 0, "action": flip.astype(int), "certified": counted,
                          "radius": np.where(counted, radius, 0.0), "smoothed_top_lower": P_L,
                          "smoothed_others_upper_max": upper})
    attack = pd.DataFrame({"eps": eps, "episode": range(episodes), "return": 1.0, "steps": H, "horizon": H,
                           "flips_certified": steps[counted & flip].groupby("episode").size()
                           .reindex(range(episodes), fill_value=0).to_numpy(), "same_start_as_lore": False})
    return steps, attack


def _flip_rows(rng, units: int, planted: int | None = None, rate: float = 0.5) -> list[dict]:
    rows = []
    for u in range(units):
        steps, attack = _flip_unit(rng, 0.05, 2, rate if u == planted else None)
        chance = {"steps": None, "attack_steps": steps, "v_min": 0.0, "v_max": 1.0, "m": M, "alpha": 1e-3,
                  "n_actions": 2, "horizon": H}
        rows += check_certified_steps_not_flipped(attack, chance, SIGMA)
    return rows


@pytest.mark.slow
def test_flip_test_holds_its_level_when_the_attack_seeks_near_ties():
    """Each counted step flipping at its own bound, 10 % of them near ties the attack steers into: over 200
    folders of 81 runs the audit FAILs at most α of them (the estimate over LoAct's clean steps this replaces
    FAILed every such folder)."""
    rng, draws, fails = np.random.default_rng(5), 200, 0
    for _ in range(draws):
        fails += _audit_fails(_flip_rows(rng, 81))
    assert fails <= sst.binom.ppf(0.999, draws, ALPHA), fails


@pytest.mark.slow
def test_flip_test_flags_a_broken_certificate_in_one_run():
    """80 % of the certified steps of one run of 81 flipped (far beyond α + the flip bound): a violation of that
    run's check in at least 1 − α of 100 draws; a run whose steps all flip at their bound is not."""
    rng, draws, caught = np.random.default_rng(6), 100, 0
    for _ in range(draws):
        rows = _flip_rows(rng, 81, planted=7, rate=0.8)
        items = [{**r, "env": "CartPole-v0", "algo": f"A{u}", "sigma": SIGMA, "attack_seed": u}
                 for u, r in enumerate(rows)]
        out, _, _ = classify(items, ALPHA)
        caught += out[7]["status"] == "violation"
    assert caught >= (1 - ALPHA) * draws, caught


def test_ville_p_is_one_without_flips_and_never_below_its_min_p():
    t = np.repeat(np.arange(5), 2)
    counted, bound = np.ones(10, bool), np.full(10, 0.01)
    assert ville_flip_p(t, counted, np.zeros(10, bool), bound, 1e-3) == 1.0
    every = ville_flip_p(t, counted, np.ones(10, bool), np.zeros(10), 1e-3)
    assert every == pytest.approx(ville_min_p(10, 1e-3)) and every < 1e-20
    assert ville_flip_p(t, counted, np.ones(10, bool), np.ones(10), 1e-3) == 1.0  # bound 1: a flip says nothing
    assert ville_flip_p(t, ~counted, np.ones(10, bool), bound, 1e-3) == 1.0       # uncounted steps say nothing


def test_lore_piece_avoids_a_near_tie_at_the_initial_state():
    """Every attacked path pays the leave bound at s₀; where s₀ excludes an action just beyond J̲(0)'s piece
    (leave bound ≈ 1: the check could never fail there), the check moves to the next piece whose tree keeps that
    action — chosen from LoRe's states, never the attacked return — and can fail again (min_p = α spent)."""
    lore = pd.DataFrame({"eps": [0.0, TREE_UNTIL, 0.03], "lower_bound": [H - 0.5, H - 1.5, 0.0]})
    assert _leave_bound(TREE_UNTIL) > 0.9
    row = _one_step(TREE_UNTIL, "s0", 1, H - 2.0, lore)
    assert row["eps_bound"] == TREE_UNTIL and row["bound"] == H - 1.5 and row["tree_until"] == 0.03
    assert row["min_p"] == A_SPENT and row["p_value"] == A_SPENT and "stayed in LoRe's tree" in row["note"]


def test_lore_check_is_unassessed_when_the_attack_does_not_start_at_s0():
    """The attacked episode from another initial state (another seed, profile or environment) walks nothing of
    LoRe's tree: untestable (min_p 1), with why — never an 'ok' that could not have failed."""
    row = _one_step(0.05, "other", 1, 0.0)
    assert row["min_p"] == row["p_value"] == 1.0 and "does not start at LoRe's s₀" in row["note"]
    out, _, _ = classify([{**row, "env": "CartPole-v0", "algo": "A", "sigma": SIGMA}], ALPHA)
    assert out[0]["status"] == "untestable" and "not start" in out[0]["reason"]


def test_flip_row_whose_attack_counted_no_step_is_vacuous_yet_in_the_family():
    """LoAct certified steps beyond ε (the row is in the family), but the attack's own clean certificates put
    none of its attacked steps beyond ε: nothing is counted, p = 1 whatever flips — reported ``vacuous``, never
    ``ok``, and still counted in the family (K) since its membership was fixed before the attack."""
    rng = np.random.default_rng(7)
    rows = _flip_rows(rng, 3)
    steps, attack = _flip_unit(rng, 0.05, 2, None)
    steps = steps.assign(radius=np.where(steps["certified"], 0.05, 0.0), action=1)   # every step flipped, none beyond ε
    loact = pd.DataFrame({"certified": [True], "radius": [0.2]})
    chance = {"steps": loact, "attack_steps": steps, "v_min": 0.0, "v_max": 1.0, "m": M, "alpha": 1e-3,
              "n_actions": 2, "horizon": H}
    row, = check_certified_steps_not_flipped(attack, chance, SIGMA)
    assert row["counted"] == 0 and row["p_value"] == 1.0 and row["nothing_counted"] and not row["vacuous"]
    items = [{**r, "env": "CartPole-v0", "algo": f"A{u}", "sigma": SIGMA, "attack_seed": u}
             for u, r in enumerate([*rows, row])]
    out, _, block = classify(items, ALPHA)
    assert out[-1]["status"] == "vacuous" and out[-1]["in_audit_family"]
    assert block["K"] == len(items) + 1 and {o["status"] for o in out[:-1]} == {"ok"}   # + the pooled count


def _two_steps(second: str, action: int, ret: float, chance: dict | None = None) -> dict:
    """The classified LoRe row (with the family's K) of a two-step attacked episode from s₀ through ``second``,
    taking action 0 then ``action``, returning ``ret`` against J̲ = H − 0.5."""
    states = pd.DataFrame({"obs_digest": ["s0", "s1"], "step": [0, 1], "smoothed_top_lower": P_L, "radius_0": 0.0,
                           "radius_1": 0.05})
    attack = pd.DataFrame({"eps": [0.0], "episode": 0, "return": ret, "steps": 2, "flips_certified": 0,
                           "same_start_as_lore": True, "horizon": H})
    path = pd.DataFrame({"eps": 0.0, "episode": 0, "step": [0, 1], "obs_digest": ["s0", second],
                         "action": [0, action], "clean_action": 0, "certified": True, "radius": 0.0,
                         "smoothed_top_lower": P_L, "smoothed_others_upper_max": 0.5})
    row, = check_lore_vs_local_attack(LORE, {"search": {"alpha_spent": A_SPENT}}, attack,
                                      {**_lore_chance(states, path), **(chance or {})}, SIGMA, j_min=0.0)
    out, _, block = classify([{**row, "env": "CartPole-v0", "algo": "A", "sigma": SIGMA}], ALPHA)
    return out[0] | {"K": block["K"]}


def test_lore_path_off_lore_states_is_untestable_with_why():
    """An attacked path from s₀ whose next state is not among LoRe's certified states while it is still in the
    tree gets p = 1 whatever its return.  Where it returns at least J̲ it is untestable with why, never an 'ok'
    that could not fail — yet still in the family (K).  Where it returns below J̲ no noise explains it (that
    state is a pruned node, every continuation ≥ J̲, or an open one counted at its worst): a violation (a faulty
    search or a replay that differs).  The same path leaving the tree on LoRe's states is tested by chance."""
    off = _two_steps("elsewhere", 0, H)
    assert off["p_value"] == 1.0 and off["min_p"] < ALPHA and off["off_lore_states"] and off["K"] == 2
    assert off["status"] == "untestable" and "not among LoRe's certified states" in off["reason"]
    bad = _two_steps("elsewhere", 0, 0.0)
    assert bad["status"] == "violation" and "neither certified" in bad["impossible"] and not bad["off_lore_states"]
    on = _two_steps("s1", 1, 0.0)
    assert not on["off_lore_states"] and not on["impossible"] and "left LoRe's tree at attacked step 1" in on["note"]
    assert on["p_value"] < ALPHA and on["status"] == "violation"


def test_lore_path_whose_return_secured_the_bound_is_tested_not_untestable():
    """LoRe never smooths a pruned node (its return so far already reaches the bound) nor an open node of a
    truncated search: an attacked path reaching one has a return so far that secures J̲ (rewards ≥ 0 where LoRe
    prunes).  From that step on the check cannot fail, so the path is judged by the leave bounds before it (a
    tested 'ok', not 'untestable'); a return below J̲ after it is a reward below the declared range: a
    violation.  Before the return secures J̲, an unknown state stays untestable."""
    lore = pd.DataFrame({"eps": [0.0, TREE_UNTIL], "lower_bound": [1.0, 0.0]})
    states = pd.DataFrame({"obs_digest": ["s0"], "step": [0], "smoothed_top_lower": P_L, "radius_0": 0.0,
                           "radius_1": 0.05})

    def row_of(so_far: float, ret: float, pruning: bool = True) -> dict:
        path = pd.DataFrame({"eps": 0.0, "episode": 0, "step": [0, 1], "obs_digest": ["s0", "pruned"],
                             "action": [0, 0], "clean_action": 0, "certified": True, "radius": 0.0,
                             "smoothed_top_lower": P_L, "smoothed_others_upper_max": 0.5,
                             "return_so_far": [0.0, so_far]})
        attack = pd.DataFrame({"eps": [0.0], "episode": 0, "return": ret, "steps": 2, "flips_certified": 0,
                               "same_start_as_lore": True, "horizon": H})
        chance = {**_lore_chance(states, path), "lore_pruning": pruning, "lore_gamma": 1.0, "attack_gamma": 1.0,
                  "reward_min": -1.0}
        row, = check_lore_vs_local_attack(lore, {"search": {"alpha_spent": A_SPENT}}, attack, chance, SIGMA,
                                          j_min=0.0)
        out, _, block = classify([{**row, "env": "CartPole-v0", "algo": "A", "sigma": SIGMA}], ALPHA)
        return out[0]

    secured = row_of(1.0, float(H))
    assert secured["status"] == "ok" and not secured["off_lore_states"] and "secured" in secured["note"]
    assert secured["p_leave"] == pytest.approx(_leave_bound(0.05))   # the step before it counts, not after
    fell = row_of(1.0, 0.5)
    assert fell["status"] == "violation" and "below the declared range" in fell["impossible"]
    short = row_of(0.9, float(H))   # 0.9 < J̲ = 1: the unknown state is reached before the bound is secured
    assert short["status"] == "untestable" and short["off_lore_states"]
    # Without pruning the remaining steps may still lose up to r_min = −1 each: 1.0 − 8 < J̲, not secured.
    assert row_of(1.0, float(H), pruning=False)["status"] == "untestable"


def test_lore_path_that_stayed_in_the_tree_below_its_bound_fails_whatever_alpha():
    """J̲ is the least return over every path of LoRe's tree: a 10-step attacked path that never left it and
    returned 3.0 against J̲ = 9.5 is impossible for a correct search whatever the noise — a violation even where
    α_spent (0.045) leaves the chance-based p-value above α; the same return after leaving is judged by chance."""
    states = pd.DataFrame({"obs_digest": [f"s{t}" for t in range(H)], "step": range(H), "smoothed_top_lower": P_L,
                           "radius_0": 0.0, "radius_1": 0.05})

    def row_of(last_action: int, steps: int = H, chance: dict | None = None) -> dict:
        path = pd.DataFrame({"eps": 0.0, "episode": 0, "step": range(H), "obs_digest": states["obs_digest"],
                             "action": [0] * (H - 1) + [last_action], "clean_action": 0, "certified": True,
                             "radius": 0.0, "smoothed_top_lower": P_L, "smoothed_others_upper_max": 0.5})
        attack = pd.DataFrame({"eps": [0.0], "episode": 0, "return": 3.0, "steps": steps, "flips_certified": 0,
                               "same_start_as_lore": True, "horizon": H})
        row, = check_lore_vs_local_attack(LORE, {"search": {"alpha_spent": 0.045}}, attack,
                                          {**_lore_chance(states, path), **(chance or {})}, SIGMA, j_min=0.0)
        out, pooled, _ = classify([{**row, "env": "CartPole-v0", "algo": "A", "sigma": SIGMA}], ALPHA)
        return out[0] | {"verdict": verdict_of({"violation": sum(i["status"] == "violation" for i in out)}, 0)}

    stayed = row_of(0)
    assert stayed["p_value"] > ALPHA and "stayed in LoRe's tree to LoRe's horizon" in stayed["impossible"]
    assert stayed["status"] == "violation" and stayed["verdict"] == "FAIL"
    left = row_of(1)
    assert not left["impossible"] and left["status"] != "violation" and "left LoRe's tree" in left["note"]
    # the episode took 11 steps, 10 recorded: nothing shows the path stayed throughout
    assert not row_of(0, steps=H + 1)["impossible"]
    # not a replay of LoRe's game: untestable, never a violation
    other = row_of(0, chance={"attack_gamma": 0.99, "lore_gamma": 1.0})
    assert not other["impossible"] and other["status"] == "untestable" and "gamma" in other["reason"]


@pytest.mark.parametrize("change, named", [({"lore_horizon": H // 2}, "horizon"), ({"lore_horizon": 2 * H}, "horizon"),
                                           ({"attack_gamma": 0.99, "lore_gamma": 1.0}, "gamma"),
                                           ({"attack_reward_modification": None,
                                             "lore_reward_modification": "max(r, 0)"}, "reward_modification"),
                                           ({"attack_reward_modification": "not recorded",
                                             "lore_reward_modification": "not recorded"}, "reward_modification")])
def test_lore_check_needs_a_replay_of_lores_game(change, named):
    """The attacked return compares with J̲ only over LoRe's game: the same horizon (a longer one adds rewards, a
    shorter one drops them), γ and reward modification, each recorded; else untestable, saying which differs."""
    row = _two_steps("s1", 1, 0.0, change)
    assert row["p_value"] == row["min_p"] == 1.0 and row["status"] == "untestable"
    assert named in row["reason"] and not row["impossible"]


def test_lore_secured_keeps_a_rounding_margin_where_rewards_can_be_negative():
    """With r_min < 0 the worst continuation is one product in the audit and a sum of H products in LoRe, both
    rounded to the CSV's digits: a return so far that secures J̲ only within that rounding is not secured (else a
    later leave, a chance event, would be ruled impossible); a clear margin is."""
    from crop.audit.checks_lore import lore_secured

    gamma, t, j_t = 0.97, 3, 105.7027822
    worst = sum(gamma ** k for k in range(t, H))
    path = pd.DataFrame({"step": [t], "return_so_far": [j_t]})
    c = {"lore_horizon": H, "lore_gamma": gamma, "lore_pruning": False, "reward_min": -1.0}
    assert not lore_secured(c, path, j_t - worst - 1e-8)[0]
    assert lore_secured(c, path, j_t - worst - 1e-3)[0]
    assert lore_secured({**c, "lore_pruning": True}, path, j_t)[0]   # rewards ≥ 0: J_t ≥ J̲ is exact
