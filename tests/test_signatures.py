"""The certifiers, the attacks and the engine take their settings as one frozen dataclass each: no function or
class ``__init__`` in those modules has more than eight parameters (``self``/``cls`` not counted, ``*args`` and
``**kwargs`` one each), so a new option is a field of its settings class, not one more argument."""
import ast
from pathlib import Path

import pytest

import crop

MODULES = ("engine", "smoothing", "loact", "gre", "qrange", "attack", "percentile", "lore")
MAX_PARAMETERS = 8


def _wide(path: Path) -> list[str]:
    """``name (n)`` of every function or method in ``path`` with more than MAX_PARAMETERS parameters."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
        n = len([p for p in names if p not in ("self", "cls")]) + (a.vararg is not None) + (a.kwarg is not None)
        if n > MAX_PARAMETERS:
            out.append(f"{node.name} ({n})")
    return out


@pytest.mark.parametrize("module", MODULES)
def test_at_most_eight_parameters(module):
    path = Path(crop.__file__).parent / f"{module}.py"
    assert _wide(path) == [], f"crop/{module}.py: more than {MAX_PARAMETERS} parameters: {_wide(path)}"


def test_the_count_sees_a_wide_function(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("class A:\n    def __init__(self, a, b, c, d, e, f, g, h, *, i=1):\n        pass\n"
                   "def f(a, b, c, d, e, f, g, *args, **kw):\n    pass\n"
                   "def ok(self, a, b, c, d, e, f, g, h):\n    pass\n")
    assert sorted(_wide(src)) == ["__init__ (9)", "f (9)"]
