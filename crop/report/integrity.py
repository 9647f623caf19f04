"""Integrity of result files: each must still have the sha256 recorded in its ``.meta.json`` when it was
written, so a truncated or edited intermediate (half a ``loact.csv``) is caught before anything reads it."""
from __future__ import annotations

from pathlib import Path

from crop.io import meta_path, read_json, sha256_file
from crop.layout import RUN_FILES

__all__ = ["check_integrity", "IntegrityError"]


class IntegrityError(ValueError):
    pass


def check_integrity(run_dir: Path) -> list[dict]:
    """Files whose content no longer matches the hash recorded when they were written."""
    problems = []
    for name in RUN_FILES.values():
        f = run_dir / name
        if not f.is_file():
            problems.append({"file": str(f), "problem": "missing"})
            continue
        if name.endswith(".json"):
            try:
                read_json(f)
            except ValueError as exc:
                problems.append({"file": str(f), "problem": f"unreadable JSON: {exc}"})
            continue
        m = meta_path(f)
        if not m.is_file():
            problems.append({"file": str(f), "problem": "no provenance file"})
            continue
        rec = read_json(m).get("output", {})
        if rec.get("sha256") != sha256_file(f):
            problems.append({"file": str(f), "problem": "sha256 differs from the one recorded at write time "
                                                         "(truncated or modified)"})
    return problems
