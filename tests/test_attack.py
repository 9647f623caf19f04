"""ℓ2 PGD (Appendix E) stays inside its budget exactly: ‖δ‖ ≤ ε as computed in float32, also for the
perturbation (x + δ) − x that the network sees, and the projection is the nearest point up to rounding."""
import numpy as np
import pandas as pd
import pytest
import torch

from crop.certify.attack import LocalAttackSettings, pgd_l2, project_l2, run_local_attack
from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings


def _norms(d):
    return d.flatten(1).norm(dim=1)


def _cases(shape, n=4000, seed=0):
    """Random δ at every scale: on the sphere (ε·u/‖u‖ rounded in float32), just outside and inside it,
    far outside, tiny and huge ε."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn((n, *shape), generator=g)
    eps = torch.exp(torch.empty(n).uniform_(-12, 6, generator=g)).float()
    eps[:50] = 0.0
    on = u / _norms(u).reshape(-1, *[1] * len(shape)) * eps.reshape(-1, *[1] * len(shape))
    kind = torch.randint(0, 4, (n,), generator=g)
    factor = torch.tensor([1.0, 1.0 + 1e-7, 0.999, 7.5])[kind].reshape(-1, *[1] * len(shape))
    return on * factor, eps


@pytest.mark.parametrize("shape", [(4,), (25,), (3, 11, 13)])
def test_projection_keeps_the_float32_norm_within_eps(shape):
    delta, eps = _cases(shape)
    view = (-1,) + (1,) * len(shape)
    naive = delta * torch.clamp(eps.reshape(view) / _norms(delta).clamp_min(1e-12).reshape(view), max=1.0)
    assert (_norms(naive) > eps).sum() > 20, "the cases must include ones the plain scaling gets wrong"
    out = project_l2(delta, eps)
    assert out.dtype == torch.float32 and torch.all(_norms(out) <= eps)
    inside = _norms(delta) <= eps
    assert torch.equal(out[inside], delta[inside])  # nothing to do: unchanged, bit for bit
    # the nearest point of the ball, up to a few ulps: same direction, norm ε to float32 precision
    outside = ~inside & (eps > 0)
    assert torch.all(_norms(out[outside]) >= eps[outside] * (1 - 1e-5))
    cos = (out[outside] * delta[outside]).flatten(1).sum(1) / (_norms(out[outside]) * _norms(delta[outside]))
    assert torch.all(cos > 1 - 1e-5)


def test_projection_bounds_the_perturbation_the_network_sees():
    """(x + δ) − x rounds too (|x| ≫ ε): given x, that perturbation is within ε as well."""
    delta, eps = _cases((4,), seed=1)
    x = torch.randn(delta.shape, generator=torch.Generator().manual_seed(2)) * 100
    seen = ((x + delta) - x)
    assert (_norms(seen) > eps).sum() > 20, "rounding of x + δ must matter for the test to bite"
    out = project_l2(delta, eps, x)
    assert torch.all(_norms(out) <= eps) and torch.all(_norms((x + out) - x) <= eps)


def test_pgd_stays_within_eps_and_finds_the_linear_optimum():
    """Linear loss w·(x+δ): the optimum is δ = ε·w/‖w‖; PGD reaches it without leaving the ball."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 6, generator=g) * 3
    w = torch.randn(6, generator=g)
    eps = torch.exp(torch.empty(500).uniform_(-8, 1, generator=g))
    delta = pgd_l2(lambda z: z @ w, x, eps, steps=10)
    assert torch.all(_norms(delta) <= eps) and torch.all(_norms((x + delta) - x) <= eps)
    best = (eps[:, None] * w / w.norm()) @ w
    # short of the optimum only by the rounding of x + δ (a few ulps of x per coordinate) and ~1e-4 of PGD
    ulp = np.spacing(x.abs().max(1).values.numpy()) * np.sqrt(6) * float(w.norm())
    assert np.all((delta @ w).numpy() <= best.numpy() * (1 + 1e-6))
    assert np.all((delta @ w).numpy() >= best.numpy() * (1 - 1e-4) - 4 * ulp)


class _SpySmoother(SmoothedNetwork):
    """Records the size of every smoothing call."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batches = []

    def estimate_batch(self, obs_batch, indices=None, alpha=None):
        self.batches.append(len(obs_batch))
        return super().estimate_batch(obs_batch, indices, alpha)


def test_local_attack_smooths_each_step_in_two_batched_calls(mlp_factory):
    """At every time step the clean states of all live runs are smoothed in one call and the attacked
    states in another; a seed fixes the result; a flip at a step certified beyond ε does not happen."""
    eps_grid, seeds, horizon = [0.0, 0.05, 0.3], [1, 2], 15
    tables = []
    for _ in range(2):
        net = mlp_factory(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0)
        sm = _SpySmoother(net, SmoothingSettings(0.1, 400, -4.0, 4.0, 0.01, seed=5), 2)
        table = run_local_attack("CartPole-v0", sm, LocalAttackSettings(eps_grid, seeds, horizon, m_grad=32, seed=3),
                                 progress=False)
        tables.append(table)
    steps = table["steps"].to_numpy()
    live = [int((steps > t).sum()) for t in range(int(steps.max()))]
    assert sm.batches == [n for n in live for _ in range(2)] and max(sm.batches) == len(eps_grid) * len(seeds)
    assert tables[0].equals(tables[1])
    assert (table["flips_certified"] == 0).all()
    assert table.loc[table["eps"] == 0.3, "flips"].sum() > 0, "the attack must flip some actions to bite"


def test_local_attack_records_every_attacked_step(mlp_factory):
    """``steps_out`` gets one row per attacked step, whose flips beyond ε are the table's ``flips_certified`` and
    whose first state, for every ε, is the same initial state (LoRe's s₀ for episode 0); recording changes
    nothing of the attack."""
    eps_grid, seeds, horizon = [0.0, 0.3], [1, 2], 8
    net = mlp_factory(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0)
    plain = run_local_attack("CartPole-v0", SmoothedNetwork(net, SmoothingSettings(0.1, 400, -4.0, 4.0, 0.01, seed=5),
                                                            2),
                             LocalAttackSettings(eps_grid, seeds, horizon, m_grad=32, seed=3), progress=False)
    rows: list = []
    table = run_local_attack("CartPole-v0", SmoothedNetwork(net, SmoothingSettings(0.1, 400, -4.0, 4.0, 0.01, seed=5),
                                                            2),
                             LocalAttackSettings(eps_grid, seeds, horizon, m_grad=32, seed=3), progress=False,
                             steps_out=rows)
    steps = pd.DataFrame(rows)
    assert table.equals(plain) and len(steps) == table["steps"].sum()
    beyond = steps["certified"] & (steps["radius"] > steps["eps"]) & (steps["action"] != steps["clean_action"])
    per_run = beyond.groupby([steps["eps"], steps["episode"]]).sum()
    assert [int(per_run[(e, ep)]) for e, ep in zip(table["eps"], table["episode"])] == table["flips_certified"].tolist()
    flips = (steps["action"] != steps["clean_action"]).groupby([steps["eps"], steps["episode"]]).sum()
    assert [int(flips[(e, ep)]) for e, ep in zip(table["eps"], table["episode"])] == table["flips"].tolist()
    first = steps[(steps["step"] == 0) & (steps["episode"] == 0)]["obs_digest"]
    assert len(first) == len(eps_grid) and first.nunique() == 1
    assert (steps["smoothed_top_lower"] > steps["smoothed_others_upper_max"])[steps["certified"]].all()


def test_local_attack_records_the_return_before_each_step_as_lore_sums_it(mlp_factory):
    """``return_so_far`` at step t is Σ_{k<t} γ^k r_k summed step by step as LoRe sums a node's return (J ← J +
    γ^t·r), bit for bit, and the last step's plus its own reward is the episode's return: what lets the audit
    stop a LoRe check where the return already secures the bound."""
    net = mlp_factory(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0)
    rows: list = []
    gamma = 0.9
    table = run_local_attack("CartPole-v0", SmoothedNetwork(net, SmoothingSettings(0.1, 200, -4.0, 4.0, 0.01, seed=5),
                                                            2),
                             LocalAttackSettings([0.0, 0.3], [1, 2], 12, m_grad=16, seed=3, gamma=gamma),
                             progress=False, steps_out=rows)
    steps = pd.DataFrame(rows)
    for (eps, ep), g in steps.groupby(["eps", "episode"]):
        j, want = 0.0, []
        for t in g["step"]:
            want.append(j)
            j = j + (gamma ** t) * 1.0   # CartPole's reward is 1 per step
        assert g["return_so_far"].tolist() == want
        assert j == table[(table["eps"] == eps) & (table["episode"] == ep)]["return"].item()
