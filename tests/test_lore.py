"""LoRe (Algorithm 3): the adaptive search equals a brute-force enumeration of every action sequence the
radii allow, at every ε; terminal transitions, ties, pruning and snapshots are handled."""
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from crop.certify.loact import certify_estimate
from crop.certify.lore import lore_bound_at
from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings

from toy_lore import CachedSmoother, ToyWalk, brute_force, lore, lore_settings


@pytest.mark.parametrize("signed,prune,repeat", [(False, True, False), (False, False, False),
                                                 (True, False, False), (False, True, True)])
@pytest.mark.slow
def test_lore_equals_brute_force(mlp_factory, signed, prune, repeat):
    horizon = 6
    net = mlp_factory(n_in=2, n_out=3, hidden=(16,), seed=3, scale=3.0)
    sm = CachedSmoother(net, SmoothingSettings(0.3, 2000, -6.0, 6.0, 0.05, seed=0), 3)
    make = lambda: ToyWalk(signed=signed, repeat_states=repeat)  # noqa: E731
    table, info = lore("toy", sm, horizon, 0, prune=prune, make=make, progress=False)
    assert table["eps"].is_monotonic_increasing
    assert table["lower_bound"].is_monotonic_decreasing
    radii = sorted({float(r) for e in sm.cache.values()
                    for r in certify_estimate(e, sm.sigma, sm.v_min, sm.v_max).radii})
    grid = sorted({0.0, *radii, *[r + 1e-9 for r in radii], *[max(r - 1e-9, 0) for r in radii], 10.0})
    assert len(radii) > 3, "the test network should produce several distinct radii"
    for eps in grid:
        assert lore_bound_at(table, eps) == pytest.approx(brute_force(make, sm, horizon, eps)), eps
    assert info["distinct_states_smoothed"] <= len(sm.cache)


def test_lore_bound_at_respects_search_limit():
    import pandas as pd

    t = pd.DataFrame({"eps": [0.0, 0.5], "lower_bound": [10.0, 7.0]})
    assert lore_bound_at(t, 0.49) == 10.0 and lore_bound_at(t, 0.5) == 7.0
    assert math.isnan(lore_bound_at(t, 0.8, valid_until=0.8))


@pytest.mark.slow
def test_lore_on_cartpole_equals_brute_force(mlp_factory):
    """CartPole: the real environment, deepcopy snapshots of the wrapped env, terminal rewards kept."""
    from crop.envs import make_env

    horizon = 12
    net = mlp_factory(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0)
    sm = CachedSmoother(net, SmoothingSettings(0.05, 300, -4.0, 4.0, 0.05, seed=0), 2)
    make = lambda: make_env("CartPole-v0")  # noqa: E731
    table, info = lore("CartPole-v0", sm, horizon, 3, progress=False)
    assert len(table) >= 3, "the pole must be able to fall within the horizon for the test to bite"
    for eps in sorted({0.0, *table["eps"], *(table["eps"] + 1e-9), 1.0}):
        assert lore_bound_at(table, eps) == pytest.approx(brute_force(make, sm, horizon, eps, seed=3)), eps


@pytest.mark.slow
def test_lore_family_alpha_schedule_is_spent_state_by_state(mlp_factory):
    """alpha_mode family: the i-th distinct state smoothed gets α·6/(π² i²); the outputs report what was
    spent, and the tree's joint confidence is ≥ 1 − α however many states were smoothed.  The search itself
    is still exact for the certificates it drew (brute force)."""
    from crop.smoothing import stats

    horizon, alpha = 6, 0.05
    net = mlp_factory(n_in=2, n_out=3, hidden=(16,), seed=3, scale=3.0)
    sm = CachedSmoother(net, SmoothingSettings(0.3, 2000, -6.0, 6.0, alpha, seed=0), 3)
    make = lambda: ToyWalk()  # noqa: E731
    table, info = lore("toy", sm, horizon, 0, make=make, progress=False,
                           alpha_of=lambda i: stats.lore_state_alpha(alpha, "family", i))
    n = info["distinct_states_smoothed"]
    schedule = [alpha * 6 / (math.pi ** 2 * i * i) for i in range(1, n + 1)]
    assert n > 3 and sm.alphas == pytest.approx(schedule)
    assert info["alpha_spent"] == pytest.approx(sum(schedule)) and info["alpha_spent"] <= alpha
    assert info["confidence_union"] == pytest.approx(1 - sum(schedule)) and info["confidence_union"] >= 1 - alpha
    assert info["per_state_alpha_first"] == pytest.approx(schedule[0])
    assert info["per_state_alpha_last"] == pytest.approx(schedule[-1])
    for eps in (0.0, 0.05, 0.2, 10.0):
        assert lore_bound_at(table, eps) == pytest.approx(brute_force(make, sm, horizon, eps)), eps
    # state mode (the paper): every state at α, the union bound over N states
    sm2 = CachedSmoother(net, SmoothingSettings(0.3, 2000, -6.0, 6.0, alpha, seed=0), 3)
    _, info2 = lore("toy", sm2, horizon, 0, make=make, progress=False)
    assert set(sm2.alphas) == {alpha} and info2["per_state_alpha"] == alpha
    assert info2["confidence_union"] == pytest.approx(max(0.0, 1 - alpha * info2["distinct_states_smoothed"]))


class _SaturatedQ(torch.nn.Module):
    """Q(s) = (±huge by the sign of the position, 1, 0.5 or 3 by the time): every noisy sample of action 0 clips
    to V_max or V_min (the position is ≥ 0.1 from 0, the noise ~1e-3) and the others are piecewise constant far
    from their steps, so every Monte-Carlo mean, bound and radius is the same whatever noise a state draws —
    the certificates are deterministic."""

    def forward(self, x):
        big = torch.clamp(1e5 * x[:, :1], -1e3, 1e3)
        late = torch.clamp(1e5 * (x[:, 1:2] - 0.25), 0.5, 3.0)
        return torch.cat([big, torch.ones_like(big), late], 1)


@pytest.mark.slow
@pytest.mark.parametrize("prune", [True, False])
def test_batched_search_equals_one_state_at_a_time(prune):
    """Smoothing the pending nodes together changes only which noise each state draws: with certificates
    that do not depend on the noise, the batched and the one-at-a-time searches are identical (same
    certificates, bound table and counts), the batched one makes fewer smoothing calls, and both equal the
    brute force."""
    make = lambda: ToyWalk()  # noqa: E731
    runs = {}
    for batch in (1, 64):
        sm = CachedSmoother(_SaturatedQ(), SmoothingSettings(1e-3, 500, -6.0, 6.0, 0.05, seed=batch), 3)
        table, info = lore("toy", sm, 7, 0, prune=prune, make=make, progress=False, batch=batch)
        runs[batch] = (sm, table, info)
    (sm1, t1, i1), (sm64, t64, i64) = runs[1], runs[64]
    assert t1.equals(t64) and len(t1) >= 3
    assert i1["smoothing_calls"] == i1["distinct_states_smoothed"]
    assert i64["smoothing_calls"] < i64["distinct_states_smoothed"], "batches of several pending nodes"
    volatile = ("runtime_s", "nodes_per_s", "smoothing_calls", "batch", "distinct_states_smoothed",
                "alpha_spent", "confidence_union", "per_state_alpha_last")
    assert {k: v for k, v in i1.items() if k not in volatile} == {k: v for k, v in i64.items() if k not in volatile}
    for key in set(sm1.cache) & set(sm64.cache):
        a = certify_estimate(sm1.cache[key], sm1.sigma, sm1.v_min, sm1.v_max)
        b = certify_estimate(sm64.cache[key], sm64.sigma, sm64.v_min, sm64.v_max)
        assert a.radii.tobytes() == b.radii.tobytes() and a.action == b.action
    for eps in sorted({0.0, *t1["eps"], *(t1["eps"] + 1e-9), 10.0}):
        assert lore_bound_at(t64, eps) == pytest.approx(brute_force(make, sm64, 7, eps)), eps


@pytest.mark.slow
@pytest.mark.parametrize("signed,prune", [(False, True), (True, False)])
def test_batched_lore_equals_brute_force_with_family_alphas(mlp_factory, signed, prune):
    """Batching on, per-node α from the family schedule passed per state in each batch: the bound table is
    still the brute force's for the certificates drawn, and the i-th state smoothed got α_i."""
    from crop.smoothing import stats

    net = mlp_factory(n_in=2, n_out=3, hidden=(16,), seed=3, scale=3.0)
    sm = CachedSmoother(net, SmoothingSettings(0.3, 2000, -6.0, 6.0, 0.05, seed=0), 3)
    make = lambda: ToyWalk(signed=signed)  # noqa: E731
    table, info = lore("toy", sm, 7, 0, prune=prune, make=make, progress=False, batch=8,
                           alpha_of=lambda i: stats.lore_state_alpha(0.05, "family", i))
    n = info["distinct_states_smoothed"]
    assert info["smoothing_calls"] < n
    assert sm.alphas == pytest.approx([stats.lore_state_alpha(0.05, "family", i) for i in range(1, n + 1)])
    for eps in sorted({0.0, *table["eps"], *(table["eps"] + 1e-9), 10.0}):
        assert lore_bound_at(table, eps) == pytest.approx(brute_force(make, sm, 7, eps)), eps


@pytest.mark.parametrize("bad", [{"horizon": -1}, {"gamma": 1.5}, {"eps_max": -0.1}, {"batch": 0},
                                 {"max_nodes": 0, "reward_min": 0.0}, {"max_nodes": 10},
                                 {"order": "breadth-first"}, {"report_double": True}])
def test_lore_settings_refuse_a_bad_value_naming_it(bad):
    """LoReSettings' parts check their values once, when made: one line naming the bad field."""
    with pytest.raises(ValueError, match=next(iter(bad))):
        lore_settings(**{"horizon": 3, "env_seed": 0, **bad})
    assert lore_settings(3, 0, gamma=0.0, eps_max=0.0, batch=1, max_nodes=1, reward_min=0.0).problem.horizon == 3


def _bounds(table, valid_until, grid):
    return [lore_bound_at(table, e, valid_until) for e in grid]


@pytest.mark.slow
@pytest.mark.parametrize("signed,prune,gamma", [(False, True, 1.0), (True, False, 0.9), (True, False, 1.0)])
def test_bounded_search_is_below_the_unbounded_one_and_equal_when_the_budget_suffices(mlp_factory, signed, prune,
                                                                                     gamma):
    """Bounded LoRe (max_nodes), depth-first (the same operations as the unbounded search, so the same noise per
    state): at every ε its bound is ≤ the unbounded search's (which is the brute force's, above), equal to it
    exactly when the budget is not hit, and non-decreasing in the budget; ``truncated`` holds exactly when the
    budget is below the unbounded tree's node count.  Best-first: tests/test_lore_budget.py."""
    horizon = 6
    make = lambda: ToyWalk(signed=signed)  # noqa: E731
    reward_min = -1.0 if signed else 0.0  # ToyWalk's rewards are 1 − |pos| ≥ −0.35 (≥ 0 unsigned)

    def run(max_nodes):
        sm = SmoothedNetwork(mlp_factory(n_in=2, n_out=3, hidden=(16,), seed=3, scale=3.0),
                       SmoothingSettings(0.3, 2000, -6.0, 6.0, 0.05, seed=0), 3)
        return lore("toy", sm, horizon, 0, prune=prune, make=make, progress=False, gamma=gamma,
                        max_nodes=max_nodes, reward_min=reward_min, order="depth-first")

    full, full_info = run(None)
    n = full_info["nodes"]
    assert n > 40 and not full_info["truncated"] and len(full) >= 3
    grid = sorted({0.0, *full["eps"], *(full["eps"] + 1e-9), 10.0})
    exact = _bounds(full, full_info["valid_until_eps"], grid)
    previous = None
    for budget in sorted({*range(1, 25), *range(25, n, max(1, n // 20)), n - 1, n, n + 1, 10 * n}):
        table, info = run(budget)
        got = _bounds(table, info["valid_until_eps"], sorted({*grid, *table["eps"]}))
        at_grid = _bounds(table, info["valid_until_eps"], grid)
        assert all(b <= e for b, e in zip(at_grid, exact)), budget
        assert info["truncated"] == (budget < n) and info["nodes"] == min(budget, n), budget
        if budget >= n:
            assert table.equals(full), budget
        # the pairs recorded below the ε the search stopped at are the full search's
        assert (info["exact_below_eps"] is None) == (budget >= n), budget
        if info["truncated"]:
            below = info["exact_below_eps"]
            assert table[table["eps"] < below].equals(full[full["eps"] < below]), budget
        if previous is not None:
            assert all(b >= p for b, p in zip(at_grid, previous)), f"not monotone in the budget at {budget}"
        previous = at_grid
        assert all(math.isfinite(b) for b in got)
    one, _ = run(1)  # the root alone: its worst case, J_min of the whole horizon (rounded down)
    j_min = min(0.0, reward_min * (horizon if gamma == 1.0 else (1 - gamma ** horizon) / (1 - gamma)))
    assert len(one) == 1 and one["lower_bound"][0] <= j_min and one["lower_bound"][0] == pytest.approx(j_min)


class FloorWalk(gym.Env):
    """Two actions with the same dynamics: reward 1.7 at step 0, then the declared lowest reward −0.1 at every
    step — the worst case of an open subtree is reached by its leaves, to the last bit."""

    observation_space = gym.spaces.Box(-5, 5, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.array([0, 0], np.float32), {}

    def step(self, a):
        r = 1.7 if self.t == 0 else -0.1
        self.t += 1
        return np.array([self.t / 10, a], np.float32), r, False, False, {}


@pytest.mark.slow
@pytest.mark.parametrize("order", ["best-first", "depth-first"])
@pytest.mark.parametrize("gamma,horizon", [(1.0, 3), (0.9, 5), (1.0, 6)])
def test_bounded_search_stays_below_the_unbounded_one_where_the_lowest_reward_is_reached(mlp_factory, gamma,
                                                                                         horizon, order):
    """Where every leaf collects the declared lowest reward, an open subtree's worst case equals its leaves'
    return in the reals; computed, it must not come out above the unbounded search's bound by rounding."""
    def run(max_nodes):
        net = mlp_factory(n_in=2, n_out=2, hidden=(8,), seed=0)
        sm = SmoothedNetwork(net, SmoothingSettings(0.3, 500, -6.0, 6.0, 0.05, seed=0), 2)
        return lore("toy", sm, horizon, 0, prune=False, make=FloorWalk, progress=False, gamma=gamma,
                        max_nodes=max_nodes, reward_min=-0.1, order=order)

    full, info = run(None)
    grid = sorted({0.0, *full["eps"], 10.0})
    exact = _bounds(full, info["valid_until_eps"], grid)
    for budget in range(1, info["nodes"] + 1):
        table, binfo = run(budget)
        got = _bounds(table, binfo["valid_until_eps"], grid)
        assert all(b <= e for b, e in zip(got, exact)), (budget, got, exact)


def test_bounded_search_refuses_a_false_reward_range(mlp_factory):
    """The open subtrees' worst case rests on the declared lowest reward: a reward below it stops the search."""
    from crop.io import InputError

    sm = SmoothedNetwork(mlp_factory(n_in=2, n_out=3, hidden=(16,), seed=3, scale=3.0),
                   SmoothingSettings(0.3, 200, -6.0, 6.0, 0.05), 3)
    with pytest.raises(InputError, match="lowest reward declared"):
        lore("toy", sm, 6, 0, prune=False, make=lambda: ToyWalk(signed=True), progress=False, max_nodes=500,
                 reward_min=0.5)
    with pytest.raises(ValueError, match="reward_min"):
        lore("toy", sm, 6, 0, make=ToyWalk, max_nodes=5)
