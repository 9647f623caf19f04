"""V-range estimation (Appendix B.1): the three methods against a network whose smoothed Q is known."""
import numpy as np
import pytest
import torch
from scipy.stats import norm

from crop.envs import make_env, to_obs
from crop.qrange import estimate_qrange

torch.set_num_threads(1)

SIGMA, M, HORIZON = 0.5, 20000, 12
SEEDS = [11, 12]
COEF = torch.tensor([3.0, 1.0])   # Q_a(s) = COEF_a · relu(w·s): action 0 is always (weakly) best


class ReluProbe(torch.nn.Module):
    """Q(s) = COEF · relu(w·s) with ‖w‖ = 1, so w·(s + Δ) = w·s + σZ and the smoothed value is in closed form:
    E relu(u + σZ) = u Φ(u/σ) + σ φ(u/σ)."""

    def __init__(self):
        super().__init__()
        self.w = torch.tensor([0.5, 0.5, 0.5, 0.5])

    def forward(self, x):
        return torch.relu(x @ self.w)[:, None] * COEF


def _visited_states():
    """The states the rollouts visit: action 0 every step (COEF makes it the argmax of every mean)."""
    out = []
    for s in SEEDS:
        env = make_env("CartPole-v0")
        obs, _ = env.reset(seed=s)
        for _ in range(HORIZON):
            out.append(to_obs(obs))
            obs, _, term, trunc, _ = env.step(0)
            if term or trunc:
                break
    return np.array(out)


def _estimate(method, **kw):
    return estimate_qrange("CartPole-v0", ReluProbe(), SIGMA, M, len(SEEDS), HORIZON, SEEDS, seed=7,
                           chunk=5000, progress=False, method=method, **kw)


def test_smoothed_range_is_the_closed_form_extremes():
    u = _visited_states() @ np.array([0.5, 0.5, 0.5, 0.5])
    smooth = u * norm.cdf(u / SIGMA) + SIGMA * norm.pdf(u / SIGMA)        # E relu(u + σZ)
    q = np.outer(smooth, COEF.numpy())                                     # smoothed Q of every (s, a)
    res = _estimate("smoothed")
    assert res["method"] == "smoothed" and res["states"] == len(u)
    # Monte-Carlo error of a mean of m samples of COEF_a·relu(·) ≤ COEF_a·(|u| + σ)-ish; 5 standard errors
    tol = 5 * float(COEF.max()) * (SIGMA + np.abs(u).max()) / np.sqrt(M)
    assert res["v_min"] == pytest.approx(q.min(), abs=tol)
    assert res["v_max"] == pytest.approx(q.max(), abs=tol)


def test_methods_nest_on_the_same_states():
    """The three methods visit the same states with the same noise: smoothed ⊆ quantile ⊆ samples."""
    sm, qu, sa = _estimate("smoothed"), _estimate("quantile", quantile=0.01), _estimate("samples")
    assert sm["states"] == qu["states"] == sa["states"]
    assert sa["v_min"] <= qu["v_min"] <= sm["v_min"] < sm["v_max"] <= qu["v_max"] <= sa["v_max"]
    # relu outputs 0 on a large share of the noisy samples: the samples' minimum is exactly 0
    assert sa["v_min"] == 0.0
    assert qu["quantile"] == 0.01 and sm["quantile"] is None


def test_samples_method_is_todays_range():
    """``samples`` keeps the old procedure's numbers: the extremes of every single noisy output."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    res = estimate_qrange("CartPole-v0", net, 0.1, 300, 1, 5, [3], seed=1, chunk=100, progress=False,
                          method="samples")
    g = torch.Generator().manual_seed(1)
    env = make_env("CartPole-v0")
    obs, _ = env.reset(seed=3)
    lo, hi = np.inf, -np.inf
    with torch.no_grad():
        for _ in range(5):
            x = torch.as_tensor(to_obs(obs))
            qs = [net(torch.randn((100, 4), generator=g).mul_(0.1).add_(x)) for _ in range(3)]
            q = torch.cat(qs)
            lo, hi = min(lo, float(q.min())), max(hi, float(q.max()))
            obs, _, term, trunc, _ = env.step(int(torch.argmax(q.sum(0, dtype=torch.float64))))
            if term or trunc:
                break
    assert (res["v_min"], res["v_max"]) == (lo, hi)


@pytest.mark.parametrize("kw", [{"method": "median"}, {"method": "quantile", "quantile": 0.5},
                                {"method": "quantile", "quantile": None}])
def test_bad_method_settings_are_refused(kw):
    with pytest.raises(ValueError):
        estimate_qrange("CartPole-v0", ReluProbe(), SIGMA, 10, 1, 2, SEEDS, seed=0, progress=False, **kw)
