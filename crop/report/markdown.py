"""The one Markdown table writer of the report: tables (:mod:`crop.report.tables`), ``audit.md``
(:mod:`crop.audit.audit`) and ``reproduction.md`` (:mod:`crop.audit.reproduction`); and the escapes of a
received name or value for Markdown text (:func:`md_text`), a code span (:func:`md_code`) and a terminal line
(:func:`printable`): a folder named ``<img src=x onerror=alert(1)>``, or one whose name holds a newline and
``| **PASS** |``, is shown as it is named, never as markup or a row of its own."""
from __future__ import annotations

import unicodedata

import pandas as pd

__all__ = ["pipe_table", "md_text", "md_code", "printable"]

_MD_ESCAPES = {"\\": "\\\\", "|": "\\|", "<": "&lt;", ">": "&gt;", "&": "&amp;", "`": "\\`"}


def printable(value) -> str:
    """``value`` as one line of text: each control character (a newline, an escape sequence's ESC) and line or
    paragraph separator as its Python escape (``\\n``, ``\\x1b``)."""
    return "".join(ch.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in str(value))


def md_text(value) -> str:
    """A received name or value as Markdown text (a table cell, a sentence): one line (:func:`printable`) whose
    backslashes, ``|``, backticks, ``<``, ``>`` and ``&`` are escaped, so it reads as written and is no markup,
    HTML or table cell boundary."""
    return "".join(_MD_ESCAPES.get(ch, ch) for ch in printable(value))


def md_code(value) -> str:
    """A received value as a Markdown code span: one line (:func:`printable`) between more backticks than
    any run of them it holds."""
    text, run, longest = printable(value), 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if longest else ""
    return f"{fence}{pad}{text}{pad}{fence}"


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
    df = df.rename(columns=md_text)   # every name and text cell escaped: a received one is no markup
    for c in df.columns:
        if not pd.api.types.is_numeric_dtype(df[c]):   # object or string cells (bools are numeric)
            df[c] = pd.Series([v if v is None or isinstance(v, (bool, int, float, complex)) else md_text(v)
                               for v in df[c]], index=df.index, dtype=object)   # a None stays None: "—"
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
