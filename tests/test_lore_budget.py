"""Bounded LoRe (``max_nodes``) in either order against brute force on small trees, at every budget: the truncated
bound is sound at every ε, exact once the budget covers the tree, and best-first's bound at the smallest ε is at
least depth-first's (docs/statistics.md, "Bounded LoRe"); the record of what was explored and the bound at twice
the budget."""
import copy
import math

import numpy as np
import pytest

from crop.certify.loact import certify_estimate
from crop.certify.lore import lore_bound_at
from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings

from toy_lore import CachedSmoother, ToyWalk, brute_force, lore, lore_settings

ORDERS = ("best-first", "depth-first")


def tree_size(make, sm, horizon, eps):
    """The number of nodes of T_ε (the root and every child the certificates allow at ε), by enumeration."""
    def rec(env, obs, t):
        if t == horizon:
            return 1
        c = certify_estimate(sm.estimate(obs), sm.sigma, sm.v_min, sm.v_max)
        n = 1
        for a in range(len(c.radii)):
            if c.radii[a] <= eps:
                e = copy.deepcopy(env)
                o, _, term, trunc, _ = e.step(a)
                n += 1 if (term or trunc) else rec(e, o, t + 1)
        return n

    env = make()
    obs, _ = env.reset(seed=0)
    return rec(env, obs, 0)


# (network scale, m, signed rewards, prune, γ, horizon): small scales and m leave many actions inseparable at
# ε = 0, so the tree at the smallest ε branches and the budget cuts it there.
CASES = [(0.3, 200, True, False, 0.9, 4), (0.3, 200, True, False, 1.0, 4), (0.3, 200, False, True, 1.0, 4),
         (1.0, 300, False, False, 1.0, 4), (3.0, 2000, True, False, 0.9, 5), (3.0, 2000, False, True, 1.0, 6)]


@pytest.mark.slow
@pytest.mark.parametrize("scale,m,signed,prune,gamma,horizon", CASES)
def test_truncated_bound_is_sound_at_every_budget_in_either_order(mlp_factory, scale, m, signed, prune, gamma,
                                                                  horizon):
    """Certificates fixed per observation (one estimate each, shared by every run and the brute force), so the
    tree T_ε is the same for every order and budget.  At every budget from 1 to past the tree's size, in both
    orders: the bound at every ε is ≤ the brute-force minimum return over T_ε, equal where the search is not
    truncated; ``explored_nodes`` ≤ ``known_nodes`` ≤ |T_ε| at the ε it stopped at; the bound is non-decreasing
    in the budget; and at the smallest ε (0) best-first's bound is ≥ depth-first's (the proof's claim)."""
    sm = CachedSmoother(mlp_factory(n_in=2, n_out=3, hidden=(16,), seed=3, scale=scale),
                        SmoothingSettings(0.3, m, -6.0, 6.0, 0.05, seed=0), 3)
    make = lambda: ToyWalk(signed=signed)  # noqa: E731
    reward_min = -1.0 if signed else 0.0    # ToyWalk's rewards are 1 − |pos| ≥ −0.35 (≥ 0 unsigned)
    full, info = lore("toy", sm, horizon, 0, prune=prune, make=make, gamma=gamma)
    n = info["nodes"]
    radii = sorted({float(r) for e in list(sm.cache.values())
                    for r in certify_estimate(e, sm.sigma, sm.v_min, sm.v_max).radii})
    grid = sorted({0.0, *radii, *[r + 1e-9 for r in radii], 10.0})
    exact = {eps: brute_force(make, sm, horizon, eps, gamma) for eps in grid}
    sizes = {}
    previous = dict.fromkeys(ORDERS)
    cut_at_zero = 0
    for budget in range(1, n + 2):
        at_zero = {}
        for order in ORDERS:
            table, binfo = lore("toy", sm, horizon, 0, prune=prune, make=make, gamma=gamma, max_nodes=budget,
                                reward_min=reward_min, order=order)
            got = [lore_bound_at(table, eps, binfo["valid_until_eps"]) for eps in grid]
            for eps, b in zip(grid, got):
                assert b <= exact[eps] + 1e-9, (order, budget, eps, b, exact[eps])
                if not binfo["truncated"]:
                    assert b == pytest.approx(exact[eps]), (order, budget, eps)
            if binfo["truncated"]:
                stop = binfo["exact_below_eps"]
                if stop not in sizes:
                    sizes[stop] = tree_size(make, sm, horizon, stop)
                assert binfo["explored_nodes"] <= binfo["known_nodes"] <= sizes[stop], (order, budget)
                assert binfo["known_nodes"] > binfo["nodes"] == budget, (order, budget)
                cut_at_zero += stop == 0.0
            else:
                assert binfo["explored"] == 1.0 and binfo["nodes"] <= budget
            if previous[order] is not None:
                assert all(b >= p for b, p in zip(got, previous[order])), (order, budget)
            previous[order] = got
            at_zero[order] = got[0]
        assert at_zero["best-first"] >= at_zero["depth-first"], (budget, at_zero)
    assert cut_at_zero > 0, "some budget must cut the tree at the smallest ε for the test to bite"


@pytest.mark.slow
def test_best_first_raises_the_bound_sooner_where_rewards_are_signed(mlp_factory):
    """Signed rewards (r_min < 0): depth-first leaves shallow open nodes whose worst case takes every remaining
    step at r_min; best-first expands them first and reaches the exact bound at ε = 0 with a smaller budget."""
    sm = CachedSmoother(mlp_factory(n_in=2, n_out=3, hidden=(16,), seed=3, scale=0.3),
                        SmoothingSettings(0.3, 200, -6.0, 6.0, 0.05, seed=0), 3)
    make = lambda: ToyWalk(signed=True)  # noqa: E731
    exact = brute_force(make, sm, 5, 0.0, 0.9)

    def first_exact(order):
        for budget in range(1, 400):
            table, _ = lore("toy", sm, 5, 0, prune=False, make=make, gamma=0.9, max_nodes=budget, reward_min=-1.0,
                            order=order)
            if lore_bound_at(table, 0.0) == pytest.approx(exact):
                return budget
        return math.inf

    assert first_exact("best-first") < first_exact("depth-first")


@pytest.mark.slow
@pytest.mark.parametrize("order", ORDERS)
def test_the_bound_at_twice_the_budget_comes_from_the_same_search(mlp_factory, order):
    """report_double: the search continues to 2·max_nodes, yet its certified result (table, states, record) is a
    search with max_nodes's, byte for byte (real noise: the same operations draw the same noise), and the
    bound at twice the budget it reports is a search with 2·max_nodes's."""
    make = lambda: ToyWalk(signed=True)  # noqa: E731

    def run(max_nodes, double=False):
        sm = SmoothedNetwork(mlp_factory(n_in=2, n_out=3, hidden=(16,), seed=3, scale=0.5),
                             SmoothingSettings(0.3, 200, -6.0, 6.0, 0.05, seed=0), 3)
        from crop.certify.lore import run_lore

        return run_lore("toy", sm, lore_settings(6, 0, prune=False, gamma=0.9, max_nodes=max_nodes,
                                                 reward_min=-1.0, order=order, report_double=double,
                                                 batch=4), make=make, progress=False)

    volatile = ("runtime_s", "nodes_per_s", "double_budget")
    for budget in (5, 40, 150, 5000):
        plain, twice, both = run(budget), run(2 * budget), run(budget, True)
        assert both.table.equals(plain.table) and both.states.equals(plain.states), budget
        assert {k: v for k, v in both.info.items() if k not in volatile} == \
            {k: v for k, v in plain.info.items() if k not in volatile}, budget
        d = both.info["double_budget"]
        assert d["max_nodes"] == 2 * budget and d["nodes"] == twice.info["nodes"]
        assert d["truncated"] == twice.info["truncated"] and d["explored"] == twice.info["explored"]
        assert [tuple(p) for p in d["pairs"]] == list(twice.table.itertuples(index=False, name=None))
        assert np.isclose(d["lower_bound_at_smallest_eps"], twice.table["lower_bound"].iloc[0])
        assert plain.info["double_budget"] is None
