"""The README tested as written: the `[workflow]` extra its quick start installs provides
everything `snakemake --report` imports, and the quick-start summary it shows is what a run of
configs/quickstart.yaml prints (the counts computed from that config by the functions the workflow uses)."""
import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from crop.audit.audit import audit
from crop.workflow import layout
from crop.workflow.config import sigma_label, validate_config

from paths import REPO
from synthetic_results import GLOBAL_FACTORS, GRE_FACTORS, LOCAL_FACTORS, make_results

README = (REPO / "README.md").read_text()
QUICKSTART = REPO / "configs" / "quickstart.yaml"


# -------------------------------------------------------------------------- the extra has what --report needs

def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _closure(requirements: list[str], extras: tuple[str, ...] = ()) -> set[str]:
    """Every distribution that installing ``requirements`` brings in (markers evaluated here, extras followed),
    from the installed distributions' own metadata."""
    seen: set[str] = set()
    todo = [(Requirement(r), extras) for r in requirements]
    while todo:
        req, parent_extras = todo.pop()
        env_extras = parent_extras or ("",)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in env_extras):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not installed: its own requirements cannot be followed (the import check then fails)
        todo += [(Requirement(r), tuple(req.extras)) for r in dist.requires or []]
    return seen


def _imports_of(package_dir: Path) -> set[str]:
    """Top-level modules imported anywhere in a package's source (lazy imports inside functions included)."""
    names = set()
    for f in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names)


@pytest.mark.slow
def test_the_workflow_extra_provides_what_snakemake_report_imports():
    """Each module snakemake's report code imports (pygments, jinja2, docutils, …) must come from a
    distribution that `pip install -e '.[workflow]'` installs: the README's quick start, then its --report."""
    project = _pyproject()["project"]
    closure = _closure(project["dependencies"] + project["optional-dependencies"]["workflow"])
    assert "snakemake" in closure and "torch" in closure
    import snakemake.report

    needed = _imports_of(Path(snakemake.report.__file__).parent)
    assert {"pygments", "jinja2", "docutils"} <= needed  # the scan sees the lazy imports
    providers = metadata.packages_distributions()
    missing = {m: providers.get(m) for m in sorted(needed)
               if not {canonicalize_name(d) for d in providers.get(m, [])} & closure}
    assert not missing, (f"snakemake --report imports {sorted(missing)} (provided by {missing}), which "
                         "crop[workflow] does not install: add them to the workflow extra in pyproject.toml")


def test_the_closure_check_can_fail():
    """Without the workflow extra's own pins (snakemake alone), pygments is not in the closure."""
    assert "pygments" not in _closure(["snakemake==9.27.1"])
    assert "pygments" in _closure(_pyproject()["project"]["optional-dependencies"]["workflow"])


# ---------------------------------------------------------------------------- the quick start's summary

def _readme_summary() -> dict[str, str]:
    block = re.search(r"```\n(Summary: results in .*?)```", README, re.S)
    assert block, "README.md: no quick-start summary block"
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in block.group(1).splitlines()}


def _checks_per_run(global_eps, gre_eps, percentiles, local_eps) -> int:
    """The audit's soundness checks of one complete run (crop/audit/audit.py `_audit_run`) when every
    percentile bound is certified and LoRe's bound is finite at every ε attacked (as in the quick start):
    at each ε both the global attack and GRe have, the expectation bound and each percentile bound against
    the attacked returns; at each ε of the local attack, LoRe's bound against the episode that starts where
    LoRe does, and LoAct's certified steps not flipped."""
    common = {round(float(e), 12) for e in global_eps} & {round(float(e), 12) for e in gre_eps}
    return len(common) * (1 + len(percentiles)) + 2 * len(local_eps)


@pytest.mark.slow
def test_the_checks_formula_is_the_audits():
    """The formula above against the audit itself, on a synthetic results folder (two runs)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        make_results(Path(tmp) / "res", {"CartPole-v0": {"StdTrain": [0.1, 0.5]}})
        rep = audit(Path(tmp) / "res", Path(tmp) / "res" / "audit")
    assert rep["passed"]
    assert rep["checked"] == 2 * _checks_per_run(GLOBAL_FACTORS, GRE_FACTORS, [0.5], LOCAL_FACTORS)


def test_the_readme_summary_is_what_the_quick_start_prints():
    cfg = validate_config(yaml.safe_load(QUICKSTART.read_text()), str(QUICKSTART))
    results = cfg["results"]
    got = _readme_summary()
    plan = {env: (ec["algorithms"], [sigma_label(s) for s in ec["sigmas"]]) for env, ec in cfg["environments"].items()}
    files = layout.aggregate_files(Path(results) / "figures", Path(results) / "tables", plan)
    n_png, n_pdf = (sum(p.suffix == s for p in files) for s in (".png", ".pdf"))
    n_tables = sum(p.suffix == ".csv" for p in files)
    checks = sum(len(ec["algorithms"]) * len(ec["sigmas"]) * _checks_per_run(
        ec["attack"]["global_eps_factors"], ec["gre"]["eps_factors"], ec["gre"]["percentiles"],
        ec["attack"]["local_eps_factors"]) for ec in cfg["environments"].values())
    assert got["Summary"] == f"results in {results}/"
    # the audit's verdict line (crop/audit/audit.py verdict_line): every check counted once, none violated;
    # which of them could not fail is the audit's to say (a WARN, not a pass)
    line = re.fullmatch(r"soundness (PASS|WARN): (\d+) checks \((\d+) ok, 0 violation, 0 suspicious, (\d+) untestable, "
                        r"(\d+) vacuous(?:, (\d+) reported outside the guarantee)?\), "
                        r"(\d+) pooled counts \(0 violation\), 0 integrity problem\(s\) \((.*)\)",
                        got["audit"])
    assert line, got["audit"]
    verdict, (n, ok, untestable, vacuous, reported) = line.group(1), (int(g or 0) for g in line.groups()[1:6])
    assert n == checks and ok + untestable + vacuous + reported == n and line.group(8) == f"{results}/audit/audit.md"
    assert verdict == ("WARN" if untestable else "PASS")
    assert got["figures"] == f"{n_png} PNG, {n_pdf} PDF in {results}/figures/"
    assert got["tables"] == f"{n_tables} tables (CSV, Markdown, LaTeX) in {results}/tables/"
    assert got["report"].startswith("snakemake --report report.html --configfile configs/quickstart.yaml ")
    # the README's commands name the same config and the jobs it counts
    assert "snakemake --cores all --configfile configs/quickstart.yaml" in README
    assert "pip install -q -e '.[workflow]'" in README


def test_the_reliability_table_cites_tests_that_exist():
    """docs/reliability.md's table of hostile inputs names, per row, the tests that show what each gets: every
    `test_file.py::test_name` (and each `::test_name` after it, of the same file) is a test function there."""
    text = (REPO / "docs" / "reliability.md").read_text()
    table = text.split("## Every hostile or careless input tried", 1)[1].split("## In detail", 1)[0]
    cited = 0
    for row in (line for line in table.splitlines() if line.startswith("| ") and "::" in line):
        current = None
        for file, name in re.findall(r"`(test_[a-z0-9_]+\.py)?::(test_[a-z0-9_]+)`", row):
            current = file or current
            assert current, row
            defined = re.findall(r"^def (test_[a-z0-9_]+)", (REPO / "tests" / current).read_text(), re.M)
            assert name in defined, f"docs/reliability.md cites {current}::{name}, which is no test"
            cited += 1
    assert cited >= 60


@pytest.mark.slow
def test_the_quick_start_prints_the_readme_summary_on_this_machine(tmp_path):
    """The README's quoted block is what the quick start prints here, counts and all: results are
    byte-reproducible on the CPU for a seed, so a change of these counts is a change of the code's results or of
    the audit, and this test makes it visible (the README, docs/audit.md and this block must move together)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                        "--cores", "2", "--configfile", str(QUICKSTART)], capture_output=True, text=True,
                       timeout=3600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    printed = re.search(r"^(Summary: results in .*?)^report:", p.stdout + p.stderr, re.S | re.M)
    assert printed, (p.stdout + p.stderr)[-3000:]
    got = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in printed.group(1).splitlines()}
    quoted = _readme_summary()
    for key in ("Summary", "audit", "figures", "tables"):
        assert got[key] == quoted[key], f"README's {key!r} line: {quoted[key]!r}; the quick start printed {got[key]!r}"
    assert quoted["audit"].rsplit(" (", 1)[0] in (REPO / "docs" / "audit.md").read_text()   # without its path
