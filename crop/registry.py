"""Where each (environment, algorithm) policy comes from: a training recipe or a published checkpoint.

The data lives in ``registry.yaml`` beside this file, so adding a checkpoint is a data change.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml

__all__ = ["registry", "checkpoint_source"]


@lru_cache(maxsize=1)
def registry() -> dict:
    return yaml.safe_load(resources.files("crop").joinpath("registry.yaml").read_text())


def checkpoint_source(env: str, algo: str) -> dict:
    """The registry entry for (env, algo); KeyError with a readable message when there is none."""
    entries = registry().get("policies", {})
    try:
        return entries[env][algo]
    except KeyError:
        known = sorted(entries.get(env, {}))
        raise KeyError(f"no checkpoint source or training recipe for algorithm {algo!r} on {env!r} "
                       f"(available: {known})") from None
