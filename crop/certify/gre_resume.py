"""GRe's resume file (:mod:`crop.certify.gre`): the returns of the finished blocks of trajectories, written as data
and read back as untrusted input.

Step 1 of Algorithm 2 samples its m trajectories in blocks; trajectory i's return depends only on i (its seeded
reset and its own noise stream, :class:`crop.certify.gre.TrajectoryNoise`), so a block's returns, once saved,
need no random state beside them: a rerun skips the saved blocks and samples the rest as an uninterrupted run
would, and its returns are the same, byte for byte.  The file is an uncompressed ``.npz`` of two members, a JSON
header (``key``, ``done``) and the ``done`` returns as float64, rewritten atomically after every block.  It is
keyed by every field of :class:`crop.certify.gre.GReSettings` (the device as resolved), the environment and
profile, the network's parameters (a digest), a digest of the code the returns come from and the versions of
the libraries it runs on.  A file that is not a regular file (a symlink), larger than ``done`` ≤ m returns take,
not of this run, damaged, or holding returns that are not finite, not whole blocks, or outside [J_min, J_max], is
ignored with one line on stderr and sampling starts from the first trajectory.
"""
from __future__ import annotations

import io
import json
import math
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crop.certify.lore_resume import _net_digest, key_of
from crop.fingerprint import code_digest, library_versions
from crop.io import count_value, open_state_file

__all__ = ["GReResume", "RESUME_FORMAT", "resume_key", "save", "load"]

#: Layout of the resume file: a file of another layout never matches, sampling starts afresh.
RESUME_FORMAT = 1
#: What a trajectory's return depends on (paths under crop/): a change there makes older files another run's.
_CODE = ("certify/gre.py", "certify/gre_resume.py", "envs", "models", "smoothing/engine.py", "io.py")
#: Bytes a resume file may hold beyond its returns (zip and .npy headers, the JSON header).
_SLACK = 1 << 16


@dataclass(frozen=True)
class GReResume:
    """Where GRe saves its finished blocks: ``path``; ``j_range`` = (J_min, J_max), the range every saved return
    must lie in to be used (None: finite is enough)."""

    path: Path
    j_range: tuple[float, float] | None = None


def resume_key(env_id: str, profile, settings, net, device) -> dict:
    """What identifies a GRe run: a resume file written under another key is ignored.  Every field of
    ``settings`` (a field added there is in the key without a word here), ``device`` as resolved, the
    environment and profile, the network's parameters, the code's digest and the library versions; as a file
    holds it (tuples are lists)."""
    key = {"format": RESUME_FORMAT, "env_id": env_id, "profile": profile, **key_of(settings), "device": str(device),
           "network": _net_digest(net), "code": code_digest(_CODE), "versions": library_versions(),
           "python": list(sys.version_info[:2])}
    return json.loads(json.dumps(key, default=repr))


def save(path, key: dict, returns: np.ndarray) -> None:
    """Write the returns of the finished blocks to ``path`` atomically (a temporary file renamed onto it)."""
    from crop.io import atomic_write_bytes

    returns = np.ascontiguousarray(returns, dtype=np.float64)
    header = json.dumps({"key": key, "done": int(returns.size)}).encode()
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(header, np.uint8), returns=returns)
    atomic_write_bytes(path, buf.getvalue())


_NPY_HEADER = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _read_npy(z: zipfile.ZipFile, name: str, dtype, shape) -> np.ndarray:
    """Member ``name`` as an array of ``dtype`` and ``shape`` (``None``: 1-D, as long as its bytes make it), its
    declared dtype and shape checked against these and its bytes before anything is allocated; no object or
    pickled data."""
    data = z.read(f"{name}.npy")
    fp = io.BytesIO(data)
    header = _NPY_HEADER.get(np.lib.format.read_magic(fp))
    if header is None:
        raise ValueError(f"{name}: not a .npy array of a known version")
    got, fortran, got_dtype = header(fp)
    body, want = memoryview(data)[fp.tell():], np.dtype(dtype)
    expected = (len(body) // want.itemsize,) if shape is None else tuple(shape)
    if (got_dtype, got, fortran) != (want, expected, False) or math.prod(got) * want.itemsize != len(body):
        raise ValueError(f"{name}: {got_dtype} {got} in {len(body)} bytes, expected {want} {expected}")
    return np.frombuffer(body, want).reshape(got).copy()


def _contents(path: Path, cap: int) -> bytes:
    """The bytes of ``path`` if it is a regular file (no symlink, device or FIFO) of at most ``cap`` bytes
    (:func:`crop.io.open_state_file`, checked on the file opened), never more than ``cap`` read."""
    with open_state_file(path, cap) as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise ValueError(f"more than {cap} bytes")
    return data


def load(resume: GReResume, key: dict, m: int, batch: int) -> np.ndarray | None:
    """The returns saved at ``resume.path`` if it holds whole blocks of ``batch`` trajectories (or all ``m``) of
    the run ``key``, every one finite and within ``resume.j_range``; else None — sampling starts from the first
    trajectory, and one line on stderr says why unless there was no file."""
    path = Path(resume.path)
    if not os.path.lexists(path):
        return None
    try:
        data = _contents(path, 8 * m + _SLACK)
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            infos = z.infolist()
            if sorted(i.filename for i in infos) != ["header.npy", "returns.npy"]:
                raise ValueError(f"members {sorted(i.filename for i in infos)[:5]} are not the resume file's")
            if any(i.compress_type != zipfile.ZIP_STORED or i.file_size != i.compress_size for i in infos) or \
                    sum(i.file_size for i in infos) > len(data):
                raise ValueError("a compressed member, or members larger than the file")
            header = json.loads(bytes(_read_npy(z, "header", np.uint8, None)).decode())
            if not isinstance(header, dict) or header.get("key") != key:
                print(f"GRe: {path} belongs to another run (other settings, network, code or versions); starting "
                      "afresh", file=sys.stderr)
                return None
            done = count_value(header.get("done"), "done")
            if done > m or (done % batch and done != m):
                raise ValueError(f"{done} returns: not whole blocks of {batch} trajectories within m = {m}")
            returns = _read_npy(z, "returns", np.float64, (done,))
        if not np.isfinite(returns).all():
            raise ValueError("a return that is not finite")
        if resume.j_range is not None and done and (returns.min() < resume.j_range[0] - 1e-9 or
                                                    returns.max() > resume.j_range[1] + 1e-9):
            raise ValueError(f"returns outside [J_min, J_max] = {list(resume.j_range)}")
    except Exception as exc:  # noqa: BLE001 -- any content of an untrusted file: ignore it, sample afresh
        print(f"GRe: ignoring the resume file {path} ({type(exc).__name__}: {str(exc)[:200]}); starting afresh",
              file=sys.stderr)
        return None
    return returns
