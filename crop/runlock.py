"""Stale Snakemake locks after a killed run.

Snakemake locks the working directory while a workflow runs, so a second workflow on the same folder is
stopped.  A run killed with SIGKILL (or a power loss) cannot release its lock, and the next run would refuse
to start until ``snakemake --unlock``.  The workflow records the PID and host of the Snakemake process that
holds the lock (``.snakemake/crop-owner.json``); at the next start, a lock whose owner is provably gone — same
host, no such process — is cleared, so rerunning the same command just works.  A lock whose owner is alive,
or on another host, is left alone: Snakemake's lock then stops the second run as usual.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

__all__ = ["record_owner", "clear_stale_lock"]

OWNER = "crop-owner.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def record_owner(snakemake_dir: str | Path = ".snakemake") -> None:
    d = Path(snakemake_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{OWNER}.{os.getpid()}"
    tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    os.replace(tmp, d / OWNER)


def clear_stale_lock(snakemake_dir: str | Path = ".snakemake") -> str | None:
    """Remove the locks of a dead owner on this host; returns a message when it did."""
    d = Path(snakemake_dir)
    locks, owner = d / "locks", d / OWNER
    if not locks.is_dir() or not any(locks.iterdir()) or not owner.is_file():
        return None
    try:
        rec = json.loads(owner.read_text())
        pid, host = int(rec["pid"]), rec["host"]
    except (ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname() or _alive(pid):
        return None
    shutil.rmtree(locks)
    owner.unlink(missing_ok=True)
    return f"cleared the lock left by a killed run (Snakemake PID {pid} on {host} no longer exists)"
