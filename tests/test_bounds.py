"""crop.models.bounds_ibp: IBP and CROWN bounds must contain every output reachable from the input set."""
import math

import pytest
import torch
from torch import nn

from crop.models.bounds_ibp import (
    CrownSettings,
    UnsupportedNetwork,
    crown_bounds,
    ibp_bounds,
    margin_spec,
    output_bounds,
    parse_norm,
)

torch.set_num_threads(1)  # the machine is shared; these nets are tiny

METHODS = ["ibp", "crown-ibp", "crown"]


def _mlp(seed, dims, dtype=torch.float64):
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(dtype)


def _cnn(seed, dtype=torch.float64):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(4, 3, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype)


def _samples(x, eps, norm, n, gen):
    """n points per centre in the set: uniform in the box (ℓ∞, a quarter on vertices) resp. in and on
    the ball (ℓ2); shape (n, B, *x.shape[1:])."""
    shape = (n, *x.shape)
    if parse_norm(norm) == math.inf:
        d = (torch.rand(shape, generator=gen, dtype=x.dtype) * 2 - 1) * eps
        d[: n // 4] = torch.sign(d[: n // 4]) * eps
    else:
        d = torch.randn(shape, generator=gen, dtype=x.dtype)
        d = d / d.flatten(2).norm(dim=-1).reshape(n, x.shape[0], *[1] * (x.dim() - 1))
        r = torch.rand((n, x.shape[0], *[1] * (x.dim() - 1)), generator=gen, dtype=x.dtype)
        r[: n // 2] = 1.0  # half on the sphere, where the extremes of a ReLU net's outputs often lie
        d = d * eps * r
    return x.unsqueeze(0) + d


def _pgd_extremes(net, x, eps, norm, C, steps=30):
    """Points in the set found by gradient ascent/descent on every output row (the hardest test points)."""
    K = C.shape[-2] if C is not None else net(x).shape[1]
    pts = []
    for k in range(K):
        for sign in (1.0, -1.0):
            d = torch.zeros_like(x, requires_grad=True)
            for _ in range(steps):
                out = net(x + d)
                out = torch.einsum("bko,bo->bk", C if C.dim() == 3 else C.expand(x.shape[0], *C.shape),
                                   out) if C is not None else out
                g, = torch.autograd.grad((sign * out[:, k]).sum(), d)
                with torch.no_grad():
                    if parse_norm(norm) == math.inf:
                        d += 0.25 * eps * g.sign()
                        d.clamp_(-eps, eps)
                    else:
                        gn = g.flatten(1).norm(dim=1).clamp_min(1e-12).reshape(-1, *[1] * (x.dim() - 1))
                        d += 0.25 * eps * g / gn
                        dn = d.flatten(1).norm(dim=1).clamp_min(1e-12).reshape(-1, *[1] * (x.dim() - 1))
                        d *= torch.clamp(eps / dn, max=1.0)
            pts.append((x + d).detach())
    return torch.stack(pts)


def _outputs(net, pts, C):
    n, B = pts.shape[:2]
    with torch.no_grad():
        y = net(pts.flatten(0, 1)).reshape(n, B, -1)
    if C is not None:
        y = torch.einsum("bko,nbo->nbk", C if C.dim() == 3 else C.expand(B, *C.shape), y)
    return y


def _assert_inside(y, lo, hi, tol):
    assert lo.shape == hi.shape == y.shape[1:]
    assert torch.all(lo <= hi + tol)
    below = (lo - y).max().item()
    above = (y - hi).max().item()
    assert below <= tol and above <= tol, f"sampled output outside the bounds by {max(below, above):.3g}"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("norm", ["inf", 2])
@pytest.mark.parametrize("seed", range(4))
def test_random_mlps_contain_every_sampled_output(seed, norm, method):
    gen = torch.Generator().manual_seed(100 + seed)
    dims = [4, *[8 + 7 * ((seed + j) % 4) for j in range(1 + seed % 3)], 3]
    net = _mlp(seed, dims)
    x = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    for eps in (0.02, 0.3, 1.5):
        specs = (None, margin_spec(torch.tensor([0, 1, 2, 0, 1, 2]), 3, torch.float64),
                 torch.randn(2, 3, generator=gen, dtype=torch.float64))
        for C in specs:
            lo, hi = output_bounds(net, x, eps, norm, method, C=C)
            pts = torch.cat([_samples(x, eps, norm, 1000, gen), _pgd_extremes(net, x, eps, norm, C, steps=20)])
            _assert_inside(_outputs(net, pts, C), lo, hi, 1e-9)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("norm", ["inf", 2])
def test_small_cnn_contains_every_sampled_output(norm, method):
    gen = torch.Generator().manual_seed(7)
    net = _cnn(3)
    x = torch.rand(3, 2, 8, 8, generator=gen, dtype=torch.float64)
    for eps in (0.01, 0.1):
        for C in (None, margin_spec(torch.tensor([2, 0, 1]), 3, torch.float64)):
            lo, hi = output_bounds(net, x, eps, norm, method, C=C)
            pts = torch.cat([_samples(x, eps, norm, 1000, gen), _pgd_extremes(net, x, eps, norm, C, steps=15)])
            _assert_inside(_outputs(net, pts, C), lo, hi, 1e-9)


def test_float32_networks_are_sound_within_rounding():
    gen = torch.Generator().manual_seed(1)
    net = _mlp(11, [4, 128, 128, 2], torch.float32)
    x = torch.randn(20, 4, generator=gen)
    for method in METHODS:
        lo, hi = output_bounds(net, x, 0.1, 2, method)
        y = _outputs(net, _samples(x, 0.1, 2, 3000, gen), None)
        _assert_inside(y, lo, hi, 1e-4 * (1 + y.abs().max().item()))


@pytest.mark.parametrize("norm", ["inf", 2])
def test_domain_clamp_is_sound_and_never_looser(norm):
    gen = torch.Generator().manual_seed(2)
    net = _mlp(5, [4, 16, 16, 3])
    x = torch.rand(8, 4, generator=gen, dtype=torch.float64) * 0.2   # near the lower edge of [0, 1]
    for method in METHODS:
        lo_d, hi_d = output_bounds(net, x, 0.3, norm, method, domain=(0.0, 1.0))
        lo, hi = output_bounds(net, x, 0.3, norm, method)
        assert torch.all(lo_d >= lo - 1e-12) and torch.all(hi_d <= hi + 1e-12)
        pts = _samples(x, 0.3, norm, 3000, gen).clamp(0.0, 1.0)  # clamping keeps a point in set ∩ domain
        _assert_inside(_outputs(net, pts, None), lo_d, hi_d, 1e-9)
    # The domain actually cuts: on the ℓ∞ box the clamped bounds are strictly tighter somewhere.
    if norm == "inf":
        assert torch.any(output_bounds(net, x, 0.3, norm, "ibp", domain=(0.0, 1.0))[0]
                         > output_bounds(net, x, 0.3, norm, "ibp")[0] + 1e-6)


def test_crown_is_no_looser_than_ibp_on_random_mlps():
    """Pure CROWN (no IBP intersection) has a smaller mean width than IBP on every random net; with the
    intersection (the default) every single bound is at least as tight as IBP's.  (Not necessarily as
    tight as pure CROWN's: tighter pre-activation bounds can flip CROWN's adaptive lower slope.)"""
    gen = torch.Generator().manual_seed(3)
    for seed in range(30):
        dims = [4, *[int(torch.randint(4, 40, (), generator=gen)) for _ in range(1 + seed % 4)], 3]
        net = _mlp(seed, dims)
        x = torch.randn(8, 4, generator=gen, dtype=torch.float64)
        for eps in (0.01, 0.1, 0.5):
            for norm in ("inf", 2):
                li, ui = ibp_bounds(net, x, eps, norm)
                lp, up = crown_bounds(net, x, eps, norm, settings=CrownSettings(intersect_ibp=False))
                lc, uc = crown_bounds(net, x, eps, norm)
                assert (up - lp).mean() <= (ui - li).mean() + 1e-12, (seed, eps, norm)
                assert torch.all(lc >= li - 1e-12) and torch.all(uc <= ui + 1e-12)


@pytest.mark.parametrize("norm", ["inf", 2])
def test_crown_is_exact_on_a_linear_network(norm):
    """Without ReLUs the linear bound is the function itself: the bounds are attained at a point of the set."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 2)).double()
    x = torch.randn(4, 5, dtype=torch.float64)
    eps = 0.3
    lo, hi = crown_bounds(net, x, eps, norm)
    w = (net[1].weight @ net[0].weight)                          # (2, 5)
    for k in range(2):
        if norm == "inf":
            arg_min = x - eps * torch.sign(w[k])
        else:
            arg_min = x - eps * w[k] / w[k].norm()
        torch.testing.assert_close(lo[:, k], net(arg_min)[:, k])
        torch.testing.assert_close(hi[:, k], net(2 * x - arg_min)[:, k])


def test_zero_eps_gives_the_network_output():
    net = _mlp(1, [4, 16, 16, 3])
    x = torch.randn(5, 4, dtype=torch.float64)
    for method in METHODS:
        for norm in ("inf", 2):
            lo, hi = output_bounds(net, x, 0.0, norm, method)
            torch.testing.assert_close(lo, net(x))
            torch.testing.assert_close(hi, net(x))


def test_spec_bounds_are_tighter_than_differences_of_output_bounds():
    net = _mlp(4, [4, 32, 32, 3])
    x = torch.randn(16, 4, dtype=torch.float64)
    labels = net(x).argmax(1)
    C = margin_spec(labels, 3, torch.float64)
    assert C.shape == (16, 2, 3)
    for method in METHODS:
        lo, hi = output_bounds(net, x, 0.2, "inf", method)
        _, hi_c = output_bounds(net, x, 0.2, "inf", method, C=C)
        others = torch.stack([torch.cat([r[:a], r[a + 1:]]) for r, a in zip(hi, labels)])
        naive = others - lo.gather(1, labels[:, None])                 # ub(Q_a) − lb(Q_label)
        assert torch.all(hi_c <= naive + 1e-9)
        assert torch.any(hi_c < naive - 1e-6)


def test_margin_spec_rows():
    C = margin_spec(torch.tensor([1, 0]), 3)
    expected = torch.tensor([[[1., -1., 0.], [0., -1., 1.]], [[-1., 1., 0.], [-1., 0., 1.]]])
    torch.testing.assert_close(C, expected)


def test_per_sample_eps_matches_separate_calls():
    net = _mlp(2, [4, 16, 16, 2])
    x = torch.randn(3, 4, dtype=torch.float64)
    eps = torch.tensor([0.0, 0.1, 0.5], dtype=torch.float64)
    for method in METHODS:
        lo, hi = output_bounds(net, x, eps, 2, method)
        for i in range(3):
            l1, h1 = output_bounds(net, x[i:i + 1], float(eps[i]), 2, method)
            torch.testing.assert_close(lo[i:i + 1], l1)
            torch.testing.assert_close(hi[i:i + 1], h1)


def test_bounds_are_differentiable_and_work_in_inference_mode():
    net = _mlp(0, [4, 16, 16, 2], torch.float32)
    x = torch.randn(5, 4)
    lo, hi = crown_bounds(net, x, 0.1, "inf", settings=CrownSettings(intermediate="ibp"))
    (hi - lo).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    with torch.inference_mode():
        lo2, _ = crown_bounds(net, x, 0.1, "inf", settings=CrownSettings(intermediate="ibp"))
    torch.testing.assert_close(lo.detach(), lo2)


def test_one_sided_bounds():
    net = _mlp(0, [4, 16, 16, 2])
    x = torch.randn(5, 4, dtype=torch.float64)
    lo, hi = crown_bounds(net, x, 0.1, 2)
    lo_only, none = crown_bounds(net, x, 0.1, 2, settings=CrownSettings(upper=False))
    none2, hi_only = crown_bounds(net, x, 0.1, 2, settings=CrownSettings(lower=False))
    assert none is None and none2 is None
    torch.testing.assert_close(lo_only, lo)
    torch.testing.assert_close(hi_only, hi)


def test_bad_input_is_refused():
    net = _mlp(0, [4, 8, 2], torch.float32)
    x = torch.randn(3, 4)
    with pytest.raises(UnsupportedNetwork, match="Tanh"):
        ibp_bounds(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), x, 0.1)
    with pytest.raises(UnsupportedNetwork):
        crown_bounds(nn.Linear(4, 2), x, 0.1)
    with pytest.raises(ValueError, match="norm"):
        crown_bounds(net, x, 0.1, norm=1)
    with pytest.raises(ValueError, match="eps"):
        ibp_bounds(net, x, -0.1)
    with pytest.raises(ValueError, match="eps"):
        ibp_bounds(net, x, torch.tensor([0.1, 0.2]))
    with pytest.raises(ValueError, match="C must have shape"):
        crown_bounds(net, x, 0.1, C=torch.ones(2, 3))
    with pytest.raises(ValueError, match="method"):
        output_bounds(net, x, 0.1, method="lp")
    assert parse_norm("linf") == math.inf and parse_norm("l2") == 2.0 and parse_norm(2) == 2.0
