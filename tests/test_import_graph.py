"""The package's import graph (every ``import`` of crop/, at the top of a module or inside a function) has no
circle, so its modules form layers: nothing imports from a layer above it.  A package's ``__init__`` and its
own submodules are one unit here (``crop.envs`` and ``crop.envs.atari`` may import each other's names)."""
import ast
import graphlib
import re
from pathlib import Path

import pytest

from paths import REPO

CROP = REPO / "crop"


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


# The layers of docs/layout.md, lowest first: a module imports only from its own layer or the layers below.
LAYERS = (
    # read by everything; no torch
    ("crop", "crop.names", "crop.columns", "crop.io", "crop.progress", "crop.fingerprint", "crop.schema"),
    ("crop.envs",),
    ("crop.models",),
    ("crop.smoothing",),
    ("crop.certify",),
    ("crop.train",),
    ("crop.agents",),
    ("crop.workflow",),
    ("crop.reference", "crop.report"),
    ("crop.audit",),
    ("crop.handlers",),
    ("crop.__main__",),
)


def _layer(module: str) -> int:
    """The index in LAYERS of the innermost entry that is ``module`` or a package holding it."""
    for name in (module, *(module.rsplit(".", k)[0] for k in range(1, module.count(".") + 1))):
        for i, layer in enumerate(LAYERS):
            if name in layer:
                return i
    raise AssertionError(f"{module} is in no layer of LAYERS: add its package there and to docs/layout.md")


def test_the_import_graph_sees_the_imports():
    g = import_graph()
    assert len(g) > 30
    assert "crop.workflow.stage_table" in g["crop.workflow.cli"]     # at the top of a module
    assert "crop.envs" in g["crop.workflow.cli_options"]             # inside a function
    assert "crop.audit.rerun" in g["crop.audit.audit"]
    assert "crop.envs" in g["crop.envs.vector"]                      # a package's own name
    assert "crop.handlers.stages" in g["crop.__main__"]              # the command imports its handlers


def test_every_arrow_points_down():
    g = import_graph()
    up = sorted(f"{a} → {b}" for a, imported in g.items() for b in imported if _layer(b) > _layer(a))
    assert up == [], "imports from a higher layer (docs/layout.md): " + "; ".join(up)


def test_no_import_circle_between_modules():
    """Not even within a package: ``crop.report.metrics`` and ``crop.report.integrity`` are two ideas or one."""
    g = {a: imported - {a} for a, imported in import_graph().items()}
    for a, imported in g.items():
        # a package's __init__ re-exporting its submodules is not a circle of ideas
        g[a] = {b for b in imported if not (b.startswith(a + ".") and a in g)}
    try:
        list(graphlib.TopologicalSorter(g).static_order())
    except graphlib.CycleError as exc:
        pytest.fail("an import circle: " + " → ".join(reversed(exc.args[1])))


def test_the_top_of_the_house_holds_few_modules():
    top = sorted(p.name for p in CROP.glob("*.py"))
    assert len(top) <= 10, f"crop/ holds {len(top)} modules directly: {top}; put them in the package of their layer"


@pytest.mark.parametrize("module", ["crop.io", "crop.names", "crop.columns"])
def test_the_lowest_layer_imports_nothing_of_crop(module):
    # the provenance writer, the names of the choices and the column names are read by everything
    assert import_graph()[module] == set()


#: ``"crop.module:function"`` (or its start, in an f-string): a function named by a string, imported by name
#: where it is called, an arrow the graph above cannot see.
_BY_NAME = re.compile(r"\bcrop(?:\.\w+)+:(?!\s)")

#: The one place left, within its layer: the stage rows' cost, memory and device functions
#: (crop/workflow/stage_costs.py), named so because that module reads the layout, which reads the rows.
_NAMED_BY_STRING = {("crop/workflow/stage_table.py", "crop.workflow.stage_costs:")}


def test_no_function_is_named_by_a_string():
    found = set()
    for path in CROP.rglob("*.py"):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found |= {(rel, m.group(), node.lineno) for m in _BY_NAME.finditer(node.value)}
    named = sorted(f"{rel}:{line}: {text}" for rel, text, line in found if (rel, text) not in _NAMED_BY_STRING)
    assert named == [], "functions named by a string, not imported (the import graph cannot see them): " + \
        "; ".join(named)


def test_a_function_named_by_a_string_is_found():
    assert _BY_NAME.search('HANDLERS = {"qrange": "crop.handlers.stages:cmd_qrange"}')
    assert _BY_NAME.search("crop.handlers.stages:") and not _BY_NAME.search("module:function, crop.io: writes")


def test_no_test_module_imports_another():
    """The tests share helpers through conftest.py's fixtures and the helper modules (networks, paths,
    synthetic_results, toy_lore), never through another test file."""
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert found == [], "a test file imports another: " + "; ".join(found)
