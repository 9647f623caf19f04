"""The deterministic actor of a continuous-action agent (Box action spaces): s ↦ a ∈ [low, high]^d, mapped into
the environment's bounds as the agent itself maps it:

* SB3 ``SAC``: a = tanh(μ(s)) ∈ [−1, 1]^d, rescaled to [low, high] (SB3's ``unscale_action``);
* SB3 ``TD3`` / ``DDPG``: the actor's last Tanh, rescaled alike;
* SB3 ``PPO`` / ``A2C`` with a Gaussian policy: the mean action, clipped to [low, high] (SB3's ``predict``
  clips an unsquashed action); with ``squash_output`` (gSDE) tanh and the rescaling.

The bounds are recorded in the network spec (``model.json``).  Where the agent's file holds a critic (SAC,
TD3) it is kept: the global attack (:func:`crop.certify.attack.run_global_attack`) then minimises the agent's own
objective Q(s, π(s + δ)).  Its files are read by :mod:`crop.agents.continuous`.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["ContinuousActor", "build_actor", "is_continuous", "actor_summary", "act", "SQUASHES"]

#: How the actor's raw output becomes an action in [low, high]: ``tanh`` (squashed into [−1, 1], then
#: rescaled affinely), ``clip`` (clipped to [low, high] as it is).
SQUASHES = ("tanh", "clip")


def _mlp(dims: list[int], act: str) -> nn.Sequential:
    """Linear layers of ``dims`` with ``act`` between them: crop's ``mlp`` (keys 0, 2, 4, …)."""
    from crop.models import _mlp as mlp

    return mlp({"in": dims[0], "hidden": dims[1:-1], "out": dims[-1], "activation": act})


class ContinuousActor(nn.Module):
    """A deterministic actor s ↦ a ∈ [low, high]^d (``forward``) and, optionally, the agent's critics
    Q(s, a) on the actor's own action scale (``q``).  Spec::

        {"arch": "actor", "in": 3, "hidden": [256, 256], "out": 1, "activation": "relu", "squash": "tanh",
         "low": [-2.0], "high": [2.0],
         "critic": {"hidden": [256, 256], "activation": "relu", "count": 2}}      # optional

    State-dict keys: ``actor.0.weight, …`` and ``critics.K.0.weight, …``; the bounds are the spec's (not
    weights)."""

    continuous = True

    def __init__(self, spec: dict):
        super().__init__()
        act = spec.get("activation", "relu")
        if spec.get("squash") not in SQUASHES:
            raise ValueError(f"squash must be one of {SQUASHES}, got {spec.get('squash')!r}")
        self.squash = spec["squash"]
        d_in, d_out = int(spec["in"]), int(spec["out"])
        self.actor = _mlp([d_in, *[int(h) for h in spec.get("hidden", [])], d_out], act)
        low, high = [float(x) for x in spec["low"]], [float(x) for x in spec["high"]]
        if len(low) != d_out or len(high) != d_out or not all(np.isfinite(low + high)) \
                or not all(lo < hi for lo, hi in zip(low, high)):
            raise ValueError(f"low/high must be {d_out} finite numbers each with low < high")
        self.register_buffer("low", torch.tensor(low, dtype=torch.float32), persistent=False)
        self.register_buffer("high", torch.tensor(high, dtype=torch.float32), persistent=False)
        crit = spec.get("critic")
        # SB3's critics take the squashed action in [−1, 1]; CleanRL's the environment's action
        self.critic_on_env_scale = bool(crit) and crit.get("action_scale") == "env"
        self.critics = nn.ModuleList()
        if crit:
            dims = [d_in + d_out, *[int(h) for h in crit.get("hidden", [])], 1]
            self.critics.extend(_mlp(dims, crit.get("activation", "relu")) for _ in range(int(crit.get("count", 1))))

    @property
    def has_critic(self) -> bool:
        return len(self.critics) > 0

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """The action on the agent's own scale: tanh → [−1, 1]^d (what its critic takes); clip → [low, high]."""
        out = self.actor(x)
        return torch.tanh(out) if self.squash == "tanh" else torch.clamp(out, self.low, self.high)

    def to_env(self, raw: torch.Tensor) -> torch.Tensor:
        """The environment's action for a raw one: tanh's [−1, 1] mapped affinely onto [low, high], clamped to
        [low, high] (float32 rounding of the map can land one ulp outside for asymmetric bounds; the
        environment's bounds and the percentile certificate's fallback ends rely on every action in them)."""
        if self.squash == "tanh":
            return torch.clamp(self.low + 0.5 * (raw + 1.0) * (self.high - self.low), self.low, self.high)
        return raw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_env(self.raw(x))

    def q(self, s: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        """The agent's value of taking ``raw`` (its own scale) in ``s``: the minimum over the critics kept, each
        given the action on the scale it was trained on."""
        a = self.to_env(raw) if self.critic_on_env_scale else raw
        sa = torch.cat([s, a], dim=-1)
        return torch.stack([c(sa).squeeze(-1) for c in self.critics], 0).min(0).values


def build_actor(spec: dict) -> ContinuousActor:
    return ContinuousActor(spec)


def is_continuous(net_or_spec) -> bool:
    """Whether a network (or its spec) is a continuous-action actor."""
    if isinstance(net_or_spec, dict):
        return net_or_spec.get("arch") == "actor"
    return bool(getattr(net_or_spec, "continuous", False))


def actor_summary(spec: dict) -> str:
    dims = [spec["in"], *spec.get("hidden", []), spec["out"]]
    bounds = f"[{', '.join(f'{x:g}' for x in spec['low'])}]..[{', '.join(f'{x:g}' for x in spec['high'])}]"
    crit = spec.get("critic")
    return ("actor MLP " + "→".join(str(d) for d in dims) + f" ({spec.get('activation', 'relu')}, {spec['squash']} "
            f"to {bounds})" + (f" + {crit.get('count', 1)} critic(s)" if crit else ""))


@torch.no_grad()
def act(net, obs) -> np.ndarray:
    """The deterministic action of an actor for one observation (float32 array of the action's shape)."""
    x = torch.as_tensor(np.asarray(obs, dtype=np.float32)).unsqueeze(0)
    return net(x)[0].cpu().numpy().astype(np.float32)
