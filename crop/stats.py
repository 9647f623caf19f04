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
from scipy import stats as _st

__all__ = [
    "Phi",
    "Phi_inv",
    "hoeffding_margin",
    "per_bound_alpha",
    "percentile_order_index",
    "percentile_p_prime",
    "expectation_bound",
]


def Phi(x):
    """Standard normal CDF Φ."""
    return _st.norm.cdf(x)


def Phi_inv(p):
    """Standard normal quantile Φ⁻¹ (Φ⁻¹(0) = -inf, Φ⁻¹(1) = +inf)."""
    return _st.norm.ppf(p)


def hoeffding_margin(value_range: float, m: int, alpha: float) -> float:
    """One-sided Hoeffding margin Δ for the mean of ``m`` i.i.d. samples in an interval of width
    ``value_range``: P[mean − E > Δ] ≤ alpha (and likewise for the other side).

    Δ = (hi − lo) · sqrt(ln(1/alpha) / (2m)) — Algorithm 1 line "confidence interval", Algorithm 2 Δ_conf.
    """
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
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
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if p_prime <= 0.0:
        return None
    j = np.arange(m)  # j = k − 1
    cdf = _st.binom.cdf(j, m, min(p_prime, 1.0))
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
