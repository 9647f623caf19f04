"""V-range estimation (Appendix B.1): the three methods against a network whose smoothed Q is known."""
import numpy as np
import pytest
import torch
from scipy.stats import norm

from crop.certify.qrange import QRangeSettings, estimate_qrange
from crop.envs import make_env, to_obs

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
    return estimate_qrange("CartPole-v0", ReluProbe(), QRangeSettings(SIGMA, M, len(SEEDS), HORIZON, SEEDS, seed=7,
                                                                      chunk=5000, method=method, **kw), progress=False)


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


def _reference_lockstep(net, sigma, m, seeds, horizon, seed, rows):
    """An independent re-implementation of the documented stream layout: time step after time step, the live
    episodes' states (in episode order) get m samples each, drawn state-major in randn blocks of ``rows``
    rows (⌊rows/m⌋ whole states per block, or pieces of one state); the smallest/largest single output, the
    actions from the unclipped means."""
    g = torch.Generator().manual_seed(seed)
    envs = [make_env("CartPole-v0") for _ in seeds]
    obs = [to_obs(e.reset(seed=s)[0]) for e, s in zip(envs, seeds)]
    live, lo, hi, lengths = list(range(len(seeds))), np.inf, -np.inf, [0] * len(seeds)
    with torch.no_grad():
        for _ in range(horizon):
            if not live:
                break
            per_state = {b: [] for b in range(len(live))}
            if rows >= m:
                per = rows // m
                for s0 in range(0, len(live), per):
                    k = min(per, len(live) - s0)
                    z = torch.randn((k * m, 4), generator=g)
                    for j in range(k):
                        per_state[s0 + j].append(z[j * m:(j + 1) * m])
            else:
                for b in range(len(live)):
                    for j0 in range(0, m, rows):
                        per_state[b].append(torch.randn((min(rows, m - j0), 4), generator=g))
            still = []
            for b, ep in enumerate(live):
                q = net(torch.cat(per_state[b]) * sigma + torch.as_tensor(obs[ep]))
                lo, hi = min(lo, float(q.min())), max(hi, float(q.max()))
                o, _, term, trunc, _ = envs[ep].step(int(torch.argmax(q.sum(0, dtype=torch.float64))))
                obs[ep] = to_obs(o)
                lengths[ep] += 1
                if not (term or trunc):
                    still.append(ep)
            live = still
    return lo, hi, lengths


@pytest.mark.parametrize("block_floats", [None, 4 * 2 * 300, 4 * 120])
def test_samples_method_follows_the_documented_lockstep_stream(monkeypatch, block_floats):
    """``samples`` in lockstep reproduces an independent implementation of the documented noise layout
    exactly: several states per block, one state per block, and pieces of one state (small blocks)."""
    import crop.certify.qrange

    if block_floats is not None:
        monkeypatch.setattr(crop.certify.qrange, "NOISE_BLOCK_FLOATS", block_floats)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    seeds, horizon, m = [3, 4, 5], 40, 300
    res = estimate_qrange("CartPole-v0", net, QRangeSettings(0.1, m, len(seeds), horizon, seeds, seed=1, chunk=50,
                                                             method="samples"), progress=False)
    rows = max(50, crop.certify.qrange.NOISE_BLOCK_FLOATS // 4)
    lo, hi, lengths = _reference_lockstep(net, 0.1, m, seeds, horizon, 1, rows)
    assert len(set(lengths)) > 1, "episodes must end at different steps for the test to bite"
    assert res["states"] == sum(lengths)
    assert (res["v_min"], res["v_max"]) == pytest.approx((lo, hi), rel=1e-6, abs=1e-6)


def test_lockstep_is_deterministic_for_a_seed():
    a = estimate_qrange("CartPole-v0", ReluProbe(), QRangeSettings(SIGMA, 500, 2, HORIZON, SEEDS, seed=3,
                                                                   method="quantile", quantile=0.05), progress=False)
    b = estimate_qrange("CartPole-v0", ReluProbe(), QRangeSettings(SIGMA, 500, 2, HORIZON, SEEDS, seed=3,
                                                                   method="quantile", quantile=0.05), progress=False)
    c = estimate_qrange("CartPole-v0", ReluProbe(), QRangeSettings(SIGMA, 500, 2, HORIZON, SEEDS, seed=4,
                                                                   method="quantile", quantile=0.05), progress=False)
    assert a == b and (a["v_min"], a["v_max"]) != (c["v_min"], c["v_max"])


@pytest.mark.parametrize("kw", [{"method": "median"}, {"method": "quantile", "quantile": 0.5},
                                {"method": "quantile", "quantile": None}])
def test_bad_method_settings_are_refused(kw):
    with pytest.raises(ValueError):
        QRangeSettings(SIGMA, 10, 1, 2, SEEDS, seed=0, **kw)
