"""Continuous-action agents (Box action spaces): their import from Stable-Baselines3 and CleanRL files as the
deterministic actor crop certifies (:class:`crop.models.actor.ContinuousActor`, which says how each agent maps
its output into the environment's bounds).

The bounds come from the file (SB3's ``data`` member records the action space it was trained on) and are
recorded in the network spec (``model.json``); a file that does not tell them, or tells ones that differ
from the environment's, is refused.  Where the file holds a critic (SAC, TD3) it is kept: the global attack
then minimises the agent's own objective Q(s, π(s + δ)) (SAC: the minimum over its critics, as its actor
loss; TD3/DDPG: the first, as theirs); otherwise it maximises the action's deviation from the clean one.

Nothing of SB3 is imported: the zip is read as :mod:`crop.agents.importing` reads any SB3 archive (one member in
memory, tensors only), and ``data`` as JSON (its pickled ``:serialized:`` fields are never unpickled).
CleanRL's ``td3_continuous_action.py`` / ``ddpg_continuous_action.py`` checkpoints (and a
``sac_continuous_action.py`` actor's state dict) carry their bounds in the buffers ``action_scale`` and
``action_bias`` (:func:`_read_cleanrl`); its ``ppo_continuous_action.py`` agent is refused (its observation
normalisation lives outside the file).
"""
from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np
import torch

__all__ = ["read_continuous"]

# ------------------------------------------------------------------------------------------- SB3 import

class _Refused(Exception):
    pass


def _layers(state: dict, prefix: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight, bias) of the Linear layers ``prefix{i}`` (i = 0, 2, 4, …: Linear and activation alternate)."""
    idx = sorted({int(m.group(1)) for k in state if (m := re.fullmatch(re.escape(prefix) + r"(\d+)\.weight", k))})
    if not idx or idx != list(range(0, 2 * len(idx), 2)):
        raise _Refused(f"no Linear layers {prefix}0, {prefix}2, … (keys {sorted(state)[:6]}…)")
    out = []
    for i in idx:
        w, b = state.get(f"{prefix}{i}.weight"), state.get(f"{prefix}{i}.bias")
        if b is None or w.dim() != 2:
            raise _Refused(f"layer {prefix}{i} is not a Linear layer with a bias")
        out.append((w, b))
    return out


def _bounds_from_data(data: dict, path: Path) -> tuple[list[float], list[float]]:
    """The action bounds SB3 recorded in ``data``'s ``action_space`` (its readable ``low``/``high`` texts; the
    pickled form is never read)."""
    space = data.get("action_space")
    if not isinstance(space, dict):
        raise _Refused("its 'data' member records no action_space, so its action bounds cannot be told")
    kind = str(space.get(":type:", ""))
    if "Box" not in kind:
        raise _Refused(f"its action space is {kind or 'not recorded'}, not a Box; refusing it")
    shape = space.get("_shape") or space.get("shape")
    out = []
    for key in ("low", "high"):
        text = space.get(key)
        if not isinstance(text, str) or "..." in text:
            raise _Refused(f"its action_space {key} is not recorded readably ({text!r}), so its action bounds "
                           "cannot be told")
        try:
            vals = [float(v) for v in text.replace("[", " ").replace("]", " ").replace(",", " ").split()]
        except ValueError:
            raise _Refused(f"its action_space {key} {text!r} is not a list of numbers") from None
        out.append(vals)
    if not isinstance(shape, list) or len(shape) != 1 or len(out[0]) != shape[0] or len(out[1]) != shape[0]:
        raise _Refused(f"its action_space (shape {shape}) is not a vector of {len(out[0])} bounds")
    if not all(np.isfinite(out[0]) & np.isfinite(out[1])) or not all(lo < hi for lo, hi in zip(*out)):
        raise _Refused(f"its action bounds {out[0]}..{out[1]} are not finite with low < high")
    return out[0], out[1]


def _sb3_data(path: Path) -> dict:
    from crop.agents.archive import _ZIP_ERRORS, MAX_DATA_BYTES, _corrupt_zip, sb3_json

    try:
        with zipfile.ZipFile(path) as zf:
            info = next((i for i in zf.infolist() if i.filename == "data"), None)
            if info is None:
                raise _Refused("it has no 'data' member, so its action bounds and squashing cannot be told")
            if info.file_size > MAX_DATA_BYTES:
                raise _Refused(f"its 'data' member is {info.file_size} bytes, over the limit of {MAX_DATA_BYTES}")
            raw = zf.read(info)
    except _ZIP_ERRORS as exc:
        raise _corrupt_zip(path, exc) from None
    try:
        data = sb3_json(raw)
    except ValueError:
        raise _Refused("its 'data' member is not SB3's JSON") from None
    if not isinstance(data, dict):
        raise _Refused("its 'data' member is not SB3's JSON")
    return data


def _activation(kwargs: dict, default: str) -> str:
    from crop.agents.archive import ACTIVATIONS

    fn = kwargs.get("activation_fn")
    if fn is None:
        return default
    for name, act in ACTIVATIONS.items():
        if re.search(rf"\b{name}\b", str(fn)):
            return act
    raise _Refused(f"activation {fn!r} is not supported (known: {sorted(ACTIVATIONS)})")


def _sb3_kind(state: dict) -> str | None:
    """SB3's continuous-action algorithm a policy state dict comes from, or None (a discrete one): SAC's actor
    ends in one Linear ``actor.mu`` (after ``actor.latent_pi``, absent where net_arch is []), TD3's/DDPG's
    ``actor.mu`` is a Sequential (``actor.mu.0``, …)."""
    if "actor.mu.weight" in state:
        return "SAC"
    if any(k.startswith("actor.mu.") for k in state) and any(k.startswith("critic.qf0.") for k in state):
        return "TD3"
    if "log_std" in state and "action_net.weight" in state:
        return "PPO/A2C"
    return None


#: The algorithm each SB3 policy module declares (``data``'s ``policy_class.__module__``).
_DECLARED = {"stable_baselines3.sac.policies": "SAC", "stable_baselines3.td3.policies": "TD3",
             "stable_baselines3.common.policies": "PPO/A2C"}


def _declared_kind(data: dict, kind: str) -> None:
    """Refuse a file whose declared policy class names another algorithm than its tensors' layout (``kind``);
    a file that declares none, or one crop does not know, is read by its layout."""
    pc = data.get("policy_class")
    module = pc.get("__module__") if isinstance(pc, dict) else None
    declared = _DECLARED.get(module)
    if declared is not None and declared != kind:
        raise _Refused(f"its data declares a {declared} policy ({module}) but its tensors are laid out as {kind}'s")


def _n_critics(state: dict) -> int:
    """How many critics ``critic.qf0``, ``critic.qf1``, … the file holds (SB3's n_critics)."""
    idx = sorted({int(m.group(1)) for k in state if (m := re.match(r"critic\.qf(\d+)\.", k))})
    if idx != list(range(len(idx))):
        raise _Refused(f"its critics are numbered {idx}, not 0, 1, …")
    return len(idx)


def _critic(state: dict, count: int, act: str) -> tuple[dict, dict]:
    out, hidden = {}, None
    for k in range(count):
        layers = _layers(state, f"critic.qf{k}.")
        h = [int(w.shape[0]) for w, _ in layers[:-1]]
        if hidden is not None and h != hidden:
            raise _Refused("its critics differ in size")
        hidden = h
        for j, (w, b) in enumerate(layers):
            out[f"critics.{k}.{2 * j}.weight"], out[f"critics.{k}.{2 * j}.bias"] = w, b
    return out, {"hidden": hidden, "activation": act, "count": count}


def _sb3_continuous(state: dict, data: dict, kind: str) -> tuple[dict, dict]:
    """(state dict with :class:`crop.models.actor.ContinuousActor`'s keys, spec) of an SB3 continuous-action policy."""
    kwargs = data.get("policy_kwargs") or {}
    if not isinstance(kwargs, dict):
        kwargs = {}
    if kind == "SAC" and (data.get("use_sde") in (True, "True") or "actor.log_std" in state and
                          state["actor.log_std"].dim() != 2):
        raise _Refused("a SAC policy with gSDE (use_sde): its deterministic action passes a clipping crop does "
                       "not model; refusing it")
    extra = sorted(k for k in state if k.startswith("features_extractor.") or ".features_extractor." in k)
    if extra:
        raise _Refused(f"a features extractor with weights ({extra[0]}): crop imports MlpPolicy agents only")
    out = {}
    if kind == "SAC":
        act = _activation(kwargs, "relu")
        latent = _layers(state, "actor.latent_pi.") if any(k.startswith("actor.latent_pi.") for k in state) else []
        layers = latent + [(state["actor.mu.weight"], state["actor.mu.bias"])]
        squash = "tanh"
        n = _n_critics(state)   # SAC's actor loss: the minimum over all its critics
        critic, crit_spec = _critic(state, n, act) if n else ({}, None)
    elif kind == "TD3":
        act = _activation(kwargs, "relu")
        layers = _layers(state, "actor.mu.")
        squash = "tanh"   # SB3's TD3/DDPG actor ends in Tanh (squash_output)
        critic, crit_spec = _critic(state, 1, act)   # the actor's loss is −Q₁(s, μ(s))
    else:
        act = _activation(kwargs, "tanh")
        other = sorted(k for k in state if k.startswith("mlp_extractor.")
                       and not k.startswith(("mlp_extractor.policy_net.", "mlp_extractor.value_net.")))
        if other:
            raise _Refused(f"unexpected key {other[0]} (an mlp_extractor layout crop does not know)")
        policy = [] if not any(k.startswith("mlp_extractor.policy_net.") for k in state) \
            else _layers(state, "mlp_extractor.policy_net.")
        layers = policy + [(state["action_net.weight"], state["action_net.bias"])]
        squash = "tanh" if kwargs.get("squash_output") in (True, "True") else "clip"
        critic, crit_spec = {}, None
    for j, (w, b) in enumerate(layers):
        out[f"actor.{2 * j}.weight"], out[f"actor.{2 * j}.bias"] = w, b
    for (w, _), (w2, _) in zip(layers, layers[1:]):
        if w2.shape[1] != w.shape[0]:
            raise _Refused("its actor's layers do not chain")
    spec = {"arch": "actor", "in": int(layers[0][0].shape[1]), "hidden": [int(w.shape[0]) for w, _ in layers[:-1]],
            "out": int(layers[-1][0].shape[0]), "activation": act, "squash": squash}
    if crit_spec:
        if critic["critics.0.0.weight"].shape[1] != spec["in"] + spec["out"]:
            raise _Refused("its critic does not take (observation, action)")
        spec["critic"] = crit_spec
    out.update(critic)
    return out, spec


def read_continuous(path: str | Path, fmt: str, max_bytes: int) -> tuple[dict, str, str, dict] | None:
    """(state dict, format, member, spec) of an SB3 continuous-action policy zip or a CleanRL continuous-action
    checkpoint (:func:`_read_cleanrl`), or None for any other file.
    The spec names the algorithm, the squashing and the bounds the file records.  Raises
    :class:`crop.agents.archive.PolicyImportError` in one line where the file is a continuous-action agent whose
    bounds or squashing cannot be told."""
    from crop.agents.archive import PolicyImportError, _load_bytes, _sb3_policy_bytes, check_file

    path = Path(path)
    check_file(path, fmt, max_bytes)
    found = _sb3_policy_bytes(path, max_bytes) if fmt in ("auto", "sb3") and zipfile.is_zipfile(path) else None
    if found is None:
        return None if fmt == "sb3" else _read_cleanrl(path, max_bytes)
    data, member = found
    what = f"{path}: member {member!r}"
    state = _load_bytes(data, what)
    kind = _sb3_kind(state)
    if kind is None:
        return None
    try:
        meta = _sb3_data(path)
        _declared_kind(meta, kind)
        low, high = _bounds_from_data(meta, path)
        out, spec = _sb3_continuous(state, meta, kind)
    except _Refused as exc:
        raise PolicyImportError(f"{path}: an SB3 {kind} continuous-action policy: {exc}; refusing it") from None
    if len(low) != spec["out"]:
        raise PolicyImportError(f"{path}: its actor gives {spec['out']} action values, its recorded action space "
                                f"has {len(low)}; refusing it")
    spec.update(low=low, high=high, algorithm=kind)
    return out, "sb3", member, spec


def _cleanrl_kind(state: dict) -> str | None:
    if "action_scale" in state and "action_bias" in state:
        if "fc_mu.weight" in state:
            return "TD3"     # td3_continuous_action.py / ddpg_continuous_action.py: tanh(fc_mu) · scale + bias
        if "fc_mean.weight" in state:
            return "SAC"     # sac_continuous_action.py: tanh(fc_mean) · scale + bias (the deterministic action)
    if any(str(k).startswith("actor_mean.") for k in state):
        return "PPO"
    return None


def _read_cleanrl(path: Path, max_bytes: int) -> tuple[dict, str, None, dict] | None:
    """CleanRL's continuous-action agents: ``torch.save((actor.state_dict(), qf1.state_dict()[, qf2…]))`` of
    ``td3_continuous_action.py`` / ``ddpg_continuous_action.py`` (or the actor's state dict alone), and
    ``sac_continuous_action.py``'s actor alike: Linear ``fc1``, ``fc2``, ``fc_mu``/``fc_mean`` with ReLU, the
    bounds in the buffers ``action_scale`` and ``action_bias``; the Q-networks (``fc1..fc3`` on (s, a), the
    action on the environment's scale) kept as the critic.  ``ppo_continuous_action.py``'s agent is refused:
    its observation normalisation (NormalizeObservation) and action clipping live in wrappers, not the file."""
    from crop.agents.archive import PolicyImportError
    from crop.models import CheckpointError, load_tensors

    with open(path, "rb") as fh:
        raw = fh.read(max_bytes + 1)   # bounded: the file may have grown since its size was checked
    if len(raw) > max_bytes:
        raise PolicyImportError(f"{path}: over the limit of {max_bytes} bytes; refusing it")
    try:
        obj = load_tensors(raw, str(path))
    except CheckpointError:
        return None   # read_state_dict says why, in its words
    parts = list(obj) if isinstance(obj, (tuple, list)) else [obj]
    if not parts or not all(isinstance(d, dict) and all(isinstance(v, torch.Tensor) for v in d.values())
                            for d in parts):
        return None
    kind = _cleanrl_kind(parts[0])
    if kind is None:
        return None
    if kind == "PPO":
        raise PolicyImportError(f"{path}: a CleanRL ppo_continuous_action.py agent, whose observation normalisation "
                                "(NormalizeObservation) and action clipping live in the training script's wrappers, "
                                "not in the file, so the policy it was trained as cannot be told; refusing it")
    actor = parts[0]
    try:
        head = "fc_mu" if kind == "TD3" else "fc_mean"
        layers = [(actor[f"{n}.weight"], actor[f"{n}.bias"]) for n in ("fc1", "fc2", head)]
        scale, bias = actor["action_scale"].double().flatten(), actor["action_bias"].double().flatten()
        out = {f"actor.{2 * j}.{w}": t for j, lw in enumerate(layers) for w, t in zip(("weight", "bias"), lw)}
        spec = {"arch": "actor", "in": int(layers[0][0].shape[1]), "hidden": [int(w.shape[0]) for w, _ in layers[:-1]],
                "out": int(layers[-1][0].shape[0]), "activation": "relu", "squash": "tanh",
                "low": (bias - scale).tolist(), "high": (bias + scale).tolist(), "algorithm": f"CleanRL {kind}"}
        critics = parts[1:] if kind == "SAC" else parts[1:2]   # SAC's loss: min over all; TD3/DDPG's: Q₁
        for k, q in enumerate(critics):
            for j, n in enumerate(("fc1", "fc2", "fc3")):
                out[f"critics.{k}.{2 * j}.weight"], out[f"critics.{k}.{2 * j}.bias"] = q[f"{n}.weight"], q[f"{n}.bias"]
        if critics:
            spec["critic"] = {"hidden": [int(critics[0][f"{n}.weight"].shape[0]) for n in ("fc1", "fc2")],
                              "activation": "relu", "count": len(critics), "action_scale": "env"}
    except KeyError as exc:
        raise PolicyImportError(f"{path}: a CleanRL {kind} continuous-action agent without {exc.args[0]!r} (the layout "
                                "of td3/ddpg/sac_continuous_action.py: fc1, fc2, fc_mu or fc_mean, action_scale, "
                                "action_bias); refusing it") from None
    if scale.numel() != spec["out"] or bias.numel() != spec["out"] or not bool((scale > 0).all()):
        raise PolicyImportError(f"{path}: its action_scale/action_bias do not give {spec['out']} bounds with low < "
                                "high; refusing it")
    return out, "cleanrl", None, spec
