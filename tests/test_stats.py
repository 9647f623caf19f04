"""crop.stats and the Theorem 1/4 radius: hand computations, direct sums, coverage."""
import math

import numpy as np
import pytest
from scipy import stats as st

from crop import stats
from crop.loact import certify_estimate
from crop.smoothing import Estimate


def test_hoeffding_margin_formula():
    # (V_max − V_min)·sqrt(ln(1/α)/(2m)) with numbers done by hand: 10·sqrt(ln(20)/20000)
    assert stats.hoeffding_margin(10.0, 10000, 0.05) == pytest.approx(10 * math.sqrt(2.995732273553991 / 20000))
    with pytest.raises(ValueError):
        stats.hoeffding_margin(1.0, 0, 0.05)
    with pytest.raises(ValueError):
        stats.hoeffding_margin(1.0, 10, 1.0)


@pytest.mark.parametrize("dist", ["bernoulli_half", "beta_skewed", "near_constant"])
def test_hoeffding_covers_at_rate_1_minus_alpha(dist, rng):
    m, reps, alpha = 200, 2000, 0.05
    if dist == "bernoulli_half":
        x, mu = rng.random((reps, m)) < 0.5, 0.5
    elif dist == "beta_skewed":
        x, mu = rng.beta(0.5, 3.0, (reps, m)), 0.5 / 3.5
    else:  # Q-values of a saturated agent: almost always the top of the range
        x, mu = np.where(rng.random((reps, m)) < 0.999, 1.0, 0.0), 0.999
    d = stats.hoeffding_margin(1.0, m, alpha)
    miss = np.mean(x.mean(1) - d > mu)
    assert miss <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)


def test_per_bound_alpha_splits_over_all_one_sided_bounds():
    assert stats.per_bound_alpha(0.05, 2) == pytest.approx(0.0125)
    assert stats.per_bound_alpha(0.05, 5) == pytest.approx(0.005)


def test_order_statistic_matches_direct_binomial_sum():
    for m, p_prime, alpha in [(50, 0.3, 0.05), (200, 0.5, 0.05), (1000, 0.12, 0.01), (30, 0.9, 0.2)]:
        k = stats.percentile_order_index(m, p_prime, alpha)

        def lhs(k):  # Σ_{i=0}^{k−1} C(m,i) p′^i (1−p′)^(m−i), Eq. (5)
            return sum(math.comb(m, i) * p_prime ** i * (1 - p_prime) ** (m - i) for i in range(k))

        assert k is not None
        assert lhs(k) <= alpha
        assert k == m or lhs(k + 1) > alpha


def test_order_statistic_none_when_no_k_qualifies():
    # (1 − p′)^m > α: even the smallest return is not a valid bound.
    assert stats.percentile_order_index(10, 0.1, 0.05) is None
    assert stats.percentile_order_index(10, 0.0, 0.05) is None


def test_percentile_bound_covers_true_quantile(rng):
    m, reps, alpha, p = 500, 2000, 0.05, 0.5
    k = stats.percentile_order_index(m, p, alpha)
    samples = rng.normal(size=(reps, m))
    kth = np.sort(samples, axis=1)[:, k - 1]
    miss = np.mean(kth > st.norm.ppf(p))
    assert miss <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)


def test_p_prime_matches_theorem_3():
    assert stats.percentile_p_prime(0.5, 0.0, 100, 1.0) == pytest.approx(0.5)
    # Φ(Φ⁻¹(0.5) − 0.1·√100/1) = Φ(−1) = 0.15865525393145707
    assert stats.percentile_p_prime(0.5, 0.1, 100, 1.0) == pytest.approx(0.15865525393145707)


def test_expectation_bound_by_hand():
    # F̃=150, [J_min,J_max]=[0,200], m=10000, α=0.05, σ=0.1, ε=0.001, H=200
    conf = 200 * math.sqrt(math.log(20) / 20000)
    lip = 200 / 0.1 * math.sqrt(2 / math.pi) * 0.001 * math.sqrt(200)
    assert stats.expectation_bound(150, 0, 200, 10000, 0.05, 0.1, 0.001, 200) == pytest.approx(150 - conf - lip)


def _est(mean, lower, upper):
    mean, lower, upper = map(np.asarray, (mean, lower, upper))
    return Estimate(mean=mean, lower=lower, upper=upper, m=1, alpha=0.05, bound="test")


def test_theorem1_radius_by_hand():
    # V ∈ [0, 10]; L(a₁)=8 → p=0.8, U(a₂)=3 → p=0.3;  Φ⁻¹(0.8)=0.8416212335729143, Φ⁻¹(0.3)=−0.5244005127080407
    c = certify_estimate(_est([8.5, 2.5], [8.0, 2.0], [9.0, 3.0]), sigma=0.2, v_min=0.0, v_max=10.0)
    assert c.certified and c.action == 0
    assert c.radius == pytest.approx(0.1 * (0.8416212335729143 + 0.5244005127080407))
    assert c.radii[0] == 0.0 and c.radii[1] == pytest.approx(c.radius)


def test_certify_needs_every_other_action_not_just_runner_up():
    # The runner-up by mean (action 1) is separated, but action 2's upper bound reaches above L(a₁).
    est = _est([8.5, 6.0, 5.5], [8.0, 5.9, 3.0], [9.0, 6.1, 8.2])
    c = certify_estimate(est, sigma=1.0, v_min=0.0, v_max=10.0)
    assert not c.certified and c.radius == 0.0
    assert c.radii[2] == 0.0          # action 2 is possible even at ε = 0
    assert c.radii[1] > 0.0           # action 1 needs a perturbation


def test_theorem4_radii_are_sorted_by_upper_bound():
    est = _est([9.0, 7.0, 4.0, 1.0], [8.5, 6.5, 3.5, 0.5], [9.5, 7.5, 4.5, 1.5])
    c = certify_estimate(est, sigma=0.5, v_min=0.0, v_max=10.0)
    assert c.certified
    r = c.radii
    assert r[0] == 0 and 0 < r[1] < r[2] < r[3]
    assert c.radius == pytest.approx(r[1])
    assert r[3] == pytest.approx(0.25 * (st.norm.ppf(0.85) - st.norm.ppf(0.15)))
