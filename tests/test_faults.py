"""Faults: corrupted intermediates are caught before aggregation; a full or unwritable results folder gives
a clear error and leaves nothing half-written."""
import errno
import os

import pytest

from crop.__main__ import main
from crop.io import atomic_write_bytes
from crop.workflow.layout import RUN_FILES

from synthetic_results import make_results


@pytest.fixture
def results(tmp_path):
    make_results(tmp_path, {"CartPole-v0": {"StdTrain": [0.01, 0.1]}})
    return tmp_path


@pytest.mark.slow
def test_truncated_intermediate_is_refused_before_aggregation(results, capsys):
    f = results / f"CartPole-v0/StdTrain/sigma-0.1/{RUN_FILES['loact']}"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])  # half a loact.csv, as a crash of a careless writer would leave
    with pytest.raises(SystemExit) as e:
        main(["aggregate", str(results)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert RUN_FILES["loact"] in err and "truncated or modified" in err
    # the fix, since Snakemake will not recompute a file that exists and is newer than its inputs
    assert "delete it and rerun the workflow (or `snakemake --forcerun loact`)" in err
    assert err.count("\n") == 1, err
    assert not list((results / "figures").glob("*.png")) if (results / "figures").exists() else True


@pytest.mark.parametrize("name, rule", [(RUN_FILES["gre_returns"], "gre"), (RUN_FILES["certified_ratio"], "loact"),
                                        (RUN_FILES["attack_global"], "attack_global"), (RUN_FILES["lore"], "lore")])
@pytest.mark.slow
def test_a_modified_file_names_the_rule_that_recomputes_it(results, name, rule):
    from crop.report.integrity import check_integrity

    run = results / "CartPole-v0/StdTrain/sigma-0.01"
    with open(run / name, "a") as f:
        f.write("0\n")
    (problem,) = check_integrity(run)
    assert problem["file"].endswith(name) and f"`snakemake --forcerun {rule}`" in problem["problem"]


def test_a_full_disk_leaves_no_partial_file(tmp_path, monkeypatch):
    import crop.io as cio

    target = tmp_path / "out" / RUN_FILES["loact"]
    monkeypatch.setattr(cio.os, "fdopen", lambda fd, mode: _Full(fd))  # the disk fills up on write
    with pytest.raises(OSError, match="No space left"):
        atomic_write_bytes(target, b"x" * 1000)
    assert not target.exists() and not list(target.parent.glob(".*tmp"))


def test_cli_reports_a_full_disk_in_one_line(tmp_path, monkeypatch, capsys, mlp_factory):
    import crop.io as cio
    from crop.io import sha256_file, write_json
    from crop.models import save_network

    save_network(mlp_factory(hidden=(16,)), tmp_path / "model.pt")
    write_json(tmp_path / "model.json", {"env": "CartPole-v0", "algo": "StdTrain", "profile": "vector",
                                         "net_spec": {"arch": "mlp", "in": 4, "hidden": [16], "out": 2},
                                         "sha256": sha256_file(tmp_path / "model.pt")})
    monkeypatch.setattr(cio.os, "fdopen", lambda fd, mode: _Full(fd))
    out = tmp_path / RUN_FILES["qrange"]
    with pytest.raises(SystemExit) as e:
        main(["qrange", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint",
              str(tmp_path / "model.pt"), "--m", "20", "--episodes", "1", "--horizon", "3", "--out", str(out)])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "cannot write" in err and RUN_FILES["qrange"] in err and "No space left on device" in err
    assert "Traceback" not in err and not out.exists()


class _Full:
    def __init__(self, fd):
        self.fd = fd

    def __enter__(self):
        return self

    def __exit__(self, *a):
        os.close(self.fd)

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        pass

    def fileno(self):
        return self.fd


def _immutable(path, on: bool) -> bool:
    import shutil
    import subprocess

    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True).returncode == 0


@pytest.mark.slow
def test_read_only_results_folder_is_one_clear_error(tmp_path, repo):
    """An unwritable results folder stops the workflow before any job, naming the folder."""
    import subprocess
    import sys

    res = tmp_path / "results-smoke"
    res.mkdir()
    if not _immutable(res, True):
        pytest.skip("chattr +i not available here (the test needs an unwritable folder even for root)")
    try:
        p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "--directory",
                            str(tmp_path), "--cores", "1", "--configfile", str(repo / "tests/configs/smoke.yaml")],
                           capture_output=True, text=True, timeout=300)
    finally:
        _immutable(res, False)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "results folder results-smoke is not writable" in out
    assert not any(res.iterdir())


@pytest.mark.slow
def test_second_workflow_on_the_same_folder_is_stopped_by_the_lock(tmp_path, repo):
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "--directory", str(tmp_path),
           "--cores", "1", "--configfile", str(repo / "tests/configs/smoke.yaml")]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        locks = tmp_path / ".snakemake" / "locks"
        deadline = time.time() + 120
        while time.time() < deadline and not (locks.is_dir() and any(locks.iterdir())):
            time.sleep(0.2)
        assert locks.is_dir() and any(locks.iterdir()), "the first run never took its lock"
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert second.returncode != 0
        assert "LockException" in second.stdout + second.stderr or "cannot be locked" in second.stdout + second.stderr
    finally:
        first.kill()
        first.wait()
