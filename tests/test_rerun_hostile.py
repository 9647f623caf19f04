"""A received folder cannot steer its audit's re-run (``crop audit --rerun``): a recorded value never becomes
an option, the outputs, the checkpoint and the V range are the re-run's own, every recorded setting meets the
config schema, and every job is bounded in time and memory before and while it runs."""
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from crop.audit import rerun
from crop.audit.rerun import rerun_jobs
from crop.io import meta_name, read_json, sha256_file, write_json
from crop.workflow import layout
from crop.workflow.layout import RUN_FILES

RUN = "CartPole-v0/StdTrain/sigma-0.1"


@pytest.fixture(scope="module")
def received(tmp_path_factory):
    """A real tiny run folder (V range, LoAct, global attack), built once."""
    from synthetic_results import tiny_real_run

    root = tmp_path_factory.mktemp("received") / "res"
    tiny_real_run(root)
    return root


@pytest.fixture
def results(received, tmp_path):
    root = tmp_path / "res"
    shutil.copytree(received, root)
    return root


def _edit(results: Path, file: str, edit) -> None:
    """Change a stage's recorded settings in place (its meta file)."""
    path = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.1") / meta_name(file)
    meta = read_json(path)
    edit(meta["settings"])
    write_json(path, meta)


def _only(results: Path, stage: str) -> dict:
    """Re-run every job of the run; the row of ``stage``."""
    rr = rerun_jobs(results, [RUN], 5)
    return next(j for j in rr["jobs"] if j["stage"] == stage)


def test_a_list_element_cannot_write_outside_the_scratch_folder(results, tmp_path, capsys):
    """The refusal names the key, in audit.json, audit.md and the printed summary; a record the workflow could
    not have written is also an integrity problem of its run: FAIL, never only a job not re-run (WARN)."""
    from synthetic_results import audit_cli

    victim = tmp_path / "victim"
    _edit(results, RUN_FILES["loact"], lambda s: s.update(frames_window=[0, 200, f"--out-ratio={victim}"],
                                                          out_ratio=None))
    assert audit_cli(results, "--rerun", "5", "--out-dir", tmp_path / "a") == 1
    assert not victim.exists() and not (tmp_path / meta_name("victim")).exists()
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    job = next(j for j in rep["rerun"]["jobs"] if j["stage"] == "loact")
    line = f"loact.meta.json settings.frames_window[2]: '--out-ratio={victim}' is not an integer"
    assert (job["result"], job["note"], rep["verdict"]) == ("not_run", line, "FAIL")
    assert [p["problem"].split(": no run of")[0] for p in rep["integrity"]] == [line]
    md = (tmp_path / "a" / "audit.md").read_text()
    assert line in md and md.split("\n\n")[1].startswith("**FAIL**") and "nothing was tested" not in md
    assert f"rerun not_run: {RUN} loact: {line}" in capsys.readouterr().out


def test_a_value_the_schema_refuses_fails_the_audit_without_a_rerun(results, tmp_path):
    """One element added to a recorded list (``frames_window: [0, 200, 7]``): FAIL, naming the record and key."""
    from crop.audit.audit import audit

    _edit(results, RUN_FILES["loact"], lambda s: s.update(frames_window=[0, 200, 7]))
    rep = audit(results, tmp_path / "a")
    assert rep["verdict"] == "FAIL"
    assert [(Path(p["file"]).name, p["problem"].split(":")[0]) for p in rep["integrity"]] == [
        (meta_name(RUN_FILES["loact"]), "loact.meta.json settings.frames_window")]


def test_an_output_recorded_null_is_still_written_in_the_scratch_folder(results):
    """Every output goes to the scratch folder, recorded or not: the optional certified ratio is compared."""
    _edit(results, RUN_FILES["loact"], lambda s: s.update(out_ratio=None))
    assert _only(results, "loact")["result"] == "identical"


def test_another_network_is_not_reported_identical(results, tmp_path, mlp_factory):
    """loact.csv computed with network B while model.pt (and the metas' sha256) are A's: the record's injected
    ``--checkpoint=B`` is refused, and without it the re-run uses A and differs."""
    from crop.__main__ import main
    from crop.models import save_network

    d = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.1")
    a = layout.checkpoint_path(results, "CartPole-v0", "StdTrain")
    b = tmp_path / "B" / "model.pt"
    b.parent.mkdir()
    save_network(mlp_factory(n_in=4, n_out=2, hidden=(16,), seed=7, scale=3.0), b)
    write_json(b.with_suffix(".json"), {**read_json(a.with_suffix(".json")), "sha256": sha256_file(b)})
    before = (d / RUN_FILES["loact"]).read_bytes()
    main(["loact", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--seed", "3", "--device", "cpu",
          "--checkpoint", str(b), "--no-progress", "--qrange", str(d / RUN_FILES["qrange"]), "--settings",
          json.dumps({"m": 100, "episodes": 1, "horizon": 5}), "--out", str(d / RUN_FILES["loact"]),
          "--out-episodes", str(d / RUN_FILES["loact_episodes"]), "--out-ratio", str(d / RUN_FILES["certified_ratio"]),
          "--out-frames", str(d / RUN_FILES["frames"])])
    assert (d / RUN_FILES["loact"]).read_bytes() != before      # B certifies other radii than A
    meta_file = d / meta_name(RUN_FILES["loact"])
    meta = read_json(meta_file)
    meta["inputs"]["checkpoint"] = {"path": str(a), "sha256": sha256_file(a)}
    meta["settings"]["checkpoint"] = str(a)
    meta["settings"]["frames_window"] = [0, 200, f"--checkpoint={b}"]
    write_json(meta_file, meta)
    # the audit FAILs both ways: the element is an integrity problem itself, and without it the re-run differs
    rep, job = _audit_rerun(results, tmp_path / "a")
    assert job["result"] == "not_run" and "settings.frames_window[2]" in job["note"]
    assert rep["verdict"] == "FAIL" and "settings.frames_window[2]" in rep["integrity"][0]["problem"]
    meta["settings"]["frames_window"] = [0, 200]
    write_json(meta_file, meta)
    rep, job = _audit_rerun(results, tmp_path / "b")
    assert (job["result"], rep["verdict"], rep["integrity"]) == ("differ", "FAIL", [])


def _audit_rerun(results: Path, out: Path) -> tuple[dict, dict]:
    """The audit with every job re-run, and its loact job; audit.md's headline says FAIL (never that nothing was
    tested) when the verdict is FAIL."""
    from crop.audit.audit import AuditOptions, audit

    rep = audit(results, out, AuditOptions(rerun=5))
    md = (out / "audit.md").read_text()
    assert rep["verdict"] != "FAIL" or (md.split("\n\n")[1].startswith("**FAIL**") and "nothing was tested" not in md)
    return rep, next(j for j in rep["rerun"]["jobs"] if j["stage"] == "loact")


def test_a_string_setting_cannot_become_an_option(results, tmp_path):
    victim = tmp_path / "x"
    _edit(results, RUN_FILES["loact"], lambda s: s.update(bound=f"--out-ratio={victim}"))
    job = _only(results, "loact")
    assert not victim.exists()
    assert job["result"] == "not_run" and job["note"].startswith(
        f"loact.meta.json settings.bound: '--out-ratio={victim}' is not one of ")


def test_an_extra_list_element_is_refused(results, tmp_path):
    victim = tmp_path / "y.csv"
    _edit(results, RUN_FILES["attack_global"], lambda s: s.update(eps_factors=[0.0, 0.5, f"--out={victim}"]))
    job = _only(results, "attack_global")
    assert not victim.exists()
    assert job["result"] == "not_run"
    assert job["note"] == f"attack_global.meta.json settings.eps_factors[2]: '--out={victim}' is not a number"


def test_an_unknown_key_is_refused(results):
    _edit(results, RUN_FILES["attack_global"], lambda s: s.update(evil="--out=/tmp/z"))
    job = _only(results, "attack_global")
    assert job["result"] == "not_run"
    assert job["note"] == ("attack_global.meta.json settings: unknown key(s) ['evil']: no option of "
                           "`crop attack-global`")


def test_a_missing_sha256_is_refused(results):
    path = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.1") / meta_name(RUN_FILES["loact"])
    meta = read_json(path)
    del meta["inputs"]["qrange"]["sha256"]
    write_json(path, meta)
    job = _only(results, "loact")
    assert job["result"] == "not_run" and "inputs.qrange.sha256: not recorded" in job["note"]


def test_a_size_above_the_schema_maximum_is_refused(results):
    """A recorded ``pgd_steps: 1000000`` costs the auditor nothing: refused by the schema's maximum, named."""
    _edit(results, RUN_FILES["attack_global"], lambda s: s.update(pgd_steps=1_000_000))
    job = _only(results, "attack_global")
    assert (job["result"], job["predicted_s"]) == ("not_run", None)
    assert job["note"] == "attack_global.meta.json settings.pgd_steps: 1000000 must be <= 10000"


def test_a_job_predicted_over_the_budget_is_not_started(results, tmp_path):
    """Sizes within the schema whose product is over the budget: predicted, named and not started; the audit
    says so and is at best WARN; audit.json's rerun block holds the budget and each prediction."""
    from crop.audit.audit import AuditOptions, audit

    _edit(results, RUN_FILES["attack_global"], lambda s: s.update(pgd_steps=10_000, n_eot=1000 * s["n_eot"]))
    rep = audit(results, tmp_path / "a", AuditOptions(rerun=5, rerun_budget=1))
    rr = rep["rerun"]
    job = next(j for j in rr["jobs"] if j["stage"] == "attack_global")
    assert job["result"] == "not_run" and "over the re-run budget of 1 min" in job["note"]
    assert job["predicted_s"] > 60 and job["note"].startswith(f"predicted {job['predicted_s'] / 60:.3g} min for ")
    assert rr["budget_min"] == 1 and all(j["predicted_s"] is not None for j in rr["jobs"])
    assert (rr["identical"], rr["not_run"]) == (2, 1) and rep["verdict"] != "PASS"
    md = (tmp_path / "a" / "audit.md").read_text()
    assert "rerun: 2 jobs, 0 differ, 1 not run" in md and "over the re-run budget of 1 min" in md


def test_an_oversized_record_is_refused_by_the_budget_naming_its_size(results, monkeypatch):
    """A recorded ``loact.episodes: 1000000`` (within the schema): each episode's making, tables and memory
    enter the price, so it is predicted over the default budget and not started, the refusal naming the size;
    a job predicted over this machine's memory is not started either, naming its sizes."""
    _edit(results, RUN_FILES["loact"], lambda s: s.update(episodes=1_000_000))
    rr = rerun_jobs(results, [RUN], 5)
    job = next(j for j in rr["jobs"] if j["stage"] == "loact")
    assert job["result"] == "not_run" and job["predicted_s"] > 60 * rerun.BUDGET_MINUTES
    assert "loact.episodes = 1000000" in job["note"] and "over the re-run budget of 10 min" in job["note"]
    _edit(results, RUN_FILES["loact"], lambda s: s.update(episodes=1))
    monkeypatch.setattr(rerun, "_machine_mb", lambda: 10)
    job = _only(results, "loact")
    assert job["result"] == "not_run" and "loact.episodes = 1, loact.horizon = " in job["note"]
    assert "MB of memory for" in job["note"] and "more than this machine's 10 MB: not started" in job["note"]


def test_the_budget_is_a_positive_finite_number(results, tmp_path, capsys):
    from crop.__main__ import main

    for bad in ("0", "-1", "inf", "nan"):
        with pytest.raises(SystemExit) as exc:
            main(["audit", str(results), "--rerun", "1", "--rerun-budget", bad, "--out-dir", str(tmp_path / "o")])
        assert exc.value.code == 2
    assert not (tmp_path / "o").exists()


def test_a_job_past_its_time_limit_is_ended_with_its_children(results, tmp_path, monkeypatch):
    """The time limit's pieces are the module's: a tiny limit ends the child and the process it started (its
    process group), and the job is not_run with the reason."""
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setattr(rerun, "_CHILD", "import os, subprocess, sys, time\n"
                        "p = subprocess.Popen(['sleep', '120'])\n"
                        f"open(os.path.join({str(pids)!r}, str(p.pid)), 'w').close()\ntime.sleep(120)")
    monkeypatch.setattr(rerun, "TIMEOUT_FACTOR", 0.0)
    monkeypatch.setattr(rerun, "TIMEOUT_EXTRA_S", 2.0)
    rr = rerun_jobs(results, [RUN], 1)
    job, = rr["jobs"]
    assert job["result"] == "not_run" and job["note"].startswith("ended after 2 s")
    pid, = (int(p.name) for p in pids.iterdir())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_job_past_its_memory_cap_is_not_run(results, monkeypatch):
    monkeypatch.setattr(rerun, "MEM_FACTOR", 0)
    monkeypatch.setattr(rerun, "MEM_EXTRA_MB", 64)
    job, = rerun_jobs(results, [RUN], 1)["jobs"]
    assert job["result"] == "not_run" and job["note"].startswith("stopped by its memory cap of 64 MB")


def test_the_command_is_built_from_values_and_parses_as_the_workflow_passes_it(results, tmp_path):
    """Every word of the rebuilt command is one ``--name=value`` the code built, and the CLI reads it as it
    reads the workflow's ``--settings`` block: the recorded settings again."""
    from crop.audit.rerun import _argv, _checked_settings, _jobs
    from crop.workflow.cli import build_parser, stage_params

    (run, row, rec), = [j for j in _jobs(results, [RUN])[0] if j[1].rule == "loact"]
    values = _checked_settings(rec, row)
    argv = _argv(rec, values, row, results, run, tmp_path)
    assert argv[0] == "loact" and argv[-1] == "--no-progress"
    assert all(w.startswith("--") and "=" in w for w in argv[1:-1])
    args = stage_params(build_parser().parse_args(argv))
    for option in row.options:
        assert getattr(args, option) == rec["settings"][option], option
    assert args.out == str(tmp_path / RUN_FILES["loact"]) and args.out_ratio == str(tmp_path / RUN_FILES[
        "certified_ratio"])


def test_a_record_is_checked_before_anything_runs(received):
    """Checked without a child process: a missing key the command needs, a σ written as text, a size
    recorded as a float, a flag of the wrong type, and inputs that are not a mapping each give one line."""
    from crop.audit.rerun import _checked_settings, _jobs, _NotRun, _verified

    (_, row, rec), = [j for j in _jobs(received, [RUN])[0] if j[1].rule == "attack_global"]
    cases = [({"command": None}, "attack_global.meta.json settings: 'command' is a required property"),
             ({"sigma": "0.1"}, "attack_global.meta.json settings.sigma: '0.1' is not a number"),
             ({"pgd_steps": 2.0}, "attack_global.meta.json settings.pgd_steps: 2.0 is not an integer"),
             ({"command": "loact"}, "attack_global.meta.json settings.command: 'loact' is not 'attack-global'"),
             ({"seed": -1}, "attack_global.meta.json settings.seed: -1 must be >= 0"),
             ({"n_eot": float("nan")}, "attack_global.meta.json settings.n_eot: nan is not a finite number")]
    for change, line in cases:
        with pytest.raises(_NotRun) as exc:
            _checked_settings({**rec, "settings": {**rec["settings"], **change}}, row)
        assert str(exc.value) == line
    with pytest.raises(_NotRun, match="inputs.checkpoint.sha256: not recorded"):
        _verified({**rec, "inputs": ["x"]}, row, "checkpoint", Path("model.pt"))


def test_an_environment_without_units_is_priced_by_its_family():
    """CartPole-v1 has no units in the shipped table: CartPole-v0's stand in, so its job is still bounded;
    an Atari game takes each unit's larger of Pong's and Freeway's; a calibrated id keeps its own."""
    from crop.workflow.cost import unit_costs

    table = unit_costs("cpu")[0]
    envs = table["envs"]
    assert "CartPole-v1" not in envs
    assert rerun._stand_in_units(table, "CartPole-v1")["envs"]["CartPole-v1"] == envs["CartPole-v0"]
    atari = rerun._stand_in_units(table, "BreakoutNoFrameskip-v4")["envs"]["BreakoutNoFrameskip-v4"]
    pong, freeway = envs["PongNoFrameskip-v4"], envs["FreewayNoFrameskip-v4"]
    assert atari["env_step_s"] == max(pong["env_step_s"], freeway["env_step_s"])
    assert atari["gre_step_s"] == max(pong["gre_step_s"], freeway["gre_step_s"])
    assert rerun._stand_in_units(table, "CartPole-v0") is table


def test_every_record_the_workflow_writes_is_one_the_report_reads(received):
    """Of the shape the report reads, every file a regular one within its cap, every setting one the schema
    allows: no false alarm on the workflow's own records."""
    from crop.audit.audit import _settings_problems
    from crop.report.records import record_problem, run_record_problems

    records = sorted(received.rglob("*.json"))
    assert len(records) >= 6 and [p.name for p in records if record_problem(p)] == []
    assert run_record_problems(received / RUN) == [] and _settings_problems(received / RUN) == []


def test_the_rerun_does_not_draw_a_run_whose_records_cannot_be_read(results):
    (results / RUN / meta_name(RUN_FILES["loact"])).write_text("[1]")
    rr = rerun_jobs(results, [RUN], 5)
    assert rr["jobs"] == [] and {j["stage"] for j in rr["not_eligible_list"]} == {"qrange", "loact", "attack_global"}
