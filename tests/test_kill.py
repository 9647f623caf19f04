"""Killed mid-stage with SIGKILL, rerun with the same command: the workflow completes and its results are
byte-identical to an uninterrupted run; two uninterrupted runs are byte-identical too (CPU)."""
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crop.io import meta_name
from crop.workflow import stage_table
from crop.workflow.layout import RUN_FILES

from paths import REPO

CONFIG = REPO / "tests" / "configs" / "kill.yaml"
STAGES = ["checkpoint", *stage_table.STAGES]
# Files whose bytes are results; provenance (.meta.json, qrange.json/model.json/audit: runtimes, paths,
# timestamps), logs and benchmarks legitimately differ between runs.
VOLATILE = (".meta.json", RUN_FILES["qrange"], "model.json", "audit.json", "audit.md")


# What each stage writes: the target of the run that is killed during that stage, so that the stage runs
# (after its inputs) whatever order the scheduler picks among independent jobs.
RUN = "results-kill/CartPole-v0/StdTrain/sigma-0.05"
TARGETS = {"checkpoint": "results-kill/CartPole-v0/StdTrain/checkpoint/model.pt",
           **{name: f"{RUN}/{row.outputs[0].file}" for name, row in stage_table.STAGES.items()}}


def _cmd(work, *targets):
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(work), *targets,
            "--cores", "1", "--configfile", str(CONFIG)]


def result_hashes(results: Path) -> dict:
    out = {}
    for f in sorted(results.rglob("*")):
        rel = f.relative_to(results)
        if not f.is_file() or rel.parts[0] in ("logs", "benchmarks") or f.name.endswith(VOLATILE):
            continue
        out[str(rel)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _crop_procs(stage: str, session: int) -> list[tuple[int, float]]:
    """(pid, seconds running) of live `crop <stage>` processes of ``session`` (the workflow the test started in
    its own session): never a `crop` of another workflow running on the same machine."""
    found = []
    clk = os.sysconf("SC_CLK_TCK")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
            stat = (p / "stat").read_text().rsplit(")", 1)[1].split()
            start, sid = int(stat[19]) / clk, int(stat[3])
        except (OSError, IndexError, ValueError):
            continue
        words = [a.decode(errors="replace") for a in argv]
        if sid == session and any(w.endswith("crop") or w == "crop.workflow.cli" for w in words) and stage in words:
            found.append((int(p.name), uptime - start))
    return found


def run(work) -> None:
    p = subprocess.run(_cmd(work), capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def run_and_kill_during(work, stage: str, after: float = 2.5) -> bool:
    """Start the workflow; SIGKILL it (Snakemake and its job) once `crop <stage>` has run `after` seconds."""
    p = subprocess.Popen(_cmd(work, TARGETS[stage]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        while p.poll() is None:
            procs = _crop_procs(stage, p.pid)
            if procs and max(t for _, t in procs) >= after:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                return True
            time.sleep(0.1)
        return False
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_the_comparison_sees_a_result_byte_and_skips_provenance_and_logs(tmp_path):
    """What the kill tests compare (the fast counterpart of the slow runs below): every result byte, not the
    provenance, logs or benchmarks that legitimately differ between runs."""
    run = tmp_path / "CartPole-v0" / "StdTrain" / "sigma-0.05"
    run.mkdir(parents=True)
    for name in (RUN_FILES["loact"], meta_name(RUN_FILES["loact"]), RUN_FILES["qrange"]):
        (run / name).write_text("1\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "loact.log").write_text("took 3 s\n")
    before = result_hashes(tmp_path)
    assert list(before) == [f"CartPole-v0/StdTrain/sigma-0.05/{RUN_FILES['loact']}"]
    (run / meta_name(RUN_FILES["loact"])).write_text("2\n")
    (tmp_path / "logs" / "loact.log").write_text("took 4 s\n")
    assert result_hashes(tmp_path) == before
    (run / RUN_FILES["loact"]).write_text("2\n")
    assert result_hashes(tmp_path) != before


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    work = tmp_path_factory.mktemp("clean")
    run(work)
    return work


@pytest.mark.slow
def test_two_runs_are_byte_identical(clean, tmp_path):
    run(tmp_path)
    a, b = result_hashes(clean / "results-kill"), result_hashes(tmp_path / "results-kill")
    assert a == b and len(a) > 40


@pytest.mark.slow
def test_killed_in_every_stage_and_rerun_gives_the_same_results(clean, tmp_path):
    killed = []
    for stage in STAGES:
        if run_and_kill_during(tmp_path, stage):
            killed.append(stage)
    run(tmp_path)  # the same command, to completion
    assert killed == STAGES, f"could not kill during {set(STAGES) - set(killed)}"
    assert result_hashes(tmp_path / "results-kill") == result_hashes(clean / "results-kill")


@pytest.mark.slow
def test_a_retry_after_a_wall_time_kill_resumes_lore(clean, tmp_path):
    """What a SLURM wall-time kill and the profile's ``retries`` do to a LoRe job: SIGTERM to the running
    ``crop lore`` (it saves its search at the next node and exits 143); Snakemake removes only the failed
    job's declared outputs, keeps the resume file beside them and reruns the job, which resumes from it:
    lore.csv byte-identical to an uninterrupted run."""
    import json

    env = {**os.environ, "CROP_PROGRESS_INTERVAL": "0.2"}  # the search's progress lines show it has started
    p = subprocess.Popen(_cmd(tmp_path, TARGETS["lore"]) + ["--retries", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    termed = False
    try:
        deadline = time.time() + 1200
        while p.poll() is None and time.time() < deadline and not termed:
            logs = [f for f in (tmp_path / "results-kill").rglob("*.log") if "lore" in f.name]
            procs = _crop_procs("lore", p.pid)
            if procs and logs and "LoRe σ" in logs[0].read_text(errors="replace"):
                time.sleep(1.0)
                for pid, _ in procs:
                    os.kill(pid, signal.SIGTERM)
                termed = True
            time.sleep(0.1)
        out = p.communicate(timeout=1200)[0]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert termed and p.returncode == 0, out[-3000:]
    assert "attempt 2" in out.lower() or "restart" in out.lower(), out[-3000:]  # the retry ran the job again
    lore = Path(TARGETS["lore"])
    assert (tmp_path / lore).read_bytes() == (clean / lore).read_bytes()
    meta = json.loads((tmp_path / lore.with_name(meta_name(RUN_FILES["lore"]))).read_text())
    assert meta["search"]["resumed"] is True and not (tmp_path / f"{lore}.resume").exists()
