"""SmoothedQ (Eq. (2)) and LoAct's certificate: fresh noise, determinism, NaN handling, soundness."""
import numpy as np
import pytest
import torch

from crop.attack import pgd_l2
from crop.loact import certify_state
from crop.smoothing import NonFiniteQError, SmoothedQ


def test_fresh_noise_for_every_state_and_reproducible_by_seed(mlp_factory):
    net = mlp_factory(seed=1)
    x = np.zeros(4, np.float32)
    a = SmoothedQ(net, 0.5, 2000, -5, 5, 0.05, 2, seed=3)
    m1, m2 = a.estimate(x).mean, a.estimate(x).mean
    assert not np.array_equal(m1, m2), "the same noise was reused for a second state"
    b = SmoothedQ(net, 0.5, 2000, -5, 5, 0.05, 2, seed=3)
    np.testing.assert_array_equal(b.estimate(x).mean, m1)
    np.testing.assert_array_equal(b.estimate(x).mean, m2)


def test_chunking_does_not_change_the_estimate(mlp_factory):
    net = mlp_factory(seed=2)
    x = np.full(4, 0.3, np.float32)
    ests = [SmoothedQ(net, 0.2, 3000, -5, 5, 0.05, 2, seed=9, chunk=c).estimate(x) for c in (3000, 1000)]
    # Different chunking draws the same stream of normals in the same order.
    np.testing.assert_allclose(ests[0].mean, ests[1].mean, rtol=1e-6)


def test_clipping_to_the_q_range(mlp_factory):
    net = mlp_factory(seed=4, scale=30.0)
    e = SmoothedQ(net, 1.0, 1000, -0.5, 0.5, 0.05, 2, seed=0).estimate(np.ones(4, np.float32))
    assert np.all(e.mean >= -0.5) and np.all(e.mean <= 0.5)
    assert np.all(e.lower >= -0.5) and np.all(e.upper <= 0.5)


class _NaNAfter(torch.nn.Module):
    def forward(self, x):
        q = torch.stack([x[:, 0], -x[:, 0]], 1)
        q[0, 0] = float("nan")
        return q


def test_nan_q_values_abort_with_state_index():
    sm = SmoothedQ(_NaNAfter(), 0.1, 100, -1, 1, 0.05, 2)
    with pytest.raises(NonFiniteQError, match="state 7"):
        sm.estimate(np.zeros(4, np.float32), index=7)


@pytest.mark.parametrize("bad", [dict(sigma=0.0), dict(sigma=-1.0), dict(m=0), dict(alpha=1.5),
                                 dict(v_min=1.0, v_max=1.0)])
def test_bad_parameters_are_refused(mlp_factory, bad):
    kw = dict(sigma=0.1, m=10, v_min=-1.0, v_max=1.0, alpha=0.05)
    kw.update(bad)
    with pytest.raises(ValueError):
        SmoothedQ(mlp_factory(), n_actions=2, **kw)


def test_radius_cannot_be_beaten_by_pgd(mlp_factory):
    """Soundness of Theorem 1: PGD with restarts at 0.99 × the certified radius never changes the smoothed
    action, judged with 40× more samples than the certificate used."""
    torch.manual_seed(0)
    sigma, certified = 0.5, 0
    for net_seed in range(3):
        net = mlp_factory(n_in=2, n_out=3, hidden=(16, 16), seed=net_seed, scale=2.0)
        states = np.random.default_rng(net_seed).normal(size=(8, 2)).astype(np.float32)
        with torch.no_grad():  # V range from independent noise, as the qrange stage does
            q = net(torch.as_tensor(states).repeat(1000, 1) + sigma * torch.randn(8000, 2))
        lo, hi = float(q.min()), float(q.max())
        cert_sm = SmoothedQ(net, sigma, 10000, lo, hi, 0.05, 3, seed=net_seed)
        judge = SmoothedQ(net, sigma, 400000, lo, hi, 0.05, 3, seed=100 + net_seed, chunk=100000)
        for s in states:
            c = certify_state(cert_sm, s)
            if not c.certified:
                continue
            certified += 1
            bank = torch.randn(512, 2) * sigma
            x = torch.as_tensor(s).unsqueeze(0).repeat(16, 1)
            x = x + 1e-3 * torch.randn_like(x)  # restarts

            def loss(z):
                q = net((z.unsqueeze(1) + bank).flatten(0, 1)).reshape(len(z), 512, 3).mean(1)
                others = q.clone()
                others[:, c.action] = -1e9
                return others.max(1).values - q[:, c.action]

            eps = torch.full((16,), 0.99 * c.radius)
            delta = pgd_l2(loss, x, eps, steps=30)
            assert torch.all(delta.norm(dim=1) <= 0.99 * c.radius * (1 + 1e-5))
            for d in delta:
                a = judge.estimate((torch.as_tensor(s) + d).numpy()).action
                assert a == c.action, f"action changed inside the certified radius {c.radius}"
    assert certified >= 5, "too few certified states for the test to mean anything"


class _HalfSpaces(torch.nn.Module):
    """Q(x, a) ≈ 1{x·w_a > b_a}: the case where Theorem 1's radius is nearly tight (Cohen et al.), so a
    radius computed even slightly too large is caught by the attack."""

    def __init__(self, w, b, k=2000.0):
        super().__init__()
        self.w = torch.as_tensor(w, dtype=torch.float32)
        self.b = torch.as_tensor(b, dtype=torch.float32)
        self.k = k

    def forward(self, x):
        return torch.sigmoid(self.k * (x @ self.w.T - self.b))


def test_nearly_tight_radius_is_not_beaten_and_is_close_to_the_boundary():
    sigma = 0.5
    net = _HalfSpaces([[1.0, 0.0], [-1.0, 0.0]], [0.0, 0.0])
    sm = SmoothedQ(net, sigma, 10000, 0.0, 1.0, 0.05, 2, seed=1)
    judge = SmoothedQ(net, sigma, 400000, 0.0, 1.0, 0.05, 2, seed=2, chunk=100000)
    bank = torch.randn(4096, 2) * sigma
    for x1 in (0.2, 0.4, 0.8):
        s = np.array([x1, 0.3], np.float32)
        c = certify_state(sm, s)
        assert c.certified and c.action == 0
        # The smoothed decision boundary is x₁ = 0: the radius is below the distance, and not far below.
        assert 0.8 * x1 < c.radius < x1

        def loss(z):
            q = net((z.unsqueeze(1) + bank).flatten(0, 1)).reshape(len(z), -1, 2).mean(1)
            return q[:, 1] - q[:, 0]

        x = torch.as_tensor(s).repeat(8, 1) + 1e-3 * torch.randn(8, 2)
        for factor, must_hold in ((0.99, True), (1.25, False)):
            delta = pgd_l2(loss, x, torch.full((8,), factor * x1 if not must_hold else factor * c.radius), steps=40)
            acts = {judge.estimate((torch.as_tensor(s) + d).numpy()).action for d in delta}
            if must_hold:
                assert acts == {0}, f"action changed inside the certified radius at x1={x1}"
            else:  # beyond the true boundary the attack must succeed: the test can fail
                assert 1 in acts
