"""Many processes fetching the same archives at once (a cluster's first checkpoint jobs): one download per
archive, every output verified, every pin kept; a lock whose holder died and a half-written cache file are
recovered from in one line each, without losing a whole download."""
import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile

import pytest

from crop.__main__ import main
from crop.agents.checkpoints import fetch_published
from crop.agents.registry import resolve_source
from crop.io import sha256_file

from archives import state_bytes, tar_archive

SA_DQN, RADIAL = "sa-dqn-models.tar.gz", "DQN_trained_models.zip"   # the registry's archives, as a mirror names them
# The paper's six SA-DQN checkpoint jobs and two RADIAL-RL ones: (env, algo, the stand-in member's seed).
JOBS = [(f"{g}NoFrameskip-v4", a, 10 * i + j) for i, g in enumerate(("Pong", "Freeway"))
        for j, a in enumerate(("StdTrain", "SA-MDP-PGD", "SA-MDP-CVX", "RadialRL"))]


def _entry(env: str, algo: str) -> dict:
    return resolve_source(env, algo, "published")[1]


class _Counting(http.server.SimpleHTTPRequestHandler):
    """A slow mirror that counts the GET requests per path (a download takes half a second: long enough for
    six processes started together to meet)."""

    def do_GET(self):
        self.server.gets[self.path] = self.server.gets.get(self.path, 0) + 1
        time.sleep(0.5)
        super().do_GET()

    def log_message(self, *a):
        pass


@pytest.fixture
def mirror(tmp_path):
    """(base URL, {path: GETs}, the served folder) of a counting mirror holding stand-ins of the two archives
    the registry's Atari sources come in, published without a checksum."""
    site = tmp_path / "site"
    site.mkdir()
    tar_archive(site / SA_DQN, [({"name": _entry(e, a)["member"]}, state_bytes(seed)) for e, a, seed in JOBS
                         if a != "RadialRL"])
    with zipfile.ZipFile(site / RADIAL, "w") as zf:
        for e, a, seed in JOBS:
            if a == "RadialRL":
                zf.writestr(f"DQN_trained_models/{_entry(e, a)['member']}", state_bytes(seed))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Counting, directory=str(site)))
    srv.gets = {}
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", srv.gets, site
    srv.shutdown()
    srv.server_close()


# One process: wait for the start signal, then fetch one member (as a checkpoint job does).
CHILD = """
import json, os, sys, time
from crop.agents.checkpoints import fetch_published
from crop.agents.registry import resolve_source
entry, dest, url, cache, lock, go = json.loads(sys.argv[1])
while not os.path.exists(go):
    time.sleep(0.01)
fetch_published(entry, dest, mirror=url, cache=cache, lock=lock)
"""


def test_concurrent_first_fetches_download_each_archive_once(tmp_path, mirror):
    """The paper's six SA-DQN jobs and two RADIAL-RL ones start together on an empty cache."""
    url, gets, site = mirror
    cache, lock, go = tmp_path / "cache", tmp_path / "checkpoints.lock.json", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(
        [_entry(e, a), str(tmp_path / "out" / e / a / "model.pt"), url, str(cache), str(lock), str(go)])],
        env=env, stderr=subprocess.PIPE, text=True) for e, a, _ in JOBS]
    time.sleep(1.5)   # every child imported and waiting
    go.touch()
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(JOBS), errs
    assert gets == {f"/{SA_DQN}": 1, f"/{RADIAL}": 1}, "an archive was downloaded more than once"
    assert any("waiting for fetching" in e for e in errs), "no process met another's download"
    pins = json.loads(lock.read_text())   # both first downloads pinned: neither write lost the other's
    assert {k: v["sha256"] for k, v in pins.items()} == {_entry("PongNoFrameskip-v4", a)["url"]: sha256_file(site / f)
                                                          for a, f in (("StdTrain", SA_DQN), ("RadialRL", RADIAL))}
    for e, a, seed in JOBS:
        assert (tmp_path / "out" / e / a / "model.pt").read_bytes() == state_bytes(seed), (e, a)
    left = sorted(p.name for p in cache.iterdir())
    assert left == sorted([f"{sha256_file(site / f)[:16]}-{f}" for f in (SA_DQN, RADIAL)]
                          + [f"{SA_DQN}.lock", f"{RADIAL}.lock"]), left
    assert sorted(p.name for p in tmp_path.iterdir() if "lock" in p.name) == [lock.name, lock.name + ".lock"]


HOLDER = """
import sys, time
from pathlib import Path
from crop.agents.cache_lock import held
cache, name, whole = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with held(cache / f"{name}.lock", f"fetching {name}"):
    staging = cache / f"{name}.partial"
    staging.mkdir()
    (staging / "tmpx1y2z3").write_bytes(b"half a downlo")   # pooch's temporary file, cut off
    (staging / name).write_bytes(whole.read_bytes())   # a whole download, not yet in place
    print("holding", flush=True)
    time.sleep(120)
"""


def test_a_dead_holder_and_its_half_written_download_are_recovered_in_one_line_each(tmp_path, mirror, capsys):
    url, gets, site = mirror
    cache, lock = tmp_path / "cache", tmp_path / "checkpoints.lock.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(cache), SA_DQN, str(site / SA_DQN)], env=env,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    os.kill(holder.pid, signal.SIGKILL)   # dies holding the lock: the kernel releases it, its name stays
    holder.wait()
    fetch_published(_entry("PongNoFrameskip-v4", "SA-MDP-PGD"), tmp_path / "a.pt", mirror=url, cache=cache, lock=lock)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err   # pooch says nothing: it found the whole download in place
    assert err[0].startswith(f"{cache / SA_DQN}.lock: its last holder (fetching {SA_DQN}, process {holder.pid} on "
                             f"{os.uname().nodename} since ")
    assert err[0].endswith(") ended without finishing; taking over")
    assert err[1] == (f"{cache / (SA_DQN + '.partial') / 'tmpx1y2z3'}: a half-written download of {SA_DQN} (13 bytes) "
                      "left by a fetch that ended without finishing; removed")
    assert gets == {}, "the whole download the dead process left was fetched again"
    assert (tmp_path / "a.pt").read_bytes() == state_bytes(1)
    assert json.loads(lock.read_text())[_entry("PongNoFrameskip-v4", "StdTrain")["url"]]["sha256"] == \
        sha256_file(site / SA_DQN)
    assert not (cache / f"{SA_DQN}.partial").exists()
    # the next fetch finds the lock free and nobody's name in it: no line, no download
    fetch_published(_entry("PongNoFrameskip-v4", "SA-MDP-CVX"), tmp_path / "b.pt", mirror=url, cache=cache, lock=lock)
    assert capsys.readouterr().err == "" and gets == {}
    assert (tmp_path / "b.pt").read_bytes() == state_bytes(2)


def test_a_half_written_cache_file_is_fetched_again(tmp_path, mirror, capsys):
    url, gets, site = mirror
    cache, lock = tmp_path / "cache", tmp_path / "checkpoints.lock.json"
    entry = _entry("FreewayNoFrameskip-v4", "StdTrain")
    fetch_published(entry, tmp_path / "a.pt", mirror=url, cache=cache, lock=lock)
    pinned = sha256_file(site / SA_DQN)
    cached = cache / f"{pinned[:16]}-{SA_DQN}"
    cached.write_bytes(cached.read_bytes()[:100])   # cut off (a disk that filled, a copy interrupted)
    capsys.readouterr()
    fetch_published(entry, tmp_path / "b.pt", mirror=url, cache=cache, lock=lock)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(str(cache))]
    assert len(lines) == 1 and lines[0].startswith(f"{cached}: a cache file whose sha256 ")
    assert lines[0].endswith(f"is not the pinned {pinned} (half-written or changed); fetching it again")
    assert gets == {f"/{SA_DQN}": 2} and sha256_file(cached) == pinned
    assert (tmp_path / "b.pt").read_bytes() == state_bytes(10)


def test_fetch_configfile_fills_the_cache_for_compute_nodes_without_internet(tmp_path, mirror, capsys, monkeypatch):
    """`crop fetch --configfile` on the login node fetches each archive of the config once; then a checkpoint
    job's fetch with no reachable mirror or publisher takes its file from the cache."""
    url, gets, site = mirror
    cfg = tmp_path / "paper.yaml"
    cfg.write_text("environments:\n  PongNoFrameskip-v4:\n"
                   "    algorithms: [StdTrain, SA-MDP-PGD, SA-MDP-CVX, RadialRL]\n    sigmas: [0.005]\n"
                   "  FreewayNoFrameskip-v4:\n    algorithms: [StdTrain]\n    sigmas: [0.005]\n"
                   f"checkpoints: {{mirror: '{url}', cache: '{tmp_path / 'cache'}', lock: '{tmp_path / 'l.json'}'}}\n")
    main(["fetch", "--configfile", str(cfg)])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == f"2 archive(s) in the cache for 5 checkpoint(s) of {cfg}"
    assert out[0].endswith("for PongNoFrameskip-v4/StdTrain, PongNoFrameskip-v4/SA-MDP-PGD, "
                           "PongNoFrameskip-v4/SA-MDP-CVX, FreewayNoFrameskip-v4/StdTrain")
    assert gets == {f"/{SA_DQN}": 1, f"/{RADIAL}": 1}
    monkeypatch.setenv("CROP_CHECKPOINT_MIRROR", "https://crop-no-such-host.invalid/")
    fetch_published(_entry("FreewayNoFrameskip-v4", "StdTrain"), tmp_path / "a.pt", cache=tmp_path / "cache",
                    lock=tmp_path / "l.json")
    assert (tmp_path / "a.pt").read_bytes() == state_bytes(10) and gets == {f"/{SA_DQN}": 1, f"/{RADIAL}": 1}
