"""Every input checked before any job: `crop validate-config` and the Snakefile open each policy file as its
checkpoint job will (a missing file, a text file, a network for another environment, a FIFO, a directory, a
device are each one line naming the entry); values the schema once let through (2.0 as a count or a seed, a
path read as an option, a reward range whose returns overflow, an architecture too large to allocate, complex
weights, labels that differ only in case) are refused in one line; a policy network's default smoothing
target is probs, judged at validation."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from crop.__main__ import main
from crop.models import CheckpointError
from crop.workflow.config import ConfigError, check_policy_files, load_config, validate_config
from crop.workflow.layout import RUN_FILES

from networks import sb3_data, sb3_mlp_policy, sb3_zip, state_dict_file


def _one_line(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "Traceback" not in out.err, out
    return out.err


def _ppo(path: Path, obs: int, actions: int) -> Path:
    """An SB3 PPO MlpPolicy archive for an environment of ``obs`` inputs and ``actions`` actions."""
    state, _ = sb3_mlp_policy([obs, 64, 64], [obs, 64, 64], actions, seed=1)
    return sb3_zip(path, state, sb3_data())


def _config(tmp_path: Path, files: dict, **env) -> Path:
    """A source: file config on Acrobot-v1 with ``files`` ({label: path or entry}) certified."""
    entries = {k: (v if isinstance(v, dict) else {"path": str(v)}) for k, v in files.items()}
    ec = {"source": "file", "files": entries, "algorithms": list(entries),
          "rewards": {"range": [-1.0, 0.0]}, "sigmas": [0.1], **env}
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"results": str(tmp_path / "results"), "environments": {"Acrobot-v1": ec}}))
    return f


# ------------------------------------------------------------------ 1. every policy file opened at validation

def test_validate_config_opens_every_policy_file(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("not a network\n")
    cartpole_ppo = _ppo(tmp_path / "ppo_cartpole.zip", 4, 2)
    cases = [
        (tmp_path / "absent.zip", "environments.Acrobot-v1.files.Mine: {}: no such policy file"),
        (text, "environments.Acrobot-v1.files.Mine: {} is not a readable PyTorch file of tensors"),
        (cartpole_ppo, "environments.Acrobot-v1.files.Mine: {}: the network (MLP 4→64→64→2 (tanh)) takes input "
                       "(4,) and gives 2 outputs, but Acrobot-v1 (profile vector) gives observations of shape (6,) "
                       "and has 3 actions"),
        (tmp_path, "environments.Acrobot-v1.files.Mine: {}: a directory, not a policy file"),
        (Path("/dev/zero"), "environments.Acrobot-v1.files.Mine: {}: a character device, not a regular file"),
    ]
    for path, message in cases:
        err = _one_line(["validate-config", str(_config(tmp_path, {"Mine": path}))], capsys)
        assert message.format(path) in err, err
    fifo = tmp_path / "pipe.zip"
    os.mkfifo(fifo)   # never opened: a reader would block
    err = _one_line(["validate-config", str(_config(tmp_path, {"Mine": fifo}))], capsys)
    assert f"files.Mine: {fifo}: a named pipe (FIFO), not a regular file" in err
    pinned = {"path": str(state_dict_file(tmp_path / "dqn.pt")), "sha256": "0" * 64}
    err = _one_line(["validate-config", str(_config(tmp_path, {"Mine": pinned}))], capsys)
    assert "files.Mine: " in err and "differs from the pinned" in err
    # a fitting network validates
    main(["validate-config", str(_config(tmp_path, {"Mine": tmp_path / "dqn.pt"}))])
    assert "valid (1 certification targets)" in capsys.readouterr().out


@pytest.mark.slow
def test_snakemake_refuses_a_missing_policy_file_before_any_job(tmp_path, repo):
    f = _config(tmp_path, {"Mine": tmp_path / "absent.zip"})
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "--cores", "1", "-n",
                        "--configfile", str(f), "--directory", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert f"config: environments.Acrobot-v1.files.Mine: {tmp_path / 'absent.zip'}: no such policy file" in out, out
    assert "MissingInputException" not in out and "Traceback" not in out
    assert not (tmp_path / "results").exists()


# ------------------------------------------------------------------ 2. values the workflow cannot use

SMALL = {"environments": {"CartPole-v0": {"algorithms": ["StdTrain"], "sigmas": [0.1]}}}


@pytest.mark.parametrize("change,message", [
    ({"replicates": 2.0}, "replicates: 2.0 is not an integer; write 2"),
    ({"seed": 1.0}, "seed: 1.0 is not an integer; write 1"),
    ({"seed": 1.5}, "seed: 1.5 is not an integer"),
    ({"chunk": True}, "chunk: True is not of type 'integer'"),
    ({"results": "-rf"}, "results: '-rf' starts with '-', which a command reads as an option; write ./-rf"),
    ({"checkpoints": {"cache": "--help"}}, "checkpoints.cache: '--help' starts with '-'"),
    ({"environments": {"CartPole-v0": {"algorithms": ["StdTrain"], "sigmas": [0.1], "lore": {"horizon": 2.0}}}},
     "environments.CartPole-v0.lore.horizon: 2.0 is not an integer; write 2"),
    ({"environments": {"Acrobot-v1": {"source": "file", "files": {"M": {"path": "m.pt"}}, "algorithms": ["M"],
                                      "sigmas": [0.1], "rewards": {"range": [-1e308, 1e308]}}}},
     "environments.Acrobot-v1.rewards.range: [-1e+308, 1e+308] over 200 steps gives [J_min, J_max] = "
     "[-inf, inf], not finite numbers; give the true reward range (gre.horizon)"),
    ({"environments": {"CartPole-v0": {"algorithms": ["StdTrain"], "sigmas": [0.1],
                                       "train": {"hidden": [1000000000]}}}},
     "environments.CartPole-v0.train.hidden: [1000000000] makes an MLP of 7,000,000,002 parameters, over the limit "
     "of 268,435,456"),
    ({"environments": {"Acrobot-v1": {"source": "file", "files": {"Mine": {"path": "a.pt"}, "mine": {"path": "b.pt"}},
                                      "algorithms": ["Mine", "mine"], "sigmas": [0.1],
                                      "rewards": {"range": [-1, 0]}}}},
     "environments.Acrobot-v1.algorithms: 'Mine' and 'mine' differ only in case, so their folders collide on a "
     "case-insensitive file system; rename one"),
])
def test_values_the_workflow_cannot_use_are_refused(change, message):
    with pytest.raises(ConfigError) as e:
        validate_config({**SMALL, **change})
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_whole_numbers_stay_valid():
    cfg = validate_config({**SMALL, "replicates": 2, "seed": 1})
    assert cfg["replicates"] == 2 and cfg["seed"] == 1
    assert validate_config({**SMALL, "results": "./-rf"})["results"] == "./-rf"


def test_a_declared_architecture_is_bounded_before_allocation(tmp_path, capsys):
    src = state_dict_file(tmp_path / "dqn.pt", (4, 16, 2))
    err = _one_line(["import", "--env", "CartPole-v0", "--algo", "Mine", "--file", str(src), "--out",
                     str(tmp_path / "out" / "model.pt"), "--arch",
                     '{"arch":"mlp","in":4,"hidden":[1000000000],"out":2}'], capsys)
    assert "network spec MLP 4→1000000000→2 has 7,000,000,002 parameters, over the limit of 268,435,456" in err
    assert not (tmp_path / "out").exists()
    f = _config(tmp_path, {"Mine": {"path": str(src), "architecture": {"arch": "nature_cnn", "in_size": 100000,
                                                                       "out": 3}}})
    err = _one_line(["validate-config", str(f)], capsys)
    assert "files.Mine: network spec Nature-CNN 4×100000×100000→3 has" in err and "over the limit" in err


@pytest.mark.parametrize("spec", [{"arch": "mlp", "in": 4, "hidden": [64], "out": 2},
                                  {"arch": "noisy_mlp", "in": 4, "hidden": [64], "out": 2},
                                  {"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 6}])
def test_counting_on_the_meta_device_draws_no_random_number(spec):
    """The bound is checked on the meta device first: the network built and every draw after it are those
    of building it directly (a seeded training run stays byte-identical)."""
    from crop import models

    torch.manual_seed(0)
    a, after_a = models.build_network(spec), torch.rand(3)
    torch.manual_seed(0)
    b, after_b = models._BUILDERS[spec["arch"]](spec), torch.rand(3)
    assert torch.equal(after_a, after_b)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_complex_weights_are_refused(tmp_path, capsys):
    state = {"0.weight": torch.randn(16, 4, dtype=torch.complex64), "0.bias": torch.randn(16),
             "2.weight": torch.randn(2, 16), "2.bias": torch.randn(2)}
    torch.save(state, tmp_path / "c.pt")
    err = _one_line(["import", "--env", "CartPole-v0", "--algo", "Mine", "--file", str(tmp_path / "c.pt"),
                     "--out", str(tmp_path / "out" / "model.pt")], capsys)
    assert "complex-valued weights in ['0.weight']; a network's weights are real numbers; refusing it" in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ 3. a policy network's target at validation

def test_a_policy_network_gets_probs_by_default(tmp_path):
    ppo = _ppo(tmp_path / "ppo.zip", 6, 3)
    cfg = check_policy_files(load_config(_config(tmp_path, {"MyPPO": ppo})))
    assert cfg["environments"]["Acrobot-v1"]["target"] == "probs"
    # a Q-network keeps the paper's q, written nowhere (the config and its hash are unchanged)
    plain = load_config(_config(tmp_path, {"MyDQN": state_dict_file(tmp_path / "dqn.pt")}))
    assert check_policy_files(plain) is plain and "target" not in plain["environments"]["Acrobot-v1"]


def test_a_passed_policy_check_is_remembered_by_the_files_bytes_and_settings(tmp_path, monkeypatch):
    """The workflow parses the config in every job's process: a check that passed is not repeated for the
    same bytes and settings (no torch imported then), and a changed file or setting is checked afresh."""
    import crop.agents.importing

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ppo = _ppo(tmp_path / "ppo.zip", 6, 3)
    f = _config(tmp_path, {"MyPPO": ppo})
    assert check_policy_files(load_config(f))["environments"]["Acrobot-v1"]["target"] == "probs"
    code = ("import sys; from crop.workflow.config import check_policy_files, load_config; "
            "c = check_policy_files(load_config(sys.argv[1])); assert c['environments']['Acrobot-v1']['target'] "
            "== 'probs'; assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr

    calls, real = [], crop.agents.importing.check_policy_file
    monkeypatch.setattr(crop.agents.importing, "check_policy_file", lambda *a: calls.append(a) or real(*a))
    check_policy_files(load_config(f))
    assert calls == []
    check_policy_files(load_config(_config(tmp_path, {"MyPPO": {"path": str(ppo), "format": "sb3"}})))
    assert len(calls) == 1                                       # another setting of the check
    f = _config(tmp_path, {"MyPPO": ppo})
    state_dict_file(ppo, (6, 32, 3))                                        # other bytes at the same path: a Q-network
    plain = load_config(f)
    assert check_policy_files(plain) is plain and len(calls) == 2
    for entry in (tmp_path / "cache" / "crop" / "policy-checks").iterdir():
        entry.write_text("garbage")                              # an unreadable memo is no verdict
    check_policy_files(load_config(f))
    assert len(calls) == 3


def test_a_target_that_does_not_fit_the_network_is_refused_at_validation(tmp_path, capsys):
    ppo, dqn = _ppo(tmp_path / "ppo.zip", 6, 3), state_dict_file(tmp_path / "dqn.pt")
    err = _one_line(["validate-config", str(_config(tmp_path, {"MyPPO": ppo}, target="q"))], capsys)
    assert "environments.Acrobot-v1.target: q for MyPPO, which has no Q-values to smooth; use probs or vote" in err
    err = _one_line(["validate-config", str(_config(tmp_path, {"MyDQN": dqn}, targets=["vote", "probs"]))],
                    capsys)
    assert "environments.Acrobot-v1.targets: probs for MyDQN, which is a Q-network" in err
    err = _one_line(["validate-config", str(_config(tmp_path, {"MyPPO": ppo, "MyDQN": dqn}))], capsys)
    assert ("environments.Acrobot-v1: MyPPO policy network(s) and MyDQN Q-network(s) have no smoothing target in "
            "common by default (probs, q); give target: vote") in err
    main(["validate-config", str(_config(tmp_path, {"MyPPO": ppo, "MyDQN": dqn}, target="vote"))])
    assert "valid" in capsys.readouterr().out


@pytest.mark.slow
def test_the_workflow_plans_probs_for_a_policy_network(tmp_path, repo):
    """No qrange job for a policy network with no target: its runs smooth probs (ENV/ALGO@probs)."""
    f = _config(tmp_path, {"MyPPO": _ppo(tmp_path / "ppo.zip", 6, 3)})
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "--cores", "1", "-n",
                        "-p", "--configfile", str(f), "--directory", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "crop qrange" not in p.stdout and "rule qrange" not in p.stdout
    assert f"MyPPO@probs/sigma-0.1/{RUN_FILES['loact']}" in p.stdout and "--target probs" in p.stdout


@pytest.mark.slow
def test_gre_by_hand_refuses_a_reward_range_whose_returns_overflow(tmp_path, capsys):
    big = "9" * 308   # 1e308 written as argparse takes a negative number
    err = _one_line(["gre", "--env", "Acrobot-v1", "--algo", "Mine", "--sigma", "0.1", "--checkpoint",
                     str(tmp_path / "model.pt"), "--reward-range", "-" + big, big, "--out",
                     str(tmp_path / "out" / RUN_FILES["gre"]), "--out-returns", str(tmp_path / "out" / "r.csv")],
                    capsys)
    assert "--reward-range: [-1e+308, 1e+308] over 200 steps gives [J_min, J_max] = [-inf, inf], not finite" in err, err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ 5. files a collaborator can read, one run

@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_results_follow_the_umask(umask, mode, tmp_path):
    from crop.io import atomic_write_bytes, write_json

    old = os.umask(umask)
    try:
        atomic_write_bytes(tmp_path / "a" / "x.csv", b"1\n")
        write_json(tmp_path / "a" / "y.json", {"a": 1})
        (tmp_path / "plain.txt").write_text("")   # what open() gives a new file
    finally:
        os.umask(old)
    for f in ("a/x.csv", "a/y.json", "plain.txt"):
        assert (tmp_path / f).stat().st_mode & 0o777 == mode, f


@pytest.mark.slow
def test_an_imported_checkpoint_follows_the_umask(tmp_path):
    src = state_dict_file(tmp_path / "dqn.pt", (4, 16, 2))
    p = subprocess.run(f"umask 022 && {sys.executable} -m crop import --env CartPole-v0 --algo Mine --file "
                       f"{src} --eval-episodes 1 --out {tmp_path / 'out' / 'model.pt'}", shell=True,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for f in ("model.pt", "model.json"):
        assert (tmp_path / "out" / f).stat().st_mode & 0o777 == 0o644, f


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_lock_taken_before_its_owner_is_recorded_is_not_cleared(tmp_path):
    """The gap: run A has taken Snakemake's lock but not yet recorded itself (onstart), so the owner record
    is still the previous, finished run's (a dead PID).  A run B starting then must not clear A's lock."""
    import json
    import socket

    from crop.workflow.runlock import clear_stale_lock, record_owner

    snake = tmp_path / ".snakemake"
    (snake / "locks").mkdir(parents=True)
    record_owner(snake)   # the previous run, while it held its lock …
    rec = json.loads((snake / "crop-owner.json").read_text())
    (snake / "crop-owner.json").write_text(json.dumps({**rec, "pid": _dead_pid()}))   # … has ended
    (snake / "locks" / "0.input.lock").write_text("A's inputs")   # run A locks: the gap
    (snake / "locks" / "0.output.lock").write_text("A's outputs")
    assert clear_stale_lock(snake) is None
    assert sorted(p.name for p in (snake / "locks").iterdir()) == ["0.input.lock", "0.output.lock"]
    # A records itself (onstart), then is killed: its lock is stale and is cleared
    record_owner(snake)
    rec = json.loads((snake / "crop-owner.json").read_text())
    assert [f[0] for f in rec["locks"]] == ["0.input.lock", "0.output.lock"] and rec["host"] == socket.gethostname()
    (snake / "crop-owner.json").write_text(json.dumps({**rec, "pid": _dead_pid()}))
    assert "cleared the lock left by a killed run" in clear_stale_lock(snake)
    assert not (snake / "locks").exists()
    # a live owner's lock is never cleared
    (snake / "locks").mkdir()
    (snake / "locks" / "0.input.lock").write_text("B")
    record_owner(snake)
    assert clear_stale_lock(snake) is None and (snake / "locks" / "0.input.lock").exists()


# ------------------------------------------------------------------ 4. captions in words

def test_report_params_are_words_and_the_captions_still_read_them(repo):
    """Snakemake's report prints a job's params as name={value}: the audit block and the caption settings
    show in words, not as a Python repr, and the captions (report/*.rst, Jinja) read their keys as before."""
    import jinja2
    from snakemake.logging import format_dict

    from crop.report.captions import audit_settings, caption_settings

    cfg = validate_config({**SMALL, "audit": {"reference": "paper"}})
    params = {"audit": audit_settings(cfg["audit"]), "settings": caption_settings(cfg)}
    shown = format_dict(params)
    assert "audit=α = 0.05; reference: the paper's published numbers; tolerances: built-in; strict: no" in shown
    assert "settings=CartPole-v0: StdTrain at σ ∈ {0.1}; LoAct m = " in shown
    assert "{'" not in shown and "None" not in shown
    assert repr(params["audit"]) == repr(cfg["audit"])   # Snakemake's record of the params is unchanged
    caption = (repo / "report" / "audit.rst").read_text()
    text = jinja2.Template(caption).render(snakemake={"params": params})
    assert "α = 0.05" in text and "``paper``" in text


@pytest.mark.slow
def test_a_probs_run_without_a_v_range_is_complete_for_the_audit(tmp_path):
    """A policy network's run (ENV/ALGO@probs/sigma-S) has no qrange stage: the audit takes it as complete."""
    import shutil

    from crop.audit.audit import audit
    from crop.report.integrity import stages_present

    from synthetic_results import make_results, runs_of

    runs = make_results(tmp_path, {"CartPole-v0": {"MyPPO": [0.1]}})
    (run,) = runs_of(runs)
    probs = tmp_path / run.replace("MyPPO", "MyPPO@probs")
    probs.parent.mkdir(parents=True)
    shutil.move(tmp_path / run, probs)
    (probs / RUN_FILES["qrange"]).unlink(missing_ok=True)
    full, absent, half = stages_present(probs)
    assert "qrange" not in full + absent and not half
    rep = audit(tmp_path, tmp_path / "audit")
    assert rep["incomplete_runs"] == [] and rep["runs"] == ["CartPole-v0/MyPPO@probs/sigma-0.1"]


@pytest.mark.slow
def test_a_run_starting_in_the_lock_gap_is_stopped_by_the_live_lock(tmp_path, repo):
    """The race: run A is stopped (SIGSTOP) just after Snakemake took its lock, before onstart records it as the
    owner, while the record still names the previous run's dead PID.  Run B, started then, must be stopped by A's
    lock, not clear it and proceed; A then finishes."""
    import json
    import signal
    import socket
    import time

    from crop.models import save_network

    save_network(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
                   tmp_path / "p.pt")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"results": "results", "environments": {"CartPole-v0": {
        "source": "file", "files": {"StdTrain": {"path": "p.pt"}}, "algorithms": ["StdTrain"], "sigmas": [0.1],
        "train": {"eval_episodes": 1}}}}))
    snake = tmp_path / ".snakemake"
    snake.mkdir()
    previous = subprocess.Popen([sys.executable, "-c", "pass"])
    previous.wait()
    (snake / "crop-owner.json").write_text(json.dumps({"pid": previous.pid, "host": socket.gethostname(),
                                                       "locks": []}))
    cmd = [sys.executable, "-m", "snakemake", "results/CartPole-v0/StdTrain/checkpoint/model.pt", "-s",
           str(repo / "Snakefile"), "--cores", "1", "--configfile", "c.yaml"]
    a = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # Snakemake writes its input lock, then its output lock, each file opened before its lines are
        # written, and checks for a conflict before either: a run stopped before its output lock is whole
        # does not stop B (Snakemake's own window, not the one under test).  Stop A once its lock is whole.
        t0, whole = time.time(), snake / "locks" / "0.output.lock"
        while not (whole.is_file() and whole.read_text().endswith("\n")):
            assert a.poll() is None and time.time() - t0 < 300, "run A ended before it locked"
            time.sleep(0.0005)
        os.kill(a.pid, signal.SIGSTOP)
        if json.loads((snake / "crop-owner.json").read_text())["pid"] != previous.pid:
            pytest.skip("run A recorded itself before it could be stopped: the gap was not caught this time")
        b = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert b.returncode != 0 and "LockException" in b.stdout + b.stderr, b.stdout[-2000:] + b.stderr[-2000:]
        assert "cleared the lock" not in b.stdout + b.stderr
    finally:
        os.kill(a.pid, signal.SIGCONT)
        out, _ = a.communicate(timeout=300)
    assert a.returncode == 0, out[-3000:]
    assert (tmp_path / "results/CartPole-v0/StdTrain/checkpoint/model.pt").is_file()


def test_a_carrl_network_is_counted_through_its_base():
    """CARRL's constructor bounds a real input (no meta tensors): its size is its base MLP's, bounded the same
    way, and a CARRL spec of a sound base builds (the default workflow derives one from StdTrain)."""
    from crop.models import build_network
    from crop.models.carrl import CarrlQ, carrl_spec

    base = {"arch": "mlp", "in": 4, "hidden": [128, 128], "out": 2}
    net = build_network(carrl_spec(base, 0.1, 2, "crown-ibp"))
    assert isinstance(net, CarrlQ) and sum(p.numel() for p in net.parameters()) == 4 * 128 + 128 * 128 + 128 * 2 + 258
    with pytest.raises(CheckpointError, match="over MLP 4→1000000000→2 has 7,000,000,002 parameters, over the limit"):
        build_network(carrl_spec({**base, "hidden": [1000000000]}, 0.1))
