"""crop.smoothing.stats and the Theorem 1/4 radius: hand computations, direct sums, coverage."""
import math

import numpy as np
import pytest
from scipy import stats as st

from crop.certify.loact import certify_estimate
from crop.smoothing import stats
from crop.smoothing.smoothed import Estimate


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


def test_normalise_maps_the_v_range_onto_zero_one_and_clips():
    q = np.array([-3.0, -1.0, 0.0, 2.0, 3.0, 9.0])
    np.testing.assert_array_equal(stats.normalise(q, -1.0, 3.0), [0.0, 0.0, 0.25, 0.75, 1.0, 1.0])
    assert stats.normalise(8.0, 0.0, 10.0) == 0.8 and stats.normalise(3, -1, 3) == 1.0


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


# ------------------------------------------------------------------------------------------------------------
# The confidence bounds of ``bound``: coverage, range, tightness, and the betting inversion.
# ------------------------------------------------------------------------------------------------------------

def _sample(dist, rng, shape):
    """(samples in [0, 1], true mean) for the coverage tests; ``near_*``: Q-values of saturated agents."""
    if dist == "bernoulli_half":
        return (rng.random(shape) < 0.5).astype(float), 0.5
    if dist == "beta_skewed":
        return rng.beta(0.5, 3.0, shape), 0.5 / 3.5
    if dist == "uniform":
        return rng.random(shape), 0.5
    if dist == "two_point":  # mostly one value, sometimes the top of the range
        return np.where(rng.random(shape) < 0.9, 0.3, 1.0), 0.37
    if dist == "near_constant_top":  # almost always the top of the range, rarely the bottom
        return np.where(rng.random(shape) < 0.999, 1.0, 0.0), 0.999
    if dist == "near_constant_spread":  # a narrow continuous band just below the top
        return 1.0 - 1e-3 * rng.beta(2.0, 5.0, shape), 1.0 - 1e-3 * 2.0 / 7.0
    if dist == "near_constant_bottom":
        return np.where(rng.random(shape) < 0.002, 1.0, 1e-4 * rng.random(shape)), 0.002 + 0.998 * 0.5e-4
    raise ValueError(dist)


DISTS = ["bernoulli_half", "beta_skewed", "uniform", "two_point", "near_constant_top", "near_constant_spread",
         "near_constant_bottom"]


def _bound_fn(name):
    if name == "empirical_bernstein":
        return lambda x, alpha: stats.empirical_bernstein_bounds(x, 0.0, 1.0, alpha)
    if name == "betting":
        return lambda x, alpha: stats.betting_bounds(x, 0.0, 1.0, alpha)
    if name == "clopper_pearson":
        g = np.random.default_rng(777)
        return lambda x, alpha: stats.clopper_pearson_bounds(x, 0.0, 1.0, alpha, g)
    if name == "hoeffding":
        return lambda x, alpha: (x.mean(0) - stats.hoeffding_margin(1.0, len(x), alpha),
                                 x.mean(0) + stats.hoeffding_margin(1.0, len(x), alpha))
    if name == "plain_mean":  # not a bound: used to show that the coverage check can fail
        return lambda x, alpha: (x.mean(0), x.mean(0))
    raise ValueError(name)


def _miscoverage(name, dist, rng, m=1000, reps=2000, alpha=0.05):
    x, mu = _sample(dist, rng, (m, reps))  # one column per repetition: all reps in one vectorised call
    lower, upper = _bound_fn(name)(x, alpha)
    return float(np.mean(lower > mu)), float(np.mean(upper < mu))


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("name", ["empirical_bernstein", "betting", "clopper_pearson"])
def test_every_bound_covers_at_rate_1_minus_alpha(name, dist, rng):
    """2,000 repetitions of m = 1,000 draws: each one-sided bound misses the true mean in at most
    α + 3 standard errors of the repetitions."""
    alpha, reps = 0.05, 2000
    miss_lower, miss_upper = _miscoverage(name, dist, rng, reps=reps, alpha=alpha)
    limit = alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)
    assert miss_lower <= limit, (name, dist, miss_lower)
    assert miss_upper <= limit, (name, dist, miss_upper)


def test_the_coverage_check_catches_a_bound_that_is_too_tight(rng):
    miss_lower, miss_upper = _miscoverage("plain_mean", "uniform", rng)
    assert miss_lower > 0.3 and miss_upper > 0.3


@pytest.mark.parametrize("name", ["hoeffding", "empirical_bernstein", "betting", "clopper_pearson"])
def test_bounds_stay_in_range_even_for_degenerate_and_out_of_range_samples(name):
    from crop.smoothing.smoothed import BOUNDS

    fn = BOUNDS[name][0]
    rng = np.random.default_rng(3)
    lo, hi = -2.0, 5.0
    cases = [np.full((500, 3), lo), np.full((500, 3), hi), rng.uniform(lo, hi, (500, 3)),
             # float32 clamping can leave samples a hair outside [v_min, v_max]
             np.clip(rng.uniform(lo - 1, hi + 1, (500, 3)), lo, hi) * (1 + 1e-7),
             np.array([[lo, hi, 0.0]] * 2)]
    for x in cases:
        mean, lower, upper = fn(x.sum(0), len(x), lo, hi, 0.01, x, rng=np.random.default_rng(0))
        assert np.all(np.isfinite(lower)) and np.all(np.isfinite(upper))
        assert np.all((lo <= lower) & (lower <= hi)) and np.all((lo <= upper) & (upper <= hi))
    # constant samples at the top: the lower bound is high but strictly below the top (nothing is certain)
    _, lower, upper = fn(np.full(3, 500 * hi), 500, lo, hi, 0.01, np.full((500, 3), hi), rng=np.random.default_rng(0))
    assert np.all(lower < hi) and np.all(upper == hi)


@pytest.mark.parametrize("name", ["empirical_bernstein", "betting", "clopper_pearson"])
def test_tighter_than_hoeffding_on_near_constant_q_values(name):
    """m = 10,000, |A| = 6, α = 0.05 split over 12 one-sided bounds, Q-values of a saturated agent (almost
    always the top of the range): the new bounds are much tighter than Hoeffding's."""
    rng = np.random.default_rng(11)
    alpha_each = stats.per_bound_alpha(0.05, 6)
    x = np.where(rng.random((10000, 6)) < 0.999, 1.0, 0.0)  # Bernoulli-like: clopper_pearson's home ground
    lower, upper = _bound_fn(name)(x, alpha_each)
    hoeff = stats.hoeffding_margin(1.0, 10000, alpha_each)
    assert np.all(x.mean(0) - lower < 0.25 * hoeff)
    assert np.all(upper - x.mean(0) < 0.25 * hoeff)
    if name != "clopper_pearson":  # a narrow continuous band (rounding throws the spread away)
        x = 0.98 + 0.01 * rng.beta(5.0, 2.0, (10000, 6))
        lower, upper = _bound_fn(name)(x, alpha_each)
        assert np.all(x.mean(0) - lower < 0.1 * hoeff) and np.all(upper - x.mean(0) < 0.1 * hoeff)


def test_empirical_bernstein_formula_by_hand():
    # x = (0, 1, 1, 1) on [0, 1]: mean 0.75, unbiased variance 0.25, δ = 0.1, ln(2/δ) = ln 20
    x = np.array([[0.0], [1.0], [1.0], [1.0]])
    lower, upper = stats.empirical_bernstein_bounds(x, 0.0, 1.0, 0.1)
    margin = math.sqrt(2 * 0.25 * math.log(20) / 4) + 7 * math.log(20) / 9
    assert upper[0] == pytest.approx(min(1.0, 0.75 + margin)) and lower[0] == pytest.approx(max(0.0, 0.75 - margin))
    # on [10, 20] the same data scale linearly
    l2, u2 = stats.empirical_bernstein_bounds(10 + 10 * x, 10.0, 20.0, 0.1)
    assert l2[0] == pytest.approx(10 + 10 * lower[0]) and u2[0] == pytest.approx(10 + 10 * upper[0])


def _log_capital_direct(z, bets, block, m, trunc=stats.BETTING_TRUNCATION):
    """log K(m) = Σ_i log(1 + min(λ̃_i, c/m)(z_i − m)), written out sample by sample."""
    lam = np.repeat(bets, block)[: len(z)]
    return float(np.sum(np.log1p(np.minimum(lam, trunc / m) * (z - m))))


@pytest.mark.parametrize("dist", ["uniform", "near_constant_top", "near_constant_spread", "two_point"])
def test_betting_is_never_tighter_than_the_exact_inversion(dist):
    """The reported bound is a rejected candidate: at most the exact inf{m : K(m) < 1/α} (found here by
    200 bisection steps on K written out sample by sample), and at most rtol·(x̄ − L) below it (rtol = 1 %)."""
    rng = np.random.default_rng(5)
    alpha, block = 0.01, stats.BETTING_BLOCK
    x, _ = _sample(dist, rng, (3037, 4))  # n not a multiple of the block: the tail block is exercised
    for z in (x.T, 1.0 - x.T):
        s1, s2 = stats._block_sums(z, block)
        bets = stats._betting_bets(s1, s2, z.shape[1], block, alpha)
        reported = stats.betting_bounds(z.T, 0.0, 1.0, alpha)[0]   # the lower bounds of the rows of z
        for row in range(z.shape[0]):
            f = lambda m: _log_capital_direct(z[row], bets[row], block, m)  # noqa: E731
            grid = np.linspace(1e-6, 1.0, 400)
            assert np.all(np.diff([f(m) for m in grid]) <= 1e-9), "K must be non-increasing in m"
            a, b = 1e-15, 1.0
            if f(a) < math.log(1 / alpha):
                exact = 0.0
            else:
                for _ in range(200):
                    mid = 0.5 * (a + b)
                    a, b = (mid, b) if f(mid) >= math.log(1 / alpha) else (a, mid)
                exact = a
            assert reported[row] <= exact + 1e-12
            assert exact - reported[row] <= 1.02e-2 * (z[row].mean() - exact) + 1e-9  # rtol = 1e-2


def test_betting_bets_are_predictable():
    """The bet of a block depends only on earlier blocks: changing later samples changes no earlier bet."""
    rng = np.random.default_rng(8)
    z = rng.random((2, 1000))
    z2 = z.copy()
    z2[:, 550:] = rng.random((2, 450))
    b1 = stats._betting_bets(*stats._block_sums(z, 100), 1000, 100, 0.05)
    b2 = stats._betting_bets(*stats._block_sums(z2, 100), 1000, 100, 0.05)
    np.testing.assert_array_equal(b1[:, :6], b2[:, :6])  # blocks 0..5 only see samples < 500 ≤ 550
    assert not np.array_equal(b1[:, 6:], b2[:, 6:])


def test_clopper_pearson_is_reproducible_and_exact_on_bernoulli_data():
    x = np.array([[1.0], [0.0], [1.0], [1.0], [0.0]] * 20)  # 60 of 100 ones, already 0/1: rounding is exact
    lo1, up1 = stats.clopper_pearson_bounds(x, 0.0, 1.0, 0.05, np.random.default_rng(1))
    assert lo1[0] == pytest.approx(st.beta.ppf(0.05, 60, 41)) and up1[0] == pytest.approx(st.beta.ppf(0.95, 61, 40))
    y = np.random.default_rng(2).random((300, 2))
    a = stats.clopper_pearson_bounds(y, 0.0, 1.0, 0.05, np.random.default_rng(9))
    b = stats.clopper_pearson_bounds(y, 0.0, 1.0, 0.05, np.random.default_rng(9))
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------------------------
# GRe: the CDF-based expectation bound (Kumar, Levine & Feizi).
# ------------------------------------------------------------------------------------------------------------

def test_cdf_expectation_bound_by_hand():
    # returns (0, 10, 10, 20) on [0, 20], α = 0.5 → ε_DKW = sqrt(ln 2 / 8) ≈ 0.294.  From J_min = 0 the
    # sorted returns give widths 0, 10, 0, 10 with survival levels 1, 3/4, 2/4, 1/4; at ε = 0 each width is
    # weighted by (level − ε_DKW)⁺:
    d = math.sqrt(math.log(2) / 8)
    r = np.array([10.0, 0.0, 20.0, 10.0])
    expect = 0 + 0 * (1 - d) + 10 * (3 / 4 - d) + 0 * (2 / 4 - d) + 10 * max(1 / 4 - d, 0)
    assert stats.cdf_expectation_bound(r, 0.0, 20.0, 0.5, 1.0, 0.0, 1) == pytest.approx(expect)
    # at ε > 0 each level p becomes Φ(Φ⁻¹(p) − ε√H/σ)
    shift = 0.1 * math.sqrt(4) / 0.5
    expect = 10 * st.norm.cdf(st.norm.ppf(3 / 4 - d) - shift) + 10 * st.norm.cdf(st.norm.ppf(max(1 / 4 - d, 0)) - shift)
    assert stats.cdf_expectation_bound(r, 0.0, 20.0, 0.5, 0.5, 0.1, 4) == pytest.approx(expect)


def test_cdf_expectation_bound_range_monotonicity_and_comparison_with_theorem_2(rng):
    returns = np.where(rng.random(2000) < 0.8, 200.0, rng.integers(0, 200, 2000)).astype(float)
    eps = np.array([0.0, 0.001, 0.005, 0.01, 0.05, 0.5, 5.0])
    b = stats.cdf_expectation_bound(returns, 0.0, 200.0, 0.05, 0.1, eps, 200)
    assert np.all(np.diff(b) <= 1e-12) and np.all(b >= 0.0) and np.all(b <= 200.0)
    assert b[-1] == pytest.approx(0.0, abs=1e-6)  # huge ε: nothing is left, but never below J_min
    hoeff = stats.expectation_bound(returns.mean(), 0, 200, 2000, 0.05, 0.1, 0.0, 200)
    assert b[0] >= hoeff - 1e-9  # ε = 0: never looser than the Hoeffding-based J̲_E
    lip = [stats.expectation_bound(returns.mean(), 0, 200, 2000, 0.05, 0.1, e, 200) for e in eps[1:4]]
    assert np.all(b[1:4] > np.array(lip))  # and far tighter than the Lipschitz bound at small ε > 0


@pytest.mark.parametrize("eps", [0.0, 0.01, 0.03])
def test_cdf_expectation_bound_covers_the_worst_case_mean(eps, rng):
    """2,000 repetitions of m = 500 returns of a trajectory function whose worst case under ℓ2 perturbations
    is known: F(ζ) = J·1{Σ_t ζ_t / √H ≥ τ} (ζ_t ∼ N(0, σ²)), so the adversary (δ_t = −ε each step, total
    ℓ2 norm ε√H) gets E F = J·(1 − Φ((τ + ε√H)/σ)) — the Neyman–Pearson case where the bound is tight.
    Also mixed with a uniform part so that the DKW band matters at several thresholds."""
    m, reps, alpha, H, sigma, tau, J = 500, 2000, 0.05, 100, 0.2, -0.1, 200.0
    noise_sum = rng.normal(0.0, sigma, (reps, m))  # Σ_t ζ_t / √H ~ N(0, σ²)
    extra = rng.uniform(0, 0.25 * J, (reps, m))
    returns = np.where(noise_sum >= tau, 0.75 * J, 0.0) + extra
    worst = 0.75 * J * (1 - st.norm.cdf((tau + eps * math.sqrt(H)) / sigma)) + 0.125 * J
    bounds = np.array([stats.cdf_expectation_bound(r, 0.0, J, alpha, sigma, eps, H) for r in returns])
    miss = np.mean(bounds > worst)
    assert miss <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)
    if eps == 0.0:
        assert np.all(bounds >= 0.0) and np.mean(bounds) > worst - 0.1 * J  # not trivially J_min


# ------------------------------------------------------------------------------------------------------------
# Confidence accounting (alpha_mode).
# ------------------------------------------------------------------------------------------------------------

def test_alpha_schedules_sum_to_at_most_alpha():
    assert stats.loact_state_alpha(0.05, "state", 200) == 0.05
    assert stats.loact_state_alpha(0.05, "family", 200) == pytest.approx(0.05 / 200)
    a = [stats.lore_state_alpha(0.05, "family", i) for i in range(1, 200001)]
    assert a[0] == pytest.approx(0.05 * 6 / math.pi ** 2) and np.all(np.diff(a) < 0)
    assert sum(a) <= 0.05 and sum(a) > 0.05 * 0.9999
    assert stats.lore_state_alpha(0.05, "state", 7) == 0.05
    assert stats.union_confidence([0.01] * 10) == pytest.approx(0.9)
    assert stats.union_confidence([0.3] * 10) == 0.0
    with pytest.raises(ValueError):
        stats.lore_state_alpha(0.05, "family", 0)
    with pytest.raises(ValueError):
        stats.loact_state_alpha(0.05, "episode", 10)


def test_phi_and_phi_inv_are_bit_for_bit_scipy_stats_norm():
    """Φ and Φ⁻¹ evaluate scipy.special directly; every certificate rests on them, so they must give exactly
    scipy.stats.norm's numbers, signed zeros and infinities included, NaN where it has NaN (its sign bit aside),
    for scalars and arrays."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 3, 20_000), rng.normal(0, 40, 2_000),
                        [0.0, -0.0, 1e-300, -1e-300, 8.3, -38.5, -40.0, np.inf, -np.inf, np.nan]])
    p = np.concatenate([rng.random(20_000), 10.0 ** -rng.uniform(1, 300, 2_000), 1 - rng.random(200) * 1e-15,
                        [0.0, 1.0, 0.5, -0.0, 1e-320, -0.1, 1.1, np.nan]])
    for ours, theirs, v in ((stats.Phi, st.norm.cdf, x), (stats.Phi_inv, st.norm.ppf, p)):
        got, want = ours(v), theirs(v)
        nan = np.isnan(want)
        assert got.dtype == want.dtype and np.array_equal(np.isnan(got), nan)
        assert got[~nan].tobytes() == want[~nan].tobytes()
        for s in v[::97].tolist() + [0.5, 0]:
            a, b = ours(s), theirs(s)
            assert type(a) is type(b) and (np.isnan(a) and np.isnan(b) or a.tobytes() == b.tobytes())
    assert stats.Phi(np.float32(0.3)).dtype == st.norm.cdf(np.float32(0.3)).dtype == np.float64
