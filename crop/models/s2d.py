"""Strided convolutions rewritten as stride-1 convolutions on space-to-depth inputs (a GPU speed-up).

A k×k convolution of stride s (s divides k, no padding) on an H×W input (s divides H and W) equals a
(k/s)×(k/s) convolution of stride 1 on the input's ``pixel_unshuffle`` by s — C·s² channels of H/s × W/s,
channel c·s² + i·s + j holding the pixels at offset (i, j) of every s×s cell — with the weights
W'[o, c·s² + i·s + j, u, v] = W[o, c, s·u + i, s·v + j].  The same sums in another order: the function is
the network's, up to float rounding (like a change of cuDNN algorithm).  The Nature CNN's first layer (4
channels, 8×8, stride 4) becomes 64 channels, 2×2, stride 1, which the GPU's convolution kernels run much
faster in channels-last.

For smoothing, the network's *input* layer is rewritten so that the noisy samples are made directly in the
space-to-depth layout: i.i.d. Gaussian noise on a permutation of the pixels is i.i.d. Gaussian noise on the
pixels, so Eq. (2)'s smoothed Q is unchanged (:class:`crop.smoothing.engine.Engine` does this on CUDA).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["space_to_depth_conv", "space_to_depth_input", "PixelUnshuffle"]


class PixelUnshuffle(nn.PixelUnshuffle):
    """``nn.PixelUnshuffle`` that keeps a channels-last input channels-last, in one copy (torch's returns a
    contiguous tensor, which the next channels-last convolution copies back: two passes over the
    activations instead of one)."""

    def forward(self, x):
        if x.dim() != 4 or x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
            return super().forward(x)
        n, c, h, w = x.shape
        s = self.downscale_factor
        # memory (n, h, w, c) → (n, h/s, i, w/s, j, c) → (n, h/s, w/s, c, i, j): channel c·s² + i·s + j
        y = x.permute(0, 2, 3, 1).reshape(n, h // s, s, w // s, s, c).permute(0, 1, 3, 5, 2, 4)
        return y.reshape(n, h // s, w // s, c * s * s).permute(0, 3, 1, 2)


def _eligible(conv: nn.Module, h: int, w: int) -> bool:
    if not isinstance(conv, nn.Conv2d):
        return False
    s, k = conv.stride, conv.kernel_size
    return (s[0] == s[1] > 1 and k[0] == k[1] and k[0] % s[0] == 0 and conv.padding in ((0, 0), 0)
            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding_mode == "zeros"
            and h % s[0] == 0 and w % s[0] == 0)


def space_to_depth_conv(conv: nn.Conv2d) -> nn.Conv2d:
    """The stride-1 convolution on ``pixel_unshuffle(x, s)`` that equals ``conv(x)``."""
    s, k = conv.stride[0], conv.kernel_size[0]
    o, c = conv.out_channels, conv.in_channels
    new = nn.Conv2d(c * s * s, o, k // s, stride=1, bias=conv.bias is not None,
                    device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        w = conv.weight.reshape(o, c, k // s, s, k // s, s)          # [o, c, u, i, v, j]
        new.weight.copy_(w.permute(0, 1, 3, 5, 2, 4).reshape(o, c * s * s, k // s, k // s))
        if conv.bias is not None:
            new.bias.copy_(conv.bias)
    return new


def _input_slot(net: nn.Module):
    """(parent, name) of the module that first sees the network's input: the first leaf of nested
    ``nn.Sequential`` (and of a dueling network's ``cnn`` trunk); None for any other structure."""
    from crop.models import DuelingCnn

    parent = net.cnn if isinstance(net, DuelingCnn) else net
    while isinstance(parent, nn.Sequential) and len(parent):
        first = parent[0]
        if isinstance(first, nn.Sequential):
            parent = first
            continue
        return parent, "0"
    return None


def space_to_depth_input(net: nn.Module, shape: tuple, inner: bool = False) -> tuple[nn.Module, int] | None:
    """A copy of ``net`` whose input layer takes ``pixel_unshuffle(x, s)`` for inputs of ``shape`` (C, H, W),
    and s; None when the input layer is not a strided convolution that allows it.  ``inner``: the later
    eligible convolutions are rewritten too (each preceded by its own :class:`PixelUnshuffle`)."""
    if len(shape) != 3:
        return None
    slot = _input_slot(net)
    if slot is None or not _eligible(getattr(slot[0], slot[1]), shape[1], shape[2]):
        return None
    new = copy.deepcopy(net)
    parent, name = _input_slot(new)
    first = getattr(parent, name)
    s = first.stride[0]
    if inner:
        sizes = {}

        def record(mod, args):
            sizes[id(mod)] = tuple(args[0].shape[-2:])

        hooks = [mod.register_forward_pre_hook(record) for mod in new.modules() if isinstance(mod, nn.Conv2d)]
        with torch.no_grad():
            new(torch.zeros((1, *shape), device=first.weight.device, dtype=first.weight.dtype))
        for h in hooks:
            h.remove()
        for mod in list(new.modules()):
            for key, child in list(mod.named_children()):
                if child is not first and id(child) in sizes and _eligible(child, *sizes[id(child)]):
                    setattr(mod, key, nn.Sequential(PixelUnshuffle(child.stride[0]), space_to_depth_conv(child)))
    setattr(parent, name, space_to_depth_conv(first))
    return new.eval(), s
