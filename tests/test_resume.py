"""A LoRe search killed with SIGKILL and restarted reaches the same result as an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crop.io import sha256_file, write_json
from crop.models import save_q_network

from conftest import random_mlp


def _setup(d: Path):
    d.mkdir(parents=True)
    net = random_mlp(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0)
    save_q_network(net, d / "model.pt")
    write_json(d / "model.json", {"env": "CartPole-v0", "algo": "StdTrain", "profile": "vector",
                                  "net_spec": {"arch": "mlp", "in": 4, "hidden": [16], "out": 2},
                                  "sha256": sha256_file(d / "model.pt")})
    write_json(d / "qrange.json", {"env": "CartPole-v0", "algo": "StdTrain", "sigma": 0.05,
                                   "v_min": -4.0, "v_max": 4.0})
    return [sys.executable, "-m", "crop.cli", "lore", "--env", "CartPole-v0", "--algo", "StdTrain",
            "--sigma", "0.05", "--checkpoint", str(d / "model.pt"), "--qrange", str(d / "qrange.json"),
            "--m", "300", "--horizon", "13", "--seed", "5", "--checkpoint-every", "0.3", "--out",
            str(d / "lore.csv"), "--no-progress"]


@pytest.mark.slow
def test_lore_survives_sigkill(tmp_path):
    clean = _setup(tmp_path / "clean")
    subprocess.run(clean, check=True, capture_output=True, timeout=600)
    killed = _setup(tmp_path / "killed")
    resume = tmp_path / "killed" / "lore.csv.resume"
    p = subprocess.Popen(killed, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    saves = 0
    last = None
    while time.time() < deadline and p.poll() is None:  # wait for the search to have saved twice
        if resume.exists() and resume.stat().st_mtime_ns != last:
            last = resume.stat().st_mtime_ns
            saves += 1
            if saves >= 2:  # at least one save after the first, so the state file is being rewritten
                break
        time.sleep(0.05)
    assert p.poll() is None, "the search finished before it could be killed; make it longer"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert resume.exists() and not (tmp_path / "killed" / "lore.csv").exists()
    subprocess.run(killed, check=True, capture_output=True, timeout=600)
    a, b = tmp_path / "clean" / "lore.csv", tmp_path / "killed" / "lore.csv"
    assert a.read_bytes() == b.read_bytes()
    assert json.loads((tmp_path / "killed" / "lore.meta.json").read_text())["search"]["resumed"] is True
    assert not resume.exists()
