"""One process at a time on a download or on the lock file's pins: an advisory lock (``fcntl.flock``) on a
file beside what it guards.

The kernel releases a lock when its process ends, however it ends (killed, out of memory, its node rebooted),
so a lock never outlives its holder and nobody has to remove it.  On NFS, Linux maps ``flock`` onto the
server's byte-range locks, which hold across every node that mounts the folder (a mount with ``nolock`` makes
them local to each node: fill the cache once on the login node instead, ``crop fetch --configfile``).  The
holder writes who it is into the file and empties it when it is done: a waiter says whom it waits for, and a
process that finds the file not empty knows that its last holder ended without finishing, and says so.
"""
from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

__all__ = ["held", "say"]


def say(line: str) -> None:
    """One line on stderr (the job's log under the workflow)."""
    print(line, file=sys.stderr, flush=True)


def _holder(fd: int) -> str:
    """Who the lock file says holds it (empty: nobody, or a holder that finished)."""
    data = os.pread(fd, 4096, 0)
    return " ".join(data.decode("utf-8", "replace").split())[:300]


def _write(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


@contextmanager
def held(path: str | os.PathLike, what: str):
    """Hold the lock ``path`` for ``what`` (a few words: "the download of X"), waiting for its holder if
    another process has it; yields who held it last and ended without finishing (empty: nobody)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for {_holder(fd) or 'another process'} to finish (lock {path})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        previous = _holder(fd)
        if previous:
            say(f"{path}: its last holder ({previous}) ended without finishing; taking over")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _write(fd, f"{what}, process {os.getpid()} on {socket.gethostname()} since {stamp}\n")
        try:
            yield previous
        finally:  # an error is an end too: only a process that dies leaves its name behind
            _write(fd, "")
    finally:
        os.close(fd)   # releases the lock
