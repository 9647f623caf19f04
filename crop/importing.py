"""Your own policy: a Q-network trained elsewhere, imported into a checkpoint that every certifier accepts.

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

The file is untrusted: its size is bounded and its sha256 taken before anything reads it (and compared with
a pinned one when given); a zip is read in memory, one member, never extracted to disk; tensors only
(``torch.load(weights_only=True)``); every weight must be finite and fit the architecture exactly.
"""
from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path, PurePosixPath

import torch

from crop.checkpoints import MAX_ARCHIVE_MEMBERS, MAX_MEMBER_BYTES, _check_name
from crop.io import sha256_file
from crop.models import CheckpointError, load_state, unsafe_load_reason

__all__ = ["FORMATS", "PolicyImportError", "import_policy", "infer_mlp_spec", "parse_architecture",
           "read_state_dict"]

FORMATS = ("auto", "torch", "cleanrl", "sb3")
SB3_POLICY = "policy.pth"


class PolicyImportError(CheckpointError):
    """A policy file that cannot be imported: unreadable, unsafe, too large or not a fitting Q-network."""


def parse_architecture(text_or_spec) -> dict:
    """``--arch`` / the config's ``architecture``: a network spec (JSON object or dict), or ``mlp`` for an MLP
    whose sizes are read from the weights."""
    import json

    if isinstance(text_or_spec, dict):
        spec = dict(text_or_spec)
    elif str(text_or_spec).lstrip().startswith("{"):
        try:
            spec = json.loads(text_or_spec)
        except json.JSONDecodeError as exc:
            raise PolicyImportError(f"architecture {text_or_spec!r} is not valid JSON: {exc}") from None
    else:
        spec = {"arch": str(text_or_spec)}
    if not isinstance(spec, dict) or "arch" not in spec:
        raise PolicyImportError(f"architecture {text_or_spec!r}: give a network spec such as "
                                '{"arch": "mlp", "in": 4, "hidden": [64, 64], "out": 2}, or mlp')
    return spec


def _tensors(obj, what: str) -> dict:
    """The state dict inside what ``torch.load`` returned (top level or a usual wrapping key)."""
    if isinstance(obj, dict):
        for key in ("state_dict", "model_state_dict", "q_network"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise PolicyImportError(f"{what} is not a state dict of tensors")
    return obj


def _load_bytes(data: bytes, what: str) -> dict:
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle refusing a non-tensor object lands here too
        raise PolicyImportError(f"{what} cannot be loaded safely (weights_only=True): {unsafe_load_reason(exc)}; "
                                "refusing it") from None
    return _tensors(obj, what)


def _sb3_member(zf: zipfile.ZipFile, path: Path) -> zipfile.ZipInfo | None:
    """The ``policy.pth`` member of an SB3 archive (None: not an SB3 archive), after checking every name."""
    infos = zf.infolist()
    if len(infos) > MAX_ARCHIVE_MEMBERS:
        raise PolicyImportError(f"{path}: {len(infos)} archive members; refusing it")
    for info in infos:
        try:
            _check_name(info.filename)
        except Exception as exc:
            raise PolicyImportError(str(exc)) from None
    hits = [i for i in infos if PurePosixPath(i.filename).name == SB3_POLICY and not i.is_dir()]
    if len(hits) > 1:
        raise PolicyImportError(f"{path}: {len(hits)} members named {SB3_POLICY}; refusing it")
    return hits[0] if hits else None


def read_state_dict(path: str | Path, fmt: str = "auto",
                    max_bytes: int = MAX_MEMBER_BYTES) -> tuple[dict, str, str | None]:
    """(state dict, format, archive member) of a policy file; nothing is extracted to disk."""
    path = Path(path)
    if fmt not in FORMATS:
        raise PolicyImportError(f"unknown format {fmt!r}; known: {list(FORMATS)}")
    if not path.is_file():
        raise PolicyImportError(f"{path}: no such policy file")
    size = path.stat().st_size
    if size > max_bytes:
        raise PolicyImportError(f"{path}: {size} bytes, over the limit of {max_bytes}; refusing it")
    # A torch.save file is itself a zip archive: an SB3 archive is told apart by its policy.pth member.
    member = None
    if fmt in ("auto", "sb3") and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            member = _sb3_member(zf, path)
            if member is not None:
                if member.file_size > max_bytes:
                    raise PolicyImportError(f"{path}: member {member.filename!r} declares {member.file_size} "
                                            f"bytes, over the limit of {max_bytes}; refusing it")
                with zf.open(member) as src:  # the read limit also stops a member that lies about its size
                    data = src.read(max_bytes + 1)
                if len(data) > max_bytes:
                    raise PolicyImportError(f"{path}: member {member.filename!r} expands beyond {max_bytes} "
                                            "bytes; refusing it")
                what = f"{path}: member {member.filename!r}"
                return _sb3_q_net(_load_bytes(data, what), what), "sb3", member.filename
    if fmt == "sb3":
        raise PolicyImportError(f"{path}: not a Stable-Baselines3 archive (a zip with a {SB3_POLICY} member)")
    state = _load_bytes(path.read_bytes(), str(path))
    if fmt == "auto":
        fmt = "cleanrl" if path.suffix == ".cleanrl_model" else "torch"
    return state, fmt, None


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
    return {"arch": "mlp", "in": int(ws[0].shape[1]), "hidden": [int(w.shape[0]) for w in ws[:-1]],
            "out": int(ws[-1].shape[0])}


def import_policy(path: str | Path, arch, fmt: str = "auto", sha256: str | None = None,
                  max_bytes: int = MAX_MEMBER_BYTES) -> tuple[torch.nn.Module, dict]:
    """Read ``path`` (checked as the module says) into the architecture ``arch``; returns the network (eval
    mode) and the import record: source path, sha256, format, member, net_spec."""
    path = Path(path)
    spec = parse_architecture(arch)
    if not path.is_file():
        raise PolicyImportError(f"{path}: no such policy file")
    digest = sha256_file(path)
    if sha256 is not None and digest != sha256.lower():
        raise PolicyImportError(f"{path}: sha256 {digest} differs from the pinned {sha256}; refusing it")
    state, fmt, member = read_state_dict(path, fmt, max_bytes)
    if sha256_file(path) != digest:  # the file changed while it was read
        raise PolicyImportError(f"{path}: changed while it was read; refusing it")
    if spec == {"arch": "mlp"}:
        spec = infer_mlp_spec(state)
    bad = sorted(k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all())
    if bad:
        raise PolicyImportError(f"{path}: non-finite weights (NaN or inf) in {bad[:5]}; refusing it")
    net = load_state(state, spec, f"{path}" + (f" member {member!r}" if member else "") + f" ({fmt})")
    return net, {"path": str(path), "sha256": digest, "format": fmt, "member": member, "net_spec": spec}
