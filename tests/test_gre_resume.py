"""GRe (Algorithm 2) killed mid-run and rerun with the same command continues after its last saved block of
trajectories: the same gre.csv and gre_returns.csv, byte for byte, as an uninterrupted run.  A resume file that
is not this run's, or not sound data, is ignored with one line and sampling starts from the first trajectory."""
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import fields, replace

import numpy as np
import pytest
import torch

from crop.__main__ import main
from crop.certify import gre_resume
from crop.certify.gre import GReSettings, sample_randomized_returns
from crop.certify.gre_resume import GReResume
from crop.io import sha256_file, write_json
from crop.models import build_network, save_network
from crop.workflow.layout import RUN_FILES

SPEC = {"arch": "mlp", "in": 4, "hidden": [2], "out": 2}
SETTINGS = GReSettings(0.05, 300, 50, 1.0, seed=3, env_seed=7, batch=100)


def balancer(w=(0.1, 0.5, 1.0, 1.0)):
    """A Q-network that keeps CartPole's pole up (push towards the side w·s > 0): long trajectories, so that a
    block takes long enough to be killed in."""
    net = build_network(SPEC)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net[0].weight[0], net[0].weight[1] = torch.tensor(w), -torch.tensor(w)
        net[2].weight[1, 0] = net[2].weight[0, 1] = 1.0
    return net.eval()


def _command(d):
    """``crop gre`` on CartPole with :func:`balancer`, 8 blocks of 50 trajectories, writing into ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    save_network(balancer(), d / "model.pt")
    write_json(d / "model.json", {"env": "CartPole-v0", "algo": "StdTrain", "profile": "vector", "net_spec": SPEC,
                                  "sha256": sha256_file(d / "model.pt")})
    return ["gre", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.05", "--checkpoint",
            str(d / "model.pt"), "--m", "400", "--batch", "50", "--horizon", "150", "--seed", "5", "--no-progress",
            "--out", str(d / RUN_FILES["gre"]), "--out-returns", str(d / RUN_FILES["gre_returns"])]


def _outputs(d):
    return [(d / RUN_FILES[k]).read_bytes() for k in ("gre", "gre_returns")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    d = tmp_path_factory.mktemp("clean")
    main(_command(d))
    assert not (d / f"{RUN_FILES['gre']}.resume").exists(), "the resume file is removed once gre.csv is written"
    return _outputs(d)


def _done(resume) -> int:
    """Trajectories a resume file holds (0 while it is being replaced)."""
    try:
        with zipfile.ZipFile(resume) as z:
            return json.loads(bytes(np.load(io.BytesIO(z.read("header.npy")))).decode())["done"]
    except (OSError, zipfile.BadZipFile, KeyError, ValueError):
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_gre_killed_mid_run_and_rerun_writes_the_uninterrupted_results(tmp_path, uninterrupted, sig):
    """A subprocess running ``crop gre`` is killed once two blocks are saved (SIGTERM, a cluster's wall-time kill:
    one line, exit 143; SIGKILL: no word) and the same command rerun: it resumes after the saved blocks and
    writes gre.csv and gre_returns.csv byte-identical to an uninterrupted run's, then removes the resume file."""
    argv = _command(tmp_path)
    resume = tmp_path / f"{RUN_FILES['gre']}.resume"
    p = subprocess.Popen([sys.executable, "-m", "crop", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None and _done(resume) < 100:
        time.sleep(0.01)
    assert p.poll() is None, "GRe finished before it could be killed; make it longer"
    os.kill(p.pid, sig)
    err = p.communicate(timeout=60)[1]
    kept = _done(resume)
    assert 100 <= kept < 400 and kept % 50 == 0, kept
    if sig == signal.SIGTERM:
        assert p.returncode == 143 and f"SIGTERM: {kept} of 400 trajectories saved" in err, err[-2000:]
    else:
        assert p.returncode == -signal.SIGKILL
    assert not (tmp_path / RUN_FILES["gre"]).exists()
    rerun = subprocess.run([sys.executable, "-m", "crop", *argv], capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0 and f"resumed {kept} of 400 trajectories" in rerun.stderr, rerun.stderr[-2000:]
    assert _outputs(tmp_path) == uninterrupted
    assert not resume.exists()


@pytest.fixture(scope="module")
def clean_returns():
    return sample_randomized_returns("CartPole-v0", balancer(), SETTINGS, progress=False)


def _key(settings=SETTINGS, net=None, profile=None, device="cpu"):
    return gre_resume.resume_key("CartPole-v0", profile, settings, net or balancer(), torch.device(device))


def test_a_resumed_run_keeps_the_saved_blocks_and_samples_the_rest_as_an_uninterrupted_run(tmp_path, capsys,
                                                                                            clean_returns):
    """The saved blocks are taken as they are (here: forged, in range), and the blocks after them — sampled in a
    fresh pool, starting at trajectory 200 — are the uninterrupted run's, byte for byte; every block is saved."""
    resume = tmp_path / "gre.resume"
    forged = np.full(200, 5.0)
    gre_resume.save(resume, _key(), forged)
    out = sample_randomized_returns("CartPole-v0", balancer(), SETTINGS, progress=False,
                                    resume=GReResume(resume, (0.0, 50.0)))
    assert "resumed 200 of 300 trajectories" in capsys.readouterr().err
    assert out[:200].tobytes() == forged.tobytes() and out[200:].tobytes() == clean_returns[200:].tobytes()
    assert _done(resume) == 300 and not np.array_equal(clean_returns[:200], forged)


def test_sigterm_saves_the_finished_blocks_and_exits_143(tmp_path, capsys, monkeypatch, clean_returns):
    """SIGTERM mid-run (here: right after the first block is saved): the run stops at the next step of the block
    in flight with the finished blocks saved, one line, status 143; the same call resumes from them and gives
    the uninterrupted returns."""
    resume = GReResume(tmp_path / "gre.resume", (0.0, 50.0))
    save = gre_resume.save

    def save_then_sigterm(*a):
        save(*a)
        monkeypatch.setattr(gre_resume, "save", save)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(gre_resume, "save", save_then_sigterm)
    with pytest.raises(SystemExit) as e:
        sample_randomized_returns("CartPole-v0", balancer(), SETTINGS, progress=False, resume=resume)
    assert e.value.code == 143 and _done(resume.path) == 100
    assert capsys.readouterr().err.strip().splitlines() == [
        f"GRe: SIGTERM: 100 of 300 trajectories saved to {resume.path}; the same command resumes it"]
    out = sample_randomized_returns("CartPole-v0", balancer(), SETTINGS, progress=False, resume=resume)
    assert "resumed 100 of 300" in capsys.readouterr().err
    assert out.tobytes() == clean_returns.tobytes()


class _Payload:
    """A pickle that runs a shell command when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _npz(path, header, compressed=False, **arrays):
    """A resume file of the given header (a dict, JSON-encoded) and arrays, as written by hand."""
    save = np.savez_compressed if compressed else np.savez
    with open(path, "wb") as f:   # a file, not a name: np.savez would add ".npz" to it
        save(f, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)


def _other_settings(path, key, returns):
    gre_resume.save(path, _key(replace(SETTINGS, sigma=0.06)), returns)


TAMPER = {
    "random bytes": lambda p, k, r: p.write_bytes(np.random.default_rng(0).bytes(3000)),
    "cut short": lambda p, k, r: (gre_resume.save(p, k, r), p.write_bytes(p.read_bytes()[:1500])),
    "a symlink": lambda p, k, r: (gre_resume.save(p.with_name("real"), k, r), p.symlink_to(p.with_name("real"))),
    "other settings": _other_settings,
    "not finite": lambda p, k, r: gre_resume.save(p, k, np.where(np.arange(200) == 7, np.nan, r)),
    "infinite": lambda p, k, r: gre_resume.save(p, k, np.where(np.arange(200) == 7, np.inf, r)),
    "outside [J_min, J_max]": lambda p, k, r: gre_resume.save(p, k, np.where(np.arange(200) == 7, 1e6, r)),
    "shape not its count": lambda p, k, r: _npz(p, {"key": k, "done": 200}, returns=r[:150]),
    "float32": lambda p, k, r: _npz(p, {"key": k, "done": 200}, returns=r.astype(np.float32)),
    "two dimensions": lambda p, k, r: _npz(p, {"key": k, "done": 200}, returns=r.reshape(100, 2)),
    "not whole blocks": lambda p, k, r: gre_resume.save(p, k, r[:150]),
    "a count not an int": lambda p, k, r: _npz(p, {"key": k, "done": 200.0}, returns=r),
    "more than m": lambda p, k, r: gre_resume.save(p, k, np.concatenate([r, r, r])[:400]),
    "compressed": lambda p, k, r: _npz(p, {"key": k, "done": 200}, compressed=True, returns=r),
    "an extra member": lambda p, k, r: _npz(p, {"key": k, "done": 200}, returns=r, extra=r),
    "larger than m returns take": lambda p, k, r: p.write_bytes(b"\0" * (8 * 300 + (1 << 16) + 1)),
    "a pickle": lambda p, k, r: p.write_bytes(pickle.dumps({"key": k, "x": _Payload(p.with_name("pwned"))})),
    "an object array": lambda p, k, r: _npz(p, {"key": k, "done": 200},
                                           returns=np.array([_Payload(p.with_name("pwned")), 1.0], dtype=object)),
}


@pytest.mark.parametrize("tamper", list(TAMPER))
def test_a_resume_file_that_is_not_this_runs_sound_data_is_ignored_with_one_line(tmp_path, capsys, clean_returns,
                                                                                 tamper):
    """Random bytes, a file cut short, a symlink, another run's settings, a return that is NaN, infinite
    or outside [J_min, J_max], arrays of another shape or dtype, part of a block, more than m returns, a compressed
    or extra member, a file larger than m returns take, a pickle: one line on stderr, nothing of it used (the
    pickle runs nothing), the uninterrupted returns."""
    resume = tmp_path / "gre.resume"
    TAMPER[tamper](resume, _key(), clean_returns[:200])
    out = sample_randomized_returns("CartPole-v0", balancer(), SETTINGS, progress=False,
                                    resume=GReResume(resume, (0.0, 50.0)))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("GRe: ") and ("ignoring the resume file" in err[0] or
                                                            "belongs to another run" in err[0]), err
    assert out.tobytes() == clean_returns.tobytes()
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("field", [f.name for f in fields(GReSettings)])
def test_every_setting_the_network_the_profile_and_the_device_are_in_the_resume_key(field):
    """A file of any other setting (a field added to GReSettings is in the key without a word more), another
    network, profile or device belongs to another run."""
    other = {"sigma": 0.06, "m": 301, "horizon": 51, "gamma": 0.99, "seed": 4, "env_seed": 8, "chunk": 7,
             "device": "cuda", "workers": 2, "batch": 7, "reward_clip": (0.0, 1.0)}
    if field == "device":
        assert _key(device="meta") != _key()
    else:
        assert _key(replace(SETTINGS, **{field: other[field]})) != _key()
    assert _key(net=balancer((0.1, 0.5, 1.0, 0.9))) != _key() and _key(profile="vector:other") != _key()
    assert _key() == _key()


@pytest.mark.slow
def test_a_worker_ended_by_sigterm_stops_the_run_as_sigterm_does(tmp_path, capsys, monkeypatch):
    """A cluster's SIGTERM reaches the pool's worker processes too, and a worker's end may reach the run before
    its own signal: a worker ended by SIGTERM stops the run as SIGTERM does (finished blocks saved, one line, 143),
    and the rerun gives the uninterrupted returns."""
    import multiprocessing

    from networks import random_mlp

    net = random_mlp(n_in=6, n_out=3, hidden=(16,), seed=1)
    settings = GReSettings(0.05, 60, 40, 1.0, seed=3, env_seed=7, batch=20, workers=2)
    clean = sample_randomized_returns("Acrobot-v1", net, settings, progress=False)
    resume = GReResume(tmp_path / "gre.resume", (-40.0, 0.0))
    save = gre_resume.save

    def save_then_end_a_worker(*a):
        save(*a)
        monkeypatch.setattr(gre_resume, "save", save)
        worker = multiprocessing.active_children()[0]
        os.kill(worker.pid, signal.SIGTERM)
        worker.join(10)

    monkeypatch.setattr(gre_resume, "save", save_then_end_a_worker)
    with pytest.raises(SystemExit) as e:
        sample_randomized_returns("Acrobot-v1", net, settings, progress=False, resume=resume)
    assert e.value.code == 143 and _done(resume.path) == 20
    assert "SIGTERM: 20 of 60 trajectories saved" in capsys.readouterr().err
    out = sample_randomized_returns("Acrobot-v1", net, settings, progress=False, resume=resume)
    assert out.tobytes() == clean.tobytes()
