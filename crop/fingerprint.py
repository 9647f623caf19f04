"""What a saved state was made with: a digest of the code that made it and the versions of the libraries it ran
on (resume files are keyed by them, so a state saved by other code or libraries is not resumed)."""
from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["LIBRARIES", "code_digest", "library_versions"]

#: The libraries whose version a saved state's key records.
LIBRARIES = ("torch", "numpy", "gymnasium", "highway-env", "ale-py")


def code_digest(parts) -> str:
    """sha256 over ``parts`` of the package (files or folders relative to ``crop/``; a folder's ``*.py`` in
    sorted order), each file's relative path and bytes."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for part in parts:
        for f in sorted((root / part).rglob("*.py")) if (root / part).is_dir() else [root / part]:
            h.update(f"{f.relative_to(root)};".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def library_versions() -> dict:
    """``{library: version or None}`` for :data:`LIBRARIES`."""
    from importlib import metadata

    out = {}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out
