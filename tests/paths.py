"""Where the tests find the repository and the shared data, stated once.

A test that needs the root asks for the ``repo`` fixture (conftest.py); these constants serve what runs at
import time or outside a test: module-level paths, ``parametrize`` and ``skipif`` arguments, and the helpers a
test module shares between its tests.
"""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"   # checkpoints and reference tables, next to the checkout
