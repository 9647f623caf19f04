"""Stale Snakemake locks after a killed run.

Snakemake locks the working directory while a workflow runs, so a second workflow on the same folder is
stopped.  A run killed with SIGKILL (or a power loss) cannot release its lock, and the next run would refuse
to start until ``snakemake --unlock``.  The workflow records the PID and host of the Snakemake process that
holds the lock (``.snakemake/crop-owner.json``); at the next start, a lock whose owner is provably gone — same
host, no such process — is cleared, so rerunning the same command just works.  A lock whose owner is alive,
or on another host, is left alone: Snakemake's lock then stops the second run as usual.

The record names the lock files it owns (name, inode, modification time).  Snakemake takes its lock before the
workflow's ``onstart`` can record the new owner, so for a moment the record still describes the previous run;
a lock whose files are not the recorded ones belongs to a run that has not recorded itself yet, and is left
alone — else a run starting in that moment would clear a live lock and both would proceed.
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


def _lock_files(locks: Path) -> list[list]:
    """[name, inode, mtime in ns] of each lock file: what tells one run's lock from the next run's."""
    out = []
    for f in sorted(locks.iterdir()) if locks.is_dir() else []:
        try:
            st = f.stat()
        except FileNotFoundError:
            continue
        out.append([f.name, st.st_ino, st.st_mtime_ns])
    return out


def record_owner(snakemake_dir: str | Path = ".snakemake") -> None:
    """Record this process as the owner of the lock Snakemake holds now (onstart, after it locked)."""
    d = Path(snakemake_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{OWNER}.{os.getpid()}"
    tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "locks": _lock_files(d / "locks")}))
    os.replace(tmp, d / OWNER)


def clear_stale_lock(snakemake_dir: str | Path = ".snakemake") -> str | None:
    """Remove the locks of a dead owner on this host, when they are the very files it recorded; returns a
    message when it did."""
    d = Path(snakemake_dir)
    locks, owner = d / "locks", d / OWNER
    if not locks.is_dir() or not any(locks.iterdir()) or not owner.is_file():
        return None
    try:
        rec = json.loads(owner.read_text())
        pid, host, owned = int(rec["pid"]), rec["host"], rec["locks"]
    except (ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname() or _alive(pid) or owned != _lock_files(locks):
        return None
    shutil.rmtree(locks)
    owner.unlink(missing_ok=True)
    return f"cleared the lock left by a killed run (Snakemake PID {pid} on {host} no longer exists)"
