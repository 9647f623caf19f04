"""Resumable training (crop/train/resume.py): a training stopped after any step — by the test hook, by SIGTERM
(a cluster's wall-time signal: saved at the end of the step, exit 143) or by SIGKILL (from the last periodic
save) — and rerun with the same command writes the same model.pt, byte for byte, as an uninterrupted run
(CPU); a damaged, hostile or foreign resume file is ignored with one line on stderr and training starts
afresh; the file is deleted once model.pt is written."""
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from crop.train import DQNConfig, train_policy
from crop.train.resume import ResumeOptions

torch.set_num_threads(1)

# A small CartPole training whose replay buffer (500) wraps around, learning from step 200.
SMALL = {"total_steps": 1200, "target_return": None, "eval_episodes": 2, "hidden": [16],
         "dqn": {"learning_starts": 200, "eps_decay_steps": 500, "buffer_size": 500, "eval_every": 300},
         "recipes": {"AdvTrain": {"ramp_start": 300, "ramp_steps": 300}}}
# With a threshold: quick evaluations every 150 steps, accepted at step 450 (the first evaluation after min_steps).
THRESHOLD = {**SMALL, "target_return": 8.5, "min_steps": 400, "eval_episodes": 3,
             "dqn": {**SMALL["dqn"], "eval_every": 150, "quick_eval_episodes": 2}}
SHORT = {**SMALL, "total_steps": 600}


def _bytes(net) -> bytes:
    """model.pt's bytes (crop.models.save_network's format)."""
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, buf)
    return buf.getvalue()


def _train(algo="StdTrain", settings=SMALL, seed=3, resume=None):
    return train_policy("CartPole-v0", algo, seed, settings, progress=False, resume=resume)


def _stopped(path: Path, step: int, algo="StdTrain", settings=SMALL, seed=3) -> None:
    """Train until the end of ``step``, save and stop there as on SIGTERM."""
    with pytest.raises(SystemExit) as e:
        _train(algo, settings, seed, ResumeOptions(path, stop_after=step))
    assert e.value.code == 143 and path.exists()


@pytest.mark.parametrize("algo,settings,stops", [
    ("StdTrain", SMALL, (150, 1199)),     # before learning starts; after the very last step
    ("StdTrain", {**SMALL, "prioritized": False}, (640, 641)),
    ("GaussAug", SMALL, (333, 1100)),     # the recipe's torch generator
    ("AdvTrain", SMALL, (450,)),          # its numpy generator, mid-ramp
    ("NoisyNet", SMALL, (333, 900)),      # noise instead of ε-greedy
    ("StdTrain", THRESHOLD, (200, 320)),  # evaluations before and after the stops, accepted at 450
    ("StdTrain", {**SMALL, "dqn": {**SMALL["dqn"], "lr_end": 1e-4, "lr_decay_steps": 700}}, (451,)),  # lr decaying
])
def test_a_training_stopped_and_resumed_writes_the_uninterrupted_model(tmp_path, capsys, algo, settings, stops):
    clean, clean_info = _train(algo, settings)
    resume = tmp_path / "model.pt.resume"
    for step in stops:
        _stopped(resume, step, algo, settings)
    net, info = _train(algo, settings, resume=ResumeOptions(resume))
    assert _bytes(net) == _bytes(clean)
    assert info["resumed_at_steps"] == [s + 1 for s in stops]
    for k in ("acceptance", "evaluations", "episodes", "steps"):
        assert info[k] == clean_info[k], k
    if settings is THRESHOLD:
        assert info["steps"] == 450 and len(info["evaluations"]) == 2
    err = capsys.readouterr().err
    assert err.count("training state saved") == len(stops) and err.count("resumed from") == len(stops)


def test_saving_after_every_step_changes_nothing(tmp_path, monkeypatch):
    import crop.train.resume as resume

    saves = []
    monkeypatch.setattr(resume, "SAVE_SPACING", 0.0)
    monkeypatch.setattr(resume, "save", lambda *a, save=resume.save: saves.append(1) or save(*a))
    clean, _ = _train(settings=SHORT)
    net, info = _train(settings=SHORT, resume=ResumeOptions(tmp_path / "r", every_s=0.0))
    # one save per step, and one before the final evaluation (a kill during it resumes at it)
    assert _bytes(net) == _bytes(clean) and "resumed_at_steps" not in info and len(saves) == SHORT["total_steps"] + 1
    header = json.loads(bytes(_members(tmp_path / "r")["header"]).decode())
    assert header["next_step"] == SHORT["total_steps"]   # the caller deletes the file once model.pt is written
    net, info = _train(settings=SHORT, resume=ResumeOptions(tmp_path / "r"))
    assert _bytes(net) == _bytes(clean) and info["resumed_at_steps"] == [SHORT["total_steps"]]


def test_a_slow_save_waits_a_hundred_times_its_duration(tmp_path, monkeypatch):
    """Saving costs at most 1 % of the time, whatever the state's size: a save of 20 ms with every_s = 0 is
    followed by none for the next 2 s."""
    import crop.train.resume as resume

    saves = []
    monkeypatch.setattr(resume, "save", lambda *a: saves.append(time.sleep(0.02)))
    saver, step, until = resume.Checkpointer(ResumeOptions(tmp_path / "r", every_s=0.0), {}), 0, time.monotonic() + 1
    while time.monotonic() < until:
        saver.after_step(step, None)
        step += 1
    assert len(saves) == 1 and step > 100


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(a resume file saved after step 400 of SHORT, the uninterrupted network's bytes)."""
    path = tmp_path_factory.mktemp("saved") / "model.pt.resume"
    _stopped(path, 400, settings=SHORT)
    assert len(_members(path)["actions"]) > 0   # mid-episode: the resumed run replays the episode so far
    return path, _bytes(_train(settings=SHORT)[0])


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _members(path: Path) -> dict:
    with zipfile.ZipFile(path) as z:
        return {i.filename[:-4]: np.load(io.BytesIO(z.read(i))) for i in z.infolist()}


def _rewrite(path: Path, members: dict) -> None:
    buf = io.BytesIO()
    np.savez(buf, **members)
    path.write_bytes(buf.getvalue())


def _tamper(path: Path, how: str, marker: Path) -> None:
    data = path.read_bytes()
    if how == "bytes":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes())
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "pickle":        # an object array where the header goes: np.load would unpickle it
        m = _members(path)
        m["header"] = np.array([_Payload(marker)], dtype=object)
        _rewrite(path, m)
    elif how == "shape":         # a network of another shape
        m = _members(path)
        m["q.0.weight"] = np.zeros((3, 3), np.float32)
        _rewrite(path, m)
    elif how == "extra":
        m = _members(path)
        m["more"] = np.zeros(3)
        _rewrite(path, m)
    elif how == "bitflip":       # one bit of a weight flipped: the member's CRC-32 no longer matches
        with zipfile.ZipFile(path) as z:
            info = z.getinfo("q.0.weight.npy")
        at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 128 + 4   # past the .npy header
        path.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])
    elif how == "dev_zero":      # a zip reader would read it to the end of memory
        path.unlink()
        path.symlink_to("/dev/zero")
    elif how == "fifo":          # opening it for reading would wait for a writer
        path.unlink()
        os.mkfifo(path)
    elif how == "oversized":     # over the most bytes the largest state of this training takes
        with open(path, "ab") as f:
            f.truncate(len(data) + (64 << 20))
    elif how in ("nan_weight", "nan_reward", "nan_obs", "neg_second_moment", "adam_step"):
        m = _members(path)
        name, index, value = {"nan_weight": ("q.0.weight", (0, 0), np.nan), "nan_reward": ("buf.r", 7, np.nan),
                              "nan_obs": ("buf.s2", (3, 1), np.inf), "adam_step": ("opt.0.step", (), 5.0),
                              "neg_second_moment": ("opt.0.exp_avg_sq", (0, 0), -1e-8)}[how]
        m[name] = m[name].copy()
        m[name][index] = value
        _rewrite(path, m)
    elif how in ("lr_inf", "lr_1e3", "ep_ret_inf", "max_prio_low"):
        m = _members(path)
        h = json.loads(bytes(m["header"]).decode())
        if how == "max_prio_low":   # below the stored priorities
            h["max_prio"] = 1.0
        elif how == "ep_ret_inf":
            h["ep_ret"] = float("inf")
        else:
            h["lr"] = [float("inf") if how == "lr_inf" else 1e3]
        m["header"] = np.frombuffer(json.dumps(h).encode(), np.uint8)
        _rewrite(path, m)
    elif how in ("obs", "ep_ret", "next_step"):   # the environment does not replay it; an impossible step
        m = _members(path)
        if how == "obs":
            m["obs"] = m["obs"] + np.float32(1e-3)
        else:
            h = json.loads(bytes(m["header"]).decode())
            h[how] = h[how] + 0.5 if how == "ep_ret" else 10**6
            m["header"] = np.frombuffer(json.dumps(h).encode(), np.uint8)
        _rewrite(path, m)


HOSTILE = ["bytes", "truncated", "bitflip", "pickle", "shape", "extra", "obs", "ep_ret", "next_step", "dev_zero",
           "fifo", "oversized", "nan_weight", "nan_reward", "nan_obs", "neg_second_moment", "adam_step", "lr_inf",
           "lr_1e3", "ep_ret_inf", "max_prio_low"]


@pytest.mark.parametrize("how", HOSTILE)
def test_a_damaged_or_hostile_resume_file_is_ignored_with_one_line(tmp_path, capsys, saved, how):
    """Random bytes, a file cut short, a pickle inside the .npz (never unpickled: its payload would create
    ``marker``), a bit of a weight flipped, a tensor of another shape, an unknown member, a saved state the
    environment does not replay or a step beyond the training; a symbolic link to /dev/zero, a FIFO, a file over
    the largest state's size; a NaN weight, reward or ±inf observation in the buffer, a negative second moment
    or another step count in Adam's state, a learning rate of inf or other than the setting's, an infinite
    return, a largest priority below the stored ones: one line on stderr, and the uninterrupted model, byte for
    byte."""
    path, clean = saved
    resume = tmp_path / "model.pt.resume"
    shutil.copy(path, resume)
    if how == "shape":
        assert "q.0.weight" in _members(resume), sorted(_members(resume))
    marker = tmp_path / "pwned"
    _tamper(resume, how, marker)
    capsys.readouterr()
    net, info = _train(settings=SHORT, resume=ResumeOptions(resume))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train:")]
    assert len(err) == 1 and "ignoring the resume file" in err[0] and "starting afresh" in err[0], err
    assert _bytes(net) == clean and "resumed_at_steps" not in info and not marker.exists()


@pytest.mark.parametrize("change", [{"seed": 4}, {"dqn": {**SHORT["dqn"], "lr": 2e-3}}, {"hidden": [17]},
                                    {"prioritized": False}, {"algo": "GaussAug"}])
def test_a_resume_file_of_other_settings_is_ignored(tmp_path, capsys, saved, change):
    path, _ = saved
    resume = tmp_path / "model.pt.resume"
    shutil.copy(path, resume)
    change = dict(change)
    algo, seed = change.pop("algo", "StdTrain"), change.pop("seed", 3)
    capsys.readouterr()
    _, info = _train(algo, {**SHORT, **change}, seed, ResumeOptions(resume))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train:")]
    assert len(err) == 1 and "belongs to another run" in err[0], err
    assert "resumed_at_steps" not in info


def test_every_training_setting_is_in_the_key(monkeypatch, tmp_path):
    """The key holds the whole DQN configuration (a field added to DQNConfig is in it without a word more),
    the recipe and its hyper-parameters, the network, environment, profile, seed, device, code and versions."""
    import crop.train.dqn as dqn
    from crop.train.resume import training_key

    seen = []
    monkeypatch.setattr(dqn, "training_key", lambda run: seen.append(run) or training_key(run))
    _train(settings={**SHORT, "total_steps": 30, "dqn": {"learning_starts": 10}},
           resume=ResumeOptions(tmp_path / "r"))
    key = training_key(seen[0])
    assert set(seen[0]["train_config"]) == {f.name for f in fields(DQNConfig)}
    assert {"env", "profile", "seed", "recipe", "hyperparameters", "net_spec", "device", "code", "versions",
            "format"} <= set(key)
    assert re.fullmatch(r"[0-9a-f]{64}", key["code"]) and key["versions"]["torch"] == torch.__version__


@pytest.mark.slow
@pytest.mark.parametrize("env,stop", [("PongNoFrameskip-v4", 250), ("highway-fast-v0", 130)])
def test_atari_and_highway_trainings_resume_mid_episode_to_the_uninterrupted_model(tmp_path, env, stop):
    """Pixels (a uint8 replay buffer, the Atari wrappers' frame stack and no-op reset replayed from the episode's
    seed) and highway-env (a simulator that cannot be snapshotted) resume byte-identically too."""
    settings = {"total_steps": stop + 50, "target_return": None, "eval_episodes": 1,
                "dqn": {"learning_starts": 100, "buffer_size": 200, "batch_size": 8, "eval_max_steps": 50}}
    clean, _ = train_policy(env, "StdTrain", 0, settings, progress=False)
    resume = tmp_path / "model.pt.resume"
    with pytest.raises(SystemExit):
        train_policy(env, "StdTrain", 0, settings, progress=False, resume=ResumeOptions(resume, stop_after=stop))
    assert len(_members(resume)["actions"]) > 0
    net, info = train_policy(env, "StdTrain", 0, settings, progress=False, resume=ResumeOptions(resume))
    assert _bytes(net) == _bytes(clean) and info["resumed_at_steps"] == [stop + 1]


# ------------------------------------------------------------------------------------- through the CLI

CLI_SETTINGS = {**SMALL, "total_steps": 6000, "dqn": {**SMALL["dqn"], "buffer_size": 2000}}


def _cmd(out: Path, every: float = 1e6) -> list[str]:
    return [sys.executable, "-m", "crop", "train", "--env", "CartPole-v0", "--algo", "StdTrain", "--seed", "5",
            "--settings", json.dumps(CLI_SETTINGS), "--target-return", "none", "--checkpoint-every", str(every),
            "--out", str(out)]


def _env() -> dict:
    return {**os.environ, "CROP_PROGRESS_INTERVAL": "0.2", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def clean_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "model.pt"
    subprocess.run(_cmd(out), check=True, capture_output=True, timeout=600, env=_env())
    assert not out.with_name("model.pt.resume").exists()
    return out.read_bytes()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_crop_train_survives_sigterm_and_sigkill(tmp_path, clean_model, sig):
    """SIGTERM mid-training: saved at the end of the step, exit 143; SIGKILL: the last periodic save stays.
    The same command then resumes and writes the uninterrupted model.pt, and deletes the resume file."""
    out = tmp_path / "model.pt"
    resume = tmp_path / "model.pt.resume"
    cmd = _cmd(out, 1e6 if sig == signal.SIGTERM else 0.3)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    lines = []
    for line in p.stderr:   # progress lines: signal once training is under way (and has saved, for SIGKILL)
        lines.append(line)
        m = re.search(r": (\d+)/6000 it", line)
        if m and int(m.group(1)) >= 1500 and (sig == signal.SIGTERM or resume.exists()):
            break
    assert p.poll() is None, "training finished before it could be killed; make it longer:\n" + "".join(lines)
    assert sig == signal.SIGKILL or not resume.exists()
    os.kill(p.pid, sig)
    err = p.communicate(timeout=120)[1]
    if sig == signal.SIGTERM:
        assert p.returncode == 143 and "SIGTERM: training state saved" in err, err[-2000:]
    assert resume.exists() and not out.exists()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env())
    assert r.returncode == 0 and "resumed from" in r.stderr, r.stderr[-2000:]
    assert out.read_bytes() == clean_model and not resume.exists()
    record = json.loads(out.with_suffix(".json").read_text())
    assert len(record["training"]["resumed_at_steps"]) == 1


def test_a_failed_training_leaves_no_resume_file(tmp_path):
    out = tmp_path / "model.pt"
    settings = {**SHORT, "total_steps": 300, "target_return": 1000, "min_steps": 0,
                "dqn": {"learning_starts": 100, "eval_every": 100, "quick_eval_episodes": 1}}
    r = subprocess.run([sys.executable, "-m", "crop", "train", "--env", "CartPole-v0", "--algo", "StdTrain",
                        "--settings", json.dumps(settings), "--checkpoint-every", "0.01", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=_env())
    assert r.returncode != 0 and "did not reach" in r.stderr, r.stderr[-2000:]
    assert not out.exists() and not out.with_name("model.pt.resume").exists()
    assert not list(tmp_path.iterdir())   # no temporary file left either
