"""Progress of every long loop: a live bar on a terminal, and in a rule's log (stderr not a terminal) one
plain line every ``CROP_PROGRESS_INTERVAL`` seconds (default 30) with the position, rate and ETA, so that
``tail -f`` on a Snakemake log shows where a job is."""
from __future__ import annotations

import os
import sys

from tqdm.auto import tqdm

__all__ = ["pbar", "LOG_INTERVAL_S", "LineWriter"]

LOG_INTERVAL_S = 30.0
# Without a bar (a log file has no use for one): position, percentage when the total is known, rate, ETA.
_LOG_FORMAT = ("{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f} %) "
               "[{elapsed} elapsed, {remaining} left, {rate_fmt}{postfix}]")
_LOG_FORMAT_NO_TOTAL = "{desc}: {n_fmt} {unit} [{elapsed} elapsed, {rate_fmt}{postfix}]"


class _LogBar(tqdm):
    """tqdm for a log: a line only on the interval's schedule.  tqdm's ``set_postfix``/``set_description``
    print at once by default, and inside ``for x in bar`` the position they print is the last scheduled one
    (tqdm syncs it only when it prints): a loop that sets a postfix would write a line per call with a
    frozen position and ETA.  Here they only change what the next scheduled line says."""

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def set_postfix_str(self, s="", refresh=True):
        super().set_postfix_str(s, refresh=False)

    def set_description(self, desc=None, refresh=True):
        super().set_description(desc, refresh=False)

    def set_description_str(self, desc=None, refresh=True):
        super().set_description_str(desc, refresh=False)


class LineWriter:
    """A file for tqdm that turns its in-place redraws (``\\r…``) into whole lines, as a log needs."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("CROP_PROGRESS_INTERVAL", LOG_INTERVAL_S)))
    except ValueError:
        return LOG_INTERVAL_S


def pbar(iterable=None, *, desc: str, total: int | None = None, progress: bool | None = None,
         unit: str = "it", interval: float | None = None):
    """``progress=None``: a bar on a terminal, log lines every ``interval`` s otherwise (``interval``
    defaults to ``$CROP_PROGRESS_INTERVAL`` or 30 s); ``True`` forces the bar, ``False`` silences both."""
    if progress is False:
        return tqdm(iterable, total=total, desc=desc, unit=unit, disable=True)
    if progress or _isatty(sys.stderr):
        return tqdm(iterable, total=total, desc=desc, unit=unit, mininterval=2.0, dynamic_ncols=True)
    if total is None and iterable is not None:
        try:
            total = len(iterable)
        except TypeError:
            pass
    # maxinterval=inf: the monitor thread must not shorten mininterval; miniters=1 checks the clock on
    # every update, so a slow loop is reported on time.
    return _LogBar(iterable, total=total, desc=desc, unit=unit, file=LineWriter(sys.stderr),
                mininterval=_interval() if interval is None else interval, maxinterval=float("inf"),
                miniters=1, bar_format=_LOG_FORMAT if total else _LOG_FORMAT_NO_TOTAL, ascii=True)
