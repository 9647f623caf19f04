"""The one Markdown table writer of the report: tables (:mod:`crop.report.tables`), ``audit.md``
(:mod:`crop.report.audit`) and ``reproduction.md`` (:mod:`crop.report.reproduction`)."""
from __future__ import annotations

import pandas as pd

__all__ = ["pipe_table"]


def pipe_table(rows, columns=None, *, floatfmt: str = ".6g", colalign=None, limit: int | None = None,
               rest: str = "", pad: bool = True, text=()) -> str:
    """``rows`` (a DataFrame or a list of dicts) as a Markdown pipe table, without a trailing newline.

    ``columns``: which columns, in which order (those the rows lack are left out).  ``pad``: columns aligned
    by padding (tabulate's pipe format: numbers with ``floatfmt``, ``colalign`` per column, a ``None`` cell of
    an object column as ``—``; pandas reads other missing values as ``nan``); without ``pad`` each cell is
    written as it is, ``| a | b |`` (rows already formatted for reading).
    ``text``: columns written as they are, never read as numbers (a hash prefix of digits only, or with one
    ``e``, would otherwise be right-aligned or printed as a float).
    ``limit``: at most that many rows, then a line saying how many more and where they are (``rest``).
    No rows: ``(none)``."""
    df = pd.DataFrame(rows)
    if columns:
        df = df[[c for c in columns if c in df.columns]]
    if df.empty and not len(df.columns):
        return "(none)"
    more = ""
    if limit is not None and len(df) > limit:
        more = f"\n\n… and {len(df) - limit} more rows ({rest})."
        df = df.head(limit)
    if not pad:
        lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
        lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
        return "\n".join(lines) + more
    kw = {"disable_numparse": [i for i, c in enumerate(df.columns) if c in text]} if text else {}
    return df.to_markdown(index=False, floatfmt=floatfmt, missingval="—", colalign=colalign, **kw) + more
