"""What the workflow's parse and a job's start import: the Snakemake process parses the workflow once per run
(and the DAG grows with the config), every job starts a Python; neither should load heavy libraries it
does not use."""
import re
import subprocess
import sys

import pytest

from paths import REPO


def _loaded(code: str, modules) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {list(modules)!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    return out.stdout.split()


def test_workflow_parse_imports_neither_torch_nor_pandas():
    """Every module the Snakefile and rules/*.smk import at their top level (what the Snakemake process
    loads to parse the workflow) together load no torch, pandas, scipy.stats, matplotlib or highway-env."""
    files = [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]
    statement = r"^(?:from crop[\w.]* import (?:\([^)]*\)|.+)|import crop[\w.]*)"
    imports = [i for f in files for i in re.findall(statement, f.read_text(), re.M)]
    assert any("crop.reference" in i for i in imports) and any("layout" in i for i in imports)  # found them
    heavy = ["torch", "pandas", "scipy.stats", "matplotlib", "highway_env"]
    assert _loaded("\n".join(imports), heavy) == []


@pytest.mark.slow
def test_a_stage_job_does_not_load_scipy_stats():
    """Φ and Φ⁻¹ come from scipy.special; scipy.stats (about 0.5 s per job) loads only for GRe's order
    statistic."""
    code = ("import crop.__main__, crop.smoothing.smoothed, crop.certify.loact, crop.certify.lore, "
            "crop.certify.gre, crop.certify.attack, crop.certify.qrange")
    assert _loaded(code, ["scipy.stats"]) == []
    order = "\ncrop.smoothing.stats.percentile_order_index(100, 0.5, 0.05)"
    assert _loaded(code + order, ["scipy.stats"]) == ["scipy.stats"]


@pytest.mark.slow
def test_a_run_folder_is_looked_up_without_highway_env():
    """The report's run discovery asks whether ENV/ALGO is a namespaced gymnasium id; highway-env registers
    none, so that question loads no highway-env (0.65 s per aggregate and audit job), while a highway id
    still registers it."""
    code = "from crop.envs import _registration\nassert _registration('CartPole-v0/StdTrain') is None"
    assert _loaded(code, ["highway_env"]) == []
    assert _loaded("from crop.envs import _registration\n_registration('highway-fast-v0')", ["highway_env"]) == [
        "highway_env"]
