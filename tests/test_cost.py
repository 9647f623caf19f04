"""The cost model (crop/workflow/cost.py) and ``crop plan``: the plan's jobs are the DAG Snakemake builds, every job
asks SLURM for at least its prediction, a config it cannot price is one line naming what to calibrate."""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from crop.__main__ import main
from crop.workflow import cost
from crop.workflow.config import load_config, validate_config
from crop.workflow.layout import RUN_FILES

from paths import REPO as ROOT

QUICK = ROOT / "configs" / "quickstart.yaml"
PAPER = ROOT / "configs" / "paper.yaml"


pytestmark = pytest.mark.usefixtures("no_calibration")


def _config(path, **changes) -> dict:
    cfg = yaml.safe_load(Path(path).read_text())
    for key, value in changes.items():
        target = cfg
        *parents, last = key.split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[last] = value
    return cfg


# --------------------------------------------------------------------------------------------- the model

def test_lore_nodes_counts_the_internal_nodes_of_the_tree():
    assert cost.lore_nodes(10, 2) == 2 ** 10 - 1          # a full binary tree of depth 10: 1023 smoothed
    assert cost.lore_nodes(3, 5) == 1 + 5 + 25
    assert cost.lore_nodes(10, 5, certified=1.0) == 10     # every action certified: one path
    assert cost.lore_nodes(10, 2, certified=0.5) == pytest.approx((1.5 ** 10 - 1) / 0.5)
    assert cost.lore_nodes(200, 6) > cost.MAX_PRICED_NODES
    assert cost.lore_nodes(500, 6) == math.inf              # beyond a float: infinite, not an overflow
    assert cost.lore_nodes(200, 6, max_nodes=5000) == 5000
    assert cost.lore_nodes(3, 2, max_nodes=5000) == 7      # a budget the tree does not reach


def test_lore_transitions_count_every_node_but_the_root():
    assert cost.lore_transitions(10, 2) == 2 ** 11 - 2     # a full binary tree of depth 10: 2047 nodes
    assert cost.lore_transitions(3, 5) == 5 + 25 + 125
    assert cost.lore_transitions(10, 5, certified=1.0) == 10
    assert cost.lore_transitions(500, 6) == math.inf
    assert cost.lore_transitions(200, 6, max_nodes=5000) == 4999   # the budget counts the root too
    assert cost.lore_transitions(3, 2, max_nodes=5000) == 14


@pytest.mark.parametrize("max_nodes", [None, 40])
def test_the_lore_model_bounds_a_real_search(max_nodes, mlp_factory):
    """The counts the model prices a LoRe job by are never below what a search does: an exhaustive search (no
    pruning, every action possible) of CartPole at H = 6, unbounded and with a budget it hits."""
    from crop.certify.lore import LoReSettings, Problem, Search, run_lore
    from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings

    sm = SmoothedNetwork(mlp_factory(), SmoothingSettings(0.5, 16, -10.0, 10.0, 0.05, chunk=1000), 2)
    settings = LoReSettings(Problem(6, 0), Search(prune=False, max_nodes=max_nodes, reward_min=0.0))
    info = run_lore("CartPole-v0", sm, settings, progress=False).info
    assert info["truncated"] == (max_nodes is not None)
    assert info["transitions"] <= cost.lore_transitions(6, 2, 0.0, max_nodes)
    assert info["distinct_states_smoothed"] <= cost.lore_nodes(6, 2, 0.0, max_nodes)
    if max_nodes is None:   # nothing to prune and no ε limit: the whole tree, as the model counts it
        assert info["transitions"] == cost.lore_transitions(6, 2)


def test_runtime_is_the_prediction_with_headroom_and_the_cap():
    assert cost.runtime_minutes(600) == 2 * 10 + cost.HEADROOM_MIN
    assert cost.runtime_minutes(600, cap=12) == 12
    for s in (1, 59, 61, 3600, 86400):
        assert cost.runtime_minutes(s) * 60 >= s
        # a resumable job is never signalled (5 min before its limit) when it runs as predicted
        assert cost.runtime_minutes(s, kind="resumable") * 60 >= s + 300
        assert cost.runtime_minutes(s, kind="resumable") <= cost.runtime_minutes(s)
        assert cost.runtime_minutes(s, kind="grouped", cap=12) <= 12
    assert cost.runtime_minutes(36000, kind="resumable") == 750          # 1.25 × 10 h
    assert cost.runtime_minutes(1, kind="grouped") == 1                  # at least a minute
    assert cost.runtime_minutes(600, kind="grouped") == 15               # 1.5 × 10 min


def test_makespan_respects_cores_gpus_and_dependencies():
    jobs = [cost.Job("a", seconds=10), cost.Job("b", seconds=10), cost.Job("c", seconds=5, needs=[0, 1])]
    assert cost.makespan(jobs, cores=1, gpus=0) == 25
    assert cost.makespan(jobs, cores=2, gpus=0) == 15
    assert cost.makespan(jobs, cores=1, gpus=0, nodes=2) == 15
    g = [cost.Job("a", seconds=10, gpus=1), cost.Job("b", seconds=10, gpus=1)]
    assert cost.makespan(g, cores=16, gpus=1) == 20       # one GPU: one at a time
    assert cost.makespan(g, cores=16, gpus=2) == 10


def test_a_job_on_the_gpu_goes_first():
    """Two 4-thread CPU jobs (12 s) fill 8 cores; a chain of two GPU jobs (4 threads, 10 s each) waiting behind
    them would idle the GPU until 12 s (32 s in all).  GPU jobs first: B beside A1, then C beside A2 (24 s)."""
    jobs = [cost.Job("a1", seconds=12, threads=4), cost.Job("a2", seconds=12, threads=4),
            cost.Job("b", seconds=10, threads=4, gpus=1), cost.Job("c", seconds=10, threads=4, gpus=1, needs=[2])]
    assert cost.makespan(jobs, cores=8, gpus=1) == 24
    assert cost.job_priority(1) > cost.job_priority(0)


# --------------------------------------------------------------------------------------------- crop plan

def test_plan_json_has_exactly_its_documented_fields(capsys):
    main(["plan", "--configfile", str(QUICK), "--cores", "2", "--json"])
    out = capsys.readouterr()
    plan = json.loads(out.out)
    assert set(plan) == {"jobs", "total", "makespan_hours"}
    assert set(plan["total"]) == {"cpu_hours", "gpu_hours", "requested_cpu_hours", "requested_gpu_hours",
                                  "allocations", "jobs"}
    assert plan["total"]["jobs"] == len(plan["jobs"])
    for j in plan["jobs"]:
        assert set(j) == {"rule", "env", "algo", "sigma", "device", "minutes"}
        assert j["minutes"] > 0
    ck = [j for j in plan["jobs"] if j["rule"] == "checkpoint"]
    assert ck and all(j["sigma"] is None for j in ck)
    assert plan["total"]["gpu_hours"] == 0                 # device: cpu
    total = sum(j["minutes"] for j in plan["jobs"]) / 60
    assert plan["total"]["cpu_hours"] == pytest.approx(total, rel=1e-2)   # threads: 1
    assert total / 2 * 0.99 <= plan["makespan_hours"] <= total * 1.01
    assert "the shipped cpu table" in out.err               # it says which table


def test_what_slurm_is_asked_for_is_the_rules_resources_summed_per_allocation():
    """requested_* are the rules' own requests (job_resources, the Snakefile's) as the profile submits them: a
    group per (env, algo) of the one-thread stage jobs asking for the sum of its members' minutes with one
    thread and its GPU once, every other job alone; and every allocation asks for at least what it is
    predicted to run (with the paper's 4-thread GRe and GPU stages)."""
    cfg = load_config(PAPER)
    jobs, _ = cost.predict(cfg, gpus=1)
    groups, alone = {}, []
    for j in jobs:
        res = cost.job_resources(cfg, j.rule, j.wildcards, j.threads, j.gpus)
        if cost.stage_group(j.rule):
            assert j.threads == 1, j
            g = groups.setdefault((j.env, j.algo), [0, 0, 0.0])
            g[0] += res["runtime"]
            g[1] = max(g[1], j.gpus)
            g[2] += j.seconds
        else:
            alone.append((res["runtime"], j))
            assert res["runtime"] * 60 >= j.seconds, j
    # GRe's workers on the config's threads, but CartPole's pool, which steps in one process
    assert {(j.env == "CartPole-v0", j.threads) for _, j in alone if j.rule == "gre"} == {(False, 4), (True, 1)}
    cpu = sum(m for m, _, _ in groups.values()) + sum(m * j.threads for m, j in alone)
    gpu = sum(m * g for m, g, _ in groups.values()) + sum(m * j.gpus for m, j in alone)
    asked = cost.requested(cfg, jobs)
    assert asked["cpu_hours"] == pytest.approx(cpu / 60) and asked["gpu_hours"] == pytest.approx(gpu / 60)
    assert asked["allocations"] == len(groups) + len(alone)
    for minutes, _, seconds in groups.values():
        assert minutes * 60 >= 1.2 * seconds   # a group asks for its members' sum with headroom


def test_plan_table_names_every_rule(capsys):
    main(["plan", "--configfile", str(QUICK), "--cores", "2"])
    out = capsys.readouterr().out
    for rule in ("checkpoint", "qrange", "loact", "gre", "lore", "attack_local", "attack_global", "aggregate",
                 "audit"):
        assert re.search(rf"^{rule}\s", out, re.M), rule
    assert "CPU-hours" in out and "makespan" in out


def test_a_calibration_file_is_used_and_named(tmp_path, capsys):
    table = cost.shipped_table("cpu")
    fast = copy.deepcopy(table)
    for units in fast["envs"].values():
        units["smooth_sample_s"] /= 10
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cpu": {**fast, "measured": "today", "machine": {"cpu": "x"}}}))
    main(["plan", "--configfile", str(QUICK), "--json", "--calibration", str(path)])
    out = capsys.readouterr()
    assert str(path) in out.err
    loact = [j for j in json.loads(out.out)["jobs"] if j["rule"] == "loact"]
    main(["plan", "--configfile", str(QUICK), "--json"])
    shipped = [j for j in json.loads(capsys.readouterr().out)["jobs"] if j["rule"] == "loact"]
    assert all(a["minutes"] < b["minutes"] for a, b in zip(loact, shipped))


def test_an_environment_without_unit_costs_is_one_line_naming_the_calibration(tmp_path, capsys):
    table = cost.shipped_table("cpu")
    del table["envs"]["CartPole-v0"]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cpu": table}))
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--configfile", str(QUICK), "--calibration", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "crop calibrate --device cpu --env CartPole-v0" in err


def test_a_missing_unit_is_named_never_a_zero(tmp_path, capsys):
    table = cost.shipped_table("cpu")
    del table["envs"]["CartPole-v0"]["grad_sample_s"]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cpu": table}))
    with pytest.raises(SystemExit):
        main(["plan", "--configfile", str(QUICK), "--calibration", str(path)])
    assert "grad_sample_s of CartPole-v0" in capsys.readouterr().err


def test_a_calibration_from_before_lore_transitions_says_so(tmp_path, capsys):
    """A calibration file written when LoRe was priced per node (lore_node_s) is one line saying it predates
    the unit the model now needs and what to run, never priced with a zero."""
    table = cost.shipped_table("cpu")
    for units in table["envs"].values():
        units["lore_node_s"] = units.pop("lore_transition_s") * 100
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cpu": table}))
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--configfile", str(QUICK), "--calibration", str(path)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    assert "predates lore_transition_s" in err and "crop calibrate --device cpu --env CartPole-v0" in err


def test_calibrating_one_environment_keeps_the_others(tmp_path, monkeypatch):
    """`crop calibrate --env ID` replaces that environment's units in the device's table and keeps the ones
    measured before for the other environments (and the other devices' tables)."""
    from crop.workflow import calibrate as cal

    cpu, cuda = cost.shipped_table("cpu"), cost.shipped_table("cuda")
    now = {k: v if isinstance(v, (bool, dict)) else v * 2 for k, v in cpu["envs"]["CartPole-v0"].items()}
    monkeypatch.setattr(cal, "_start_s", lambda: 1.0)
    monkeypatch.setattr(cal, "_env_costs", lambda env, device, log: now)
    path = tmp_path / "calibration.json"
    old = {e: cpu["envs"][e] for e in ("CartPole-v0", "highway-fast-v0")}
    path.write_text(json.dumps({"cpu": {**cpu, "envs": old}, "cuda": cuda}))
    cal.calibrate("cpu", envs=["CartPole-v0"], out=path, log=lambda *a: None)
    tables = json.loads(path.read_text())
    assert tables["cpu"]["envs"] == {"CartPole-v0": now, "highway-fast-v0": old["highway-fast-v0"]}
    assert tables["cuda"] == cuda and tables["cpu"]["start_s"] == 1.0


def test_calibrate_refuses_a_hostile_file_before_measuring(tmp_path, monkeypatch, capsys):
    """What `crop calibrate` would keep of a file that fails the checks would make its new file fail them
    too: refused in one line naming the key, before a minute is spent measuring; a file that is not JSON is
    replaced."""
    from crop.workflow import calibrate as cal

    measured = []
    monkeypatch.setattr(cal, "_start_s", lambda: measured.append(1) or 1.0)
    path = tmp_path / "calibration.json"
    cpu = cost.shipped_table("cpu")
    cpu["envs"]["CartPole-v0"]["node_mb"] = 1e12
    path.write_text(json.dumps({"cpu": cpu}))
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--device", "cpu", "--env", "CartPole-v0", "--out", str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "CartPole-v0.node_mb = 1e+12" in err
    assert measured == [] and json.loads(path.read_text())["cpu"]["envs"]["CartPole-v0"]["node_mb"] == 1e12
    path.write_text(json.dumps([cpu]))
    with pytest.raises(SystemExit):
        main(["calibrate", "--device", "cpu", "--env", "CartPole-v0", "--out", str(path)])
    assert "not a calibration file (a JSON list" in capsys.readouterr().err and measured == []


def test_an_unbounded_lore_tree_asks_for_max_nodes(tmp_path, capsys):
    cfg = _config(PAPER)
    del cfg["environments"]["PongNoFrameskip-v4"]["lore"]["max_nodes"]
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(cfg))
    with pytest.raises(SystemExit):
        main(["plan", "--configfile", str(f)])
    err = capsys.readouterr().err.strip()
    assert "environments.PongNoFrameskip-v4.lore.max_nodes" in err and len(err.splitlines()) == 1


def test_jobs_over_the_cap_are_named_and_ask_for_the_cap(tmp_path, capsys):
    cfg = _config(QUICK, **{"slurm.max_runtime": 6})
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(cfg))
    main(["plan", "--configfile", str(f), "--json"])
    err = capsys.readouterr().err
    over = [line for line in err.splitlines() if line.startswith("over slurm.max_runtime")]
    jobs, _ = cost.predict(load_config(f))
    longer = [j for j in jobs if cost.runtime_minutes(j.seconds) > 6]
    assert longer and len(over) == len(longer)
    assert any("checkpoint CartPole-v0/StdTrain" in line for line in over)
    res = cost.job_resources(load_config(f), "checkpoint", {"env": "CartPole-v0", "algo": "StdTrain"}, 1, 0)
    assert res["runtime"] == 6


def test_paper_config_every_job_is_priced_with_lore_budgets():
    cfg = load_config(PAPER)
    jobs, sources = cost.predict(cfg)
    assert set(sources) == {"cuda", "cpu"}     # stages on the GPU, downloads and highway training on a core
    assert len(jobs) == 1328                   # snakemake -n counts 1,329: these and the target rule all
    for j in jobs:
        assert math.isfinite(j.seconds) and j.seconds > 0
        res = cost.job_resources(cfg, j.rule, j.wildcards, j.threads, j.gpus)
        assert res["runtime"] * 60 >= j.seconds, j


def test_gre_runs_on_cpu_cores_and_leaves_the_gpu():
    """GRe steps environments on CPU cores: no GPU asked, priced from the CPU table, and several GRe jobs run
    at once on a node; the other stages keep the config's device."""
    cfg = load_config(PAPER)
    jobs, _ = cost.predict(cfg, gpus=1)
    gre = [j for j in jobs if j.rule == "gre"]
    assert len(gre) == 216 and all(j.device == "cpu" and j.gpus == 0 for j in gre)
    atari = [j for j in jobs if j.env and j.env.endswith("NoFrameskip-v4")]
    assert all(j.device == "cuda" and j.gpus == 1 for j in atari if j.rule in ("loact", "lore", "attack_local"))
    assert cost.stage_device(cfg, "gre_replicate", "PongNoFrameskip-v4") == "cpu"
    assert cost.stage_device(cfg, "loact", "PongNoFrameskip-v4") == cfg["device"]
    atari = [dataclasses.replace(j, needs=[]) for j in gre if j.env.endswith("NoFrameskip-v4")][:4]
    assert cost.makespan(atari, cores=16, gpus=1) == max(j.seconds for j in atari)   # threads: 4 each, at once


def test_gre_prices_a_pool_start_per_slot_and_a_reset_per_trajectory(tmp_path):
    """GRe makes one environment per slot of its block and resets it for each trajectory: a table with
    gre_start_s adds slots × gre_start_s / threads to a job (the block, not m); a table without it (measured
    when every trajectory made its environment) prices as before."""
    cfg = load_config(PAPER)
    table = cost.shipped_table("cpu")
    del table["envs"]["PongNoFrameskip-v4"]["gre_start_s"]
    without, with_start = tmp_path / "without.json", tmp_path / "with.json"
    without.write_text(json.dumps({"cpu": table}))
    table["envs"]["PongNoFrameskip-v4"]["gre_start_s"] = 0.5
    with_start.write_text(json.dumps({"cpu": table}))
    before, _ = cost.predict(cfg, gpus=1, calibration=without)
    after, _ = cost.predict(cfg, gpus=1, calibration=with_start)
    pairs = [(b, a) for b, a in zip(before, after) if b.rule.startswith("gre")]
    g = cfg["environments"]["PongNoFrameskip-v4"]["gre"]
    assert g.get("batch") is None and g["m"] == 10000
    slots = 1000   # Atari's default block (ENV_SPECS gre_batch): 1,000 environments for 10,000 trajectories
    for b, a in pairs:
        extra = slots * 0.5 / b.threads if b.env == "PongNoFrameskip-v4" else 0.0
        assert a.seconds == pytest.approx(b.seconds + extra), (b.env, b.sigma)
    assert any(b.env == "PongNoFrameskip-v4" for b, _ in pairs)


def test_an_environment_s_device_replaces_the_config_s_for_its_stages(tmp_path):
    """environments.<id>.device: its certification and attack jobs run there and ask for no GPU when it is
    cpu; the other environments keep the top-level device; a GPU is asked for while any environment may use
    one, and the Snakefile passes the same --device."""
    cfg = load_config(PAPER)
    assert cfg["environments"]["CartPole-v0"]["device"] == "cpu" and cfg["device"] == "auto"
    jobs, _ = cost.predict(cfg, gpus=1)
    stages = [j for j in jobs if j.rule in ("qrange", "loact", "lore", "attack_local", "attack_global")]
    for j in stages:
        small = j.env in ("CartPole-v0", "highway-fast-v0")
        assert (j.device, j.gpus) == (("cpu", 0) if small else ("cuda", 1)), j
    assert cost.stage_gpus(cfg) == 1
    every_env_on_cpu = _config(PAPER)
    for ec in every_env_on_cpu["environments"].values():
        ec["device"] = "cpu"
    assert cost.stage_gpus(validate_config(every_env_on_cpu)) == 0
    bad = _config(PAPER)
    bad["environments"]["CartPole-v0"]["device"] = "tpu"
    with pytest.raises(Exception, match="device"):
        validate_config(bad)


# --------------------------------------------------------------------------------------------- the DAG

def _dry_run(config: Path, workdir: Path) -> list[tuple[str, dict, int]]:
    """(rule, wildcards, runtime) of every job of ``snakemake --dry-run --forceall``."""
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F", "-s", str(ROOT / "Snakefile"),
                          "--configfile", str(config), "--directory", str(workdir)],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m or m.group(1) == "all":
            continue
        w = re.search(r"wildcards: (.*)", block)
        wildcards = dict(kv.split("=", 1) for kv in w.group(1).split(", ")) if w else {}
        rt = re.search(r"runtime=(\d+)", block)
        jobs.append((m.group(1), wildcards, int(rt.group(1)) if rt else None))
    return jobs


def _plan_keys(cfg: dict) -> list:
    return sorted((j.rule, tuple(sorted(j.wildcards.items()))) for j in cost.jobs(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["quickstart", "replicates-derived-vote"])
def test_plan_jobs_are_the_dry_run_s(tmp_path, variant):
    cfg = _config(QUICK, results=str(tmp_path / "results"))
    if variant != "quickstart":
        ec = cfg["environments"]["CartPole-v0"]
        ec["algorithms"] = ["StdTrain", "CARRL"]      # CARRL is derived from StdTrain
        ec["targets"] = ["q", "vote"]
        cfg["replicates"] = 2
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(cfg))
    dry = _dry_run(f, tmp_path)
    assert sorted((r, tuple(sorted(w.items()))) for r, w, _ in dry) == _plan_keys(validate_config(cfg))
    jobs = {(j.rule, tuple(sorted(j.wildcards.items()))): j for j in cost.predict(validate_config(cfg))[0]}
    for r, w, runtime in dry:
        assert runtime * 60 >= jobs[r, tuple(sorted(w.items()))].seconds   # asks for at least its prediction


@pytest.mark.slow
def test_paper_dry_run_asks_at_least_the_plan(tmp_path):
    cfg = _config(PAPER, results=str(tmp_path / "results"))
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(cfg))
    dry = _dry_run(f, tmp_path)
    jobs = {(j.rule, tuple(sorted(j.wildcards.items()))): j for j in cost.predict(validate_config(cfg))[0]}
    assert sorted((r, tuple(sorted(w.items()))) for r, w, _ in dry) == sorted(jobs)
    for r, w, runtime in dry:
        assert runtime * 60 >= jobs[r, tuple(sorted(w.items()))].seconds, (r, w)


def _spin(seconds: float) -> None:
    """Uses ``seconds`` of this process's CPU."""
    t = time.process_time()
    while time.process_time() - t < seconds:
        pass


def test_calibration_records_the_machine_and_times_after_a_warm_up():
    """The fast counterpart of the calibration run below: the machine record, and a unit's time taken over
    calls after the first (which pays for imports and caches): at least ``repeats`` of them, and as many more
    as fill ``budget_s`` seconds (short units are otherwise at the mercy of a few milliseconds' noise)."""
    from crop.workflow.calibrate import _best, machine

    m = machine("cpu")
    assert m["cores"] == os.cpu_count() and m["cpu"] and m["gpu"] is None
    calls = []

    def unit():
        calls.append(1)
        _spin(0.3 if len(calls) == 1 else 0.02)

    assert 0.015 <= _best(unit, repeats=3, budget_s=0) < 0.3 and len(calls) == 4
    calls.clear()
    assert 0.015 <= _best(unit, repeats=3, budget_s=0.2) < 0.3 and 1 + 0.2 / 0.02 <= len(calls) <= 1 + 0.2 / 0.015 + 1


def test_a_unit_is_the_cpu_time_of_its_work_and_its_children_s_not_the_wall_clock():
    """Waiting (another process holding the core) does not enter a unit; the work's CPU seconds do, in this
    process and in a child it waits for (a job's start is a fresh interpreter's)."""
    from crop.workflow.calibrate import _best, cpu_seconds

    assert _best(lambda: time.sleep(0.2), repeats=1) < 0.05
    assert _best(lambda: _spin(0.1), repeats=1) >= 0.09
    t = cpu_seconds()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.2: pass"], check=True)
    assert cpu_seconds() - t >= 0.19


def test_gre_prices_the_main_process_apart_from_the_workers():
    """GRe's main process (noise, forward, lockstep) is one process: more workers divide the workers' stepping,
    never its part, and on threads cores the whole is shared out; CartPole's one process pays both; a table
    without the unit prices as before."""
    from crop.workflow.cost_units import Units
    from crop.workflow.stage_costs import gre_seconds

    t = cost.shipped_table("cpu")
    pong = t["envs"]["PongNoFrameskip-v4"]
    cfg = {"environments": {"PongNoFrameskip-v4": {"gre": {"m": 1000, "horizon": 100, "batch": None}},
                            "CartPole-v0": {"gre": {"m": 1000, "horizon": 100, "batch": None}}}}

    def seconds(threads, env="PongNoFrameskip-v4", **units):
        table = copy.deepcopy(t)
        table["envs"][env].update(units)
        for k in [k for k, v in units.items() if v is None]:
            del table["envs"][env][k]
        return gre_seconds(cfg, cost.Job("gre", env, "StdTrain", "0.1", threads=threads), Units(table, env, "cpu"))[0]

    w, p = pong["gre_step_s"], 4 * pong["gre_step_s"]   # the main process slower than a worker's share
    steps, rest = 1000 * 100, seconds(1, gre_parent_step_s=None, gre_step_s=1e-9)
    assert seconds(4, gre_parent_step_s=p) - rest / 4 == pytest.approx(steps * p, rel=1e-3)   # its part bounds it
    assert seconds(16, gre_parent_step_s=p) == pytest.approx(rest / 16 + steps * p, rel=1e-3)
    small = w / 100
    assert seconds(4, gre_parent_step_s=small) - rest / 4 == pytest.approx(steps * (small + w) / 4, rel=1e-3)
    assert seconds(4, gre_parent_step_s=None) - rest / 4 == pytest.approx(steps * w / 4, rel=1e-3)
    cart = t["envs"]["CartPole-v0"]
    one = seconds(4, "CartPole-v0", gre_parent_step_s=cart["gre_step_s"])
    assert one == pytest.approx(seconds(4, "CartPole-v0", gre_parent_step_s=None) + steps * cart["gre_step_s"])


def test_an_algorithm_s_own_network_prices_its_jobs_only():
    """A calibration's units of an algorithm's own network (CARRL's bound per sample) price that algorithm's
    jobs, whatever their smoothing target, and no other algorithm's."""
    cfg = load_config(QUICK)
    table = copy.deepcopy(cost.shipped_table("cpu"))
    units = table["envs"]["CartPole-v0"]
    units["algos"] = {"StdTrain": {"smooth_sample_s": 40 * units["smooth_sample_s"]}}
    loact = cost.Job("loact", "CartPole-v0", "StdTrain", "0.01")
    other = cost.Job("loact", "CartPole-v0", "GaussAug", "0.01")
    plain = cost.price(cfg, dataclasses.replace(loact), cost.shipped_table("cpu")).seconds
    assert cost.price(cfg, loact, table).seconds > 10 * plain
    assert cost.price(cfg, dataclasses.replace(loact, algo="StdTrain@probs"), table).seconds == loact.seconds
    assert cost.price(cfg, other, table).seconds == pytest.approx(plain)


def test_the_attacks_runs_share_each_gradient_call():
    """The attacks step their runs in lockstep, one gradient call per PGD step over runs × samples: with
    ``grad_call_s`` the call's cost is paid once per step whatever the runs (so twice the episodes cost less than
    twice), and a table without it prices every sample at ``grad_sample_s``, the call inside it."""
    from crop.workflow.cost_units import Units
    from crop.workflow.stage_costs import attack_global_seconds

    cfg = copy.deepcopy(load_config(QUICK))
    table = copy.deepcopy(cost.shipped_table("cpu"))
    units = table["envs"]["CartPole-v0"]
    units.pop("algos", None)
    job = cost.Job("attack_global", "CartPole-v0", "StdTrain", "0.01")

    def seconds(episodes):
        cfg["environments"]["CartPole-v0"]["attack"]["global_episodes"] = episodes
        return attack_global_seconds(cfg, job, Units(table, "CartPole-v0", "cpu"))[0]

    units["grad_call_s"] = 1000 * units["grad_sample_s"]
    one, two = seconds(1), seconds(2)
    a = cfg["environments"]["CartPole-v0"]["attack"]
    calls = cfg["environments"]["CartPole-v0"]["gre"]["horizon"] * (a["pgd_steps"] + 1)
    assert two - one == pytest.approx(one - calls * units["grad_call_s"])   # the call paid once per step
    del units["grad_call_s"]
    assert seconds(2) == pytest.approx(2 * seconds(1))


def test_a_gradient_s_units_are_a_call_and_a_sample():
    import numpy as np
    import torch

    from crop.workflow.calibrate import grad_costs

    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    units = grad_costs(net, np.zeros(4, dtype=np.float32), "cpu", image=False)
    assert set(units) == {"grad_sample_s", "grad_call_s"}
    assert units["grad_sample_s"] > 0 and units["grad_call_s"] > 0
    table = copy.deepcopy(cost.shipped_table("cpu"))
    table["envs"]["CartPole-v0"]["grad_call_s"] = -1.0
    from crop.workflow.cost_units import check_table

    with pytest.raises(cost.CostError, match="grad_call_s"):
        check_table(table, "cpu", "calibration.json")


@pytest.mark.slow
def test_calibrate_writes_every_unit_with_the_machine(tmp_path, capsys):
    path = tmp_path / "calibration.json"
    main(["calibrate", "--device", "cpu", "--env", "CartPole-v0", "--out", str(path)])
    table = json.loads(path.read_text())["cpu"]
    assert table["machine"]["cores"] >= 1 and table["machine"]["cpu"]
    for unit in cost.GLOBAL_UNITS:
        assert table[unit] > 0
    for unit in (*cost.UNITS, "gre_start_s"):   # gre_start_s: optional in a table, written by every calibration
        assert table["envs"]["CartPole-v0"][unit] > 0, unit
    assert table["envs"]["CartPole-v0"]["grad_call_s"] > 0
    assert "load" in table["machine"]
    carrl = table["envs"]["CartPole-v0"]["algos"]["CARRL"]   # its bound per sample: tens of plain forwards
    assert carrl["smooth_sample_s"] > 5 * table["envs"]["CartPole-v0"]["smooth_sample_s"]
    main(["plan", "--configfile", str(QUICK), "--json", "--calibration", str(path)])
    assert str(path) in capsys.readouterr().err


def test_a_finished_loact_narrows_lore_s_tree_only_with_a_largest_eps(tmp_path):
    """LoRe's predicted tree uses the fraction of LoAct's states certified at the search's largest ε."""
    def lore_job(cfg):
        jobs, _ = cost.predict(validate_config(cfg))
        return next(j for j in jobs if j.rule == "lore" and j.algo == "StdTrain" and j.sigma == "0.01")

    cfg = _config(QUICK, results=str(tmp_path))
    full = lore_job(cfg)
    assert full.note == "1023 nodes"
    loact = tmp_path / "CartPole-v0" / "StdTrain" / "sigma-0.01" / RUN_FILES["loact"]
    loact.parent.mkdir(parents=True)
    loact.write_text("episode,step,certified,radius\n" + "".join(f"0,{i},1,{r}\n" for i, r in
                                                                   enumerate([0.0, 0.001, 0.05, 0.05])))
    assert lore_job(cfg).note == "1023 nodes"                 # eps_max_factor null: every action, eventually
    cfg["environments"]["CartPole-v0"]["lore"]["eps_max_factor"] = 2.0    # ε_max = 0.02: half certified
    narrowed = lore_job(cfg)
    assert narrowed.note == f"{cost.lore_nodes(10, 2, certified=0.5):.0f} nodes"
    assert narrowed.seconds < full.seconds


def test_memoised_resources_are_the_prices_and_follow_a_finished_loact(tmp_path):
    """The Snakefile's memo (cost.JobResources) answers what job_resources answers, and a LoRe job priced
    before its LoAct finished is priced afresh once loact.csv exists (or changes), never served stale."""
    cfg = _config(QUICK, results=str(tmp_path))
    cfg["environments"]["CartPole-v0"]["lore"]["eps_max_factor"] = 2.0    # LoRe's price reads loact.csv
    cfg = validate_config(cfg)
    memo = cost.JobResources(cfg)
    for j in cost.jobs(cfg):
        assert memo(j.rule, j.wildcards, j.threads, j.gpus) == cost.job_resources(cfg, j.rule, j.wildcards,
                                                                                   j.threads, j.gpus), j
    w = {"env": "CartPole-v0", "algo": "StdTrain", "sigma": "0.01"}
    before = memo("lore", w, 1, 0)
    loact = tmp_path / "CartPole-v0" / "StdTrain" / "sigma-0.01" / RUN_FILES["loact"]
    loact.parent.mkdir(parents=True)
    loact.write_text("episode,step,certified,radius\n" + "".join(f"0,{i},1,0.05\n" for i in range(4)))
    certified = memo("lore", w, 1, 0)                            # every state certified at ε_max: one path
    assert certified == cost.job_resources(cfg, "lore", w, 1, 0) and certified["mem_mb"] < before["mem_mb"]
    loact.write_text("episode,step,certified,radius\n" + "".join(f"0,{i},1,0.0\n" for i in range(6)))
    assert memo("lore", w, 1, 0) == cost.job_resources(cfg, "lore", w, 1, 0) == before   # none: the full tree
    memo("lore", w, 1, 0)["mem_mb"] = 0                          # a caller's copy, not the memo's entry
    assert memo("lore", w, 1, 0) == before


@pytest.mark.slow
def test_plan_imports_no_torch(tmp_path):
    """A planning command on a login node: no torch (seconds of imports) to price a config."""
    code = ("import sys; from crop.__main__ import main; main(['plan', '--configfile', sys.argv[1], '--json']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code, str(PAPER)], capture_output=True, text=True,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["total"]["jobs"] == 1328


@pytest.mark.parametrize("env, units_of", [("Acrobot-v1", "CartPole-v0"), ("CartPole-v1", "CartPole-v0"),
                                           ("BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"),
                                           ("merge-v0", "highway-fast-v0")])
def test_an_environment_without_units_borrows_its_family_s_and_says_so(env, units_of, tmp_path, capsys):
    """`crop certify --budget paper`'s config of an environment the table has no units of is priced with its
    family's units, and the plan names them and the calibration that measures the environment's own."""
    from crop.workflow.certify_config import budget_sizes, certify_config

    sizes, sigmas = budget_sizes("paper", env)
    cfg = certify_config(env, ("Mine", tmp_path / "p.zip"), tmp_path / "out", sizes, sigmas,
                         {"range": [-1, 0]}, False)
    path = tmp_path / "certify.yaml"
    path.write_text(yaml.safe_dump(cfg))
    main(["plan", "--configfile", str(path), "--cores", "4", "--gpus", "0", "--json"])
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["total"]["cpu_hours"] > 0 and all(j["minutes"] > 0 for j in result["jobs"])
    assert result["borrowed_units"] == [{"env": env, "device": "cpu", "units_of": units_of,
                                         "note": cost.borrowed_note(env, "cpu", units_of)}]
    assert f"units of {units_of} (no calibration of {env}" in out.err
    assert f"crop calibrate --device cpu --env {env}" in out.err
    # its own units, once calibrated, price it and nothing is borrowed
    table = cost.shipped_table("cpu")
    table["envs"][env] = {k: v * 2 for k, v in table["envs"][units_of].items()
                         if not isinstance(v, (bool, dict))}
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"cpu": table}))
    main(["plan", "--configfile", str(path), "--cores", "4", "--gpus", "0", "--json", "--calibration",
          str(calibration)])
    own = json.loads(capsys.readouterr().out)
    assert "borrowed_units" not in own and own["total"]["cpu_hours"] > result["total"]["cpu_hours"]


def test_a_training_times_its_updates_and_only_them():
    """``update_cpu_s`` (crop calibrate's ``train_update_s``): the CPU time of the gradient updates, none in a run
    without updates, and within the run's own CPU time in one with an update every step."""
    from crop.train import dqn_config
    from crop.train.dqn import train_dqn

    def info(learning_starts: int) -> dict:
        cfg = dqn_config("CartPole-v0", "StdTrain", {"learning_starts": learning_starts, "train_every": 1,
                                                     "buffer_size": 500, "eps_start": 0.0, "eps_end": 0.0,
                                                     "eval_every": 10_000, "quick_eval_episodes": 1,
                                                     "eval_max_steps": 1, "device": "cpu"},
                         {"total_steps": 200, "target_return": None, "eval_episodes": 1})
        return train_dqn("CartPole-v0", 0, cfg, progress=False)[1]

    assert info(200)["update_cpu_s"] == 0.0
    learned = info(0)
    assert 0 < learned["update_cpu_s"] <= learned["cpu_s"] + 0.01
