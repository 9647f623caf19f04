"""Reading a policy file someone else wrote, safely: a regular file within its size, a zip archive's members
checked before they are read (names, count, sizes), tensors through ``torch.load(weights_only=True)`` only, and
SB3's ``data`` JSON within its depth.  Shared by the Q-network and policy import (:mod:`crop.agents.importing`)
and the continuous-action one (:mod:`crop.agents.continuous`)."""
from __future__ import annotations

import os
import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath

import torch

from crop.agents.checkpoints import MAX_ARCHIVE_MEMBERS, _check_name
from crop.models import CheckpointError, load_tensors

FORMATS = ("auto", "torch", "cleanrl", "sb3")
SB3_POLICY = "policy.pth"

class PolicyImportError(CheckpointError):
    """A policy file that cannot be imported: unreadable, unsafe, too large or not a fitting Q-network."""

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
        obj = load_tensors(data, what)
    except CheckpointError as exc:
        raise PolicyImportError(str(exc)) from None
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

# What zipfile raises for a corrupt archive, a member whose header lies about its size or checksum, or an
# unsupported compression (its own words: "Bad CRC-32 for file 'policy.pth'", "Truncated file header", …).
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError, RuntimeError)

def _corrupt_zip(path: Path, exc: BaseException) -> PolicyImportError:
    why = " ".join(str(exc).split())[:200] or type(exc).__name__
    return PolicyImportError(f"{path}: a corrupt zip archive ({why}); refusing it")

def _sb3_policy_bytes(path: Path, max_bytes: int) -> tuple[bytes, str] | None:
    """(bytes, name) of an SB3 archive's policy.pth, read in memory (None: no such member).  The read limit
    stops a member that expands beyond its declared size; a corrupt archive, a member whose header lies about
    its size or its checksum, or an unsupported compression is one line."""
    try:
        with zipfile.ZipFile(path) as zf:
            member = _sb3_member(zf, path)
            if member is None:
                return None
            if member.file_size > max_bytes:
                raise PolicyImportError(f"{path}: member {member.filename!r} declares {member.file_size} "
                                        f"bytes, over the limit of {max_bytes}; refusing it")
            with zf.open(member) as src:
                data = src.read(max_bytes + 1)
    except PolicyImportError:
        raise
    except _ZIP_ERRORS as exc:
        raise _corrupt_zip(path, exc) from None
    if len(data) > max_bytes:
        raise PolicyImportError(f"{path}: member {member.filename!r} expands beyond {max_bytes} bytes; refusing it")
    return data, member.filename

#: What a path that is not a regular file is, by its stat mode (a FIFO would block the reader, a device such as
#: /dev/zero never ends).
_NOT_REGULAR = ((stat.S_ISDIR, "a directory, not a policy file; give the file itself"),
                (stat.S_ISFIFO, "a named pipe (FIFO), not a regular file; give a policy file saved to disk"),
                (stat.S_ISCHR, "a character device, not a regular file; give a policy file saved to disk"),
                (stat.S_ISBLK, "a block device, not a regular file; give a policy file saved to disk"),
                (stat.S_ISSOCK, "a socket, not a regular file; give a policy file saved to disk"))

def _regular_file(path: Path) -> os.stat_result:
    """The stat of ``path`` (links followed) when it is a regular file this process may read; else one line
    saying what it is instead (missing, a directory, a FIFO, a device, unreadable), before anything opens it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        # A config's relative path is read from the working directory (where snakemake runs), as every
        # reader opens it, never from the config file's folder: say so, since that is the usual mix-up.
        where = "" if path.is_absolute() else f" (a relative path is read from the working directory, {os.getcwd()})"
        raise PolicyImportError(f"{path}: no such policy file{where}") from None
    except OSError as exc:
        raise PolicyImportError(f"{path}: cannot read it ({exc.strerror})") from None
    for test, what in _NOT_REGULAR:
        if test(st.st_mode):
            raise PolicyImportError(f"{path}: {what}")
    if not stat.S_ISREG(st.st_mode):
        raise PolicyImportError(f"{path}: not a regular file; give a policy file saved to disk")
    if not os.access(path, os.R_OK):
        raise PolicyImportError(f"{path}: cannot read it (permission denied)")
    return st

def check_file(path: Path, fmt: str, max_bytes: int) -> None:
    """What every reader checks before it reads a byte: a known format, a regular readable file, within the size
    limit (one line each)."""
    if fmt not in FORMATS:
        raise PolicyImportError(f"unknown format {fmt!r}; known: {list(FORMATS)}")
    size = _regular_file(path).st_size
    if size > max_bytes:
        raise PolicyImportError(f"{path}: {size} bytes, over the limit of {max_bytes}; refusing it")

#: The activations crop's ``mlp`` can have (SB3's ``policy_kwargs.activation_fn``, CleanRL's PPO: Tanh).
ACTIVATIONS = {"ReLU": "relu", "Tanh": "tanh"}

#: The largest ``data`` member (SB3's JSON of the model's settings) read for its ``policy_kwargs``.
MAX_DATA_BYTES = 1 << 22

def sb3_json(raw: bytes):
    """SB3's ``data`` member parsed as JSON; ValueError where it is not JSON, nested too deeply included (the
    parser's recursion limit is the stack's, so a hostile file's depth must not end the process's work)."""
    import json

    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None
