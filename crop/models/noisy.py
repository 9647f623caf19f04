"""NoisyNet Q-networks (Fortunato et al., ICLR 2018): factorised Gaussian noisy linear layers.

Every weight is w = μ + σ ⊙ ε with learnable μ, σ (σ initialised to σ0/√p, σ0 = 0.5, p = fan-in) and
factorised noise ε_ij = f(ε_i) f(ε_j), f(x) = sign(x)·√|x|.  The noise replaces ε-greedy exploration during
training.

Certification uses the **mean network** (all ε = 0, i.e. weights μ): in eval mode — which is how
``load_network`` returns every checkpoint — ``forward`` uses μ only and is a deterministic function of
its input, so Gaussian smoothing certifies the greedy policy argmax_a Q_μ(s, a) that is deployed.  (The
paper's NoisyNet also sampled weights at test time; a Q that changes from call to call is not a function
that CROP's smoothing theorems cover, so we deploy and certify the mean network and record this.)

State-dict keys: ``<i>.weight_mu``, ``<i>.weight_sigma``, ``<i>.bias_mu``, ``<i>.bias_sigma`` for each
noisy layer ``<i>`` of the ``nn.Sequential``; the noise itself is not saved.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["NoisyLinear", "noisy_mlp", "resample_noise"]


class NoisyLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5):
        super().__init__()
        self.in_features, self.out_features, self.sigma0 = in_features, out_features, float(sigma0)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features))
        self.bias_mu = nn.Parameter(torch.empty(out_features))
        self.bias_sigma = nn.Parameter(torch.empty(out_features))
        # The current noise sample (not part of the state dict: a checkpoint is μ and σ only).
        self.register_buffer("eps_in", torch.zeros(in_features), persistent=False)
        self.register_buffer("eps_out", torch.zeros(out_features), persistent=False)
        bound = 1.0 / math.sqrt(in_features)
        with torch.no_grad():
            self.weight_mu.uniform_(-bound, bound)
            self.bias_mu.uniform_(-bound, bound)
            self.weight_sigma.fill_(self.sigma0 * bound)
            self.bias_sigma.fill_(self.sigma0 * bound)

    @staticmethod
    def _f(x: torch.Tensor) -> torch.Tensor:
        return x.sign() * x.abs().sqrt()

    @torch.no_grad()
    def resample(self, generator: torch.Generator | None = None) -> None:
        dev = self.eps_in.device   # (a CUDA generator draws on its own device)
        self.eps_in.copy_(self._f(torch.randn(self.in_features, generator=generator, device=dev)))
        self.eps_out.copy_(self._f(torch.randn(self.out_features, generator=generator, device=dev)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:  # evaluation / certification: the mean network, deterministic
            return F.linear(x, self.weight_mu, self.bias_mu)
        w = self.weight_mu + self.weight_sigma * torch.outer(self.eps_out, self.eps_in)
        b = self.bias_mu + self.bias_sigma * self.eps_out
        return F.linear(x, w, b)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, sigma0={self.sigma0}"


def noisy_mlp(spec: dict) -> nn.Sequential:
    """``{"arch": "noisy_mlp", "in": 4, "hidden": [128, 128], "out": 2, "sigma0": 0.5}``: every linear layer
    noisy (as in NoisyNet-DQN), ReLU between them."""
    dims = [int(spec["in"]), *[int(h) for h in spec.get("hidden", [])], int(spec["out"])]
    sigma0 = float(spec.get("sigma0", 0.5))
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(NoisyLinear(a, b, sigma0))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def resample_noise(net: nn.Module, generator: torch.Generator | None = None) -> None:
    """Draw fresh factorised noise for every noisy layer of ``net`` (a no-op for other networks)."""
    for m in net.modules():
        if isinstance(m, NoisyLinear):
            m.resample(generator)
