"""Atomic file output, hashes, seeds and provenance.

Every result file is written to a temporary file in the same folder and renamed into place, so a killed
job never leaves a half-written output behind; its provenance (settings, seeds, versions, checkpoint hash,
runtime, and the file's own sha256 and row count) sits beside it as ``<name>.meta.json``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_write_bytes", "atomic_write_text", "write_json", "read_json", "write_csv", "sha256_file",
    "sha256_bytes", "derive_seed", "provenance", "META_SUFFIX", "meta_name", "meta_path", "json_object",
    "write_with_meta", "InputError", "write_frames", "count_value", "real_value", "finite_value",
    "open_state_file", "sigterm_noted",
]


@contextlib.contextmanager
def sigterm_noted(note: Callable[[int], None]):
    """Within this block SIGTERM (a cluster's wall-time kill; SIGKILL follows after a grace period) calls
    ``note(signum)`` instead of ending the process, so a long job (LoRe's search, a training) saves its state at
    its next consistent point and exits 143.  Only the main thread can take a signal: elsewhere nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: note(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def count_value(v, name: str) -> int:
    """``v``, a count read from an untrusted file (a resume file's header): a non-negative int, else
    ValueError naming ``name``."""
    if type(v) is not int or v < 0:
        raise ValueError(f"{name} is not a count: {str(v)[:40]}")
    return v


def real_value(v, name: str) -> float:
    """``v``, a number read from an untrusted file: an int or float that is not NaN, else ValueError naming
    ``name``."""
    if type(v) not in (int, float) or v != v:
        raise ValueError(f"{name} is not a number: {str(v)[:40]}")
    return float(v)


def finite_value(v, name: str) -> float:
    """``v``, a number read from an untrusted file that must be finite (a weight, a return, a learning rate):
    an int or float that is neither NaN nor ±inf, else ValueError naming ``name``."""
    x = real_value(v, name)
    if not math.isfinite(x):
        raise ValueError(f"{name} is not a finite number: {x}")
    return x


def open_state_file(path: str | Path, most: int):
    """``path`` opened for reading as an untrusted state file (a resume file): a regular file, not a symbolic
    link (``O_NOFOLLOW``: checked on the file opened, not before), a device or a FIFO (``O_NONBLOCK``: opening
    one does not wait), of at most ``most`` bytes (``inf``: any size); else ValueError saying which.  A zip
    reader given ``/dev/zero`` reads it to the end of memory, hence the check before any byte is read."""
    import stat

    if os.path.islink(path):
        raise ValueError("a symbolic link, not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file (a device, FIFO or folder)")
        if st.st_size > most:
            raise ValueError(f"{st.st_size} bytes, over the {int(most)} bytes the largest state of this run takes")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path, *, kind: str = "file", root: str | Path | None = None) -> str:
    """The sha256 of a regular file of at most ``kind``'s cap (:func:`open_received`: a device, a FIFO or a
    sparse 20 GB file is refused before it is read)."""
    h = hashlib.sha256()
    with open_received(path, kind=kind, root=root) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


#: The most bytes a received file of each kind may hold: far above any file the workflow writes (a run's records
#: are kilobytes, its per-step CSVs megabytes, CROP's largest network tens of MB), so a sparse or endless file is
#: refused before anything reads it (docs/reliability.md, "Hostile inputs").  ``file``: any other kind.
RECEIVED_CAPS = {"record": 64 << 20, "table": 1 << 30, "frames": 1 << 30, "text": 64 << 20,
                 "checkpoint": 4 << 30, "resume": 4 << 30, "file": 16 << 30}
_KIND_OF_SUFFIX = {".json": "record", ".csv": "table", ".npz": "frames", ".md": "text", ".tex": "text",
                   ".yaml": "text", ".yml": "text", ".pt": "checkpoint", ".resume": "resume"}


def received_kind(path: str | Path) -> str:
    """The kind of :data:`RECEIVED_CAPS` a file is read as, by its suffix."""
    return _KIND_OF_SUFFIX.get(Path(path).suffix, "file")


class ReceivedFileError(ValueError):
    """A received file that is not read: not a regular file, a link leaving its folder, or over its kind's cap."""


def _mode_words(mode: int) -> str:
    import stat

    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def received_problem(path: str | Path, *, kind: str | None = None, root: str | Path | None = None) -> str | None:
    """Why the received file at ``path`` is not read, in words, or None; opens nothing.  Refused: an absent
    path, anything but a regular file (a device such as ``/dev/zero``, a FIFO, a socket, a folder), a
    symbolic link that resolves outside ``root`` (when given; without it a link is followed), and a file over
    ``kind``'s cap (:data:`RECEIVED_CAPS`; None: by its suffix, :func:`received_kind`)."""
    import stat

    path = Path(path)
    kind = kind or received_kind(path)
    try:
        st = os.lstat(path)
        link = ""
        if stat.S_ISLNK(st.st_mode):
            target = path.resolve()
            link = f"a link to {target}"
            if root is not None and not target.is_relative_to(Path(root).resolve()):
                return f"{link}, outside the folder (a received file is read only from its folder)"
            st = os.stat(path)
    except FileNotFoundError:
        return "missing" + (f" ({link}, which does not exist)" if link else "")
    except (OSError, RuntimeError) as exc:   # a link loop, a name too long, no permission
        return f"cannot be examined ({type(exc).__name__}: {exc})"
    if not stat.S_ISREG(st.st_mode):
        return (f"{link}, " if link else "") + f"{_mode_words(st.st_mode)}, not a regular file"
    cap = RECEIVED_CAPS[kind]
    if st.st_size > cap:
        return (f"{st.st_size:,} bytes, over the {cap:,}-byte cap of a {kind} file (no file the workflow writes comes "
                "near it)")
    return None


@contextlib.contextmanager
def open_received(path: str | Path, mode: str = "rb", *, kind: str | None = None, root: str | Path | None = None,
                  encoding: str | None = None):
    """``path`` opened for reading once :func:`received_problem` finds nothing, and checked again on the
    descriptor (``fstat``: still a regular file within the cap, so a file swapped in between is refused too);
    :class:`ReceivedFileError` naming the file otherwise.  A FIFO is opened without waiting for a writer."""
    import stat

    kind = kind or received_kind(path)
    if not os.path.exists(path):   # absent (or a link to nothing): what open() says of it
        raise FileNotFoundError(2, "No such file or directory", str(path))
    problem = received_problem(path, kind=kind, root=root)
    if problem:
        raise ReceivedFileError(capped(f"{path}: {problem}"))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > RECEIVED_CAPS[kind]:
            raise ReceivedFileError(capped(f"{path}: changed while opened ({_mode_words(st.st_mode)}, "
                                           f"{st.st_size:,} bytes)"))
        f = open(fd, mode, encoding=encoding)
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


@contextlib.contextmanager
def load_npz(path: str | Path, *, root: str | Path | None = None):
    """A received ``.npz`` (numpy's ``NpzFile``, no pickles), opened within a frames file's cap
    (:func:`open_received`) and refused when its members' declared sizes add up to more (a zip bomb): zipfile
    never inflates a member past its declared size."""
    import zipfile

    import numpy as np

    cap = RECEIVED_CAPS["frames"]
    with open_received(path, kind="frames", root=root) as f:
        try:
            declared = sum(i.file_size for i in zipfile.ZipFile(f).infolist())
        except zipfile.BadZipFile as exc:
            raise ReceivedFileError(capped(f"{path}: not an npz archive ({exc})")) from None
        if declared > cap:
            raise ReceivedFileError(capped(f"{path}: its arrays declare {declared:,} bytes, over the {cap:,}-byte "
                                           "cap of a frames file"))
        f.seek(0)
        with np.load(f, allow_pickle=False) as z:
            yield z


def read_received_bytes(path: str | Path, *, kind: str | None = None, root: str | Path | None = None) -> bytes:
    """The bytes of a received file (:func:`open_received`), never more than its kind's cap (a file that grows
    while read is refused)."""
    kind = kind or received_kind(path)
    with open_received(path, kind=kind, root=root) as f:
        data = f.read(RECEIVED_CAPS[kind] + 1)
    if len(data) > RECEIVED_CAPS[kind]:
        raise ReceivedFileError(capped(f"{path}: grew past the {RECEIVED_CAPS[kind]:,}-byte cap of a {kind} file "
                                       "while read"))
    return data


MESSAGE_LIMIT = 600   # characters of an error line: a hostile file must not make a 351 MB one


def capped(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """``message`` on one line, cut to ``limit`` characters (the cut is marked)."""
    full = str(message)
    text = full[:limit + 1].replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return text if len(full) <= limit else text[:limit - 40] + f"… [{len(full):,} characters in all]"


class CappedError(ValueError):
    """A ValueError whose message is one line of at most :data:`MESSAGE_LIMIT` characters."""

    def __init__(self, message="", *args):
        super().__init__(capped(message), *args)


class InputError(CappedError):
    """Bad input (config, checkpoint, arguments) detected before any work: one line, exit status 2."""


class OutputError(OSError):
    """A result file could not be written (full disk, read-only or unwritable folder)."""


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temp_file(dest: Path) -> tuple[int, str]:
    """``tempfile.mkstemp`` beside ``dest`` (to be renamed onto it), with the mode a new file gets from
    ``open``: 0666 less the umask, not mkstemp's 0600, so that a result in a shared project folder is as
    readable as any file its owner writes there."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    except OSError:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``; on any failure
    the temporary file is removed and an :class:`OutputError` names the file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = temp_file(path)
    except OSError as exc:
        raise OutputError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise OutputError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def check_writable(folder: str | Path, min_free_mb: int = 50) -> None:
    """Raise :class:`OutputError` unless ``folder`` can be created and written, with some room left."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".crop-write-test-", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise OutputError(exc.errno, f"results folder {folder} is not writable: {exc.strerror or exc}") from None
    free = shutil.disk_usage(folder).free / 2**20
    if free < min_free_mb:
        raise OutputError(28, f"results folder {folder} has only {free:.0f} MB free (need ≥ {min_free_mb} MB)")


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _json_default(o: Any):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _finite_or_none(obj):
    """JSON has no inf/NaN: write them as null so no reader mistakes them for numbers."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


def dumps_json(obj: Any) -> str:
    return json.dumps(_finite_or_none(json.loads(json.dumps(obj, default=_json_default))),
                      indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, dumps_json(obj))


def read_json(path: str | Path, *, root: str | Path | None = None) -> Any:
    """A JSON file, read within a record's cap (:func:`read_received_bytes`; ``root``: the folder a link must
    stay in)."""
    return json.loads(read_received_bytes(path, kind="record", root=root).decode("utf-8"))


def read_csv(path: str | Path, *, root: str | Path | None = None, **kw):
    """A CSV file as a pandas DataFrame, opened within a table's cap (:func:`open_received`)."""
    import pandas as pd

    with open_received(path, kind="table", root=root) as f:
        return pd.read_csv(f, **kw)


def write_csv(path: str | Path, df) -> None:
    """Write a pandas DataFrame atomically; NaN becomes an empty field (no bound is not a number)."""
    atomic_write_text(path, df.to_csv(index=False, lineterminator="\n", float_format="%.10g"))


#: The provenance file beside every result: ``loact.csv`` → ``loact.meta.json`` (:func:`meta_path`).
META_SUFFIX = ".meta.json"


def meta_name(file: str) -> str:
    """The provenance file's name beside a result file."""
    return file.rsplit(".", 1)[0] + META_SUFFIX


def json_object(text: str | None, what: str) -> dict:
    """A command line's ``--settings`` JSON object (``what`` it holds, for the error); {} when not given."""
    if not text:
        return {}
    def refuse(constant):  # NaN, Infinity: JSON has no such numbers, Python's json reads them anyway
        raise InputError(f"--settings: {constant} is not a finite number")

    try:
        given = json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise InputError(f"--settings is not valid JSON: {exc}") from None
    if not isinstance(given, dict):
        raise InputError(f"--settings must be a JSON object ({what})")
    return given


def meta_path(path: str | Path) -> Path:
    """The provenance file beside a result (:func:`meta_name`)."""
    path = Path(path)
    return path.with_name(meta_name(path.name))


def derive_seed(base: int, *keys: Any) -> int:
    """A stable 63-bit seed from a base seed and any labels (env, algo, sigma, stage, …).

    Python's ``hash`` is salted per process; this is not, so reruns draw the same noise.
    """
    text = "\x1f".join([str(int(base)), *[str(k) for k in keys]])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("crop", "torch", "numpy", "scipy", "gymnasium", "pandas"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def provenance(stage: str, settings: dict, *, seed: int | None = None, inputs: dict | None = None,
               device: str | None = None, started: float | None = None) -> dict:
    """Where a result came from: stage, settings, seed, input hashes, versions, commit, device, runtime."""
    now = time.time()
    return {
        "stage": stage,
        "settings": settings,
        "seed": seed,
        "inputs": inputs or {},
        "git_commit": _git_commit(),
        "versions": _versions(),
        "device": device,
        "platform": platform.platform(),
        "argv": sys.argv,
        "runtime_s": None if started is None else round(now - started, 3),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
    }


def write_with_meta(path: str | Path, write: Callable[[Path], None], meta: dict, rows: int | None = None) -> None:
    """Write a result atomically, then its ``.meta.json`` carrying the provenance and the file's own hash."""
    path = Path(path)
    write(path)
    meta = dict(meta)
    meta["output"] = {"file": path.name, "sha256": sha256_file(path), "bytes": path.stat().st_size,
                      "rows": rows}
    write_json(meta_path(path), meta)


def write_frames(path: str | Path, frames: list, env: str) -> None:
    """Raw game frames of LoAct episode 0, ``[(step, RGB array), …]``, as ``frames.npz`` (``frames``,
    ``steps``, ``env``); empty arrays for vector observations."""
    import io

    import numpy as np

    buf = io.BytesIO()
    if frames:
        arr = np.stack([f for _, f in frames]).astype(np.uint8)
        st = np.array([t for t, _ in frames], dtype=np.int64)
    else:
        arr, st = np.zeros((0, 0, 0, 3), np.uint8), np.zeros(0, np.int64)
    np.savez_compressed(buf, frames=arr, steps=st, env=np.array(env))
    atomic_write_bytes(path, buf.getvalue())
