"""Seeded random networks, and the policy files other libraries write of them (Stable-Baselines3 archives,
CleanRL agents, state dicts), for the tests and for the module-level helpers that build checkpoints from them."""
import io
import json
import zipfile

import numpy as np
import torch
from torch import nn


def random_mlp(n_in=4, n_out=2, hidden=(16, 16), seed=0, scale=1.0):
    """An MLP Q-network with torch's default initialisation under ``seed``, its weights multiplied by ``scale``."""
    from crop.models import build_network  # after conftest has put the checkout first on sys.path

    torch.manual_seed(seed)
    net = build_network({"arch": "mlp", "in": n_in, "hidden": list(hidden), "out": n_out})
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(scale)
    return net.eval()


def mlp(sizes, seed, act=nn.ReLU, last=None):
    """``nn.Sequential`` of Linear layers of ``sizes`` under ``seed``, ``act`` between them, ``last`` after."""
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(a, b)] + ([act()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers, *([last()] if last else [])).eval()


class Affine(nn.Module):
    """Q(x) = W x + b: with clipping inactive, Q̃(s) = W s + b exactly and each sample has std σ‖W_a‖."""

    def __init__(self, w, b):
        super().__init__()
        self.w = torch.as_tensor(w, dtype=torch.float32)
        self.b = torch.as_tensor(b, dtype=torch.float32)

    def forward(self, x):
        return x @ self.w.T + self.b


# ------------------------------------------------------------------------------ other libraries' policy files

def sb3_zip(path, state, data, *, policy_bytes=None, extra=()):
    """An SB3 archive as ``model.save()`` writes it: ``data`` (JSON; no such member where None), policy.pth
    (``state`` as torch saves it, or the bytes ``policy_bytes``), the optimizer, pytorch_variables.pth, the
    version file, and the members ``extra`` ((name, bytes) pairs)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        if data is not None:
            zf.writestr("data", json.dumps(data))
        zf.writestr("policy.pth", buf.getvalue() if policy_bytes is None else policy_bytes)
        zf.writestr("policy.optimizer.pth", b"")
        zf.writestr("pytorch_variables.pth", b"")
        zf.writestr("_stable_baselines3_version", "2.3.2")
        for name, member in extra:
            zf.writestr(name, member)
    return path


def sb3_data(algo="PPO", policy_kwargs=None) -> dict:
    """The ``data`` member of an SB3 DQN, PPO or A2C archive: the policy class and its kwargs (activation_fn
    written as the class's text); DQN's MlpPolicy has net_arch [64, 64]."""
    if algo == "DQN":
        return {"policy_class": {":type:": "<class 'abc.ABCMeta'>"},
                "policy_kwargs": policy_kwargs or {"net_arch": [64, 64]}}
    return {"policy_class": {":type:": "<class 'abc.ABCMeta'>", ":serialized:": "gAWV…",
                             "__module__": "stable_baselines3.common.policies"},
            "policy_kwargs": policy_kwargs or {}, "n_steps": 2048 if algo == "PPO" else 5}


def sb3_dqn_state(q_net: nn.Sequential, target: nn.Sequential) -> dict:
    """An SB3 DQN's policy.pth: the online q_net and the target q_net_target (``q_net.q_net.0.weight`` …)."""
    state = {f"q_net.q_net.{k}": v for k, v in q_net.state_dict().items()}
    state.update({f"q_net_target.q_net.{k}": v for k, v in target.state_dict().items()})
    return state


def sb3_mlp_policy(pi_sizes, vf_sizes, n_actions, seed, act=nn.Tanh):
    """MlpPolicy's state dict: mlp_extractor.policy_net / value_net (Linear + activation), action_net,
    value_net (FlattenExtractor has no parameters); and the actor's logits as a function."""
    pi = mlp(pi_sizes, seed, act)
    pi = nn.Sequential(*pi, act())  # SB3's policy_net ends with the activation
    vf = mlp(vf_sizes, seed + 1, act)
    torch.manual_seed(seed + 2)
    action_net, value_net = nn.Linear(pi_sizes[-1], n_actions), nn.Linear(vf_sizes[-1], 1)
    state = {**{f"mlp_extractor.policy_net.{k}": v for k, v in pi.state_dict().items()},
             **{f"mlp_extractor.value_net.{k}": v for k, v in vf.state_dict().items()},
             **{f"action_net.{k}": v for k, v in action_net.state_dict().items()},
             **{f"value_net.{k}": v for k, v in value_net.state_dict().items()}}
    return state, (lambda x: action_net(pi(x)))


def box_space(low, high, kind="gymnasium.spaces.box.Box") -> dict:
    """A Box space as SB3's ``data`` writes it."""
    return {":type:": f"<class '{kind}'>", ":serialized:": "gAWV…", "dtype": "float32", "_shape": [len(low)],
            "low": str(np.array(low, dtype=np.float32)), "high": str(np.array(high, dtype=np.float32))}


def sb3_sac(path, low=(-2.0,), high=(2.0,), data_extra=None, with_data=True):
    """An SB3 SAC archive for Pendulum-v1 (net_arch [16, 16], two critics): its path, its deterministic action
    and its actor loss's value min_k Q_k(s, tanh(μ(s)))."""
    latent, mu, log_std = mlp([3, 16, 16], 1), nn.Linear(16, 1), nn.Linear(16, 1)
    latent = nn.Sequential(*latent, nn.ReLU())
    q0, q1 = mlp([4, 16, 16, 1], 2), mlp([4, 16, 16, 1], 3)
    state = {**{f"actor.latent_pi.{k}": v for k, v in latent.state_dict().items()},
             **{f"actor.mu.{k}": v for k, v in mu.state_dict().items()},
             **{f"actor.log_std.{k}": v for k, v in log_std.state_dict().items()},
             **{f"critic.qf0.{k}": v for k, v in q0.state_dict().items()},
             **{f"critic.qf1.{k}": v for k, v in q1.state_dict().items()},
             **{f"critic_target.qf0.{k}": v for k, v in q0.state_dict().items()}}
    data = {"action_space": box_space(low, high), "policy_kwargs": {"net_arch": [16, 16]}, "use_sde": False,
            **(data_extra or {})}
    lo, hi = torch.tensor(low), torch.tensor(high)

    def action(x):
        return lo + 0.5 * (torch.tanh(mu(latent(x))) + 1) * (hi - lo)

    def q(x):
        a = torch.tanh(mu(latent(x)))
        return torch.minimum(q0(torch.cat([x, a], 1)), q1(torch.cat([x, a], 1)))[:, 0]

    return sb3_zip(path, state, data if with_data else None), action, q


class CleanRLAgent(nn.Module):
    """cleanrl/ppo.py's Agent: critic and actor MLPs of 64 Tanh units."""

    def __init__(self, n_in=4, n_out=2):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
        self.actor = nn.Sequential(nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out))


def state_dict_file(path, sizes=(6, 32, 3)):
    """A crop MLP Q-network of ``sizes`` (seed 0) saved as a plain state dict at ``path``."""
    from crop.models import build_network

    torch.manual_seed(0)
    net = build_network({"arch": "mlp", "in": sizes[0], "hidden": list(sizes[1:-1]), "out": sizes[-1]})
    torch.save(net.state_dict(), path)
    return path
