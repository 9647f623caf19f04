"""GRe (Algorithm 2): lockstep rollouts equal one-at-a-time rollouts; bounds follow Theorems 2–3."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from crop import stats
from crop.envs import make_env, make_vec_env
from crop.gre import gre_bounds, sample_randomized_returns


def test_lockstep_returns_equal_single_trajectories(mlp_factory):
    net = mlp_factory(n_in=4, n_out=2, hidden=(16,), seed=5, scale=2.0)
    m, H = 12, 60
    # σ so small that the randomized policy is the greedy one: every trajectory is then deterministic
    R = sample_randomized_returns("CartPole-v0", net, 1e-9, m, H, 1.0, seed=0, env_seed=11, progress=False)
    venv = make_vec_env("CartPole-v0", m)
    venv.reset(seed=11)
    expected = []
    for i in range(m):
        e = make_env("CartPole-v0")
        e.reset(seed=0)
        e.unwrapped.state = np.array(venv.state[:, i], dtype=np.float64)
        obs, J = np.array(e.unwrapped.state, np.float32), 0.0
        for t in range(H):
            a = int(net(torch.as_tensor(obs).unsqueeze(0)).argmax(1))
            obs, r, term, trunc, _ = e.step(a)
            J += r
            if term or trunc:
                break
        expected.append(J)
    np.testing.assert_array_equal(R, expected)
    assert len(set(expected)) > 1, "trajectories of different lengths make the test bite"


def test_bounds_by_definition():
    rng = np.random.default_rng(0)
    returns = rng.integers(0, 201, 1000).astype(float)
    t = gre_bounds(returns, sigma=0.1, horizon=200, alpha=0.05, eps_grid=[0.0, 0.001, 0.05],
                   percentiles=[0.5, 0.1], j_min=0.0, j_max=200.0)
    for _, r in t.iterrows():
        assert r["expectation_bound"] == pytest.approx(
            stats.expectation_bound(returns.mean(), 0, 200, 1000, 0.05, 0.1, r["eps"], 200))
        assert r["cdf_expectation_bound"] == pytest.approx(
            stats.cdf_expectation_bound(returns, 0, 200, 0.05, 0.1, r["eps"], 200))
        assert 0.0 <= r["cdf_expectation_bound"] <= 200.0  # never looser than trivially J_min
        k = stats.percentile_order_index(1000, stats.percentile_p_prime(r["p"], r["eps"], 200, 0.1), 0.05)
        if k is None:
            assert not r["percentile_certified"] and math.isnan(r["percentile_bound"])
        else:
            assert r["percentile_certified"] and r["percentile_bound"] == np.sort(returns)[k - 1]
    # at ε = 0.05, √200·0.05/0.1 ≈ 7: p′ ≈ 0, no order statistic qualifies
    assert not t[(t["eps"] == 0.05)]["percentile_certified"].any()
    # at ε = 0 the CDF bound is never below Theorem 2's; with ε it falls, but far more slowly
    e0 = t[t["eps"] == 0.0].iloc[0]
    assert e0["cdf_expectation_bound"] >= e0["expectation_bound"]
    e1 = t[t["eps"] == 0.001].iloc[0]
    assert e1["cdf_expectation_bound"] > e1["expectation_bound"]


def test_returns_outside_the_declared_range_are_refused():
    with pytest.raises(ValueError, match="J_min, J_max"):
        gre_bounds(np.array([0.0, 250.0]), sigma=0.1, horizon=200, alpha=0.05, eps_grid=[0.0],
                   percentiles=[0.5], j_min=0.0, j_max=200.0)


def test_sharded_environments_give_the_same_returns(mlp_factory):
    """Spreading GRe's environments over worker processes changes nothing but the speed."""
    net = mlp_factory(n_in=25, n_out=5, hidden=(16,), seed=2)
    a = sample_randomized_returns("highway-fast-v0", net, 0.1, 6, 4, 1.0, seed=1, env_seed=9, progress=False)
    b = sample_randomized_returns("highway-fast-v0", net, 0.1, 6, 4, 1.0, seed=1, env_seed=9, progress=False,
                                  workers=2)
    np.testing.assert_array_equal(a, b)


def test_blocks_of_trajectories_keep_each_environment_seed(mlp_factory):
    """Stepping the trajectories in blocks (bounded memory) only changes which noise each one draws:
    with negligible σ the returns are exactly those of one big block."""
    net = mlp_factory(n_in=25, n_out=5, hidden=(16,), seed=3)
    a = sample_randomized_returns("highway-fast-v0", net, 1e-9, 5, 4, 1.0, seed=1, env_seed=7, progress=False)
    b = sample_randomized_returns("highway-fast-v0", net, 1e-9, 5, 4, 1.0, seed=1, env_seed=7, progress=False,
                                  batch=2)
    np.testing.assert_array_equal(a, b)
