"""Network architectures and a loader that refuses what it cannot trust.

An architecture is described by a small JSON-able *spec* (``{"arch": "mlp", "in": 4, "hidden": [128, 128],
"out": 2}``) that travels with every checkpoint, so a reader of the results knows exactly which function
was smoothed.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import torch
from torch import nn

from crop.io import sha256_file
from crop.names import MAX_PARAMETERS

__all__ = ["build_network", "load_network", "load_checkpoint", "load_state", "save_network", "non_finite",
           "load_refusal", "pickled_globals", "CheckpointError", "spec_summary", "n_actions", "input_shape",
           "fit_problem"]


class CheckpointError(RuntimeError):
    """A checkpoint that must not be used: wrong hash, wrong architecture, unreadable or unsafe."""


#: ``mlp``'s hidden activations: ReLU (Q-networks; the default, not written in a spec) and Tanh (the policy
#: networks of SB3's PPO/A2C MlpPolicy and CleanRL's ppo.py).
MLP_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


def _mlp(spec: dict) -> nn.Sequential:
    dims = [int(spec["in"]), *[int(h) for h in spec.get("hidden", [])], int(spec["out"])]
    act = spec.get("activation", "relu")
    if act not in MLP_ACTIVATIONS:
        raise CheckpointError(f"unknown mlp activation {act!r}; known: {sorted(MLP_ACTIVATIONS)}")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(MLP_ACTIVATIONS[act]())
    # nn.Sequential keeps the state-dict keys "0.weight", "2.weight", … used by CROP's MLP checkpoints.
    return nn.Sequential(*layers)


def _conv_trunk(c: int) -> list[nn.Module]:
    return [nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten()]


def _trunk_width(in_size: int) -> int:
    s = ((in_size - 8) // 4 + 1)
    s = (s - 4) // 2 + 1
    s = s - 3 + 1
    return 64 * s * s


def _nature_cnn(spec: dict) -> nn.Sequential:
    """The DQN of Mnih et al. (2015): 3 conv layers and a 512-unit layer on c×n×n inputs in [0, 1].

    Keys 0, 2, 4 (conv), 7, 9 (linear) — the layout of CleanRL/CROP's ``QNetwork.network`` (84×84×4),
    SA-DQN's non-dueling ``CnnDQN`` (84×84×1) and RADIAL-RL's ``CnnDQN.model`` (80×80×1).
    """
    c, n, out = int(spec.get("in_channels", 4)), int(spec.get("in_size", 84)), int(spec["out"])
    return nn.Sequential(*_conv_trunk(c), nn.Linear(_trunk_width(n), 512), nn.ReLU(), nn.Linear(512, out))


class DuelingCnn(nn.Module):
    """SA-DQN's ``DuelingCnnDQN``: Q = V + A − mean(A), keys ``cnn.*``, ``advantage.*``, ``value.*``."""

    def __init__(self, c: int, n: int, out: int):
        super().__init__()
        w = _trunk_width(n)
        self.cnn = nn.Sequential(*_conv_trunk(c))
        self.advantage = nn.Sequential(nn.Linear(w, 512), nn.ReLU(), nn.Linear(512, out))
        self.value = nn.Sequential(nn.Linear(w, 512), nn.ReLU(), nn.Linear(512, 1))

    def forward(self, x):
        h = self.cnn(x)
        a = self.advantage(h)
        return self.value(h) + a - a.mean(dim=1, keepdim=True)


def _dueling_cnn(spec: dict) -> nn.Module:
    return DuelingCnn(int(spec.get("in_channels", 1)), int(spec.get("in_size", 84)), int(spec["out"]))


_BUILDERS = {"mlp": _mlp, "nature_cnn": _nature_cnn, "dueling_cnn": _dueling_cnn}

# NoisyNet's mean network and CARRL's certified lower bound of Q (their own modules).
from crop.models.carrl import carrl as _carrl  # noqa: E402
from crop.models.noisy import noisy_mlp as _noisy_mlp  # noqa: E402

_BUILDERS.update(noisy_mlp=_noisy_mlp, carrl=_carrl)


def _actor(spec: dict) -> nn.Module:
    """A continuous-action agent's deterministic actor (and its critics): :mod:`crop.models.actor`."""
    from crop.models.actor import build_actor

    return build_actor(spec)


_BUILDERS["actor"] = _actor


def n_actions(spec: dict) -> int:
    """The number of Q-values (actions) a spec's network outputs; a wrapping spec (CARRL) has its base's."""
    if "out" in spec:
        return int(spec["out"])
    if isinstance(spec.get("base"), dict):
        return n_actions(spec["base"])
    raise CheckpointError(f"network spec {spec} names no output size ('out')")


def input_shape(spec: dict) -> tuple:
    """The observation shape a spec's network takes: (in,) for an MLP, (c, n, n) for a Nature-CNN; a
    wrapping spec (CARRL) takes its base's."""
    arch = spec.get("arch")
    if arch in ("mlp", "noisy_mlp", "actor") and "in" in spec:
        return (int(spec["in"]),)
    if arch in ("nature_cnn", "dueling_cnn"):
        n = int(spec.get("in_size", 84))
        return (int(spec.get("in_channels", 4 if arch == "nature_cnn" else 1)), n, n)
    if isinstance(spec.get("base"), dict):
        return input_shape(spec["base"])
    raise CheckpointError(f"network spec {spec} names no input size")


def fit_problem(spec: dict, env_id: str, profile: str | None = None) -> str | None:
    """Why a spec's network cannot be the Q-network of ``env_id`` under ``profile`` (its input is not the
    environment's observation, or it gives not one Q-value per action), in one line naming both shapes; or
    None."""
    from crop.envs import action_bounds, default_profile, env_shapes

    profile = profile or default_profile(env_id)
    n, shape = env_shapes(env_id, profile)
    net_in, net_out = input_shape(spec), n_actions(spec)
    bounds, actor = action_bounds(env_id, profile), spec.get("arch") == "actor"
    if actor and bounds is None:
        return (f"the network ({spec_summary(spec)}) is a continuous-action actor, but {env_id} has a Discrete "
                "action space")
    if bounds is not None and not actor:
        return (f"{env_id} has a continuous (Box) action space, and the network ({spec_summary(spec)}) is not a "
                "continuous-action actor (crop imports SB3 SAC, TD3, PPO and A2C agents for Box actions)")
    if actor and net_in == shape and net_out == n:
        import numpy as np

        if not (np.allclose(spec["low"], bounds[0], rtol=1e-6, atol=0) and
                np.allclose(spec["high"], bounds[1], rtol=1e-6, atol=0)):
            return (f"the action bounds in the file, {list(spec['low'])}..{list(spec['high'])}, disagree with "
                    f"{env_id}'s, {list(bounds[0])}..{list(bounds[1])}")
    if net_in == shape and net_out == n:
        return None
    return (f"the network ({spec_summary(spec)}) takes input {net_in} and gives {net_out} outputs, but {env_id} "
            f"(profile {profile}) gives observations of shape {shape} and has {n} actions")


def spec_summary(spec: dict) -> str:
    if spec.get("arch") == "carrl":
        return (f"CARRL ({spec.get('method', 'crown')} lower bound, ℓ{spec.get('norm', 2)} ε = {spec.get('eps')}) "
                f"over {spec_summary(spec['base'])}")
    if spec.get("arch") == "noisy_mlp":
        return "NoisyNet " + spec_summary({**spec, "arch": "mlp"})
    if spec.get("arch") == "actor":
        from crop.models.actor import actor_summary

        return actor_summary(spec)
    if spec.get("arch") == "mlp":
        dims = [spec["in"], *spec.get("hidden", []), spec["out"]]
        return "MLP " + "→".join(str(d) for d in dims) + (f" ({spec['activation']})" if "activation" in spec else "")
    if spec.get("arch") in ("nature_cnn", "dueling_cnn"):
        n = spec.get("in_size", 84)
        kind = "Nature-CNN" if spec["arch"] == "nature_cnn" else "dueling Nature-CNN"
        return f"{kind} {spec.get('in_channels', 4)}×{n}×{n}→{spec['out']}"
    return str(spec)




def _parameter_count(spec: dict) -> int:
    """Parameters of ``spec``'s network, counted on the meta device (no memory, no random draws).  CARRL's
    network is its base's layers, counted through the base: its constructor bounds a real input."""
    if spec.get("arch") == "carrl" and isinstance(spec.get("base"), dict):
        return _parameter_count(spec["base"])
    with torch.device("meta"):
        return sum(p.numel() for p in _BUILDERS[spec["arch"]](spec).parameters())


def build_network(spec: dict) -> nn.Module:
    """A fresh network for ``spec``; raises ``CheckpointError`` for an unknown architecture, sizes that are
    not positive integers or more than :data:`MAX_PARAMETERS` parameters."""
    arch = spec.get("arch")
    if arch not in _BUILDERS:
        raise CheckpointError(f"unknown architecture {arch!r}; known: {sorted(_BUILDERS)}")
    try:
        # A declared size is bounded before anything is allocated.
        n = _parameter_count(spec)
        if n <= MAX_PARAMETERS:
            return _BUILDERS[arch](spec)
    except KeyError as exc:  # a field the architecture needs is not given (or a nested arch is no known one)
        raise CheckpointError(f"network spec {spec} does not describe a network of architecture {arch!r}: "
                              f"{str(exc.args[0])[:50]!r} is missing or unknown") from None
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:  # sizes not positive integers
        raise CheckpointError(f"network spec {spec} does not describe a network of architecture {arch!r} ("
                              f"{' '.join(str(exc).split())[:200]}); sizes must be positive integers") from None
    raise CheckpointError(f"network spec {spec_summary(spec)} has {n:,} parameters, over the limit of "
                          f"{MAX_PARAMETERS:,} (1 GiB of float32 weights, the largest file crop reads); refusing it")


def _normalise_keys(state: dict, expected: set[str]) -> dict:
    """Accept the key styles published checkpoints use (``0.weight`` and ``network.0.weight``)."""
    if set(state) == expected:
        return state
    for prefix in ("network.", "model.", "module."):
        stripped = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
        if set(stripped) == expected:
            return stripped
    return state


# Globals a plain tensor pickle calls (torch's rebuild functions and storage types, OrderedDict): data.  Any
# other global in the file is code a full unpickler would run (os.system, a pickled nn.Module's class, …).
_DATA_GLOBAL = re.compile(r"collections\.OrderedDict|(__builtin__|builtins)\.(set|frozenset|slice)|"
                          r"torch(\._utils|\.storage|\.serialization)?\.(_rebuild\w*|\w*Storage|Size|device|dtype|_get_layout|u?int\d+|float\d*|b?float16|"
                          r"half|double|long|short|bool|complex\d+)")
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}


def pickled_globals(data: bytes) -> list[str]:
    """``module.name`` of every global a pickle stream calls or builds (opcodes GLOBAL, STACK_GLOBAL, INST),
    read with :mod:`pickletools` without running anything: of a torch.save zip's ``data.pkl`` members, else of
    the pickles the bytes hold (the legacy format is several).  Best effort: [] where nothing parses."""
    import pickletools
    import zipfile

    streams = []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            streams = [zf.read(i) for i in zf.infolist()[:1000] if i.filename.endswith("data.pkl")
                       and i.file_size <= len(data) * 4 + 2**20]
    except Exception:  # not a (readable) zip: the bytes are pickles themselves
        streams = [data]
    found: list[str] = []
    for stream in streams:
        buf = io.BytesIO(stream)
        for _ in range(8):  # the legacy format: magic number, protocol, sys info, the object, storage keys
            strings, memo = [], {}
            try:
                for op, arg, _pos in pickletools.genops(buf):
                    if op.name in _STRING_OPS:
                        strings.append(arg if isinstance(arg, str) else str(arg))
                    elif op.name == "MEMOIZE" and strings:
                        memo[len(memo)] = strings[-1]
                    elif op.name in ("PUT", "BINPUT", "LONG_BINPUT") and strings:
                        memo[arg] = strings[-1]
                    elif op.name in ("GET", "BINGET", "LONG_BINGET") and isinstance(memo.get(arg), str):
                        strings.append(memo[arg])
                    elif op.name in ("GLOBAL", "INST"):
                        found.append(".".join(str(arg).split(" ", 1)))
                    elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                        found.append(f"{strings[-2]}.{strings[-1]}")
            except Exception:
                break
            if buf.tell() >= len(stream):
                break
    return list(dict.fromkeys(found))


def load_refusal(data: bytes, what: str) -> str:
    """Why ``torch.load(weights_only=True)`` refused ``data``, in one line of crop's own words (torch's text
    changes between releases, and its advice to load with weights_only=False would run the file's code)."""
    code = [g for g in pickled_globals(data) if not _DATA_GLOBAL.fullmatch(g)]
    if code:
        return (f"{what} holds code, not only tensors (a pickled call of {', '.join(code[:3])}); it was not run. "
                "A policy file must hold tensors only (torch.save(net.state_dict(), path)); refusing it")
    return (f"{what} is not a readable PyTorch file of tensors (corrupt, truncated or another format); "
            "refusing it")


def non_finite(net: nn.Module) -> str | None:
    """Where ``net``'s parameters and buffers hold a value that is not a finite number (``"0.weight: 3 of 64
    values NaN or ±inf"``, the first such tensor), or None: a network that no writer of ``model.pt`` writes."""
    for name, t in net.state_dict().items():
        if t.is_floating_point() or t.is_complex():
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                return f"{name}: {bad} of {t.numel()} values NaN or ±inf"
    return None


def save_network(net: nn.Module, path: str | Path) -> None:
    """Save a state dict (CPU tensors) atomically; :class:`CheckpointError` (nothing written) where a value is
    not a finite number (:func:`non_finite`)."""
    from crop.io import atomic_write_bytes

    bad = non_finite(net)
    if bad:
        raise CheckpointError(f"{path}: not written: the network's {bad}")
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_network(path: str | Path, spec: dict, expected_sha256: str | None = None,
                   device: str | torch.device = "cpu") -> nn.Module:
    """Load a checkpoint into the architecture ``spec``, in eval mode.

    * The file's sha256 is checked *before* it is opened when ``expected_sha256`` is given.
    * ``torch.load(weights_only=True)`` never runs pickled code; tensors saved on ``cuda:0`` map to CPU.
    * A key or shape mismatch names the missing and unexpected keys and the expected architecture.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if expected_sha256 is not None:
        actual = sha256_file(path)
        if actual != expected_sha256.lower():
            raise CheckpointError(
                f"checkpoint {path}: sha256 {actual} differs from the recorded {expected_sha256}; refusing to use it")
    state = load_tensors(path.read_bytes(), f"checkpoint {path}")
    return load_state(state, spec, f"checkpoint {path}", device)


def load_tensors(data: bytes, what: str):
    """``torch.load(weights_only=True)`` of ``data`` (nothing pickled is ever run); a refusal or a corrupt file
    is a :class:`CheckpointError` of one line (:func:`load_refusal`)."""
    import warnings

    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr: the error says it all
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception:  # a refused global, a corrupt zip or pickle, a truncated file: all land here
        raise CheckpointError(load_refusal(data, what)) from None


def load_state(state, spec: dict, what: str = "state dict", device: str | torch.device = "cpu") -> nn.Module:
    """Load a state dict of tensors (as ``torch.load(weights_only=True)`` returns it) into ``spec``, in eval
    mode; ``what`` names its origin in errors.  Key styles of published checkpoints are accepted."""
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{what} is not a state dict of tensors")
    complex_ = sorted(k for k, v in state.items() if v.is_complex())
    if complex_:  # the cast to float below would drop the imaginary part
        raise CheckpointError(f"{what}: complex-valued weights in {complex_[:5]}; a network's weights are real "
                              "numbers; refusing it")
    net = build_network(spec)
    expected = net.state_dict()
    state = _normalise_keys(state, set(expected))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    bad_shapes = sorted(f"{k}: file {tuple(state[k].shape)} vs expected {tuple(expected[k].shape)}"
                        for k in set(expected) & set(state) if state[k].shape != expected[k].shape)
    if missing or unexpected or bad_shapes:
        raise CheckpointError(
            f"{what} does not fit the expected architecture {spec_summary(spec)}: "
            f"missing keys {missing}, unexpected keys {unexpected}, shape mismatches {bad_shapes}")
    try:
        net.load_state_dict({k: v.float() for k, v in state.items()})
    except RuntimeError as exc:  # what the key and shape checks above cannot see (a module's own checks)
        raise CheckpointError(f"{what} does not fit the expected architecture {spec_summary(spec)}: "
                              f"{' '.join(str(exc).split())[:300]}") from None
    return net.to(device).eval()


def load_checkpoint(path: str | Path, env: str, algo: str, why: str = "") -> tuple[nn.Module, dict]:
    """``path`` (model.pt) verified against its record model.json — for ``env``/``algo``, its sha256 and
    architecture — then loaded; returns the network and the record.  ``why`` is added to a mismatch's
    message.  Raises :class:`crop.io.InputError` (bad input, before any work)."""
    from crop.io import InputError, read_json

    ckpt = Path(path)
    meta_file = ckpt.with_suffix(".json")
    if not ckpt.is_file():
        raise InputError(f"{ckpt}: no such checkpoint file; give a model.pt written by `crop checkpoint`, "
                         "`crop fetch` or `crop import` (your own policy: `crop import`)")
    if not meta_file.is_file():
        raise InputError(f"{ckpt}: no checkpoint record {meta_file.name} beside it (sha256 and architecture); "
                         f"import your own policy with `crop import --file {ckpt} …` (docs/own-policy.md)")
    meta = read_json(meta_file)
    for key in ("sha256", "net_spec", "env", "algo"):
        if key not in meta:
            raise InputError(f"{meta_file}: missing field {key!r}")
    if meta["env"] != env or meta["algo"] != algo:
        raise InputError(f"{ckpt}: recorded for {meta['env']}/{meta['algo']}, not {env}/{algo}{why}")
    try:
        problem = fit_problem(meta["net_spec"], env, meta.get("profile"))
    except (CheckpointError, ValueError) as exc:
        problem = str(exc)
    if problem:
        raise InputError(f"{ckpt}: {problem}")
    try:
        net = load_network(ckpt, meta["net_spec"], expected_sha256=meta["sha256"])
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    net.network_kind = meta.get("network", "q")   # what its messages call it (crop.names.network_name)
    return net, meta
