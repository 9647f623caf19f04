"""Integrity of result files: each must still have the sha256 recorded in its ``.meta.json`` when it was
written, so a truncated or edited intermediate (half a ``loact.csv``) is caught before anything reads it."""
from __future__ import annotations

from pathlib import Path

from crop.io import meta_path, read_json, sha256_file
from crop.layout import RUN_FILES

__all__ = ["check_integrity", "IntegrityError"]


class IntegrityError(ValueError):
    pass


# The workflow rule (rules/*.smk) that writes a run file whose rule is not named like it.
_RULE = {"loact_episodes": "loact", "certified_ratio": "loact", "frames": "loact", "gre_returns": "gre"}


def check_integrity(run_dir: Path) -> list[dict]:
    """Files whose content no longer matches the hash recorded when they were written."""
    problems = []
    for key, name in RUN_FILES.items():
        f = run_dir / name
        if not f.is_file():
            problems.append({"file": str(f), "problem": "missing"})
            continue
        if name.endswith(".json"):
            try:
                read_json(f)
            except ValueError as exc:
                rule = _RULE.get(key, key)
                problems.append({"file": str(f), "problem": f"unreadable JSON: {exc}; delete it and rerun the "
                                                             f"workflow (or `snakemake --forcerun {rule}`)"})
            continue
        m = meta_path(f)
        if not m.is_file():
            problems.append({"file": str(f), "problem": "no provenance file"})
            continue
        rec = read_json(m).get("output", {})
        if rec.get("sha256") != sha256_file(f):
            # Snakemake will not recompute a file that exists and is newer than its inputs: say how.
            rule = _RULE.get(key, key)
            problems.append({"file": str(f), "problem": "sha256 differs from the one recorded at write time "
                                                         "(truncated or modified); delete it and rerun the workflow "
                                                         f"(or `snakemake --forcerun {rule}`) to recompute it"})
    return problems
