"""The paper's published numbers as a reference table (``crop-paper.csv``, built by :mod:`crop.reference.build`
from the CROP leaderboard's data; read by ``crop audit --reference paper``)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["PAPER_REFERENCE", "PAPER_REFERENCE_NAME"]

PAPER_REFERENCE_NAME = "paper"
PAPER_REFERENCE = Path(__file__).with_name("crop-paper.csv")
