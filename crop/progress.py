"""Progress bars for every long loop: shown on a terminal, silent in a rule's log (not a TTY), where
each stage prints a one-line summary instead."""
from __future__ import annotations

from tqdm.auto import tqdm

__all__ = ["pbar"]


def pbar(iterable=None, *, desc: str, total: int | None = None, progress: bool | None = None,
         unit: str = "it"):
    """``progress=None``: on when stderr is a terminal; ``True``/``False`` force it."""
    return tqdm(iterable, total=total, desc=desc, unit=unit, mininterval=2.0, dynamic_ncols=True,
                disable=None if progress is None else not progress)
