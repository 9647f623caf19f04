"""Where each (environment, algorithm) policy comes from: a training recipe, a published checkpoint, or
another checkpoint it is derived from — or, with a config's ``source: file``, the user's own policy file
(``environments.ENV.files.ALGO``, imported by ``crop import``).  The data lives in ``registry.yaml`` beside
this file, so adding a checkpoint is a data change.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml

__all__ = ["registry", "sources", "resolve_source", "checkpoint_source", "SOURCE_KINDS"]

SOURCE_KINDS = ("published", "derive", "train")  # the order `auto` prefers; `file`: the config's own file


@lru_cache(maxsize=1)
def registry() -> dict:
    return yaml.safe_load(resources.files("crop.agents").joinpath("registry.yaml").read_text())


def sources(env: str, algo: str) -> dict:
    """All sources of (env, algo); KeyError with a readable message when there is none."""
    entries = registry().get("policies", {})
    if env not in entries:
        raise KeyError(f"{env!r} is not one of the paper's environments: its policies are your own files (source: "
                       f"file, environments.{env}.files.{algo}; docs/own-policy.md)")
    try:
        return entries[env][algo]
    except KeyError:
        known = sorted(entries.get(env, {}))
        raise KeyError(f"no checkpoint source or training recipe for algorithm {algo!r} on {env!r} "
                       f"(available: {known})") from None


def resolve_source(env: str, algo: str, prefer: str = "auto", files: dict | None = None) -> tuple[str, dict]:
    """(kind, entry) for a config's ``source`` preference: auto (published, else derived, else trained),
    train (trained, else derived), published (published, else derived) or file (the config's own file for
    this algorithm in ``files``, else derived — from a file — where the registry derives it)."""
    if prefer == "file":
        if files and algo in files:
            return "file", dict(files[algo])
        s = registry().get("policies", {}).get(env, {}).get(algo, {})
        if "derive" in s:
            return "derive", s["derive"]
        raise KeyError(f"{algo!r} on {env!r} has source: file but no file: give environments.{env}.files.{algo} "
                       "(path, architecture, profile; docs/own-policy.md)")
    s = sources(env, algo)
    order = {"auto": SOURCE_KINDS, "train": ("train", "derive"), "published": ("published", "derive")}[prefer]
    for kind in order:
        if kind in s:
            return kind, s[kind]
    raise KeyError(f"{algo!r} on {env!r} has no {prefer} source (available: {sorted(s)})")


def checkpoint_source(env: str, algo: str, prefer: str = "auto", files: dict | None = None) -> dict:
    """The entry of the source ``prefer`` selects, with its ``kind`` added."""
    kind, entry = resolve_source(env, algo, prefer, files)
    return {"kind": kind, **entry}
