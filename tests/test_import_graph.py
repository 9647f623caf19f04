"""The package's import graph (every ``import`` of crop/, at the top of a module or inside a function) has no
circle, so its modules form layers: nothing imports from a layer above it.  A package's ``__init__`` and its
own submodules are one unit here (``crop.envs`` and ``crop.envs.atari`` may import each other's names)."""
import ast
import graphlib
from pathlib import Path

import pytest

CROP = Path(__file__).resolve().parents[1] / "crop"


def _modules() -> dict[str, Path]:
    out = {}
    for path in CROP.rglob("*.py"):
        parts = list(path.relative_to(CROP.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(name: str, modules: dict) -> str | None:
    """The crop module an imported name lives in (``crop.io.write_json`` → ``crop.io``), or None."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module → every crop module it imports (``from crop.x import y`` also counts ``crop.x.y`` if that is a
    module)."""
    modules = _modules()
    g = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for imported in {_imported(n, modules) for n in names} - {None, name}:
                g[name].add(imported)
    return g


def _unit(module: str, g: dict) -> str:
    """A module's unit: the innermost package it belongs to when it is a package's submodule."""
    parent = module.rpartition(".")[0]
    return parent if parent != "crop" and parent in g else module


def test_the_import_graph_sees_the_imports():
    g = import_graph()
    assert len(g) > 30
    assert "crop.stage_table" in g["crop.cli"]             # at the top of a module
    assert "crop.config" in g["crop.stage_table"]          # inside a function
    assert "crop.report.rerun" in g["crop.report.audit"]
    assert "crop.envs" in g["crop.envs.vector"]             # a package's own name


def test_no_import_circle():
    g = import_graph()
    units: dict[str, set[str]] = {}
    for a, imported in g.items():
        units.setdefault(_unit(a, g), set()).update(_unit(b, g) for b in imported)
    for unit, imported in units.items():
        imported.discard(unit)
    try:
        order = list(graphlib.TopologicalSorter(units).static_order())
    except graphlib.CycleError as exc:
        pytest.fail("an import circle: " + " → ".join(reversed(exc.args[1])))
    assert order.index("crop.io") < order.index("crop.stage_table") < order.index("crop.cli")


@pytest.mark.parametrize("module", ["crop.io", "crop.names", "crop.columns"])
def test_the_lowest_layer_imports_nothing_of_crop(module):
    # the provenance writer, the names of the choices and the column names are read by everything
    assert import_graph()[module] == set()
