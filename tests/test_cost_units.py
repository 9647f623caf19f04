"""A calibration file is untrusted input (crop/workflow/cost_units.py): every table — the user's, this machine's or a
shipped one — is checked key by key before anything is priced, a bad one is one line naming the key or the
path, and every job's SLURM wall-time and memory are capped (slurm.max_runtime, slurm.max_mem_mb)."""
from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import yaml

from crop.__main__ import main
from crop.workflow import cost
from crop.workflow.config import load_config

from paths import REPO

QUICK = REPO / "configs" / "quickstart.yaml"


pytestmark = pytest.mark.usefixtures("no_calibration")


def _table(**changes) -> dict:
    """The shipped CPU table with ``changes`` (``envs.ENV.UNIT`` or ``UNIT``; a value of ``...`` deletes it)."""
    t = copy.deepcopy(json.loads(resources.files("crop.workflow").joinpath("costs/cpu.json").read_text()))
    for key, value in changes.items():
        *parents, last = key.split("/")
        target = t
        for p in parents:
            target = target[p]
        if value is ...:
            del target[last]
        else:
            target[last] = value
    return {"cpu": t}


def _config(tmp_path, **slurm) -> Path:
    cfg = yaml.safe_load(QUICK.read_text())
    cfg["slurm"] = slurm
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(cfg))
    return f


HOSTILE = {
    "start_s 1e300": (_table(start_s=1e300), "cpu.start_s = 1e+300 is outside [0.001, 3600] s"),
    "env_step_s 1e308": (_table(**{"envs/CartPole-v0/env_step_s": 1e308}),
                         "cpu.envs.CartPole-v0.env_step_s = 1e+308 is outside [1e-09, 60] s"),
    "node_mb 1e12": (_table(**{"envs/CartPole-v0/node_mb": 1e12}),
                     "cpu.envs.CartPole-v0.node_mb = 1e+12 is outside [1e-06, 65536] MB"),
    "a list": ([_table()["cpu"]], "not a calibration file (a JSON list"),
    # an environment the quick start does not run: unchecked, it was never read
    "a missing unit": (_table(**{"envs/highway-fast-v0/train_step_s": ...}),
                       "no unit cost train_step_s of highway-fast-v0 on cpu (cpu.envs.highway-fast-v0.train_step_s)"),
    "a string unit": (_table(**{"envs/CartPole-v0/smooth_sample_s": "fast"}),
                      "cpu.envs.CartPole-v0.smooth_sample_s = 'fast' is not a number"),
    "a zero": (_table(**{"envs/CartPole-v0/train_step_s": 0.0}),
                        "cpu.envs.CartPole-v0.train_step_s = 0 is outside [1e-08, 600] s"),
    "NaN": (_table(figure_s=math.nan), "cpu.figure_s = nan is outside"),
    "a boolean unit": (_table(audit_run_s=True), "cpu.audit_run_s = True is not a number"),
    "an unknown key": (_table(start=2.0), "cpu.start is not a key of a calibration"),
    "a non-calibration JSON": ({"jobs": [], "total": {"cpu_hours": 1.0}},
                               "not a calibration file ('jobs' is not a device: cpu or cuda)"),
    "an empty object": ({}, "not a calibration file (an empty object"),
    "a wrong device record": ({"cuda": _table()["cpu"]}, "cuda.device = 'cpu' is not 'cuda'"),
    "an algorithm's unit 1e300": (_table(**{"envs/CartPole-v0/algos": {"CARRL": {"smooth_sample_s": 1e300}}}),
                                  "cpu.envs.CartPole-v0.algos.CARRL.smooth_sample_s = 1e+300 is outside"),
    "an algorithm's unknown unit": (_table(**{"envs/CartPole-v0/algos": {"CARRL": {"env_step_s": 1.0}}}),
                                    "cpu.envs.CartPole-v0.algos.CARRL.env_step_s is not a unit an algorithm's "
                                    "network changes"),
    "algorithms not a table": (_table(**{"envs/CartPole-v0/algos": [1]}),
                               "cpu.envs.CartPole-v0.algos is list, not a table of unit costs per algorithm"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_calibration_is_one_line_naming_its_key(tmp_path, capsys, case):
    tables, expected = HOSTILE[case]
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(tables))
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--configfile", str(QUICK), "--calibration", str(path)])
    out = capsys.readouterr()
    assert exc.value.code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and f"calibration {path}: " in out.err and expected in out.err, out.err


@pytest.mark.parametrize("what", ["no such file", "a folder"])
def test_a_calibration_path_that_is_no_file_is_refused_never_the_shipped_table(tmp_path, capsys, what):
    path = tmp_path / "no" / "such.json" if what == "no such file" else tmp_path
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--configfile", str(QUICK), "--calibration", str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and f"calibration {path}: " in err
    assert "no such file" in err if what == "no such file" else "not a calibration file" in err


def test_crop_plan_refuses_an_overflowing_table_without_a_traceback(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(_table(**{"envs/CartPole-v0/env_step_s": 1e308})))
    out = subprocess.run([sys.executable, "-m", "crop", "plan", "--configfile", str(QUICK), "--calibration",
                          str(path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin",
                                                                           "XDG_CACHE_HOME": str(tmp_path)})
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"crop plan: error: calibration {path}: cpu.envs.CartPole-v0.env_step_s = 1e+308 is outside [1e-09, 60] s "
        "(one environment step)"]


def test_this_machine_s_calibration_is_checked_too_and_refused_by_the_workflow(tmp_path):
    """The workflow's resources read this machine's calibration (no --calibration): a hostile one is refused
    when the Snakefile is parsed (JobResources), never an OverflowError in a job's resources nor a week
    asked for silently."""
    path = cost.calibration_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_table(**{"envs/CartPole-v0/env_step_s": 1e308})))
    with pytest.raises(cost.CostError, match=r"CartPole-v0\.env_step_s = 1e\+308"):
        cost.JobResources(load_config(QUICK))
    with pytest.raises(cost.CostError, match="env_step_s"):
        cost.job_resources(load_config(QUICK), "loact", {"env": "CartPole-v0", "algo": "StdTrain",
                                                         "sigma": "0.01"}, 1, 0)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_shipped_tables_pass_the_checks(device):
    from crop.workflow.cost_units import check_table, check_tables

    table = json.loads(resources.files("crop.workflow").joinpath(f"costs/{device}.json").read_text())
    check_table(table, device, "shipped")
    check_tables({device: table}, "shipped")
    assert cost.unit_costs(device)[0] == table


def test_every_unit_has_one_range_and_meaning():
    from crop.workflow.cost_units import OPTIONAL_UNITS, UNIT_TABLE

    assert set(cost.UNITS) | set(cost.GLOBAL_UNITS) | set(OPTIONAL_UNITS) == set(UNIT_TABLE)
    for name, (_, lo, hi, meaning) in UNIT_TABLE.items():
        assert 0 < lo < hi and math.isfinite(hi) and meaning, name


def test_an_optional_unit_may_be_absent_but_is_checked_when_given(tmp_path, capsys):
    """gre_start_s (a GRe slot's making, written by crop calibrate) is checked like every unit when present."""
    from crop.workflow.cost_units import check_table

    table = json.loads(json.dumps(cost.unit_costs("cpu")[0]))
    env = table["envs"]["PongNoFrameskip-v4"]
    env.pop("gre_start_s", None)
    check_table(table, "cpu", "t")
    env["gre_start_s"] = 0.2
    check_table(table, "cpu", "t")
    env["gre_start_s"] = 1e300
    with pytest.raises(cost.CostError, match=r"cpu\.envs\.PongNoFrameskip-v4\.gre_start_s = 1e\+300 is outside"):
        check_table(table, "cpu", "t")


# ------------------------------------------------------------------------------------------------ the caps

def test_a_job_over_the_memory_cap_asks_for_the_cap_and_plan_names_it(tmp_path, capsys):
    f = _config(tmp_path, max_mem_mb=1200)
    jobs, _ = cost.predict(load_config(f))
    over = [j for j in jobs if j.mem_mb > 1200]
    assert over and any(j.rule == "checkpoint" for j in over)        # 1500 MB each
    res = cost.job_resources(load_config(f), "checkpoint", {"env": "CartPole-v0", "algo": "StdTrain"}, 1, 0)
    assert res["mem_mb"] == 1200
    main(["plan", "--configfile", str(f), "--json"])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("over slurm.max_mem_mb = 1200 MB")]
    assert len(lines) == len(over)
    assert any("checkpoint CartPole-v0/StdTrain is predicted 1500 MB" in x for x in lines)


def test_without_caps_a_job_asks_for_at_most_a_week_and_512_gb(tmp_path, capsys):
    """slurm.max_runtime and slurm.max_mem_mb left out: the caps are a week and 512,000 MB; a job predicted
    longer (a training run on a slow machine's calibration) asks for the week, and crop plan names it."""
    assert cost.slurm_caps(load_config(QUICK)) == (10080, 512000)
    assert cost.runtime_minutes(math.inf, 10080) == 10080 and cost.runtime_minutes(1e300, 10080) == 10080
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(_table(**{"envs/CartPole-v0/train_step_s": 600.0})))   # the range's top
    main(["plan", "--configfile", str(QUICK), "--json", "--calibration", str(path)])
    over = [x for x in capsys.readouterr().err.splitlines() if x.startswith("over slurm.max_runtime = 10080 min")]
    assert any("checkpoint CartPole-v0/StdTrain" in x for x in over)
    cost._tables.cache_clear()
    cache = cost.calibration_path()
    cache.parent.mkdir(parents=True)
    cache.write_text(path.read_text())
    res = cost.job_resources(load_config(QUICK), "checkpoint", {"env": "CartPole-v0", "algo": "StdTrain"}, 1, 0)
    assert res == {"runtime": 10080, "mem_mb": 1500}


@pytest.mark.slow
def test_the_workflow_refuses_a_hostile_calibration_before_any_job(tmp_path):
    """snakemake on a machine whose calibration overflows: the Snakefile's parse stops with the one line
    naming the key (where a job's resources raised OverflowError before)."""
    path = tmp_path / "cache" / "crop" / "calibration.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_table(**{"envs/CartPole-v0/env_step_s": 1e308})))
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F", "-s", str(REPO / "Snakefile"),
                          "--configfile", str(QUICK), "--directory", str(tmp_path / "wd")],
                         capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "OverflowError" not in said
    assert f"calibration {path}: cpu.envs.CartPole-v0.env_step_s = 1e+308 is outside [1e-09, 60] s" in said
