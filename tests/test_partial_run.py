"""A run whose one checkpoint job fails at run time still ends with the tables, figures and audit of every run
that finished, the failed job and its log named in the audit (the Snakefile's onerror, crop/workflow/partial.py)."""
import json
import subprocess
import sys

import pytest
import yaml

from crop.audit.provenance import config_hash
from crop.workflow.config import validate_config

from paths import REPO

# A CartPole policy that trains in a second, beside CROP's published highway network fetched from a mirror whose
# copy is corrupt (its sha256 is not the registry's): the highway checkpoint job fails, the CartPole run finishes.
CONFIG = {
    "results": "results-partial", "seed": 1,
    "checkpoints": {"mirror": "mirror", "cache": "cache", "lock": "lock.json"},
    "environments": {
        "CartPole-v0": {
            "algorithms": ["StdTrain"], "sigmas": [0.1],
            "train": {"total_steps": 300, "min_steps": 0, "eval_episodes": 1, "target_return": 0, "hidden": [16],
                      "dqn": {"learning_starts": 100, "eval_every": 100}},
            "qrange": {"m": 50, "episodes": 1, "horizon": 4}, "loact": {"m": 50, "episodes": 1, "horizon": 4},
            "gre": {"m": 50, "horizon": 4, "eps_factors": [0.0, 0.1]}, "lore": {"m": 50, "horizon": 2},
            "attack": {"local_episodes": 1, "local_m_grad": 8, "local_eps_factors": [0.0, 1.0],
                       "global_episodes": 2, "global_eps_factors": [0.0, 0.1]}},
        "highway-fast-v0": {"algorithms": ["StdTrain"], "source": "published", "sigmas": [0.1]},
    },
}


@pytest.mark.slow
def test_a_failed_checkpoint_job_leaves_the_other_runs_tables_figures_and_a_warn_audit(tmp_path):
    (tmp_path / "mirror" / "crop-highway-fast-v0").mkdir(parents=True)
    (tmp_path / "mirror" / "crop-highway-fast-v0" / "highway-fast_nat.pth").write_bytes(b"not the published file")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CONFIG))
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                        "--cores", "2", "--configfile", str(tmp_path / "c.yaml")],
                       capture_output=True, text=True, timeout=900)
    said = p.stdout + p.stderr
    assert p.returncode != 0, said[-3000:]   # the run still fails: a job did
    res = tmp_path / "results-partial"
    log = res / "logs" / "highway-fast-v0" / "StdTrain" / "checkpoint.log"
    assert "refusing it" in log.read_text()
    assert "the figures, tables and audit of the 1 of 2 runs that finished" in said, said[-3000:]
    tables = sorted(f.name for f in (res / "tables").glob("*.csv"))
    figures = sorted(f.name for f in (res / "figures").glob("*.png"))
    assert tables and all(n.startswith("CartPole_") for n in tables), tables
    assert figures and all(n.startswith(("CartPole_", "Cartpole_")) for n in figures), figures
    rep = json.loads((res / "audit" / "audit.json").read_text())
    assert rep["verdict"] == "WARN" and rep["integrity"] == [] and rep["checked"] > 0
    assert rep["runs"] == ["CartPole-v0/StdTrain/sigma-0.1"]
    assert rep["config_hash"] == config_hash(validate_config(CONFIG, "config"))   # the audit rule's hash
    missing = {m["file"]: m["problem"] for m in rep["expected_missing"]}
    failed = "its job checkpoint highway-fast-v0/StdTrain failed: log results-partial/logs/highway-fast-v0/StdTrain/" \
             "checkpoint.log"
    assert failed in missing["results-partial/highway-fast-v0/StdTrain/checkpoint"]
    assert "not run: job checkpoint highway-fast-v0/StdTrain failed" in \
        missing["results-partial/highway-fast-v0/StdTrain/sigma-0.1"]
    drawn = "results-partial/figures/highway-fast_*, results-partial/tables/highway-fast_*"
    assert "of highway-fast-v0" in missing[drawn] and "a job of its runs failed" in missing[drawn]
    assert len(missing) == 3, missing   # nothing of the CartPole run is missing
    assert "highway-fast-v0/StdTrain/checkpoint.log" in (res / "audit" / "audit.md").read_text()
    assert not (res / "highway-fast-v0" / "StdTrain" / "sigma-0.1").exists()


def _quickstart(plan: dict) -> dict:
    """The quick start's config for the CartPole runs of ``plan`` = {algo: [σ, …]}, validated."""
    cfg = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    env = cfg["environments"]["CartPole-v0"]
    env["algorithms"], env["sigmas"] = list(plan), sorted({s for ss in plan.values() for s in ss})
    return validate_config(cfg, "config")


def test_expected_missing_names_the_failed_job_and_its_log_or_the_one_a_run_waited_on(tmp_path):
    """A folder whose GaussAug checkpoint job failed (its log is there, its model is not): the checkpoint folder
    names its job and log, GaussAug's run folder names the job it waited on; without the log, neither says why."""
    from crop.audit.completeness import config_missing

    from synthetic_results import make_results

    make_results(tmp_path, {"CartPole-v0": {"StdTrain": [0.1]}})
    cfg = _quickstart({"StdTrain": [0.1], "GaussAug": [0.1]})
    ck, run = tmp_path / "CartPole-v0" / "GaussAug" / "checkpoint", tmp_path / "CartPole-v0" / "GaussAug" / "sigma-0.1"
    quiet = {m["file"]: m["problem"] for m in config_missing(tmp_path, cfg)}
    assert "failed" not in quiet[str(ck)] and "failed" not in quiet[str(run)]
    log = tmp_path / "logs" / "CartPole-v0" / "GaussAug" / "checkpoint.log"
    log.parent.mkdir(parents=True)
    log.write_text("crop checkpoint: error: …\n")
    said = {m["file"]: m["problem"] for m in config_missing(tmp_path, cfg)}
    assert said[str(ck)].endswith(f"; its job checkpoint CartPole-v0/GaussAug failed: log {log}")
    assert said[str(run)].endswith(f"; not run: job checkpoint CartPole-v0/GaussAug failed (log {log})")
    assert not any(str(tmp_path / "CartPole-v0" / "StdTrain") in f for f in said)   # the finished run: nothing


class _Job:
    def __init__(self, rule):
        self.rule = type("Rule", (), {"name": rule})()


@pytest.mark.parametrize("failed, rules, wanted", [
    ({"a job"}, ["checkpoint", "aggregate", "audit"], True),     # a job failed in a run of the default target
    (set(), ["checkpoint", "aggregate", "audit"], False),        # an interrupt: nothing failed
    ({"a job"}, ["checkpoint", "loact"], False),                 # a run asked for some run files only
])
def test_the_report_of_what_finished_follows_a_failed_job_of_a_run_that_wanted_tables(failed, rules, wanted):
    from types import SimpleNamespace

    from crop.workflow.partial import wants_report

    workflow = SimpleNamespace(scheduler=SimpleNamespace(failed=failed),
                               dag=SimpleNamespace(jobs=[_Job(r) for r in rules]))
    assert wants_report(workflow) is wanted
