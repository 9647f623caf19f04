"""SmoothedNetwork on many states per call: the same distribution as one state at a time, fresh noise
for every state, the per-state error index, and the channels-last code path of convolutional networks."""
import copy

import numpy as np
import pytest
import torch
from scipy import stats as sps

from crop.smoothing.engine import Engine, block_plan
from crop.smoothing.smoothed import NonFiniteOutputError, SmoothedNetwork, SmoothingSettings

from networks import Affine


def _affine(n_in=5, n_out=3, seed=0):
    rng = np.random.default_rng(seed)
    return Affine(rng.normal(size=(n_out, n_in)) / np.sqrt(n_in), rng.normal(size=n_out) * 0.1)


def _z_scores(ests, states, net, sigma, m):
    """(mean − closed-form Q̃) / its standard error, for every state and action."""
    w, b = net.w.double().numpy(), net.b.double().numpy()
    truth = states.astype(np.float64) @ w.T + b
    se = sigma * np.linalg.norm(w, axis=1) / np.sqrt(m)
    return (np.stack([e.mean for e in ests]) - truth) / se


def test_batched_smoothing_has_the_distribution_of_one_state_at_a_time():
    """On an affine net (known smoothed value) the standardised errors of the batched means are N(0, 1),
    like those of the sequential means (two-sample KS), and the bounds cover the true value."""
    net, sigma, m = _affine(), 0.3, 2000
    states = 0.5 * np.random.default_rng(1).normal(size=(96, 5)).astype(np.float32)
    # clipping never active: |Q| stays far inside [-8, 8], so Q̃ = W s + b
    batched = SmoothedNetwork(net, SmoothingSettings(sigma, m, -8, 8, 0.05, bound="empirical_bernstein", seed=5), 3)
    single = SmoothedNetwork(net, SmoothingSettings(sigma, m, -8, 8, 0.05, bound="empirical_bernstein", seed=6), 3)
    eb = batched.estimate_batch(states[:40]) + batched.estimate_batch(states[40:])   # two launches
    es = [single.estimate(s) for s in states]
    assert batched.calls == single.calls == len(states)
    zb, zs = _z_scores(eb, states, net, sigma, m).ravel(), _z_scores(es, states, net, sigma, m).ravel()
    for z in (zb, zs):
        assert abs(z.mean()) < 4 / np.sqrt(z.size), z.mean()
        assert 0.65 < z.var() < 1.45, z.var()
        assert sps.kstest(z, "norm").pvalue > 1e-3
    assert sps.ks_2samp(zb, zs).pvalue > 1e-3
    truth = states.astype(np.float64) @ net.w.double().numpy().T + net.b.double().numpy()
    for ests in (eb, es):
        lower, upper = np.stack([e.lower for e in ests]), np.stack([e.upper for e in ests])
        covered = np.all((lower <= truth) & (truth <= upper), axis=1)
        assert covered.mean() >= 0.9, covered.mean()  # per state ≥ 1 − α = 0.95 in expectation
        assert np.all(upper - lower < 1.6)  # a tenth of the range: not vacuous, the test can fail


def test_every_state_of_a_batch_gets_its_own_noise():
    """An identity net returns the noisy input itself: the noise of every state of a batch (and of the next
    batch) is distinct and uncorrelated with every other's, and repeated states get independent means."""
    net = Affine(np.eye(4), np.zeros(4))
    sm = SmoothedNetwork(net, SmoothingSettings(1.0, 512, -50, 50, 0.05, bound="empirical_bernstein", seed=0), 4)
    x = np.random.default_rng(2).normal(size=(6, 4)).astype(np.float32)
    s1 = sm.engine.collect(sm.engine.launch(x))[3]   # the m × |A| samples of each state
    s2 = sm.engine.collect(sm.engine.launch(x))[3]
    noise = np.stack([s - xi for s, xi in zip(s1 + s2, np.concatenate([x, x]))])   # 12 × m × 4
    flat = noise.reshape(len(noise), -1)
    corr = np.corrcoef(flat)
    off = corr[~np.eye(len(flat), dtype=bool)]
    assert np.abs(off).max() < 5 / np.sqrt(flat.shape[1]), np.abs(off).max()
    rows = {r.tobytes() for r in noise.astype(np.float32).reshape(-1, 4)}
    assert len(rows) == noise.shape[0] * noise.shape[1], "two samples share their noise"
    # a batch of one repeated state: the means scatter with the Monte-Carlo standard error (σ/√m per action)
    same = SmoothedNetwork(net, SmoothingSettings(1.0, 512, -50, 50, 0.05, seed=1), 4).estimate_batch(
        np.repeat(x[:1], 200, 0))
    spread = np.stack([e.mean for e in same]).std(0)
    np.testing.assert_allclose(spread, 1 / np.sqrt(512), rtol=0.2)


def test_batch_is_reproducible_and_one_state_batch_is_estimate(mlp_factory):
    net = mlp_factory(n_in=4, n_out=2, seed=3)
    x = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32)
    a = SmoothedNetwork(net, SmoothingSettings(0.2, 1500, -5, 5, 0.05, seed=4), 2).estimate_batch(x)
    b = SmoothedNetwork(net, SmoothingSettings(0.2, 1500, -5, 5, 0.05, seed=4), 2).estimate_batch(x)
    for ea, eb in zip(a, b):
        np.testing.assert_array_equal(ea.mean, eb.mean)
        np.testing.assert_array_equal(ea.upper, eb.upper)
    one = SmoothedNetwork(net, SmoothingSettings(0.2, 1500, -5, 5, 0.05, seed=4), 2).estimate_batch(x[:1])[0]
    again = SmoothedNetwork(net, SmoothingSettings(0.2, 1500, -5, 5, 0.05, seed=4), 2).estimate(x[0])
    np.testing.assert_array_equal(one.mean, again.mean)


@pytest.mark.parametrize("block_floats", [1 << 22, 64])
def test_blocks_never_straddle_states(mlp_factory, block_floats, monkeypatch):
    """Whole states per block (large blocks) or pieces of one state (small): the estimate is the same
    function of the noise either way, and the stream has the documented state-major order (with the
    state's m samples in one block, the batch's first state equals a one-state call's)."""
    monkeypatch.setattr(Engine, "NOISE_BLOCK_FLOATS", block_floats)
    net = mlp_factory(n_in=4, n_out=2, seed=3)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    sm = SmoothedNetwork(net, SmoothingSettings(0.2, 320, -5, 5, 0.05, chunk=32, seed=8), 2)
    sm.engine._set_shape((4,))
    plan = list(block_plan(5, 320, sm.engine._rows))
    assert sum(k * c for _, k, _, c in plan) == 5 * 320
    assert all(k == 1 for _, k, _, _ in plan) == (block_floats == 64)
    batch = sm.estimate_batch(x)
    if block_floats != 64:
        first = SmoothedNetwork(net, SmoothingSettings(0.2, 320, -5, 5, 0.05, chunk=32, seed=8), 2).estimate(x[0])
        np.testing.assert_array_equal(batch[0].mean, first.mean)


class _NaNWhereLarge(torch.nn.Module):
    def forward(self, x):
        q = torch.stack([x[:, 0], -x[:, 0]], 1)
        return torch.where(x[:, :1] > 50, torch.full_like(q, float("nan")), q)


def test_nan_names_the_state_of_the_batch():
    x = np.zeros((4, 3), np.float32)
    x[2, 0] = 100.0
    sm = SmoothedNetwork(_NaNWhereLarge(), SmoothingSettings(0.1, 50, -1, 1, 0.05), 2)
    with pytest.raises(NonFiniteOutputError, match="state episode 2 step 0"):
        sm.estimate_batch(x, indices=[f"episode {i} step 0" for i in range(4)])
    with pytest.raises(ValueError, match="2 indices for 4 states"):
        sm.estimate_batch(x, indices=[0, 1])


def test_per_state_alpha_in_a_batch(mlp_factory):
    net = mlp_factory(n_in=4, n_out=2, seed=7)
    x = np.zeros((2, 4), np.float32)
    sm = SmoothedNetwork(net, SmoothingSettings(0.3, 2000, -5, 5, 0.05, seed=1), 2)
    wide, base = sm.estimate_batch(x, alpha=[1e-6, 0.05])
    assert wide.alpha == 1e-6 and base.alpha == 0.05
    assert np.all(wide.upper - wide.lower > base.upper - base.lower)
    with pytest.raises(ValueError, match="alpha"):
        SmoothedNetwork(net, SmoothingSettings(0.3, 20, -5, 5, 0.05), 2).estimate_batch(x, alpha=[0.5, 1.5])


def test_channels_last_path_gives_the_contiguous_means():
    """The CUDA code path (channels-last weights and input) forced on the CPU: the same noise (drawn
    contiguous and copied), the same smoothed means up to float rounding of the convolutions."""
    from crop.models import build_network

    torch.manual_seed(0)
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval()
    x = np.random.default_rng(0).random((3, 4, 84, 84), dtype=np.float32)
    plain = SmoothedNetwork(copy.deepcopy(net), SmoothingSettings(0.1, 96, -1, 1, 0.05, chunk=32, seed=2), 6)
    cl = SmoothedNetwork(copy.deepcopy(net), SmoothingSettings(0.1, 96, -1, 1, 0.05, chunk=32, seed=2), 6)
    assert not plain.engine.channels_last and not cl.engine.channels_last  # CPU default: contiguous
    cl.engine.channels_last = True
    mp, mc = plain.estimate_batch(x), cl.estimate_batch(x)
    assert cl.net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not plain.net[0].weight.is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(mp, mc):
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch,c,size", [("nature_cnn", 4, 84), ("dueling_cnn", 1, 84), ("nature_cnn", 1, 80)])
@pytest.mark.parametrize("inner", [False, True])
def test_space_to_depth_network_is_the_same_function(arch, c, size, inner):
    """crop.models.s2d: the rewritten network on pixel_unshuffle(x) gives the network's Q on x."""
    import torch.nn.functional as F

    from crop.models import build_network
    from crop.models.s2d import space_to_depth_input

    torch.manual_seed(1)
    net = build_network({"arch": arch, "in_channels": c, "in_size": size, "out": 6}).eval()
    new, s = space_to_depth_input(net, (c, size, size), inner=inner)
    assert s == 4 and isinstance(new, type(net))
    x = torch.rand(7, c, size, size)
    with torch.no_grad():
        np.testing.assert_allclose(new(F.pixel_unshuffle(x, s)).numpy(), net(x).numpy(), rtol=1e-5, atol=1e-6)


def test_space_to_depth_declines_what_it_cannot_rewrite():
    from crop.models import build_network
    from crop.models.s2d import space_to_depth_input

    cnn = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6})
    assert space_to_depth_input(cnn, (4, 86, 86)) is None            # 86 is not a multiple of the stride 4
    assert space_to_depth_input(build_network({"arch": "mlp", "in": 4, "out": 2}), (4,)) is None
    stride1 = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.Flatten())
    assert space_to_depth_input(stride1, (4, 84, 84)) is None


def test_space_to_depth_smoothing_is_eq2_with_the_pixels_noise_permuted():
    """The CUDA path's space-to-depth input layer forced on the CPU: the smoothed means are exactly Eq. (2)'s
    Monte-Carlo means of the *original* network at x + pixel_shuffle(z), z the stream's draw in the
    space-to-depth layout (i.i.d. noise on permuted pixels is i.i.d. noise on the pixels)."""
    import torch.nn.functional as F

    from crop.models import build_network

    torch.manual_seed(0)
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval()
    x = np.random.default_rng(0).random((2, 4, 84, 84), dtype=np.float32)
    sigma, m = 0.2, 96
    sm = SmoothedNetwork(copy.deepcopy(net), SmoothingSettings(sigma, m, -0.02, 0.02, 0.05, chunk=32, seed=5), 6)
    sm.engine.space_to_depth = True
    est = sm.estimate_batch(x)
    assert sm.engine._s2d == 4 and sm.engine._in_shape == (64, 21, 21)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for b in range(2):  # one block per state here: (m, 64, 21, 21) normals each
            z = torch.empty((m, 64, 21, 21)).normal_(0.0, sigma, generator=g)
            q = net(torch.as_tensor(x[b]) + F.pixel_shuffle(z, 4)).double()
            np.testing.assert_allclose(est[b].raw_mean, q.mean(0).numpy(), rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(est[b].mean, q.clamp(-0.02, 0.02).mean(0).numpy(), rtol=1e-5, atol=1e-7)
    assert not np.allclose(est[0].mean, est[0].raw_mean), "clipping must be active for the test to bite"


def test_channels_last_pixel_unshuffle_is_torchs_and_stays_channels_last():
    """The inner space-to-depth step keeps a channels-last activation channels-last (one copy, not two) and
    gives torch's pixel_unshuffle values; the rewritten network in channels-last is still the network."""
    import torch.nn.functional as F

    from crop.models import build_network
    from crop.models.s2d import PixelUnshuffle, space_to_depth_input

    x = torch.rand(3, 32, 20, 20).contiguous(memory_format=torch.channels_last)
    y = PixelUnshuffle(2)(x)
    assert torch.equal(y, F.pixel_unshuffle(x, 2)) and y.is_contiguous(memory_format=torch.channels_last)
    torch.manual_seed(3)
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval()
    new, s = space_to_depth_input(net, (4, 84, 84), inner=True)
    new = new.to(memory_format=torch.channels_last)
    xi = torch.rand(5, 4, 84, 84)
    with torch.no_grad():
        out = new(F.pixel_unshuffle(xi, s).contiguous(memory_format=torch.channels_last))
        np.testing.assert_allclose(out.numpy(), net(xi).numpy(), rtol=1e-5, atol=1e-6)
