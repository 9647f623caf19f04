"""Your own policy: a Q-network, a policy network or a continuous-action actor (crop.agents.continuous)
trained elsewhere, imported into a checkpoint the certifiers accept (an actor: LoAct, GRe, the global attack).

Formats (``fmt="auto"`` tells them apart):

* ``torch``: a PyTorch state dict, ``torch.save(net.state_dict(), path)`` (also under a ``state_dict`` or
  ``model_state_dict`` key); keys ``0.weight…`` or prefixed ``network.``/``model.``/``module.``.
* ``cleanrl``: CleanRL's DQN checkpoint, ``torch.save(q_network.state_dict(), f"runs/{run}/{exp}.cleanrl_model")``
  (keys ``network.0.weight…``; the MLP of ``dqn.py`` is 120→84, the CNN of ``dqn_atari.py`` the Nature DQN).
* ``sb3``: a Stable-Baselines3 DQN ``.zip``: its ``policy.pth`` member holds the online network
  (``q_net.q_net.0.weight…``; MlpPolicy, default net_arch [64, 64]) and the target network
  (``q_net_target.*``, dropped).  CnnPolicy's NatureCNN (``q_net.features_extractor.cnn.*``, ``.linear.0``,
  ``q_net.q_net.0``) maps onto ``nature_cnn``.  Read with :mod:`zipfile` and ``torch.load``; SB3 itself is
  not needed.
* Policy networks (the value branch is dropped, the logits are the network's output):
  an SB3 ``PPO`` / ``A2C`` ``.zip`` — MlpPolicy: ``mlp_extractor.policy_net.{0,2,…}`` and ``action_net``
  (activation from ``data``'s ``policy_kwargs``, default Tanh; no readable ``data``: the architecture must
  give it); CnnPolicy: the shared NatureCNN ``features_extractor.*`` and ``action_net`` onto ``nature_cnn``;
  CleanRL's ``ppo.py`` agent (``actor.0/2/4`` and ``critic.0/2/4``, Tanh) and ``ppo_atari.py`` agent
  (``network.0/2/4/7`` + ``actor``, onto ``nature_cnn``); other ``actor.*`` state dicts need the activation
  given.  The file's activation fills in or must agree with an ``mlp`` spec's.  The import record says
  ``network: policy``; such a checkpoint is smoothed through its probabilities or votes, never as Q.

The file is untrusted: its size is bounded and its sha256 taken before anything reads it (and compared with
a pinned one when given); a zip is read in memory, one member, never extracted to disk; tensors only
(``torch.load(weights_only=True)``); every weight must be finite and fit the architecture exactly.
"""
from __future__ import annotations

import re
import zipfile
from pathlib import Path

import torch

from crop.agents.archive import (
    _ZIP_ERRORS,
    ACTIVATIONS,
    FORMATS,
    MAX_DATA_BYTES,
    SB3_POLICY,
    PolicyImportError,
    _corrupt_zip,
    _load_bytes,
    _sb3_policy_bytes,
    check_file,
    sb3_json,
)
from crop.agents.checkpoints import MAX_MEMBER_BYTES
from crop.io import sha256_file
from crop.models import load_state, spec_summary

__all__ = ["FORMATS", "PolicyImportError", "check_fits_env", "check_policy_file", "import_policy", "infer_mlp_spec",
           "parse_architecture",
           "read_state_dict"]





def parse_architecture(text_or_spec) -> dict:
    """``--arch`` / the config's ``architecture``: a network spec (JSON object or dict), or ``mlp`` for an MLP
    whose sizes are read from the weights."""
    import json

    if isinstance(text_or_spec, dict):
        spec = dict(text_or_spec)
    elif str(text_or_spec).lstrip().startswith("{"):
        def refuse(constant):  # NaN, Infinity
            raise PolicyImportError(f"architecture {text_or_spec!r}: {constant} is not a size")

        try:
            spec = json.loads(text_or_spec, parse_constant=refuse)
        except json.JSONDecodeError as exc:
            raise PolicyImportError(f"architecture {text_or_spec!r} is not valid JSON: {exc}") from None
    else:
        spec = {"arch": str(text_or_spec)}
    if not isinstance(spec, dict) or "arch" not in spec:
        raise PolicyImportError(f"architecture {text_or_spec!r}: give a network spec such as "
                                '{"arch": "mlp", "in": 4, "hidden": [64, 64], "out": 2}, or mlp')
    return spec




















def read_state_dict(path: str | Path, fmt: str = "auto",
                    max_bytes: int = MAX_MEMBER_BYTES) -> tuple[dict, str, str | None, str | None, str]:
    """(state dict, format, archive member, activation, untold) of a policy file; nothing is extracted to
    disk.  A Q-network: activation None, untold "".  A policy network (its state dict comes back with crop's
    keys, the value branch dropped): activation = its MLP's as the file tells it, or None with ``untold``
    saying why the file does not tell it (then the architecture must give it)."""
    path = Path(path)
    check_file(path, fmt, max_bytes)
    # A torch.save file is itself a zip archive: an SB3 archive is told apart by its policy.pth member.
    member = None
    if fmt in ("auto", "sb3") and zipfile.is_zipfile(path):
        data = _sb3_policy_bytes(path, max_bytes)
        if data is not None:
            data, member = data
            what = f"{path}: member {member!r}"
            state = _load_bytes(data, what)
            if any(k.startswith(("action_net.", "log_std")) for k in state):  # PPO / A2C: actor-critic
                actor, cnn = _sb3_actor(state, what)
                kwargs, unreadable = _sb3_policy_kwargs(path)
                if cnn:
                    if kwargs is not None and kwargs.get("normalize_images") in (False, "False"):
                        raise PolicyImportError(f"{path}: a CnnPolicy trained with policy_kwargs normalize_images "
                                                "False (raw pixels); crop feeds it pixels/255; refusing it")
                    return actor, "sb3", member, "relu", ""  # NatureCNN: ReLU
                if kwargs is None:
                    return actor, "sb3", member, None, f"an SB3 actor-critic MlpPolicy whose 'data' member is " \
                                                       f"{unreadable}, so its activation is unknown"
                return actor, "sb3", member, _sb3_activation(path, kwargs), ""
            return _sb3_q_net(state, what), "sb3", member, None, ""
    if fmt == "sb3":
        raise PolicyImportError(f"{path}: not a Stable-Baselines3 archive (a zip with a {SB3_POLICY} member)")
    state = _load_bytes(path.read_bytes(), str(path))
    if fmt == "auto":
        fmt = "cleanrl" if path.suffix == ".cleanrl_model" else "torch"
    actor = _cleanrl_actor(state)
    return (state, fmt, None, None, "") if actor is None else (actor[0], fmt, None, actor[1], actor[2])


def _sb3_q_net(state: dict, what: str) -> dict:
    """The online Q-network of an SB3 DQN policy, with the keys of crop's ``mlp`` / ``nature_cnn``."""
    q = {k[len("q_net."):]: v for k, v in state.items() if k.startswith("q_net.")}
    if not q:
        raise PolicyImportError(f"{what}: no q_net.* tensors (keys {sorted(state)[:6]}…); is it a DQN policy?")
    # CnnPolicy: NatureCNN (cnn.0/2/4 = nature_cnn 0/2/4, linear.0 = 7) and its head q_net.0 (= 9).
    head_offset = 9 if any(k.startswith("features_extractor.") for k in q) else 0
    out = {}
    for k, v in q.items():
        cnn = re.fullmatch(r"features_extractor\.cnn\.(\d+)\.(weight|bias)", k)
        linear = re.fullmatch(r"features_extractor\.linear\.0\.(weight|bias)", k)
        head = re.fullmatch(r"q_net\.(\d+)\.(weight|bias)", k)
        if head:  # MlpPolicy: the whole network; CnnPolicy: the head
            out[f"{int(head.group(1)) + head_offset}.{head.group(2)}"] = v
        elif cnn:
            out[f"{cnn.group(1)}.{cnn.group(2)}"] = v
        elif linear:
            out[f"7.{linear.group(1)}"] = v
        else:
            raise PolicyImportError(f"{what}: unexpected key q_net.{k} (a features extractor crop does not know)")
    return out






def _sb3_policy_kwargs(path: Path) -> tuple[dict | None, str]:
    """``policy_kwargs`` of an SB3 archive's ``data`` member ({} when not given), or None and why ``data``
    cannot be read (missing, over the limit)."""
    try:
        with zipfile.ZipFile(path) as zf:
            info = next((i for i in zf.infolist() if i.filename == "data"), None)
            if info is None:
                return None, "missing"
            if info.file_size > MAX_DATA_BYTES:
                return None, f"{info.file_size} bytes, over the limit of {MAX_DATA_BYTES}"
            raw = zf.read(info)
    except _ZIP_ERRORS as exc:
        raise _corrupt_zip(path, exc) from None
    try:
        kwargs = sb3_json(raw).get("policy_kwargs") or {}
    except (ValueError, AttributeError):
        raise PolicyImportError(f"{path}: member 'data' is not SB3's JSON; refusing it") from None
    return (kwargs if isinstance(kwargs, dict) else {}), ""




def _sb3_activation(path: Path, kwargs: dict) -> str:
    """The MLP activation of an SB3 actor-critic policy: ``policy_kwargs.activation_fn`` (SB3 writes its class
    as text), Tanh (SB3's default for PPO and A2C) when it is not given."""
    fn = str(kwargs.get("activation_fn", "Tanh"))
    for name, act in ACTIVATIONS.items():
        if re.search(rf"\b{name}\b", fn):
            return act
    raise PolicyImportError(f"{path}: activation {fn!r} is not supported (known: {sorted(ACTIVATIONS)})")


def _sb3_actor(state: dict, what: str) -> tuple[dict, bool]:
    """The policy branch of an SB3 ActorCriticPolicy (PPO, A2C) with the keys of crop's ``mlp`` /
    ``nature_cnn``, and whether it is a CNN: MlpPolicy ``mlp_extractor.policy_net.{i}`` → i and ``action_net``
    → the last layer; CnnPolicy: NatureCNN (``features_extractor``, or ``pi_features_extractor`` when not
    shared) → 0/2/4/7 and ``action_net`` → 9.  The value branch (``value_net``, ``mlp_extractor.value_net``,
    ``vf_*``) is dropped; a continuous-action policy (``log_std``) and ``mlp_extractor`` keys of another
    layout (SB3 < 1.8's ``shared_net``) are refused."""
    if "log_std" in state:
        raise PolicyImportError(f"{what}: a continuous-action policy (log_std); crop certifies discrete actions "
                                "only; refusing it")
    other = sorted(k for k in state if k.startswith("mlp_extractor.")
                   and not k.startswith(("mlp_extractor.policy_net.", "mlp_extractor.value_net.")))
    if other:
        raise PolicyImportError(f"{what}: unexpected key {other[0]} (an mlp_extractor layout crop does not know, "
                                "e.g. SB3 < 1.8's shared_net); refusing it")
    fe = "pi_features_extractor." if any(k.startswith("pi_features_extractor.") for k in state) \
        else "features_extractor."
    policy = {k[len("mlp_extractor.policy_net."):]: v for k, v in state.items()
              if k.startswith("mlp_extractor.policy_net.")}
    cnn = {k[len(fe):]: v for k, v in state.items() if k.startswith(fe)}
    out = {}
    if cnn:
        if policy:
            raise PolicyImportError(f"{what}: a CNN policy with extra policy layers (mlp_extractor.policy_net) "
                                    "does not fit nature_cnn; refusing it")
        for k, v in cnn.items():
            conv = re.fullmatch(r"cnn\.(\d+)\.(weight|bias)", k)
            linear = re.fullmatch(r"linear\.0\.(weight|bias)", k)
            if not (conv or linear):
                raise PolicyImportError(f"{what}: unexpected key {fe}{k} (a features extractor crop does not know)")
            out[f"{conv.group(1)}.{conv.group(2)}" if conv else f"7.{linear.group(1)}"] = v
        head = 9
    else:
        for k, v in policy.items():
            layer = re.fullmatch(r"(\d+)\.(weight|bias)", k)
            if layer is None:
                raise PolicyImportError(f"{what}: unexpected key mlp_extractor.policy_net.{k}")
            out[k] = v
        head = 2 * len({k.split(".")[0] for k in policy})
    for k in ("weight", "bias"):
        if f"action_net.{k}" not in state:
            raise PolicyImportError(f"{what}: no action_net.{k}; a discrete-action policy is needed")
        out[f"{head}.{k}"] = state[f"action_net.{k}"]
    return out, bool(cnn)


def _is_cleanrl_ppo(state: dict) -> bool:
    """Whether a state dict is laid out as CleanRL's ``ppo.py`` Agent writes it: ``actor`` and ``critic`` each
    three Linear layers 0/2/4 (Tanh between them) on the same input, the critic giving one value."""
    keys = {f"{net}.{i}.{w}" for net in ("actor", "critic") for i in (0, 2, 4) for w in ("weight", "bias")}
    if set(state) != keys:
        return False
    for net in ("actor", "critic"):
        ws = [state[f"{net}.{i}.weight"] for i in (0, 2, 4)]
        if any(w.dim() != 2 for w in ws) or ws[1].shape[1] != ws[0].shape[0] or ws[2].shape[1] != ws[1].shape[0]:
            return False
    same_input = state["critic.0.weight"].shape[1] == state["actor.0.weight"].shape[1]
    return state["critic.4.weight"].shape[0] == 1 and same_input


def _cleanrl_actor(state: dict) -> tuple[dict, str | None, str] | None:
    """CleanRL's PPO agents with crop's keys, their MLP activation (None: not told) and why it is not told;
    None for a state dict without ``actor.*`` keys.  ``ppo.py``: ``actor.0/2/4`` (Tanh, only when the whole
    file is that Agent's layout); ``ppo_atari.py``: ``network.0/2/4/7`` (NatureCNN) + ``actor`` → 9; another
    actor-critic with ``actor.*`` keys: its activation must be given."""
    if not any(k.startswith("actor.") for k in state):
        return None
    if any(k.startswith("network.") for k in state):
        out = {k[len("network."):]: v for k, v in state.items() if k.startswith("network.")}
        out.update({f"9.{k[len('actor.'):]}": v for k, v in state.items() if k.startswith("actor.")})
        return out, "relu", ""  # NatureCNN: ReLU
    actor = {k[len("actor."):]: v for k, v in state.items() if k.startswith("actor.")}
    if _is_cleanrl_ppo(state):
        return actor, "tanh", ""
    return actor, None, "an actor-critic state dict (actor.* keys) that is not CleanRL ppo.py's layout " \
                        "(actor.0/2/4 and critic.0/2/4 Linear layers), so its activation is unknown"


def infer_mlp_spec(state: dict) -> dict:
    """The ``mlp`` spec of a state dict of Linear layers ``0, 2, 4, …`` (any prefix before the index)."""
    layers = {}
    for k, v in state.items():
        m = re.search(r"(\d+)\.weight$", k)
        if m and v.dim() == 2:
            layers[int(m.group(1))] = v
    idx = sorted(layers)
    if not idx or idx != list(range(idx[0], idx[0] + 2 * len(idx), 2)):
        raise PolicyImportError(f"cannot read an MLP's sizes from keys {sorted(state)[:8]}; give the whole "
                                "architecture, e.g. {\"arch\": \"mlp\", \"in\": 4, \"hidden\": [64, 64], \"out\": 2}")
    ws = [layers[i] for i in idx]
    for k, (w, nxt) in enumerate(zip(ws, ws[1:])):
        if nxt.shape[1] != w.shape[0]:
            raise PolicyImportError(f"its layers do not chain: layer {idx[k]} gives {w.shape[0]} values, layer "
                                    f"{idx[k + 1]} takes {nxt.shape[1]}; refusing it")
    return {"arch": "mlp", "in": int(ws[0].shape[1]), "hidden": [int(w.shape[0]) for w in ws[:-1]],
            "out": int(ws[-1].shape[0])}


def _mlp_spec(spec: dict, state: dict, activation: str | None, untold: str, path: Path) -> dict:
    """An ``mlp`` spec completed from the file: sizes read from the weights when only ``arch`` (and perhaps
    ``activation``) is given; the activation the file tells filled in (ReLU, the default, stays unwritten) or
    a conflicting one refused; a policy MLP whose activation the file does not tell needs it in the spec."""
    spec = dict(spec)
    if set(spec) <= {"arch", "activation"}:
        try:
            spec = {**infer_mlp_spec(state), **spec}
        except PolicyImportError as exc:
            raise PolicyImportError(f"{path}: {exc}") from None
    if activation is not None:
        if "activation" not in spec:
            if activation != "relu":
                spec["activation"] = activation
        elif spec["activation"] != activation:
            raise PolicyImportError(f"{path}: the architecture says activation {spec['activation']!r}, the file "
                                    f"says {activation!r}; refusing the conflict (leave activation out to use the "
                                    "file's)")
    elif untold and "activation" not in spec:
        raise PolicyImportError(f"{path}: {untold}; give it in the architecture, e.g. --arch "
                                '\'{"arch": "mlp", "activation": "tanh"}\' (config: architecture: {arch: mlp, '
                                "activation: tanh}); refusing to guess")
    return spec


def import_policy(path: str | Path, arch, fmt: str = "auto", sha256: str | None = None,
                  max_bytes: int = MAX_MEMBER_BYTES) -> tuple[torch.nn.Module, dict]:
    """Read ``path`` (checked as the module says) into the architecture ``arch``; returns the network (eval
    mode) and the import record: source path, sha256, format, member, net_spec."""
    path = Path(path)
    spec = parse_architecture(arch)
    check_file(path, fmt, max_bytes)
    digest = sha256_file(path)
    if sha256 is not None and digest != sha256.lower():
        raise PolicyImportError(f"{path}: sha256 {digest} differs from the pinned {sha256}; refusing it")
    from crop.agents.continuous import read_continuous

    continuous = read_continuous(path, fmt, max_bytes)
    if continuous is not None:   # a Box-action agent: its actor, squashing and bounds all come from the file
        state, fmt, member, file_spec = continuous
        if set(spec) - {"arch"} or spec.get("arch") not in ("mlp", "actor"):
            raise PolicyImportError(f"{path}: a continuous-action agent, whose actor, squashing and bounds are read "
                                    f"from the file; give architecture mlp (the default), not {spec}")
        spec, network = file_spec, "actor"
    else:
        state, fmt, member, activation, untold = read_state_dict(path, fmt, max_bytes)
        network = "q" if activation is None and not untold else "policy"
    if sha256_file(path) != digest:  # the file changed while it was read
        raise PolicyImportError(f"{path}: changed while it was read; refusing it")
    if spec.get("arch") == "mlp":
        spec = _mlp_spec(spec, state, activation, untold, path)
    bad = sorted(k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all())
    if bad:
        raise PolicyImportError(f"{path}: non-finite weights (NaN or inf) in {bad[:5]}; refusing it")
    net = load_state(state, spec, f"{path}" + (f" member {member!r}" if member else "") + f" ({fmt})")
    net.network_kind = network   # what its messages call it (crop.names.network_name)
    return net, {"path": str(path), "sha256": digest, "format": fmt, "member": member, "net_spec": spec,
                 "network": network}


def check_fits_env(net: torch.nn.Module, spec: dict, env_id: str, profile: str | None, what: str) -> None:
    """One forward pass on a real first observation of ``env_id`` (its ``profile``): the network must take it
    and give one Q-value per action, before any evaluation or certification relies on it."""
    from crop.envs import make_env, to_obs

    env = make_env(env_id, profile)
    try:
        obs, _ = env.reset(seed=0)
        box = env.action_space.shape if spec.get("arch") == "actor" else None
        n = int(box[0]) if box else int(env.action_space.n)
    finally:
        env.close()
    x = torch.as_tensor(to_obs(obs)).unsqueeze(0)
    try:
        with torch.no_grad():
            q = net(x)
    except RuntimeError:  # layers that do not chain, or an input size other than the observation's
        raise PolicyImportError(f"{what}: the network ({spec_summary(spec)}) cannot take a {env_id} observation "
                                f"of shape {tuple(x.shape[1:])}: its input or layers do not fit; refusing it") from None
    if tuple(q.shape) != (1, n):
        raise PolicyImportError(f"{what}: the network ({spec_summary(spec)}) gives {tuple(q.shape[1:])} values per "
                                f"state; {env_id} has {n} {'action dimensions' if box else 'actions'}; refusing it")


def check_policy_file(path: str | Path, arch, fmt: str, sha256: str | None, env_id: str,
                      profile: str) -> tuple[torch.nn.Module, dict]:
    """Everything `crop import` checks of a policy file before it evaluates or writes anything: a regular file
    within the size limit, its pinned sha256, safe to read (tensors only), finite real weights that fit the
    architecture, and a network that takes ``env_id``'s observations under ``profile`` and gives one value per
    action (sizes, then one forward pass on a real first observation).  Returns :func:`import_policy`'s
    network and record; raises :class:`PolicyImportError` (a :class:`CheckpointError`) in one line."""
    from crop.models import fit_problem

    net, info = import_policy(path, arch, fmt, sha256)
    problem = fit_problem(info["net_spec"], env_id, profile)
    if problem:
        raise PolicyImportError(f"{path}: {problem}")
    check_fits_env(net, info["net_spec"], env_id, profile, str(path))
    return net, info
