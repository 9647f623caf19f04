"""Confidence intervals of the reproduced LoAct numbers (crop.report.intervals): they cover a known mean at
their nominal rate on synthetic episodes, and their point values are the tables' metrics."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from crop.report.intervals import episode_interval, replicate_interval, run_interval
from crop.report.metrics import mean_radius

LEVEL = 0.95


def _coverage_band(n: int) -> tuple[float, float]:
    """A 99.9 % binomial band around the nominal coverage for n independent draws."""
    lo, hi = stats.binom.ppf([0.0005, 0.9995], n, LEVEL)
    return lo / n, hi / n


def _episodes(rng, k=10, horizon=30, p_cert=0.7, scale=0.3):
    """k LoAct episodes of ``horizon`` steps: each episode has its own level (which states it visits),
    each step is certified with probability p_cert and its radius is Gamma around the episode's level.
    E[radius of a step, uncertified = 0] = p_cert · scale; E[return] = 20."""
    level = rng.gamma(4.0, 0.25, k)  # mean 1
    rows = []
    for e in range(k):
        cert = rng.random(horizon) < p_cert
        rad = np.where(cert, scale * level[e] * rng.gamma(2.0, 0.5, horizon), 0.0)
        rows += [{"episode": e, "step": t, "certified": bool(c), "radius": float(r)}
                 for t, (c, r) in enumerate(zip(cert, rad))]
    return {"loact": pd.DataFrame(rows),
            "loact_episodes": pd.DataFrame({"episode": range(k), "return": 20 + 3 * rng.standard_normal(k)})}


def test_episode_interval_covers_the_known_mean_at_its_nominal_rate():
    rng = np.random.default_rng(0)
    n = 600
    hits = {"mean_radius": 0, "certified_fraction": 0, "benign_return": 0}
    truth = {"mean_radius": 0.7 * 0.3, "certified_fraction": 0.7, "benign_return": 20.0}
    for _ in range(n):
        run = _episodes(rng)
        for m in hits:
            v, lo, hi = episode_interval(run, m, LEVEL)
            assert lo <= v <= hi
            hits[m] += lo <= truth[m] <= hi
    lo, hi = _coverage_band(n)
    for m, h in hits.items():
        assert lo <= h / n <= hi, (m, h / n)


def test_replicate_interval_covers_at_its_nominal_rate_and_is_not_the_episode_interval():
    rng = np.random.default_rng(1)
    n, hits = 2000, 0
    for _ in range(n):
        x = 0.03 + 0.005 * rng.standard_normal(3)  # three replicates' mean radii
        iv = replicate_interval(x, "mean_radius", LEVEL)
        hits += iv["lo"] <= 0.03 <= iv["hi"]
        assert iv["replicates"] == 3 and iv["sd"] == pytest.approx(np.std(x, ddof=1))
    lo, hi = _coverage_band(n)
    assert lo <= hits / n <= hi
    # A run with replicates: the value is their mean, the method says so.
    runs = [_episodes(rng) for _ in range(3)]
    iv = run_interval({**runs[0], "replicates": runs[1:]}, "mean_radius")
    vals = [episode_interval(r, "mean_radius")[0] for r in runs]
    assert iv["value"] == pytest.approx(np.mean(vals)) and iv["method"] == "t over replicates"
    assert run_interval(runs[0], "mean_radius")["method"] == "jackknife-t over episodes"


def test_point_values_are_the_tables_metrics():
    rng = np.random.default_rng(2)
    run = _episodes(rng, k=5, horizon=12)
    run["loact"] = run["loact"][~((run["loact"]["episode"] == 3) & (run["loact"]["step"] > 7))]  # a short episode
    st = run["loact"]
    assert episode_interval(run, "mean_radius")[0] == pytest.approx(mean_radius(st, "uncertified_zero"))
    assert episode_interval(run, "mean_radius_certified")[0] == pytest.approx(mean_radius(st, "certified_only"))
    assert episode_interval(run, "certified_fraction")[0] == pytest.approx(st["certified"].mean())
    v, lo, hi = episode_interval(run, "certified_fraction")
    assert 0.0 <= lo <= v <= hi <= 1.0
    one = {"loact": st[st["episode"] == 0], "loact_episodes": run["loact_episodes"].head(1)}
    v, lo, hi = episode_interval(one, "mean_radius")
    assert not math.isnan(v) and math.isnan(lo) and math.isnan(hi)  # one episode: no interval


def test_benign_return_figure_draws_the_interval():
    """Cartpole_loact_clean's error bars are the benign return's 95 % t-interval over episodes."""
    import matplotlib

    matplotlib.use("Agg")
    from crop.report import figures

    rng = np.random.default_rng(3)
    data = {("CartPole-v0", "StdTrain", "0.1"): _episodes(rng, k=6)}
    fig = figures._clean_figure("CartPole-v0", data, ["StdTrain"], ["0.1"])
    bars = fig.axes[0].containers[0]
    r = data[("CartPole-v0", "StdTrain", "0.1")]["loact_episodes"]["return"]
    half = stats.t.ppf(0.975, len(r) - 1) * r.std(ddof=1) / math.sqrt(len(r))
    seg = bars.lines[2][0].get_segments()[0]  # the vertical bar: (x, lo) -> (x, hi)
    assert seg[0][1] == pytest.approx(r.mean() - half) and seg[1][1] == pytest.approx(r.mean() + half)


def test_a_benign_return_interval_is_clipped_to_the_possible_returns():
    """CartPole-v0 returns are at most 200 over 200 steps: 195.6 [183.4, 207.8] cannot be; the interval is
    clipped to [J_min, J_max] = [0, 200] (the figure's bars too), and one still covers the mean at ≥ its
    nominal rate (clipping only removes impossible values)."""
    import matplotlib

    matplotlib.use("Agg")
    from crop.report import figures
    from crop.report.intervals import benign_return_range

    ep = pd.DataFrame({"episode": range(5), "return": [200.0, 200.0, 200.0, 178.0, 200.0], "steps": [200] * 5})
    assert benign_return_range("CartPole-v0", ep) == (0.0, 200.0)
    assert benign_return_range("Acrobot-v1", ep) == (-math.inf, math.inf)   # no reward facts: not clipped
    assert benign_return_range("Acrobot-v1", ep, {"reward_range": [-1.0, 0.0]}) == (-200.0, 0.0)
    run = {"loact_episodes": ep, "benign_range": benign_return_range("CartPole-v0", ep)}
    v, lo, hi = episode_interval(run, "benign_return")
    unclipped = episode_interval({"loact_episodes": ep}, "benign_return")
    assert v == pytest.approx(195.6) and unclipped[2] > 200 and hi == 200.0 and lo == unclipped[1]
    # a mean outside [J_min, J_max] shows the reward facts are false: nothing is clipped to them
    assert episode_interval({**run, "benign_range": (0.0, 150.0)}, "benign_return")[1:] == unclipped[1:]
    iv = run_interval({**run, "replicates": [{"loact_episodes": ep.assign(**{"return": 199.0})}]}, "benign_return")
    assert iv["hi"] == 200.0
    fig = figures._clean_figure("CartPole-v0", {("CartPole-v0", "StdTrain", "0.1"): {**run, "loact": None}},
                                ["StdTrain"], ["0.1"])
    seg = fig.axes[0].containers[0].lines[2][0].get_segments()[0]
    assert seg[1][1] == pytest.approx(200.0) and seg[0][1] == pytest.approx(lo)
    # clipping never loses coverage: the true mean lies in [J_min, J_max], so whenever the t-interval covers
    # it, the clipped one does too
    rng, truth = np.random.default_rng(0), 200 - 6 * stats.norm.expect(lambda z: z - 4 / 6, lb=4 / 6)
    for _ in range(500):   # episodes of a policy near its maximum: E[min(200, 196 + 6Z)]
        e = pd.DataFrame({"episode": range(6), "return": np.minimum(200.0, 196 + 6 * rng.standard_normal(6)),
                          "steps": [200] * 6})
        _, lo0, hi0 = episode_interval({"loact_episodes": e}, "benign_return")
        _, lo, hi = episode_interval({"loact_episodes": e, "benign_range": (0.0, 200.0)}, "benign_return")
        assert hi <= 200.0 and (not lo0 <= truth <= hi0 or lo <= truth <= hi)
