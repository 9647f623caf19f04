"""Sound output bounds of small feed-forward Q-networks over a set of inputs: IBP and CROWN.

Used by SA-MDP (CVX) and RadialRL during training and by CARRL at test time.  Supported networks are
``nn.Sequential`` stacks of ``Linear``, ``Conv2d``, ``ReLU`` and ``Flatten`` (what every Q-network in this
project is made of).

Input sets
    * ``norm="inf"``: the box ‖x′ − x‖∞ ≤ ε, intersected with ``domain=(lo, hi)`` if given;
    * ``norm=2``: the ball ‖x′ − x‖₂ ≤ ε.  With a domain, the bounds are the tighter of the ball's and the
      domain-clamped enclosing box's (both contain ball ∩ domain).
    ``eps`` is a number or one value per sample (shape ``(B,)``).

Methods
    * :func:`ibp_bounds` — interval bound propagation (Gowal et al., 2018).  For an ℓ2 ball the first affine
      layer is bounded exactly (centre ± ε·‖row‖₂), the rest by intervals.
    * :func:`crown_bounds` — backward linear bounds (CROWN, Zhang et al., 2018): every ReLU with pre-activation
      bounds l < 0 < u is relaxed by the upper line through (l, 0), (u, u) and the lower line α·z with the
      adaptive α = 1[u > −l]; the linear bound of the output is propagated back to the input and
      concretised with the dual norm (ℓ1 for an ℓ∞ box, ℓ2 for an ℓ2 ball).  Pre-activation bounds of the
      ReLUs come (:class:`CrownSettings`) from CROWN itself (``intermediate="crown"``, full CROWN) or from IBP
      (``intermediate="ibp"``, i.e. CROWN-IBP, Zhang et al., 2020 — far cheaper for CNNs).  By default
      (``intersect_ibp=True``) IBP runs alongside and the tighter of the two is kept at every ReLU and at
      the output, so CROWN's bounds are never looser than IBP's.
    * :func:`output_bounds` — one entry point: ``method`` ∈ {"ibp", "crown-ibp", "crown"}.

Cost, from cheapest to dearest: IBP (about two forward passes), CROWN-IBP, full CROWN (for an MLP with two
hidden layers the pre-activation bounds of the second hidden layer dominate).

A specification matrix ``C`` (shape ``(K, n_out)`` or ``(B, K, n_out)``) asks for bounds of ``C · f(x′)``
instead of ``f(x′)`` — e.g. rows ``e_a − e_{a*}`` bound the Q-value margins Q(x′, a) − Q(x′, a*) much more
tightly than the difference of separate bounds.  :func:`margin_spec` builds those rows.

All functions are differentiable (for training) and work under ``torch.inference_mode``.  They return
``(lower, upper)`` of shape ``(B, K)`` (``K = n_out`` without ``C``).  Soundness, checked by the tests: for
every x′ in the set, lower ≤ C·f(x′) ≤ upper (up to floating-point rounding).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ibp_bounds", "crown_bounds", "CrownSettings", "output_bounds", "margin_spec", "parse_norm",
           "UnsupportedNetwork"]


class UnsupportedNetwork(TypeError):
    """The network contains a layer these bounds do not handle."""


_AFFINE = (nn.Linear, nn.Conv2d)


def parse_norm(norm) -> float:
    """``"inf"``, ``"linf"``, ``math.inf`` → ∞;  ``2``, ``"2"``, ``"l2"`` → 2."""
    text = str(norm).lower().lstrip("l")
    if text in ("inf", "infinity"):
        return math.inf
    if text in ("2", "2.0"):
        return 2.0
    raise ValueError(f"unsupported norm {norm!r}: use 'inf' (ℓ∞ box) or 2 (ℓ2 ball)")


def _layers(net) -> list[nn.Module]:
    layers = list(net) if isinstance(net, (nn.Sequential, list, tuple)) else None
    if layers is None:
        raise UnsupportedNetwork(f"bounds need an nn.Sequential, got {type(net).__name__}")
    for i, m in enumerate(layers):
        if isinstance(m, nn.Flatten):
            if m.start_dim != 1 or m.end_dim != -1:
                raise UnsupportedNetwork(f"layer {i}: only Flatten(start_dim=1, end_dim=-1) is supported")
        elif isinstance(m, nn.Conv2d):
            if m.padding_mode != "zeros" or isinstance(m.padding, str):
                raise UnsupportedNetwork(f"layer {i}: Conv2d needs numeric zero padding")
        elif not isinstance(m, (nn.Linear, nn.ReLU, nn.Identity)):
            raise UnsupportedNetwork(f"layer {i}: {type(m).__name__} is not supported "
                                     "(Linear, Conv2d, ReLU, Flatten only)")
    if not layers:
        raise UnsupportedNetwork("empty network")
    return layers


def margin_spec(labels: torch.Tensor, n_out: int, dtype=torch.float32) -> torch.Tensor:
    """Rows e_a − e_{label} for every a ≠ label: shape (B, n_out − 1, n_out).

    The upper bound of ``C · f`` is then max over the set of Q(x′, a) − Q(x′, label), per other action a.
    """
    labels = labels.long().reshape(-1)
    B = labels.shape[0]
    eye = torch.eye(n_out, dtype=dtype, device=labels.device)
    rows = eye.unsqueeze(0).expand(B, n_out, n_out) - eye[labels].unsqueeze(1)   # row a: e_a − e_label
    keep = torch.arange(n_out, device=labels.device).unsqueeze(0) != labels.unsqueeze(1)  # drop row a = label
    return rows[keep].reshape(B, n_out - 1, n_out)


# ----------------------------------------------------------------------------------------- the input set

class _InputSet:
    def __init__(self, x: torch.Tensor, eps, norm, domain):
        self.x = x
        self.B = x.shape[0]
        self.norm = parse_norm(norm)
        eps = torch.as_tensor(eps, dtype=x.dtype, device=x.device)
        if eps.dim() > 1 or (eps.dim() == 1 and eps.shape[0] != self.B):
            raise ValueError(f"eps must be a number or have shape ({self.B},), got {tuple(eps.shape)}")
        if (eps < 0).any() or not torch.isfinite(eps).all():
            raise ValueError("eps must be finite and >= 0")
        self.eps = eps.reshape(-1, *([1] * (x.dim() - 1))) if eps.dim() == 1 else eps
        self.eps_b = eps.expand(self.B) if eps.dim() == 0 else eps             # (B,)
        lo, hi = x - self.eps, x + self.eps
        if domain is not None:
            lo = torch.clamp(lo, min=domain[0])
            hi = torch.clamp(hi, max=domain[1])
            lo, hi = torch.minimum(lo, hi), torch.maximum(lo, hi)  # x outside the domain: keep a valid box
        self.domain = domain
        self.lo, self.hi = lo, hi                                               # enclosing box

    def concretize_lower(self, lam: torch.Tensor, bias: torch.Tensor, batched: bool) -> torch.Tensor:
        """min over the set of Λ·x′ + bias; Λ is (K, *in) (shared) or (B, K, *in)."""
        K = lam.shape[1] if batched else lam.shape[0]
        lam_f = lam.reshape(self.B if batched else 1, K, -1)
        def dot(a, v):  # (b, K, n) · (B, n) → (B, K)
            return torch.matmul(a, v.reshape(self.B, -1, 1)).squeeze(-1)

        if self.domain is not None:    # the (clamped) enclosing box: Λ⁺·lo + Λ⁻·hi
            box = dot(lam_f.clamp(min=0), self.lo) + dot(lam_f.clamp(max=0), self.hi)
            if self.norm == math.inf:
                return box + bias
        dual = lam_f.abs().sum(-1) if self.norm == math.inf else lam_f.norm(dim=-1)   # ‖Λ_k‖_1 resp. ‖Λ_k‖_2
        ball = dot(lam_f, self.x) - self.eps_b.reshape(self.B, 1) * dual
        return (torch.maximum(ball, box) if self.domain is not None else ball) + bias


# ----------------------------------------------------------------------------------------- IBP

def _affine_interval(m: nn.Module, mid: torch.Tensor, rad: torch.Tensor):
    if isinstance(m, nn.Linear):
        return F.linear(mid, m.weight, m.bias), F.linear(rad, m.weight.abs())
    return (F.conv2d(mid, m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups),
            F.conv2d(rad, m.weight.abs(), None, m.stride, m.padding, m.dilation, m.groups))


def _first_affine_bounds(m: nn.Module, s: _InputSet):
    """Exact (ℓ∞ box) resp. sound (ℓ2 ball: centre ± ε‖row‖₂) bounds of the first affine layer."""
    mid, rad = _affine_interval(m, (s.hi + s.lo) / 2, (s.hi - s.lo) / 2)
    lo, hi = mid - rad, mid + rad
    if s.norm == 2.0:
        w = m.weight
        centre = m(s.x)
        if isinstance(m, nn.Linear):
            r = w.norm(dim=1) * s.eps_b.reshape(-1, 1)
        else:  # ‖kernel‖₂ bounds every receptive field (zero padding only removes terms)
            r = (w.flatten(1).norm(dim=1).reshape(1, -1, 1, 1) * s.eps_b.reshape(-1, 1, 1, 1))
        b_lo, b_hi = centre - r, centre + r
        if s.domain is None:
            return b_lo, b_hi
        lo, hi = torch.maximum(lo, b_lo), torch.minimum(hi, b_hi)
    return lo, hi


def _ibp_layer(m: nn.Module, lo, hi, s: _InputSet, at_input: bool):
    """Interval bounds of the output of layer m, given bounds [lo, hi] of its input."""
    if isinstance(m, _AFFINE):
        if at_input:
            return _first_affine_bounds(m, s)
        mid, rad = _affine_interval(m, (hi + lo) / 2, (hi - lo) / 2)
        return mid - rad, mid + rad
    if isinstance(m, nn.ReLU):
        return lo.clamp(min=0), hi.clamp(min=0)
    if isinstance(m, nn.Flatten):
        return lo.flatten(1), hi.flatten(1)
    return lo, hi  # Identity


def _ibp_last(m: nn.Module, lo, hi, s: _InputSet, at_input: bool, C):
    """Bounds of C · m(h) for h ∈ [lo, hi]; a Linear layer absorbs C (tighter than bounding C·[l, u])."""
    if C is not None and isinstance(m, nn.Linear):
        W, b = _fold_spec(C, m, s.B)
        if at_input:
            return s.concretize_lower(W, b, True), -s.concretize_lower(-W, -b, True)
        mid, rad = (hi + lo) / 2, (hi - lo) / 2
        c_mid = torch.einsum("bko,bo->bk", W, mid) + b
        c_rad = torch.einsum("bko,bo->bk", W.abs(), rad)
        return c_mid - c_rad, c_mid + c_rad
    lo, hi = _ibp_layer(m, lo, hi, s, at_input)
    if C is None:
        return lo, hi
    Cb = C if C.dim() == 3 else C.unsqueeze(0).expand(s.B, *C.shape)
    lo, hi = lo.flatten(1), hi.flatten(1)
    pos, neg = Cb.clamp(min=0), Cb.clamp(max=0)
    return (torch.einsum("bko,bo->bk", pos, lo) + torch.einsum("bko,bo->bk", neg, hi),
            torch.einsum("bko,bo->bk", pos, hi) + torch.einsum("bko,bo->bk", neg, lo))


def _fold_spec(C: torch.Tensor, m: nn.Linear, B: int):
    """C·(W h + b) = (C W) h + C b, per sample."""
    W = torch.matmul(C, m.weight)                       # (K, in) or (B, K, in)
    b = torch.matmul(C, m.bias) if m.bias is not None else torch.zeros(W.shape[:-1], dtype=W.dtype)
    if W.dim() == 2:
        W, b = W.unsqueeze(0).expand(B, *W.shape), b.unsqueeze(0).expand(B, *b.shape)
    return W, b


def ibp_bounds(net, x: torch.Tensor, eps, norm="inf", C: torch.Tensor | None = None, domain=None):
    """Interval bounds of ``C · net(x′)`` (or ``net(x′)``) over the input set; see the module docstring."""
    layers = _layers(net)
    s = _InputSet(x, eps, norm, domain)
    _check_spec(C, _shapes(layers, x)[-1], s.B)
    C = C.to(x) if C is not None else None
    lo, hi, at_input = s.lo, s.hi, True
    for m in layers[:-1]:
        lo, hi = _ibp_layer(m, lo, hi, s, at_input)
        at_input = at_input and isinstance(m, nn.Identity)
    return _ibp_last(layers[-1], lo, hi, s, at_input, C)


def _check_spec(C, out_shape, B):
    n_out = math.prod(out_shape)
    if C is not None and (C.dim() not in (2, 3) or C.shape[-1] != n_out or (C.dim() == 3 and C.shape[0] != B)):
        raise ValueError(f"C must have shape (K, {n_out}) or ({B}, K, {n_out}), got {tuple(C.shape)}")


# ----------------------------------------------------------------------------------------- CROWN

def _relu_relaxation(lo: torch.Tensor, hi: torch.Tensor):
    """Slopes and intercept of the CROWN relaxation a_low·z ≤ relu(z) ≤ a_up·z + b_up on [lo, hi]."""
    active, inactive = lo >= 0, hi <= 0
    unstable = ~(active | inactive)
    denom = torch.where(unstable, hi - lo, torch.ones_like(hi))
    a_up = torch.where(unstable, hi / denom, active.to(hi.dtype))
    b_up = torch.where(unstable, -hi * lo / denom, torch.zeros_like(hi))
    a_low = torch.where(unstable, (hi > -lo).to(hi.dtype), active.to(hi.dtype))
    return a_low, a_up, b_up


def _backward_lower(layers, shapes, relax, end: int, lam: torch.Tensor, bias, batched: bool,
                    s: _InputSet) -> torch.Tensor:
    """Lower bound over the input set of Λ·f_{:end}(x′) + bias, by propagating Λ back through layers
    end−1 … 0.  Λ has shape (K, *out) (shared by the batch) or (B, K, *out)."""
    skip = False
    for i in range(end - 1, -1, -1):
        m = layers[i]
        if skip:
            skip = False
            continue
        if (isinstance(m, nn.ReLU) and not batched and i > 0 and isinstance(layers[i - 1], nn.Linear)
                and lam.dim() == 2 and lam.shape[0] > layers[i - 1].in_features):
            # Shared Λ (K, n) meets the first ReLU: fuse it with the Linear before it, so the (B, K, n)
            # tensor Λ·diag(slopes) is never formed (for 4→128→128 MLPs a 30× saving in memory traffic).
            a_low, a_up, b_up = relax[i]                                 # (B, n)
            lin = layers[i - 1]
            pos, neg = lam.clamp(min=0), lam.clamp(max=0)
            bias = bias + torch.matmul(b_up, neg.T)                      # (B, K)
            if lin.bias is not None:
                bias = bias + torch.matmul(a_low * lin.bias, pos.T) + torch.matmul(a_up * lin.bias, neg.T)
            B, n, d = a_low.shape[0], lin.out_features, lin.in_features
            # One GEMM: [pos | neg] (K, 2n) @ [diag(a_low_b) W ; diag(a_up_b) W] stacked over b (2n, B·d).
            scaled = torch.cat([a_low.unsqueeze(-1) * lin.weight, a_up.unsqueeze(-1) * lin.weight], 1)
            lam = torch.matmul(torch.cat([pos, neg], 1), scaled.permute(1, 0, 2).reshape(2 * n, B * d))
            lam = lam.reshape(-1, B, d).permute(1, 0, 2)                 # (B, K, in)
            batched, skip = True, True
            continue
        if isinstance(m, nn.Linear):
            if m.bias is not None:
                bias = bias + torch.matmul(lam, m.bias)
            lam = torch.matmul(lam, m.weight)
        elif isinstance(m, nn.Conv2d):
            lead = lam.shape[:-3]
            lam4 = lam.reshape(-1, *lam.shape[-3:])
            if m.bias is not None:
                bias = bias + (lam4.sum((-2, -1)) * m.bias).sum(-1).reshape(lead)
            in_shape = shapes[i]
            out_h, out_w = lam4.shape[-2:]
            op = []
            for d, (size, o) in enumerate(zip(in_shape[-2:], (out_h, out_w))):
                full = (o - 1) * m.stride[d] - 2 * m.padding[d] + m.dilation[d] * (m.kernel_size[d] - 1) + 1
                op.append(size - full)
            lam4 = F.conv_transpose2d(lam4, m.weight, None, m.stride, m.padding, tuple(op), m.groups,
                                      m.dilation)
            lam = lam4.reshape(*lead, *lam4.shape[1:])
        elif isinstance(m, nn.Flatten):
            lead = lam.shape[:-1]
            lam = lam.reshape(*lead, *shapes[i])
        elif isinstance(m, nn.ReLU):
            a_low, a_up, b_up = relax[i]                    # (B, *shape) each
            pos, neg = lam.clamp(min=0), lam.clamp(max=0)
            if not batched:
                pos, neg = pos.unsqueeze(0), neg.unsqueeze(0)
                batched = True
                if bias.dim() == 1:
                    bias = bias.unsqueeze(0)
            a_low, a_up, b_up = a_low.unsqueeze(1), a_up.unsqueeze(1), b_up.unsqueeze(1)
            bias = bias + (neg * b_up).flatten(2).sum(-1)
            lam = pos * a_low + neg * a_up
        # nn.Identity: nothing to do
    if not batched and bias.dim() == 1:
        bias = bias.unsqueeze(0)
    return s.concretize_lower(lam, bias, batched)


def _shapes(layers, x: torch.Tensor) -> list[tuple]:
    """Per-sample input shape of every layer (and the output shape at index len(layers))."""
    shapes = [tuple(x.shape[1:])]
    with torch.no_grad():
        h = x[:1]
        for m in layers:
            h = m(h)
            shapes.append(tuple(h.shape[1:]))
    return shapes


@dataclass(frozen=True)
class CrownSettings:
    """How :func:`crown_bounds` bounds.

    ``intermediate``: ``"crown"`` (full CROWN: every ReLU's pre-activation bounds by CROWN, tightest) or
    ``"ibp"`` (CROWN-IBP: pre-activation bounds by IBP, far cheaper for CNNs).  ``intersect_ibp``: also run
    IBP alongside and keep, at every ReLU and at the output, the tighter of the two (both are sound; the
    CROWN relaxation with the adaptive lower slope α = 1 can be looser than an interval for some neurons).
    ``lower``/``upper``: which bounds to compute (one backward pass serves both)."""

    intermediate: str = "crown"
    intersect_ibp: bool = True
    lower: bool = True
    upper: bool = True

    def __post_init__(self):
        if self.intermediate not in ("crown", "ibp"):
            raise ValueError(f"intermediate must be 'crown' or 'ibp', got {self.intermediate!r}")


def crown_bounds(net, x: torch.Tensor, eps, norm="inf", C: torch.Tensor | None = None, domain=None,
                 settings: CrownSettings | None = None):
    """CROWN bounds of ``C · net(x′)`` (or ``net(x′)``) over the input set, computed as ``settings`` say
    (:class:`CrownSettings`; None: its defaults); see the module docstring.  A bound not asked for is returned as
    ``None``.
    """
    settings = settings or CrownSettings()
    intermediate, intersect_ibp = settings.intermediate, settings.intersect_ibp
    bound_lower, bound_upper = settings.lower, settings.upper
    layers = _layers(net)
    s = _InputSet(x, eps, norm, domain)
    shapes = _shapes(layers, x)
    _check_spec(C, shapes[-1], s.B)
    C = C.to(x) if C is not None else None
    relax: dict[int, tuple] = {}
    lo, hi, at_input = s.lo, s.hi, True     # running interval bounds of the input of layer i
    n_before = 0                            # non-Identity layers before layer i
    for i, m in enumerate(layers):
        if isinstance(m, nn.ReLU):
            if intermediate == "crown" and n_before >= 2:   # (one affine layer: intervals are exact)
                n = math.prod(shapes[i])
                eye = torch.eye(n, dtype=x.dtype, device=x.device)
                lam = torch.cat([eye, -eye]).reshape(2 * n, *shapes[i])
                bias = torch.zeros(2 * n, dtype=x.dtype, device=x.device)
                low = _backward_lower(layers, shapes, relax, i, lam, bias, False, s)
                c_lo, c_hi = low[:, :n].reshape(-1, *shapes[i]), (-low[:, n:]).reshape(-1, *shapes[i])
                lo, hi = (torch.maximum(lo, c_lo), torch.minimum(hi, c_hi)) if intersect_ibp else (c_lo, c_hi)
            relax[i] = _relu_relaxation(lo, hi)
        if i == len(layers) - 1:
            break
        lo, hi = _ibp_layer(m, lo, hi, s, at_input)
        if not isinstance(m, nn.Identity):
            at_input, n_before = False, n_before + 1
    n_out = math.prod(shapes[-1])
    if C is None:
        lam, batched = torch.eye(n_out, dtype=x.dtype, device=x.device).reshape(n_out, *shapes[-1]), False
    else:
        lam, batched = C, C.dim() == 3
    K = lam.shape[1] if batched else lam.shape[0]
    bias = torch.zeros((s.B, K) if batched else (K,), dtype=x.dtype, device=x.device)
    lower = upper = None
    if bound_lower and bound_upper:   # one backward pass for both: rows [Λ; −Λ]
        both = torch.cat([lam, -lam], dim=1 if batched else 0)
        low = _backward_lower(layers, shapes, relax, len(layers), both, torch.cat([bias, bias], -1), batched, s)
        lower, upper = low[:, :K], -low[:, K:]
    elif bound_lower:
        lower = _backward_lower(layers, shapes, relax, len(layers), lam, bias, batched, s)
    elif bound_upper:
        upper = -_backward_lower(layers, shapes, relax, len(layers), -lam, bias, batched, s)
    if intersect_ibp and (lower is not None or upper is not None):
        i_lo, i_hi = _ibp_last(layers[-1], lo, hi, s, at_input, C)
        lower = torch.maximum(lower, i_lo) if lower is not None else None
        upper = torch.minimum(upper, i_hi) if upper is not None else None
    return lower, upper


def output_bounds(net, x: torch.Tensor, eps, norm="inf", method: str = "crown", C=None, domain=None):
    """``method``: ``"ibp"``, ``"crown-ibp"`` or ``"crown"``; returns (lower, upper)."""
    if method == "ibp":
        return ibp_bounds(net, x, eps, norm, C, domain)
    if method == "crown-ibp":
        return crown_bounds(net, x, eps, norm, C, domain, CrownSettings(intermediate="ibp"))
    if method == "crown":
        return crown_bounds(net, x, eps, norm, C, domain, CrownSettings(intermediate="crown"))
    raise ValueError(f"unknown bound method {method!r}; known: ibp, crown-ibp, crown")
