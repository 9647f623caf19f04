"""What `crop certify` says about its bounds: the confidence bound of a discrete agent's config (exact for the
vote, never looser than Hoeffding there), the GRe table with Kumar et al.'s CDF bound, and the reason printed
where every GRe bound at ε > 0 is vacuous — each reason's advice checked against the bounds it predicts."""

import numpy as np
import pandas as pd
import pytest

from crop.certify.gre import gre_bounds, vacuity_reason
from crop.handlers.certify import _sigma_lines
from crop.smoothing import stats
from crop.workflow.certify_config import CERTIFY_BOUND, budget_sizes, certify_config
from crop.workflow.config import validate_config

J_MIN, J_MAX = -200.0, 0.0


def _bounds(returns, sigma=0.1, horizon=200, eps=(0.0, 0.005, 0.01), alpha=0.05):
    return gre_bounds(np.asarray(returns, float), sigma=sigma, horizon=horizon, alpha=alpha, eps_grid=eps,
                      percentiles=[0.5], j_min=J_MIN, j_max=J_MAX)


def _above(bounds) -> bool:
    """Some bound at ε > 0 above J_min."""
    pos = bounds[bounds["eps"] > 0]
    return bool((pos[["expectation_bound", "cdf_expectation_bound", "percentile_bound"]] > J_MIN + 1e-6).any().any())


@pytest.mark.parametrize("env, box", [("Acrobot-v1", False), ("MountainCar-v0", False), ("Pendulum-v1", True)])
def test_a_discrete_agents_config_takes_the_exact_vote_bound_a_box_agents_none(env, box, tmp_path):
    sizes, sigmas = budget_sizes("quick", env)
    cfg = certify_config(env, ("Mine", tmp_path / "p.zip"), tmp_path / "out", sizes, sigmas,
                         {"range": [-1.0, 0.0]}, box, None if box else "auto")
    assert ("bound" in cfg) != box
    assert validate_config(cfg, "crop certify")["bound"] == ("hoeffding" if box else CERTIFY_BOUND)


@pytest.mark.parametrize("m, a_each", [(100, 0.05 / 6), (1000, 0.05 / 6), (1000, 0.05 / 4)])
def test_on_vote_samples_clopper_pearson_is_never_looser_than_hoeffding(m, a_each):
    """For 0/1 samples (the vote) at every count k: CP's lower bound ≥ Hoeffding's, its upper bound ≤
    Hoeffding's, and its random rounding changes nothing (two generators, the same bounds)."""
    d = stats.hoeffding_margin(1.0, m, a_each)
    for k in range(m + 1):
        x = np.zeros((m, 1))
        x[:k] = 1.0
        lo, hi = stats.clopper_pearson_bounds(x, 0.0, 1.0, a_each, np.random.default_rng(k))
        lo2, hi2 = stats.clopper_pearson_bounds(x, 0.0, 1.0, a_each, np.random.default_rng(k + 10**6))
        assert (lo[0], hi[0]) == (lo2[0], hi2[0])
        assert lo[0] >= max(0.0, k / m - d) - 1e-12 and hi[0] <= min(1.0, k / m + d) + 1e-12


def test_no_reason_where_a_bound_at_positive_eps_is_above_j_min():
    returns = np.random.default_rng(0).integers(-120, -80, size=500)
    bounds = _bounds(returns)
    assert _above(bounds) and vacuity_reason(returns, bounds) is None


def test_returns_all_at_j_min_no_m_or_horizon_can_lift_and_sigma_is_set_beside_the_observation():
    returns = np.full(500, J_MIN)
    why = vacuity_reason(returns, _bounds(returns), obs_low=[-1.2, -0.07], obs_high=[0.6, 0.07])
    assert "no m or horizon can lift one" in why and "71% of observation 1's range 0.14" in why
    for horizon in (1, 200):   # neither 40× the paths nor a horizon of 1 lifts a bound
        assert not _above(_bounds(np.repeat(returns, 40), horizon=horizon))


def test_too_few_paths_more_of_them_lift_the_cdf_bound_as_the_reason_says():
    returns = np.r_[np.full(19, J_MIN), [-50.0]]   # 1 path in 20 ends early: below DKW's band at m = 20
    bounds = _bounds(returns, horizon=4, eps=(0.0, 0.01))
    why = vacuity_reason(returns, bounds)
    assert not _above(bounds) and "more paths (--m) lift the CDF bound at eps 0.01" in why
    limit = float(why.rsplit("towards ", 1)[1].split(",")[0])
    more = _bounds(np.repeat(returns, 1000), horizon=4, eps=(0.0, 0.01))   # the same returns, m = 20,000
    cdf = float(more.loc[more["eps"] > 0, "cdf_expectation_bound"].iloc[0])
    assert J_MIN < cdf <= limit + 1e-9 * abs(limit)


def test_a_shift_too_large_for_any_m_names_horizon_and_sigma_and_a_shorter_horizon_lifts():
    returns = np.r_[np.full(400, J_MIN), np.full(100, -150.0)]
    bounds = _bounds(returns, sigma=0.01, horizon=400, eps=(0.0, 0.01))   # ε√H/σ = 20
    why = vacuity_reason(returns, bounds)
    assert not _above(bounds) and "more paths would not help" in why and "shorter --horizon" in why
    assert not _above(_bounds(np.repeat(returns, 40), sigma=0.01, horizon=400, eps=(0.0, 0.01)))
    assert _above(_bounds(returns, sigma=0.01, horizon=1, eps=(0.0, 0.01)))


def test_the_printed_table_has_the_cdf_bound_and_the_reason(tmp_path):
    """One σ's lines from a run folder's files: every bound at J_min marked vacuous, the CDF bound's column,
    and the reason line where no bound at ε > 0 is above J_min; none where one is."""
    for returns, vacuous in ((np.full(50, J_MIN), True), (np.linspace(-120, -80, 50), False)):
        run = tmp_path / str(vacuous)
        run.mkdir()
        _bounds(returns).to_csv(run / "gre.csv", index=False)
        pd.DataFrame({"return": returns}).to_csv(run / "gre_returns.csv", index=False)
        pd.DataFrame({"certified": [True, False], "radius": [0.1, 0.0]}).to_csv(run / "loact.csv", index=False)
        pd.DataFrame({"eps": [0.0], "return": [-90.0]}).to_csv(run / "attack_global.csv", index=False)
        lines = _sigma_lines(run, False, "MountainCar-v0")
        assert "GRe J_CDF" in lines[2] and lines[0].startswith("  LoAct: 50.0% of 2 steps certified")
        rows = lines[3:6]
        assert all(r.count("(vacuous)") == 3 for r in rows) == vacuous
        reason = [x for x in lines if "why vacuous" in x]
        assert (len(reason) == 1) == vacuous
        if vacuous:
            assert "observation 1's range 0.14" in reason[0]
