"""CARRL (Everett et al., 2021) as a Q-network: the certified lower bound of Q within an ε-ball.

CARRL trains nothing: it takes a trained Q-network and, at test time, acts on
    Q_lb(x, a) = lower bound of min_{‖x′ − x‖ ≤ ε} Q(x′, a)     (CROWN, :mod:`crop.models.bounds_ibp`)
choosing argmax_a Q_lb(x, a).  Wrapping that as a network makes CARRL's policy a *deterministic function
of the observation*, so CROP smooths Q_lb exactly as it smooths any Q-network and certifies CARRL's
deployed policy.

Spec: ``{"arch": "carrl", "base": <an MLP spec>, "eps": 0.1, "norm": 2, "method": "crown"}``
(``method``: "crown" = full CROWN, the default; "crown-ibp" or "ibp" are cheaper and looser).  The state
dict is the base network's, unchanged (same keys ``0.weight`` …), so CARRL's checkpoint is StdTrain's
weights plus this spec.

Cost: full CROWN on a 4→128→128→2 MLP costs about 30 plain forward passes, so every certifier's work on
CARRL costs about 30× that on StdTrain.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from crop.models.bounds_ibp import CrownSettings, UnsupportedNetwork, crown_bounds, ibp_bounds, parse_norm

__all__ = ["CarrlQ", "carrl", "carrl_spec", "derive_carrl"]

_METHODS = ("crown", "crown-ibp", "ibp")


class CarrlQ(nn.Sequential):
    """The layers of the base network; ``forward`` returns CROWN lower bounds of Q over the ε-ball."""

    def __init__(self, base: nn.Sequential, eps: float, norm=2, method: str = "crown"):
        super().__init__(*base)
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"CARRL: eps must be finite and >= 0, got {eps}")
        if method not in _METHODS:
            raise ValueError(f"CARRL: unknown bound method {method!r}; known: {list(_METHODS)}")
        self.eps, self.norm, self.method = float(eps), parse_norm(norm), method
        try:  # refuse a base network the bounds cannot handle now, not at the first forward
            crown_bounds(self, torch.zeros(1, base[0].in_features), 0.0, self.norm)
        except (UnsupportedNetwork, AttributeError) as exc:
            raise UnsupportedNetwork(f"CARRL needs an MLP base network: {exc}") from None
        # CROWN holds a (rows, width, width) matrix per layer: in blocks of at most 2^22 entries (16 MB) the
        # allocator reuses its memory, where a whole chunk's (65 MB for 1,000 rows of width 128) is mapped and
        # faulted in anew at every call, 1.2-1.6x the time.  Each row's bound is its own: the same bits.
        self.rows = max(1, 2 ** 22 // max(layer.out_features for layer in base if isinstance(layer, nn.Linear)) ** 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.method == "ibp":
            return ibp_bounds(self, x, self.eps, self.norm)[0]
        settings = CrownSettings(intermediate="crown" if self.method == "crown" else "ibp", upper=False)
        return torch.cat([crown_bounds(self, block, self.eps, self.norm, settings=settings)[0]
                          for block in x.split(self.rows)])

    def extra_repr(self) -> str:
        return f"eps={self.eps}, norm={self.norm}, method={self.method}"


def carrl(spec: dict) -> CarrlQ:
    from crop.models import build_network

    base_spec = spec.get("base")
    if not isinstance(base_spec, dict) or base_spec.get("arch") != "mlp":
        raise ValueError(f"CARRL spec needs an MLP base spec, got {base_spec!r}")
    return CarrlQ(build_network(base_spec), float(spec["eps"]), spec.get("norm", 2),
                  spec.get("method", "crown"))


def carrl_spec(base_spec: dict, eps: float, norm=2, method: str = "crown") -> dict:
    norm = parse_norm(norm)
    return {"arch": "carrl", "base": dict(base_spec), "eps": float(eps),
            "norm": "inf" if norm == math.inf else int(norm), "method": method}


def derive_carrl(base_net: nn.Module, base_spec: dict, eps: float, norm=2,
                 method: str = "crown") -> tuple[CarrlQ, dict]:
    """CARRL's network and spec from a trained base network (its weights are copied, not shared)."""
    spec = carrl_spec(base_spec, eps, norm, method)
    net = carrl(spec)
    net.load_state_dict(base_net.state_dict())
    return net.eval(), spec
