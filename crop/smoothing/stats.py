"""Pure statistics for CROP: confidence bounds, the percentile order statistic, Φ and Φ⁻¹.

No torch and no environments here, so that every number a certificate rests on can be checked by hand.

Conventions
-----------
* ``alpha`` is always the *total* miscoverage a caller wants for the statement it makes; functions that
  build several one-sided bounds at once say how they split it.
* Bounds are for means of samples that lie in a known interval ``[lo, hi]`` (Q-values clipped to
  ``[v_min, v_max]`` in Algorithm 1, returns in ``[J_min, J_max]`` in Algorithm 2).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special as _sp

from crop.names import ALPHA_MODES  # noqa: F401  (re-exported: the modes this section implements)

__all__ = [
    "Phi",
    "Phi_inv",
    "normalise",
    "hoeffding_margin",
    "per_bound_alpha",
    "percentile_order_index",
    "percentile_p_prime",
    "expectation_bound",
    "empirical_bernstein_bounds",
    "betting_bounds",
    "clopper_pearson_bounds",
    "cdf_expectation_bound",
    "dkw_margin",
    "ALPHA_MODES",
    "loact_state_alpha",
    "lore_state_alpha",
    "lore_schedule_text",
    "union_confidence",
    "episode_confidence",
]


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return alpha


# Φ and Φ⁻¹ are scipy.special's ndtr and ndtri, the functions scipy.stats.norm's cdf and ppf evaluate (the
# same numbers, tested), without importing scipy.stats: that import costs every job about 0.6 s of CPU.
def Phi(x):
    """Standard normal CDF Φ."""
    return _sp.ndtr(np.asarray(x, dtype=np.float64))


def Phi_inv(p):
    """Standard normal quantile Φ⁻¹ (Φ⁻¹(0) = -inf, Φ⁻¹(1) = +inf, NaN outside [0, 1])."""
    return _sp.ndtri(np.asarray(p, dtype=np.float64))


def normalise(q, v_min: float, v_max: float):
    """The clipped smoothed Q mapped to [0, 1], the argument of Φ⁻¹ in Theorem 1: (q − V_min)/(V_max − V_min),
    clipped to [0, 1]; ``q`` a value or an array (a confidence bound on Q̃ per action)."""
    return np.clip((np.asarray(q, float) - v_min) / (v_max - v_min), 0.0, 1.0)


def hoeffding_margin(value_range: float, m: int, alpha: float) -> float:
    """One-sided Hoeffding margin Δ for the mean of ``m`` i.i.d. samples in an interval of width
    ``value_range``: P[mean − E > Δ] ≤ alpha (and likewise for the other side).

    Δ = (hi − lo) · sqrt(ln(1/alpha) / (2m)) — Algorithm 1 line "confidence interval", Algorithm 2 Δ_conf.
    """
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    _check_alpha(alpha)
    if value_range < 0:
        raise ValueError(f"value_range must be >= 0, got {value_range}")
    return float(value_range) * math.sqrt(math.log(1.0 / alpha) / (2.0 * m))


def per_bound_alpha(alpha: float, n_actions: int) -> float:
    """Miscoverage of each one-sided bound when a state's certificate holds with probability ≥ 1 − alpha.

    The certificate of a state uses, for a data-chosen top action a₁, a lower bound on Q̃(s, a₁) and an
    upper bound on Q̃(s, a) for every other a (Theorems 1 and 4).  Because a₁ is chosen from the same
    samples, we make *all* 2·|A| one-sided bounds hold simultaneously (union bound), which covers any
    choice of a₁.  The official CROP code spent the full alpha on each bound; that over-states confidence.
    """
    if n_actions < 2:
        raise ValueError(f"need at least 2 actions, got {n_actions}")
    return alpha / (2.0 * n_actions)


def percentile_p_prime(p: float, eps: float, horizon: int, sigma: float) -> float:
    """p′ = Φ(Φ⁻¹(p) − ε·√H / σ) of Theorem 3."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"percentile p must be in (0, 1), got {p}")
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    return float(Phi(Phi_inv(p) - eps * math.sqrt(horizon) / sigma))


def percentile_order_index(m: int, p_prime: float, alpha: float) -> int | None:
    """The exact order statistic of ``ComputeOrderStats`` (Appendix B.2, Eq. (5)).

    Returns the largest k ∈ {1, …, m} with P[Bin(m, p′) ≤ k − 1] ≤ alpha, so that the k-th smallest of m
    i.i.d. returns lies below the p′-quantile with probability ≥ 1 − alpha; ``None`` when no k qualifies
    (then no percentile bound can be certified at this ε).  Computed exactly with scipy's binomial CDF,
    not the paper's normal approximation.
    """
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    _check_alpha(alpha)
    if p_prime <= 0.0:
        return None
    from scipy.stats import binom  # here: only GRe's percentile bound needs scipy.stats

    j = np.arange(m)  # j = k − 1
    cdf = binom.cdf(j, m, min(p_prime, 1.0))
    ok = np.nonzero(cdf <= alpha)[0]
    if ok.size == 0:
        return None
    # cdf is non-decreasing in j, so the qualifying j form a prefix; take its end.
    return int(ok[-1]) + 1


def expectation_bound(mean_return: float, j_min: float, j_max: float, m: int, alpha: float,
                      sigma: float, eps: float, horizon: int) -> float:
    """J̲_E of Theorem 2 with the Monte-Carlo term of Algorithm 2:
    F̃ − (J_max − J_min)·sqrt(ln(1/α)/(2m)) − (J_max − J_min)/σ · sqrt(2/π) · ε · √H.
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    width = j_max - j_min
    conf = hoeffding_margin(width, m, alpha)
    lip = width / sigma * math.sqrt(2.0 / math.pi) * eps * math.sqrt(horizon)
    return float(mean_return - conf - lip)


# ----------------------------------------------------------------------------------------------------------
# One-sided confidence bounds for the means of bounded samples (the options of ``bound``).
#
# Every function below takes ``samples`` of shape (n, k) — n i.i.d. draws of k bounded variables (for
# SmoothedNetwork: m noise draws × |A| actions) — and returns ``(lower, upper)``, two arrays of shape (k,), each
# entry a *one-sided* bound at level ``alpha``: P[lower_a > E X_a] ≤ alpha and P[upper_a < E X_a] ≤ alpha
# for every a separately.  The caller spends its miscoverage on them by the union bound
# (:func:`per_bound_alpha`).  Samples outside [lo, hi] are clipped into it first (the bounds are then for
# the mean of the clipped variable, which is the mean of X when X ∈ [lo, hi] almost surely).  The bounds
# are always inside [lo, hi]; ``lower ≤ mean ≤ upper`` is *not* promised (randomised rounding can break it).
# Assumptions shared by all: the n draws of a column are i.i.d. (for ``betting`` it suffices that each draw
# has the same conditional mean given the earlier ones) and the range [lo, hi] is fixed before sampling.
# ----------------------------------------------------------------------------------------------------------

def _normalised(samples, lo: float, hi: float) -> np.ndarray:
    """The samples as a C-contiguous (k, n) float64 array mapped affinely onto [0, 1] and clipped there."""
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise ValueError(f"need finite lo < hi, got [{lo}, {hi}]")
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"samples must have shape (n, k) with n >= 1, got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples contain NaN or inf")
    z = np.array(x.T, dtype=np.float64, order="C")
    z -= lo
    z /= hi - lo
    np.clip(z, 0.0, 1.0, out=z)
    return z


def _to_range(lower01, upper01, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    w = float(hi) - float(lo)
    lower = np.clip(lo + w * np.asarray(lower01, dtype=np.float64), lo, hi)
    upper = np.clip(lo + w * np.asarray(upper01, dtype=np.float64), lo, hi)
    return lower, upper


def empirical_bernstein_bounds(samples, lo: float, hi: float, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided empirical Bernstein bounds — Maurer & Pontil (2009), "Empirical Bernstein bounds and sample
    variance penalization", COLT, **Theorem 4**.

    For n ≥ 2 i.i.d. X_i ∈ [0, 1] and δ ∈ (0, 1), with probability ≥ 1 − δ

        E X − X̄ ≤ sqrt(2 V_n ln(2/δ) / n) + 7 ln(2/δ) / (3 (n − 1)),

    V_n the unbiased sample variance.  (The ln(2/δ) comes from the theorem's own union of a Bennett bound
    and a bound on the sample standard deviation; the statement is one-sided.)  Applied to X for the upper
    bound and to 1 − X for the lower bound, each with δ = ``alpha``, after mapping [lo, hi] onto [0, 1].
    Tighter than Hoeffding when the variance is small (near-constant Q-values of saturated agents);
    slightly looser when the variance is near its maximum 1/4.
    """
    alpha = _check_alpha(alpha)
    z = _normalised(samples, lo, hi)
    n = z.shape[1]
    if n < 2:
        raise ValueError("the empirical Bernstein bound needs n >= 2 samples")
    mean = z.mean(axis=1)
    var = z.var(axis=1, ddof=1)
    log_term = math.log(2.0 / alpha)
    margin = np.sqrt(2.0 * var * log_term / n) + 7.0 * log_term / (3.0 * (n - 1))
    return _to_range(mean - margin, mean + margin, lo, hi)


#: Truncation c of the bets, λ_i(m) ≤ c/m (Waudby-Smith & Ramdas use c = 1/2 or 3/4; 1/2 is their default).
BETTING_TRUNCATION = 0.5
#: The plug-in bet is refreshed once per block of this many samples (still predictable; much cheaper).
BETTING_BLOCK = 100
#: A candidate mean counts as rejected only if log K ≥ ln(1/α) + this guard (absorbs rounding: conservative).
BETTING_GUARD = 1e-7


def _block_sums(z: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-block sums of z and z² (k, ⌈n/block⌉), the last block zero-padded."""
    k, n = z.shape
    nb = -(-n // block)
    pad = nb * block - n
    zz = (np.concatenate([z, np.zeros((k, pad))], axis=1) if pad else z).reshape(k, nb, block)
    return zz.sum(axis=2), np.einsum("kbi,kbi->kb", zz, zz)


def _betting_bets(s1: np.ndarray, s2: np.ndarray, n: int, block: int, alpha: float) -> np.ndarray:
    """Predictable plug-in bets, one per block of ``block`` samples, from the block sums of z ∈ [0, 1]:
    Waudby-Smith & Ramdas (2023), Sec. 5.1, fixed-n variant: λ̃ = sqrt(2 ln(1/α) / (n σ̂²)), σ̂² a
    regularised variance (prior variance 1/4 and prior mean 1/2, each weighted as one observation) of the
    samples *before* the block.  A bet that changes only at block boundaries and depends on earlier samples
    only is predictable, which is all validity needs (their bets change every sample; the difference is
    efficiency, not soundness).  The same bets serve X and 1 − X (their regularised variances are equal)."""
    k, nb = s1.shape
    c1 = np.zeros((k, nb))
    c2 = np.zeros((k, nb))
    np.cumsum(s1[:, :-1], axis=1, out=c1[:, 1:])
    np.cumsum(s2[:, :-1], axis=1, out=c2[:, 1:])
    cnt = np.arange(nb, dtype=np.float64) * block                # samples before block b (all full blocks)
    mu = (0.5 + c1) / (cnt + 1.0)
    ss = np.maximum(c2 - 2.0 * mu * c1 + cnt * mu * mu, 0.0)     # Σ (x_j − μ̂)² over earlier samples
    var = (0.25 + ss) / (cnt + 1.0)
    return np.sqrt(2.0 * math.log(1.0 / alpha) / (n * np.maximum(var, 1e-300)))


class _Capital:
    """log K(m) − c₀ for 2k rows: rows 0…k−1 bet on the rows of z (K⁺, lower bounds of E z), rows k…2k−1
    on 1 − z (lower bounds of E(1 − z), i.e. upper bounds of E z).  Bets are constant per block."""

    def __init__(self, z: np.ndarray, bets: np.ndarray, block: int, trunc: float, c0: float):
        k, n = z.shape
        self.k, self.block, self.trunc, self.c0 = k, block, trunc, c0
        self.nf = n // block                                     # full blocks
        self.main = z[:, : self.nf * block].reshape(k, self.nf, block)
        self.tail = z[:, self.nf * block:]
        self.bets = np.concatenate([bets, bets], axis=0)         # (2k, blocks)
        self.flip = np.repeat([0.0, 1.0], k)                     # row r bets on z (0) or on 1 − z (1)
        self.sign = 1.0 - 2.0 * self.flip
        self.buf = np.empty((2 * k, self.nf, block))
        self.evals = 0

    def __call__(self, m: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """g = Σ_i log(1 + λ_i(m)(y_i − m)) − c₀ for the given rows (y = z or 1 − z), m ∈ (0, 1]."""
        self.evals += 1
        r = len(rows)
        lam = np.minimum(self.bets[rows], (self.trunc / m)[:, None])  # λ_i(m) = min(λ̃, c/m), (r, blocks)
        coef = lam * self.sign[rows, None]                       # 1 + λ(y − m) = coef·z + off
        off = 1.0 + lam * (self.flip[rows, None] - m[:, None])
        buf = self.buf[:r]
        if r == 2 * self.k:
            np.multiply(self.main[None], coef[:, : self.nf].reshape(2, self.k, self.nf, 1),
                        out=buf.reshape(2, self.k, self.nf, self.block))
        else:
            np.take(self.main, rows % self.k, axis=0, out=buf)
            np.multiply(buf, coef[:, : self.nf, None], out=buf)
        np.add(buf, off[:, : self.nf, None], out=buf)            # every factor ≥ 1 − c > 0
        np.log(buf, out=buf)
        g = buf.reshape(r, -1).sum(axis=1)
        if self.tail.shape[1]:
            t = self.tail[rows % self.k] * coef[:, -1:] + off[:, -1:]
            g += np.log(t).sum(axis=1)
        return g - self.c0


def _betting_lower(z: np.ndarray, s1: np.ndarray, s2: np.ndarray, alpha: float, block: int, trunc: float,
                   rtol: float, max_iter: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Lower confidence bounds on the means of the rows of z ∈ [0, 1]^{k×n} and of 1 − z by inverting the
    capital process K(m) = Π_i (1 + λ_i(m)(y_i − m)), λ_i(m) = min(λ̃_i, c/m).  Returns
    (bounds for z, bounds for 1 − z, evaluations of K).

    K is non-increasing in m: each factor is positive (≥ 1 − c) and non-increasing in m (for λ = λ̃ its
    slope is −λ̃; for λ = c/m the factor is 1 − c + c·y_i/m, y_i ≥ 0).  So the rejected candidates
    {m : K(m) ≥ 1/α} form an interval [0, L*) or [0, L*] and the exact inversion is
    L* = inf{m : K(m) < 1/α}.  The search keeps, per row, a bracket [lo, hi] with lo = 0 or rejected and
    hi not rejected (K(1) ≤ 1 < 1/α); it proposes secant (first: approximate Newton) steps aimed a little
    past the root, bisects when a step leaves the bracket, and returns lo: never above L*, and at most
    ``rtol``·(ȳ − lo) below it once converged (after ``max_iter`` evaluations, whatever lo was reached).
    ``s1``, ``s2``: :func:`_block_sums` of z.
    """
    k, n = z.shape
    R = 2 * k
    c0 = math.log(1.0 / alpha) + BETTING_GUARD
    cap = _Capital(z, _betting_bets(s1, s2, n, block, alpha), block, trunc, c0)
    mz = s1.sum(axis=1) / n
    vz = np.maximum(s2.sum(axis=1) / n - mz * mz, 0.0)
    mean = np.concatenate([mz, 1.0 - mz])
    var = np.concatenate([vz, vz])
    ln = math.log(1.0 / alpha)
    lo = np.zeros(R)
    hi = np.ones(R)
    done = np.zeros(R, dtype=bool)
    m = np.clip(mean - np.sqrt(2.0 * var * ln / n) - ln / n, 1e-12, 1.0)   # first probe: ≈ a Bernstein bound
    m_prev = np.full(R, np.nan)
    g_prev = np.full(R, np.nan)
    g = np.zeros(R)
    bet_mean = cap.bets.mean(axis=1)
    for _ in range(max_iter):
        rows = np.nonzero(~done)[0]
        if rows.size == 0:
            break
        g[rows] = cap(m[rows], rows)
        rej = g >= 0.0
        act = ~done
        lo = np.where(act & rej, np.maximum(lo, m), lo)
        hi = np.where(act & ~rej, np.minimum(hi, m), hi)
        tol = np.maximum(rtol * (mean - lo), 1e-12)
        done |= act & ((hi - lo) <= tol)
        done |= act & ~rej & (m <= 1e-12)                        # not even m → 0+ is rejected: L* = 0
        # slope: secant through the last two points; before that, −n·λ̄ (the slope of Σ λ(y − m))
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.where(np.isfinite(m_prev) & (m != m_prev), (g - g_prev) / (m - m_prev), np.nan)
            first = -n * np.minimum(bet_mean, trunc / m)
            slope = np.where(np.isfinite(slope) & (slope < 0), slope, first)
            step = -g / slope
        m_prev, g_prev = np.where(act, m, m_prev), np.where(act, g, g_prev)
        # aim a quarter tolerance past the root, so that the next point lands on the other side of it
        nxt = m + step + np.where(rej, 0.25, -0.25) * tol
        bad = ~np.isfinite(nxt) | (nxt <= lo) | (nxt >= hi)
        nxt = np.where(bad, 0.5 * (lo + hi), nxt)
        # a step through 0 from the accepted side: test m → 0+ at once (then L* = 0, or a bracket)
        nxt = np.where(bad & (lo == 0.0) & ~rej & (m + step <= 0.0), 1e-12, nxt)
        m = np.where(done, m, nxt)
    return lo[:k], lo[k:], cap.evals


def betting_bounds(samples, lo: float, hi: float, alpha: float, *, trunc: float = BETTING_TRUNCATION,
                   block: int = BETTING_BLOCK, rtol: float = 1e-2,
                   max_iter: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """One-sided bounds by betting — Waudby-Smith & Ramdas (2023), "Estimating means of bounded random
    variables by betting", JRSS-B 86(1); the two one-sided halves of their hedged capital process
    (Sec. 4–5) with predictable plug-in bets and truncation c/m (c = ``trunc`` = 1/2).

    For a candidate mean m ∈ (0, 1] of X ∈ [0, 1] the capital K⁺(m) = Π_i (1 + λ_i(m)(X_i − m)) with
    λ_i(m) = min(λ̃_i, c/m), λ̃_i predictable (a function of X_1 … X_{i−1}; :func:`_betting_bets`), is a
    non-negative martingale with mean 1 when m = E X, so P[K⁺_n(E X) ≥ 1/α] ≤ α (Markov's inequality) and
    L = inf{m : K⁺_n(m) < 1/α} is a lower bound at level α.  The upper bound is 1 − (the same for 1 − X).
    The hedged process max(θK⁺, (1 − θ)K⁻) with θ = 1/2 at level 2α gives exactly these two bounds.

    K⁺_n(m) is non-increasing in m (see :func:`_betting_lower`), so the inversion is a root search; it
    reports the largest *rejected* candidate found, which is never tighter than the exact inversion and at
    most ``rtol``·(x̄ − L) looser (1 % of the bound's margin by default).  A candidate counts as rejected
    only if log K ≥ ln(1/α) + 1e-7.
    Cost: O(n·k) per evaluation of K, typically 3–4 evaluations (at most ``max_iter``).  Validity assumes
    each draw has the same mean given the earlier draws (i.i.d. suffices) and the known range [lo, hi].
    """
    alpha = _check_alpha(alpha)
    z = _normalised(samples, lo, hi)
    s1, s2 = _block_sums(z, block)
    low, low_flipped, _ = _betting_lower(z, s1, s2, alpha, block, trunc, rtol, max_iter)
    return _to_range(low, 1.0 - low_flipped, lo, hi)


def clopper_pearson_bounds(samples, lo: float, hi: float, alpha: float,
                           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One-sided exact binomial (Clopper & Pearson 1934) bounds on randomly rounded samples.

    Each X_i ∈ [0, 1] (after mapping [lo, hi] onto [0, 1]) is replaced by B_i = 1{U_i < X_i}, U_i ∼ U[0, 1)
    drawn from ``rng`` independently of everything else.  Then the B_i are i.i.d. Bernoulli(E X), so with
    S = Σ B_i the Clopper–Pearson bounds Beta⁻¹(α; S, n − S + 1) (0 if S = 0) and
    Beta⁻¹(1 − α; S + 1, n − S) (1 if S = n) are one-sided bounds on E X at level α each (exact binomial
    tails; conservative).  Tight for near-Bernoulli data (saturated Q-values); it throws away the spread of
    X inside the range otherwise.  ``rng`` must be the caller's own seeded generator (reproducible, and
    independent of the data).
    """
    alpha = _check_alpha(alpha)
    z = _normalised(samples, lo, hi)
    k, n = z.shape
    u = rng.random((k, n))
    s = np.count_nonzero(u < z, axis=1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        lower = np.where(s > 0, _sp.betaincinv(np.maximum(s, 1.0), n - s + 1.0, alpha), 0.0)
        upper = np.where(s < n, _sp.betaincinv(s + 1.0, np.maximum(n - s, 1.0), 1.0 - alpha), 1.0)
    return _to_range(lower, upper, lo, hi)


# ----------------------------------------------------------------------------------------------------------
# GRe: the CDF-based expectation bound of Kumar, Levine & Feizi.
# ----------------------------------------------------------------------------------------------------------

def dkw_margin(m: int, alpha: float) -> float:
    """ε of the one-sided Dvoretzky–Kiefer–Wolfowitz inequality with Massart's (1990) tight constant:
    P[sup_t (F(t) − F_m(t)) > ε] ≤ exp(−2mε²).  Massart proves it for exp(−2mε²) ≤ 1/2, so ``alpha`` is
    capped at 1/2 (a smaller α only widens the band, which stays valid)."""
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    alpha = min(_check_alpha(alpha), 0.5)
    return math.sqrt(math.log(1.0 / alpha) / (2.0 * m))


def cdf_expectation_bound(returns, j_min: float, j_max: float, alpha: float, sigma: float, eps, horizon: int):
    """Lower bound on E[J_ε(π′)] from the empirical CDF of m σ-randomized returns — Kumar, Levine & Feizi
    (ICLR 2022), "Policy smoothing for provably robust reinforcement learning", expected-reward certificate
    (the CDF-smoothing bound of Kumar et al., NeurIPS 2020, applied to the total reward).

    With returns in [J_min, J_max], E[F] = J_min + ∫_{J_min}^{J_max} P(F > t) dt.  One-sided DKW
    (:func:`dkw_margin`) gives, simultaneously for every t with probability ≥ 1 − α,
    P(F(ζ) > t) ≥ p̲(t) = max(0, #{i : F_i > t}/m − ε_DKW).  For a perturbation of ℓ2 norm ≤ ε√H over the
    whole trajectory and any set, the Gaussian Neyman–Pearson bound gives
    P(F(δ + ζ) > t) ≥ Φ(Φ⁻¹(P(F(ζ) > t)) − ε√H/σ); the map p ↦ Φ(Φ⁻¹(p) − c) is increasing (so it may be
    applied to p̲) and convex (so it survives averaging over initial states and environment randomness).
    p̲ is constant between consecutive sorted returns F_(0) = J_min ≤ F_(1) ≤ … ≤ F_(m), so

        J̲_CDF(ε) = J_min + Σ_{i=1}^{m} (F_(i) − F_(i−1)) · Φ(Φ⁻¹(max(0, (m − i + 1)/m − ε_DKW)) − ε√H/σ),

    (ties contribute 0, so this is a sum over the distinct return values; above F_(m) nothing is added).
    Always in [J_min, J_max]; at ε = 0 and α ≤ 1/2 it is never below the Hoeffding-based J̲_E of Theorem 2
    (the DKW ε equals the Hoeffding term per unit range and the positive part only helps).  One statement at level
    α (the DKW band), like each of CROP's GRe bounds.  ``eps`` may be a scalar or an array (one bound each).
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if not j_max > j_min:
        raise ValueError(f"need J_min < J_max, got [{j_min}, {j_max}]")
    x = np.sort(np.clip(np.asarray(returns, dtype=np.float64).ravel(), j_min, j_max))
    m = x.size
    d = dkw_margin(m, alpha)
    widths = np.diff(np.concatenate([[float(j_min)], x]))
    keep = widths > 0
    surv = (m - np.arange(m, dtype=np.float64)) / m             # #{F_j > t}/m on (F_(i−1), F_(i)), i = 1..m
    p = np.clip(surv[keep] - d, 0.0, 1.0)
    shift = np.atleast_1d(np.asarray(eps, dtype=np.float64)) * math.sqrt(horizon) / sigma
    if np.any(shift < 0):
        raise ValueError("eps must be >= 0")
    with np.errstate(divide="ignore"):
        z = Phi_inv(p)                                            # Φ⁻¹(0) = −inf → Φ(−inf) = 0
    probs = Phi(z[None, :] - shift[:, None])
    out = np.clip(float(j_min) + probs @ widths[keep], j_min, j_max)
    return float(out[0]) if np.ndim(eps) == 0 else out


# ----------------------------------------------------------------------------------------------------------
# Confidence accounting: how α is spent over states (``alpha_mode``; the modes: crop.names.ALPHA_MODES).
# ----------------------------------------------------------------------------------------------------------


def _check_mode(mode: str) -> None:
    if mode not in ALPHA_MODES:
        raise ValueError(f"unknown alpha_mode {mode!r}; known: {list(ALPHA_MODES)}")


def loact_state_alpha(alpha: float, mode: str, horizon: int) -> float:
    """Per-state α of an episode of at most ``horizon`` smoothed states: α (``state``) or α/H (``family``,
    so by the union bound over ≤ H states the whole episode holds with prob ≥ 1 − H·α/H = 1 − α)."""
    _check_alpha(alpha)
    _check_mode(mode)
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    return float(alpha) if mode == "state" else float(alpha) / horizon


def lore_state_alpha(alpha: float, mode: str, i: int) -> float:
    """Per-state α of the i-th (i ≥ 1) distinct state LoRe smooths: α (``state``) or α·6/(π² i²)
    (``family``: Σ_{i≥1} 6/(π² i²) = 1, so however large the tree, the union bound over its states gives
    joint confidence ≥ 1 − α).  The schedule depends only on i, never on the data, and every state's noise
    is fresh, so the union bound holds although the tree's shape depends on earlier certificates."""
    _check_alpha(alpha)
    _check_mode(mode)
    if i < 1:
        raise ValueError(f"state index must be >= 1, got {i}")
    return float(alpha) if mode == "state" else float(alpha) * 6.0 / (math.pi ** 2 * i * i)


def lore_schedule_text(alpha: float, mode: str) -> str:
    """The per-state α schedule of LoRe in words, for the outputs' metadata."""
    _check_mode(mode)
    if mode == "state":
        return f"alpha_i = {alpha} for every state i (tree confidence >= 1 - N * {alpha})"
    return f"alpha_i = {alpha} * 6 / (pi^2 * i^2) for the i-th distinct state smoothed (sum over all i = {alpha})"


def union_confidence(alphas) -> float:
    """1 − Σ α_j, floored at 0: the confidence that a family of statements with miscoverages α_j all hold
    (Boole's inequality; no independence assumed)."""
    return max(0.0, 1.0 - float(np.sum(alphas)))


def episode_confidence(alpha: float, n_states: int) -> float:
    """1 − n·α, floored at 0: the confidence that ``n_states`` certificates at miscoverage ``alpha`` each all
    hold (Boole's inequality): a LoAct or local-attack episode of ``n_states`` smoothed states."""
    return max(0.0, 1 - alpha * n_states)
