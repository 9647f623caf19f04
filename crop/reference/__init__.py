"""The paper's published numbers as a reference table (``crop-paper.csv``, built by :mod:`crop.reference.build`
from the CROP leaderboard's data; read by ``crop audit --reference paper``)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["PAPER_REFERENCE", "PAPER_REFERENCE_NAME", "resolve_reference"]

PAPER_REFERENCE_NAME = "paper"
PAPER_REFERENCE = Path(__file__).with_name("crop-paper.csv")


def resolve_reference(reference) -> Path:
    """The file behind ``reference``: ``"paper"`` is the packaged table of the paper's numbers.  Here, beside
    the table and free of pandas and torch, so that the workflow can name it while it parses."""
    return PAPER_REFERENCE if str(reference) == PAPER_REFERENCE_NAME else Path(reference)
