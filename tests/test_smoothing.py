"""SmoothedNetwork (Eq. (2)) and LoAct's certificate: fresh noise, determinism, NaN handling, soundness."""
import numpy as np
import pytest
import torch

from crop.certify.attack import pgd_l2
from crop.certify.loact import certify_state
from crop.smoothing.smoothed import BOUNDS, NonFiniteOutputError, SmoothedNetwork, SmoothingSettings


def test_fresh_noise_for_every_state_and_reproducible_by_seed(mlp_factory):
    net = mlp_factory(seed=1)
    x = np.zeros(4, np.float32)
    a = SmoothedNetwork(net, SmoothingSettings(0.5, 2000, -5, 5, 0.05, seed=3), 2)
    m1, m2 = a.estimate(x).mean, a.estimate(x).mean
    assert not np.array_equal(m1, m2), "the same noise was reused for a second state"
    b = SmoothedNetwork(net, SmoothingSettings(0.5, 2000, -5, 5, 0.05, seed=3), 2)
    np.testing.assert_array_equal(b.estimate(x).mean, m1)
    np.testing.assert_array_equal(b.estimate(x).mean, m2)


def test_chunking_does_not_change_the_estimate(mlp_factory):
    net = mlp_factory(seed=2)
    x = np.full(4, 0.3, np.float32)
    ests = [SmoothedNetwork(net, SmoothingSettings(0.2, 3000, -5, 5, 0.05, chunk=c, seed=9), 2).estimate(x)
            for c in (3000, 1000)]
    # Different chunking draws the same stream of normals in the same order.
    np.testing.assert_allclose(ests[0].mean, ests[1].mean, rtol=1e-6)


@pytest.mark.parametrize("bound", sorted(BOUNDS))
def test_clipping_to_the_q_range(mlp_factory, bound):
    net = mlp_factory(seed=4, scale=30.0)
    e = SmoothedNetwork(net, SmoothingSettings(1.0, 1000, -0.5, 0.5, 0.05, bound=bound, seed=0), 2).estimate(
        np.ones(4, np.float32))
    assert np.all(e.mean >= -0.5) and np.all(e.mean <= 0.5)
    assert np.all(e.lower >= -0.5) and np.all(e.upper <= 0.5)


class _NaNAfter(torch.nn.Module):
    def forward(self, x):
        q = torch.stack([x[:, 0], -x[:, 0]], 1)
        q[0, 0] = float("nan")
        return q


def test_nan_q_values_abort_with_state_index():
    sm = SmoothedNetwork(_NaNAfter(), SmoothingSettings(0.1, 100, -1, 1, 0.05), 2)
    with pytest.raises(NonFiniteOutputError, match="state 7"):
        sm.estimate(np.zeros(4, np.float32), index=7)


@pytest.mark.parametrize("bad", [dict(sigma=0.0), dict(sigma=-1.0), dict(m=0), dict(alpha=1.5),
                                 dict(v_min=1.0, v_max=1.0)])
def test_bad_parameters_are_refused(mlp_factory, bad):
    kw = dict(sigma=0.1, m=10, v_min=-1.0, v_max=1.0, alpha=0.05)
    kw.update(bad)
    with pytest.raises(ValueError):
        SmoothedNetwork(mlp_factory(), SmoothingSettings(**kw), n_actions=2)


def _margins(net, s, deltas, action, sigma, generator, n=4096):
    """Smoothed margin (best other action minus ``action``) at s + δ for every δ, on a fresh noise bank."""
    with torch.no_grad():
        fresh = torch.randn(n, s.numel(), generator=generator) * sigma
        q = torch.stack([net(s + d + fresh).mean(0) for d in deltas])
        others = q.clone()
        others[:, action] = -1e9
        return others.max(1).values - q[:, action]


def _project(perturbation, radius):
    """Scale each row into the closed ℓ2 ball of its radius."""
    norm = perturbation.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return perturbation * torch.clamp(radius.reshape(-1, 1) / norm, max=1.0)


@pytest.mark.slow
def test_radius_cannot_be_beaten_by_pgd(mlp_factory):
    """Soundness of Theorem 1 with every bound: PGD with 16 restarts at 0.99 × the certified radius never
    changes the smoothed action, judged (for the 2 restarts per bound that a fresh noise bank rates most
    adversarial) with 40× more samples than the certificate used.  All bounds of a state share one batched
    attack (the action is the same for every bound: same noise, same means)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    sigma, restarts = 0.5, 16
    certified = dict.fromkeys(BOUNDS, 0)
    for net_seed in range(3):
        net = mlp_factory(n_in=2, n_out=3, hidden=(16, 16), seed=net_seed, scale=2.0)
        states = np.random.default_rng(net_seed).normal(size=(8, 2)).astype(np.float32)
        with torch.no_grad():  # V range from independent noise, as the qrange stage does
            q = net(torch.as_tensor(states).repeat(1000, 1) + sigma * torch.randn(8000, 2))
        lo, hi = float(q.min()), float(q.max())
        smoothers = {b: SmoothedNetwork(net, SmoothingSettings(sigma, 10000, lo, hi, 0.05, bound=b, seed=net_seed), 3)
                     for b in BOUNDS}
        judge = SmoothedNetwork(net, SmoothingSettings(sigma, 400000, lo, hi, 0.05, chunk=100000,
                                                       seed=100 + net_seed), 3)
        for s in states:
            certs = {b: certify_state(sm, s) for b, sm in smoothers.items()}
            certs = {b: c for b, c in certs.items() if c.certified}
            if not certs:
                continue
            action = {c.action for c in certs.values()}
            assert len(action) == 1, "the smoothed action must not depend on the bound"
            action = action.pop()
            names = list(certs)
            for b in names:
                certified[b] += 1
            radius = torch.tensor([0.99 * certs[b].radius for b in names]).repeat_interleave(restarts)
            s_t = torch.as_tensor(s)
            x = s_t.repeat(len(radius), 1) + 1e-3 * torch.randn(len(radius), 2)  # restarts
            bank = torch.randn(512, 2) * sigma

            def loss(z):
                q = net((z.unsqueeze(1) + bank).flatten(0, 1)).reshape(len(z), 512, 3).mean(1)
                others = q.clone()
                others[:, action] = -1e9
                return others.max(1).values - q[:, action]

            delta = pgd_l2(loss, x, radius, steps=30)
            adv = _project(x + delta - s_t, radius)  # the whole perturbation, restart offset included
            assert torch.all(adv.norm(dim=1) <= radius * (1 + 1e-5))
            margin = _margins(net, s_t, adv, action, sigma, gen).reshape(len(names), restarts)
            for j, b in enumerate(names):
                for i in torch.topk(margin[j], 2).indices:
                    a = judge.estimate((s_t + adv[j * restarts + i]).numpy()).action
                    assert a == action, f"{b}: action changed inside the certified radius {certs[b].radius}"
    assert all(n >= 5 for n in certified.values()), f"too few certified states for the test to bite: {certified}"


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


@pytest.mark.slow
def test_nearly_tight_radius_is_not_beaten_and_is_close_to_the_boundary():
    """For every bound: the radius lies below the true distance to the smoothed decision boundary (and not
    far below it), and PGD at 0.99 × the radius fails while PGD at 1.25 × the distance succeeds."""
    sigma = 0.5
    net = _HalfSpaces([[1.0, 0.0], [-1.0, 0.0]], [0.0, 0.0])
    judge = SmoothedNetwork(net, SmoothingSettings(sigma, 400000, 0.0, 1.0, 0.05, chunk=100000, seed=2), 2)
    bank = torch.randn(4096, 2) * sigma
    gen = torch.Generator().manual_seed(3)

    def loss(z):
        q = net((z.unsqueeze(1) + bank).flatten(0, 1)).reshape(len(z), -1, 2).mean(1)
        return q[:, 1] - q[:, 0]

    for x1 in (0.2, 0.4, 0.8):
        s = np.array([x1, 0.3], np.float32)
        s_t = torch.as_tensor(s)
        x = s_t.repeat(8, 1) + 1e-3 * torch.randn(8, 2)
        for b in BOUNDS:
            c = certify_state(SmoothedNetwork(net, SmoothingSettings(sigma, 10000, 0.0, 1.0, 0.05, bound=b, seed=1),
                                              2), s)
            assert c.certified and c.action == 0, b
            # The smoothed decision boundary is x₁ = 0: the radius is below the distance, and not far below.
            assert 0.8 * x1 < c.radius < x1, (b, x1, c.radius)
            radius = torch.full((8,), 0.99 * c.radius)
            adv = _project(x + pgd_l2(loss, x, radius, steps=40) - s_t, radius)
            for i in torch.topk(_margins(net, s_t, adv, 0, sigma, gen), 3).indices:
                a = judge.estimate((s_t + adv[i]).numpy()).action
                assert a == 0, f"{b}: action changed inside the certified radius at x1={x1}"
        # beyond the true boundary the attack must succeed: the test can fail
        delta = pgd_l2(loss, x, torch.full((8,), 1.25 * x1), steps=40)
        assert 1 in {judge.estimate((torch.as_tensor(s) + d).numpy()).action for d in delta}


def test_every_bound_is_offered_by_the_cli_and_the_schema():
    from crop.schema import load_schema
    from crop.workflow.cli import BOUND_NAMES

    assert sorted(BOUND_NAMES) == sorted(BOUNDS)
    assert sorted(load_schema()["properties"]["bound"]["enum"]) == sorted(BOUNDS)
    assert load_schema()["properties"]["bound"]["default"] == "hoeffding"
    assert load_schema()["properties"]["alpha_mode"]["default"] == "state"


def test_the_bound_never_changes_the_noise_or_the_action(mlp_factory):
    """Every bound sees the same noise stream (clopper_pearson rounds with its own generator), so the
    means — and the smoothed policy's action — do not depend on the choice of bound."""
    net = mlp_factory(n_in=4, n_out=3, seed=6)
    x = np.full(4, 0.2, np.float32)
    ests = {b: SmoothedNetwork(net, SmoothingSettings(0.3, 2000, -5, 5, 0.05, bound=b, seed=4), 3).estimate(x)
            for b in BOUNDS}
    for b, e in ests.items():
        np.testing.assert_array_equal(e.mean, ests["hoeffding"].mean)
        assert e.bound == b
    cp = [SmoothedNetwork(net, SmoothingSettings(0.3, 2000, -5, 5, 0.05, bound="clopper_pearson", seed=4),
                          3).estimate(x)
          for _ in range(2)]
    np.testing.assert_array_equal(cp[0].lower, cp[1].lower)  # the rounding is seeded


@pytest.mark.parametrize("bound", sorted(BOUNDS))
def test_per_call_alpha_overrides_the_smoothers_alpha(mlp_factory, bound):
    net = mlp_factory(n_in=4, n_out=2, seed=7)
    x = np.zeros(4, np.float32)
    wide = SmoothedNetwork(net, SmoothingSettings(0.3, 3000, -5, 5, 0.05, bound=bound, seed=1), 2).estimate(x,
                                                                                                            alpha=1e-6)
    base = SmoothedNetwork(net, SmoothingSettings(0.3, 3000, -5, 5, 0.05, bound=bound, seed=1), 2).estimate(x)
    assert wide.alpha == 1e-6 and base.alpha == 0.05
    np.testing.assert_array_equal(wide.mean, base.mean)
    if bound != "clopper_pearson":  # (randomised rounding differs draw by draw; its width still grows)
        assert np.all(wide.lower <= base.lower) and np.all(wide.upper >= base.upper)
    assert np.all(wide.upper - wide.lower > base.upper - base.lower)


def test_exact_ties_of_the_clipped_means_are_broken_by_the_unclipped_means():
    """Every sample of both actions clipped to V_min: the clipped means tie exactly, the smoothed policy takes
    the action whose unclipped mean is larger (not always action 0), and the step is not certified."""
    from crop.certify.loact import certify_state
    from crop.smoothing.smoothed import SmoothedNetwork

    net = torch.nn.Linear(4, 2)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.copy_(torch.tensor([-3.0, -2.0]))          # both far below V_min = 0
    sm = SmoothedNetwork(net, SmoothingSettings(0.1, 500, 0.0, 1.0, 0.05, seed=0), 2)
    cert = certify_state(sm, np.zeros(4, np.float32))
    est = cert.estimate
    assert est.mean[0] == est.mean[1] == 0.0
    assert cert.action == 1 and not cert.certified and cert.radius == 0.0
    np.testing.assert_allclose(est.raw_mean, [-3.0, -2.0])
    # no tie: the clipped means decide, whatever the unclipped ones say
    with torch.no_grad():
        net.bias.copy_(torch.tensor([0.6, 0.4]))
    assert certify_state(sm, np.zeros(4, np.float32)).action == 0


def test_the_smoother_and_its_engine_read_sigma_and_the_others_from_their_settings():
    """σ, m, α, the V range, the target and the bound are held once, in the frozen settings: SmoothedNetwork
    and its Engine read them from there and keep no copy."""
    settings = SmoothingSettings(0.25, 64, -1.0, 1.0, 0.05, bound="empirical_bernstein")
    sm = SmoothedNetwork(torch.nn.Linear(3, 2), settings, 2)
    for name in ("sigma", "m", "alpha", "v_min", "v_max", "target", "bound"):
        assert name not in vars(sm) and getattr(sm, name) == getattr(settings, name), name
    for name in ("sigma", "m"):
        assert name not in vars(sm.engine) and getattr(sm.engine, name) == getattr(settings, name), name
    assert sm.engine.noise == settings.noise
