"""A received folder's special files cannot crash the audit or take its memory, and its checkpoint is part of
the evidence: every file of a run is a regular file of the folder within its kind's cap
(:func:`crop.io.open_received`, :data:`crop.io.RECEIVED_CAPS`) before anything opens it, or it is one integrity
problem naming it (audit FAIL, ``crop aggregate`` one line); a checkpoint the run's records cite that is missing,
not a regular file, or of another sha256 FAILs.

The folder is the synthetic one (tests/synthetic_results.py).  A sparse 20 GB file costs no disk (``truncate``)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crop.io import (
    RECEIVED_CAPS,
    ReceivedFileError,
    load_npz,
    meta_name,
    open_received,
    read_csv,
    read_json,
    received_problem,
    sha256_file,
)
from crop.workflow import layout
from crop.workflow.layout import RUN_FILES

from paths import REPO
from synthetic_results import audit_cli, make_results

PLAN = {"CartPole-v0": {"StdTrain": [0.1], "GaussAug": [0.1]}}
GB20 = 20 << 30


def _sparse(path: Path, size: int = GB20) -> Path:
    """A file of ``size`` bytes that takes no disk (``truncate -s 20G``)."""
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def _fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _link(path: Path, target: str) -> Path:
    path.unlink(missing_ok=True)
    path.symlink_to(target)
    return path


SPECIAL = {"a link to /dev/zero": lambda p: _link(p, "/dev/zero"), "a FIFO": _fifo,
           "a sparse 20 GB file": _sparse}
READERS = {"record": read_json, "table": read_csv, "frames": lambda p: load_npz(p).__enter__(),
           "checkpoint": lambda p: sha256_file(p, kind="checkpoint"), "text": lambda p: open_received(p).__enter__()}
SUFFIX = {"record": ".json", "table": ".csv", "frames": ".npz", "checkpoint": ".pt", "text": ".md"}


@pytest.mark.parametrize("kind", sorted(READERS))
@pytest.mark.parametrize("special", sorted(SPECIAL))
def test_every_reader_refuses_a_special_file_before_reading_it(tmp_path, kind, special):
    """Refused on its lstat/fstat alone: a read of /dev/zero or of 20 GB would not end (or take the memory)."""
    path = SPECIAL[special](tmp_path / f"x{SUFFIX[kind]}")
    with pytest.raises(ReceivedFileError, match="FIFO|character device|over the .*-byte cap") as exc:
        READERS[kind](path)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_a_link_leaving_the_folder_is_refused_one_inside_is_read(tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    folder = tmp_path / "res"
    folder.mkdir()
    (folder / "real.json").write_text('{"a": 1}')
    _link(folder / "in.json", str(folder / "real.json"))
    _link(folder / "out.json", str(outside))
    assert read_json(folder / "in.json", root=folder) == {"a": 1}
    assert "outside" in received_problem(folder / "out.json", root=folder)
    with pytest.raises(ReceivedFileError, match="outside"):
        read_json(folder / "out.json", root=folder)
    with pytest.raises(FileNotFoundError):   # absent: as open() says it
        read_json(folder / "none.json")


def test_the_caps_are_far_above_real_files_and_below_a_sparse_20_gb_file():
    assert RECEIVED_CAPS["record"] >= 32 << 20 and RECEIVED_CAPS["table"] >= 512 << 20
    assert max(RECEIVED_CAPS.values()) < GB20


def test_an_npz_whose_arrays_declare_more_than_the_cap_is_refused(tmp_path, monkeypatch):
    import numpy as np

    from crop import io

    path = tmp_path / "frames.npz"
    np.savez_compressed(path, frames=np.zeros((64, 64), np.uint8), steps=np.arange(64))
    with load_npz(path) as z:
        assert z["frames"].shape == (64, 64)
    monkeypatch.setitem(io.RECEIVED_CAPS, "frames", 4096)   # the file is ~200 bytes, its arrays 4.6 kB
    assert path.stat().st_size < 4096
    with pytest.raises(ReceivedFileError, match="declare"):
        with load_npz(path):
            pass


@pytest.fixture
def received(tmp_path_factory, tmp_path):
    """A copy of the synthetic folder, made once for the session's tests of this module."""
    made = tmp_path_factory.getbasetemp() / "received-files-pristine"
    if not made.exists():
        make_results(made, PLAN)
    shutil.copytree(made, tmp_path / "results", symlinks=True)
    return tmp_path / "results"


def _run(root, algo="GaussAug"):
    return layout.run_dir(root, "CartPole-v0", algo, "0.1")


def _audit(root, out) -> tuple[int, dict, str]:
    code = audit_cli(root, "--out-dir", out)
    return code, json.loads((out / "audit.json").read_text()), (out / "audit.md").read_text()


CASES = {
    "qrange.json a link to /dev/zero": (lambda r: _run(r) / RUN_FILES["qrange"], SPECIAL["a link to /dev/zero"]),
    "loact.meta.json a link to /dev/zero": (lambda r: _run(r) / meta_name(RUN_FILES["loact"]),
                                            SPECIAL["a link to /dev/zero"]),
    "qrange.json sparse 20 GB": (lambda r: _run(r) / RUN_FILES["qrange"], _sparse),
    "loact.csv a FIFO": (lambda r: _run(r) / RUN_FILES["loact"], _fifo),
    "gre.csv sparse 20 GB": (lambda r: _run(r) / RUN_FILES["gre"], _sparse),
    "model.json a link to /dev/zero": (lambda r: layout.checkpoint_record(r, "CartPole-v0", "GaussAug"),
                                       SPECIAL["a link to /dev/zero"]),
    "model.pt a link to /dev/null": (lambda r: layout.checkpoint_path(r, "CartPole-v0", "GaussAug"),
                                     lambda p: _link(p, "/dev/null")),
    "model.pt a link to /dev/urandom": (lambda r: layout.checkpoint_path(r, "CartPole-v0", "GaussAug"),
                                        lambda p: _link(p, "/dev/urandom")),
    "model.pt a link out of the folder": (lambda r: layout.checkpoint_path(r, "CartPole-v0", "GaussAug"),
                                          lambda p: _link(p, str(REPO / "pyproject.toml"))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_special_file_in_a_run_is_one_integrity_problem_naming_it(received, tmp_path, case):
    where, make = CASES[case]
    path = make(where(received))
    code, rep, md = _audit(received, tmp_path / "a")
    assert (code, rep["verdict"]) == (1, "FAIL")
    assert [p["file"] for p in rep["integrity"]] == [str(path)], rep["integrity"]
    assert str(path) in md and "every stage used the recorded checkpoint" not in md
    assert [p["run"] for p in rep["provenance"]] == [str(_run(received, "StdTrain").relative_to(received))]


def test_aggregate_refuses_a_special_file_in_one_line(received, capsys):
    from crop.__main__ import main

    path = _link(_run(received) / RUN_FILES["qrange"], "/dev/zero")
    with pytest.raises(SystemExit) as exc:
        main(["aggregate", str(received)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and str(path) in err and "a link to /dev/zero, outside the folder" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_special_table_is_one_problem_of_the_folder(received, tmp_path):
    tables = received / "tables"
    tables.mkdir(exist_ok=True)
    path = _link(tables / "CartPole_reward_bounds.csv", "/dev/zero")
    code, rep, _ = _audit(received, tmp_path / "a")
    assert code == 1 and [p["file"] for p in rep["integrity"]] == [str(path)]


def test_under_a_3_gb_data_limit_the_audit_ends_in_a_verdict(received, tmp_path):
    """The review's case, as a user runs it: ``crop audit`` with RLIMIT_DATA at 3 GB on a folder with a sparse
    20 GB qrange.json and a loact.meta.json linked to /dev/zero: FAIL naming both, no MemoryError."""
    _sparse(_run(received) / RUN_FILES["qrange"])
    _link(_run(received, "StdTrain") / meta_name(RUN_FILES["loact"]), "/dev/zero")
    limit = ("import resource, sys; resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30)); "
             "from crop.__main__ import main; main(sys.argv[1:])")
    done = subprocess.run([sys.executable, "-c", limit, "audit", str(received), "--out-dir", str(tmp_path / "a")],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stdout + done.stderr
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert sorted(p["file"] for p in rep["integrity"]) == sorted(
        [str(_run(received) / RUN_FILES["qrange"]), str(_run(received, "StdTrain") / meta_name(RUN_FILES["loact"]))])


@pytest.mark.parametrize("gone", [("model.pt",), ("model.pt", "model.json")])
def test_a_missing_checkpoint_fails(received, tmp_path, gone):
    """The run's records cite the checkpoint's sha256: without it nothing shows the results came from it."""
    ckpt = layout.checkpoint_path(received, "CartPole-v0", "GaussAug")
    for name in gone:
        (ckpt.parent / name).unlink()
    code, rep, md = _audit(received, tmp_path / "a")
    assert (code, rep["verdict"]) == (1, "FAIL")
    assert [(p["file"], p["problem"].split(":")[0]) for p in rep["integrity"]] == [(str(ckpt), "missing")]
    assert "every stage used the recorded checkpoint" not in md


def test_a_swapped_checkpoint_fails(received, tmp_path):
    ckpt = layout.checkpoint_path(received, "CartPole-v0", "GaussAug")
    ckpt.write_bytes(b"other weights")
    code, rep, _ = _audit(received, tmp_path / "a")
    assert code == 1 and [p["problem"] for p in rep["integrity"]] == [
        "checkpoint sha256 differs from the one recorded in model.json"]


def test_an_untouched_folder_passes_and_says_what_was_checked(received, tmp_path):
    code, rep, md = _audit(received, tmp_path / "a")
    assert (code, rep["verdict"], rep["integrity"]) == (0, "PASS", [])
    assert "every stage used the recorded checkpoint, which is there with its sha256" in md


@pytest.mark.parametrize("special", sorted(SPECIAL))
def test_a_reference_or_tolerances_file_that_is_special_is_one_line(tmp_path, special):
    from crop.audit.reference import ReferenceError, load_reference, load_tolerances

    for load, name in ((load_reference, "ref.csv"), (load_tolerances, "tol.yaml")):
        path = SPECIAL[special](tmp_path / name)
        with pytest.raises(ReferenceError, match="character device|FIFO|over the .*-byte cap") as exc:
            load(path)
        assert "\n" not in str(exc.value)
