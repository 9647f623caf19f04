"""The certifiers, the attacks and the engine take their settings as one frozen dataclass each, and no function
or class ``__init__`` anywhere in crop/ has more than eight parameters (``self``/``cls`` not counted, ``*args``
and ``**kwargs`` one each), so a new option is a field of a settings class, not one more argument."""
import ast
from pathlib import Path

import pytest

import crop

CROP = Path(crop.__file__).parent
MODULES = sorted(str(p.relative_to(CROP)) for p in CROP.rglob("*.py"))
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
    assert _wide(CROP / module) == [], f"crop/{module}: more than {MAX_PARAMETERS} parameters: {_wide(CROP / module)}"


def test_every_module_is_counted():
    assert {"certify/lore.py", "audit/audit.py", "workflow/cli.py", "envs/atari.py"} <= set(MODULES)


def test_the_count_sees_a_wide_function(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("class A:\n    def __init__(self, a, b, c, d, e, f, g, h, *, i=1):\n        pass\n"
                   "def f(a, b, c, d, e, f, g, *args, **kw):\n    pass\n"
                   "def ok(self, a, b, c, d, e, f, g, h):\n    pass\n")
    assert sorted(_wide(src)) == ["__init__ (9)", "f (9)"]


def _bad_settings():
    from crop.certify.attack import GlobalAttackSettings, LocalAttackSettings
    from crop.certify.gre import GReSettings
    from crop.certify.loact import LoActSettings
    from crop.certify.percentile import PercentileSettings
    from crop.certify.qrange import QRangeSettings
    from crop.smoothing.engine import Noise
    from crop.smoothing.smoothed import SmoothingSettings

    return [
        (lambda: Noise(0.0, 10), "sigma"),
        (lambda: SmoothingSettings(0.1, 0, -1.0, 1.0, 0.05), "m"),
        (lambda: SmoothingSettings(0.1, 10, -1.0, 1.0, 1.5), "alpha"),
        (lambda: SmoothingSettings(0.1, 10, 1.0, -1.0, 0.05), "v_min < v_max"),
        (lambda: SmoothingSettings(0.1, 10, -1.0, 1.0, 0.05, bound="chernoff"), "bound"),
        (lambda: LoActSettings(2, 10, [0]), "episode seeds"),
        (lambda: GReSettings(-0.1, 10, 10, 1.0, 0, 0), "sigma"),
        (lambda: QRangeSettings(0.1, 10, 1, 10, [0], 0, method="median"), "method"),
        (lambda: LocalAttackSettings([0.0, -0.1], [0], 10), "eps"),
        (lambda: GlobalAttackSettings(0.1, [0.1], [[0]], 10, n_eot=0), "n_eot"),
        (lambda: PercentileSettings(0.1, 10, 1, 10, [0], 0.05, p=1.0), "percentile p"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_settings())))
def test_settings_refuse_a_bad_value_naming_it(case):
    make, name = _bad_settings()[case]
    with pytest.raises(ValueError, match=name):
        make()


def test_settings_are_frozen():
    from dataclasses import FrozenInstanceError

    from crop.smoothing.smoothed import SmoothingSettings

    with pytest.raises(FrozenInstanceError):
        SmoothingSettings(0.1, 10, -1.0, 1.0, 0.05).m = 20


MAX_LINES = 500


def test_no_module_is_past_its_size():
    """A module past ~500 lines is usually two ideas (docs/layout.md): split it by idea, not by length."""
    long = {m: n for m in MODULES if (n := len((CROP / m).read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"
