"""Certify your own work: an environment outside the paper's four, an Atari game other than Pong and
Freeway, a label of your own; sizes checked against the environment; every missing fact and every mismatch
refused with one line before anything is written.  Policy files are built here the way Stable-Baselines3
writes them (no SB3 needed)."""
import io
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from crop.audit.audit import discover_run_folders
from crop.envs import env_family, env_spec, make_env, profiles, restore, snapshot, snapshot_problem
from crop.io import meta_name
from crop.models import build_network
from crop.report.metrics import parse_run
from crop.workflow.config import ConfigError, validate_config
from crop.workflow.layout import RUN_FILES

from networks import mlp, sb3_data, sb3_dqn_state, sb3_zip
from paths import REPO

OWN = yaml.safe_load((REPO / "tests/configs/own_smoke.yaml").read_text())


def _cli(*args, cwd=None):
    """`crop ARGS…` in a subprocess: (exit status, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "crop", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd, env=env, timeout=900)
    return p.returncode, p.stdout, p.stderr


def _one_line_refusal(rc, err, *needles):
    lines = [ln for ln in err.splitlines() if "A.L.E:" not in ln and "[Powered by Stella]" not in ln]
    assert rc == 2 and len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _sb3_cnn_zip(path: Path, n_actions: int, fire: int | None = 1) -> Path:
    """An SB3 DQN CnnPolicy archive (NatureCNN ``features_extractor.cnn.0/2/4``, ``.linear.0``, head
    ``q_net.0``); the head's bias makes action ``fire`` the greedy one, so a Breakout episode ends soon."""
    torch.manual_seed(0)
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": n_actions})
    if fire is not None:
        with torch.no_grad():
            net[9].bias[fire] += 10.0
    names = {"0": "features_extractor.cnn.0", "2": "features_extractor.cnn.2", "4": "features_extractor.cnn.4",
             "7": "features_extractor.linear.0", "9": "q_net.0"}
    state = {}
    for k, v in net.state_dict().items():
        i, w = k.split(".")
        state[f"q_net.{names[i]}.{w}"] = v
        state[f"q_net_target.{names[i]}.{w}"] = v.clone()
    buf = io.BytesIO()
    torch.save(state, buf)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("data", json.dumps({"policy_class": "CnnPolicy"}))
        zf.writestr("policy.pth", buf.getvalue())
        zf.writestr("_stable_baselines3_version", "2.3.2")
    return path


# ---------------------------------------------------------------------------------------- environments

@pytest.mark.slow
def test_families_and_facts_from_the_environment():
    assert env_family("CartPole-v0") == "paper" and env_family("Acrobot-v1") == "vector"
    assert env_family("ALE/Breakout-v5") == "atari" and env_family("BreakoutNoFrameskip-v4") == "atari"
    assert env_family("merge-v0") == "highway"
    s = env_spec("Acrobot-v1")
    assert (s.n_actions, s.obs_shape, s.reward_range, s.profile) == (3, (6,), None, "vector")
    b = env_spec("ALE/Breakout-v5")
    assert (b.n_actions, b.obs_shape, b.reward_range) == (4, (4, 84, 84), (-1.0, 1.0))  # sign-clipped rewards
    assert b.paper_name == "ALE-Breakout-v5"   # a file name: no '/'
    m = env_spec("merge-v0", {"range": [0.0, 1.0]})
    assert m.obs_shape == (25,) and m.nonnegative_rewards and m.return_range(10) == (0.0, 10.0)
    a = env_spec("Acrobot-v1", {"range": [-1.0, 0.0], "return_range": [-500.0, 0.0]})
    assert a.return_range(10) == (-10.0, 0.0) and a.return_range(1000) == (-500.0, 0.0)
    assert not a.nonnegative_rewards
    # the paper's four keep their facts exactly
    assert env_spec("PongNoFrameskip-v4").reward_range == (-1.0, 1.0)
    assert env_spec("CartPole-v0").paper_name == "CartPole"


@pytest.mark.slow
def test_atari_v5_frameskip_and_sticky_actions_as_configured():
    e = make_env("ALE/Breakout-v5")
    ale = e.unwrapped.ale
    assert ale.getFloat("repeat_action_probability") == pytest.approx(0.25)   # v5's default, as SB3 keeps it
    assert e.unwrapped._frameskip == 1                                     # the wrappers skip 4 frames
    e0 = make_env("ALE/Breakout-v5", "cleanrl:sticky=0.0")
    assert e0.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    assert make_env("BreakoutNoFrameskip-v4").unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    assert profiles("ALE/Breakout-v5")[0] == "cleanrl" and profiles("BreakoutNoFrameskip-v4") == ["cleanrl"]
    with pytest.raises(ValueError, match="unknown preprocessing profile 'cleanrl:sticky=1.5'"):
        make_env("ALE/Breakout-v5", "cleanrl:sticky=1.5")


@pytest.mark.slow
def test_sticky_atari_snapshots_replay_exactly():
    """A snapshot holds the emulator's generator of sticky actions: two restores replay the same frames."""
    env = make_env("ALE/Breakout-v5")
    env.reset(seed=3)
    for a in [1, 2, 3, 2] * 3:
        env.step(a)
    snap = snapshot(env)
    actions = np.random.default_rng(0).integers(4, size=40)
    traces = []
    for _ in range(2):
        e = restore(env, snap)
        traces.append([(e.step(int(a))[0].tobytes()) for a in actions])
    assert traces[0] == traces[1]
    fresh = make_env("ALE/Breakout-v5", "cleanrl:sticky=0.0")
    fresh.reset(seed=3)
    assert snapshot_problem("ALE/Breakout-v5") is None


class _Unfaithful(gym.Env):
    """A Discrete-action env whose state lives outside what deepcopy copies (a global generator) and one that
    cannot be copied at all (a lock)."""

    action_space = gym.spaces.Discrete(2)
    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    lock = False

    def __init__(self):
        if self.lock:
            self._lock = threading.Lock()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, a):
        return np.random.random(3).astype(np.float32), float(a), False, False, {}


class _Locked(_Unfaithful):
    lock = True


gym.register("CropTestGlobalRng-v0", entry_point=_Unfaithful, max_episode_steps=50)
gym.register("CropTestLocked-v0", entry_point=_Locked, max_episode_steps=50)


def test_lore_refused_where_snapshots_are_not_faithful():
    assert "replay different transitions" in snapshot_problem("CropTestGlobalRng-v0")
    assert "deepcopy of it fails" in snapshot_problem("CropTestLocked-v0")
    assert snapshot_problem("Acrobot-v1") is None and snapshot_problem("MountainCar-v0") is None
    cfg = {"environments": {"CropTestLocked-v0": {"source": "file", "files": {"X": {"path": "x.pt"}},
                                                  "algorithms": ["X"], "sigmas": [0.1],
                                                  "rewards": {"range": [0, 1]}}}}
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert "\n" not in str(e.value) and "LoRe needs faithful snapshots of CropTestLocked-v0" in str(e.value)


# ------------------------------------------------------------------------------------- one-line refusals

def _own(mutate):
    cfg = json.loads(json.dumps(OWN))
    mutate(cfg["environments"]["Acrobot-v1"], cfg)
    return cfg


REFUSALS = [
    ("reward range unknown", lambda ec, c: ec.pop("rewards"), "environments.Acrobot-v1.rewards.range"),
    ("reward range upside down", lambda ec, c: ec.update(rewards={"range": [0.0, -1.0]}),
     "environments.Acrobot-v1.rewards.range: [0.0, -1.0] must be [low, high]"),
    ("own label without source file", lambda ec, c: ec.update(source="auto"),
     "'MyDQN' is not one of the paper's nine labels"),
    ("own label without its file", lambda ec, c: ec.update(files={}), "give environments.Acrobot-v1.files.MyDQN"),
    ("label with a space", lambda ec, c: ec.update(algorithms=["My DQN"]), "'My DQN' is not a valid label"),
    ("label too long", lambda ec, c: ec.update(algorithms=["x" * 41]), "is not a valid label"),
    ("label '..'", lambda ec, c: ec.update(algorithms=[".."]), "'..' is not a valid label"),
    ("label that looks like a run folder", lambda ec, c: ec.update(algorithms=["sigma-1"]), "not a valid label"),
    ("unknown profile", lambda ec, c: ec["files"]["MyDQN"].update(profile="cleanrl"),
     "unknown preprocessing profile 'cleanrl'"),
    ("continuous actions with a target", lambda ec, c: c["environments"].update(
        {"Pendulum-v1": {**c["environments"].pop("Acrobot-v1"), "target": "q"}}),
     "environments.Pendulum-v1.target: its actions are continuous (a Box)"),
    ("unregistered id", lambda ec, c: c["environments"].update({"Acrobat-v1": c["environments"].pop("Acrobot-v1")}),
     "unknown environment 'Acrobat-v1' (did you mean 'Acrobot-v1'?)"),
    ("facts of a paper environment", lambda ec, c: c["environments"].update(
        {"CartPole-v0": {"algorithms": ["StdTrain"], "sigmas": [0.1], "rewards": {"range": [0, 2]}}}),
     "CartPole-v0 is one of the paper's environments"),
    ("highway family without its reward range", lambda ec, c: c["environments"].update(
        {"merge-v0": {"source": "file", "files": {"A": {"path": "a.pt"}}, "algorithms": ["A"], "sigmas": [0.1]}}),
     "environments.merge-v0.rewards.range"),
]


@pytest.mark.parametrize("name,mutate,needle", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_config_refusals_are_one_line(name, mutate, needle):
    with pytest.raises(ConfigError) as e:
        validate_config(_own(mutate))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


def test_own_config_valid_with_any_label_and_atari_without_reward_facts():
    cfg = validate_config(_own(lambda ec, c: ec.update(algorithms=["MyDQN"], files={"MyDQN": {"path": "a.zip"}})))
    assert cfg["environments"]["Acrobot-v1"]["algorithms"] == ["MyDQN"]
    for label in ("A", "ppo_v2.1+aug", "_x", "Z" * 40):
        validate_config(_own(lambda ec, c: ec.update(algorithms=[label], files={label: {"path": "a.zip"}})))
    validate_config({"environments": {"ALE/Breakout-v5": {   # Atari: sign-clipped rewards, [-1, 1] known
        "source": "file", "files": {"Mine": {"path": "b.zip", "profile": "cleanrl:sticky=0.0"}},
        "algorithms": ["Mine"], "sigmas": [0.01]}}})


@pytest.mark.slow
def test_import_sizes_checked_against_the_environment(tmp_path):
    acro = sb3_zip(tmp_path / "acro.zip", sb3_dqn_state(mlp([6, 64, 64, 3], 0), mlp([6, 64, 64, 3], 1)),
                   sb3_data("DQN"))
    three = sb3_zip(tmp_path / "three.zip", sb3_dqn_state(mlp([4, 64, 64, 3], 0), mlp([4, 64, 64, 3], 1)),
                    sb3_data("DQN"))
    cases = [("CartPole-v0", acro, "takes input (6,) and gives 3 outputs, but CartPole-v0 (profile vector) gives "
                                   "observations of shape (4,) and has 2 actions"),
             ("CartPole-v0", three, "takes input (4,) and gives 3 outputs, but CartPole-v0"),
             ("ALE/Breakout-v5", acro, "ALE/Breakout-v5 (profile cleanrl) gives observations of shape (4, 84, 84)"),
             ("Acrobot-v1", _sb3_cnn_zip(tmp_path / "cnn.zip", 4), "takes input (4, 84, 84) and gives 4 outputs, "
                                                                   "but Acrobot-v1 (profile vector) gives observations "
                                                                   "of shape (6,) and has 3 actions")]
    for env, src, needle in cases:
        out = tmp_path / "ck" / env / "model.pt"
        rc, _, err = _cli("import", "--env", env, "--algo", "MyDQN", "--file", src, "--eval-episodes", "1",
                          "--arch", '{"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 4}'
                          if src.name == "cnn.zip" else "mlp", "--out", out)
        _one_line_refusal(rc, err, needle)
        assert not out.parent.exists()   # nothing written


@pytest.mark.slow
def test_checkpoint_used_on_another_environment_is_one_line(tmp_path):
    """A model.json edited to name another environment is refused when the checkpoint is used."""
    acro = sb3_zip(tmp_path / "acro.zip", sb3_dqn_state(mlp([6, 16, 3], 0), mlp([6, 16, 3], 1)), sb3_data("DQN"))
    ck = tmp_path / "Acrobot-v1" / "Mine" / "checkpoint" / "model.pt"
    rc, out, err = _cli("import", "--env", "Acrobot-v1", "--algo", "Mine", "--file", acro, "--eval-episodes", "1",
                        "--out", ck)
    assert rc == 0, err
    rec = json.loads(ck.with_suffix(".json").read_text())
    rec["env"] = "MountainCar-v0"
    ck.with_suffix(".json").write_text(json.dumps(rec))
    rc, _, err = _cli("qrange", "--env", "MountainCar-v0", "--algo", "Mine", "--sigma", "0.1", "--checkpoint", ck,
                      "--m", "8", "--episodes", "1", "--horizon", "2", "--out", tmp_path / "q.json")
    _one_line_refusal(rc, err, "takes input (6,) and gives 3 outputs, but MountainCar-v0 (profile vector) gives "
                               "observations of shape (2,)")
    assert not (tmp_path / "q.json").exists()


@pytest.mark.slow
def test_gre_and_lore_need_the_reward_range_loact_does_not(tmp_path):
    acro = sb3_zip(tmp_path / "acro.zip", sb3_dqn_state(mlp([6, 16, 3], 0), mlp([6, 16, 3], 1)), sb3_data("DQN"))
    ck = tmp_path / "Acrobot-v1" / "Mine" / "checkpoint" / "model.pt"
    assert _cli("import", "--env", "Acrobot-v1", "--algo", "Mine", "--file", acro, "--eval-episodes", "1",
                "--out", ck)[0] == 0
    common = ["--env", "Acrobot-v1", "--algo", "Mine", "--sigma", "0.05", "--checkpoint", ck]
    q = tmp_path / RUN_FILES["qrange"]
    assert _cli("qrange", *common, "--m", "16", "--episodes", "1", "--horizon", "3", "--out", q)[0] == 0
    rc, _, err = _cli("loact", *common, "--qrange", q, "--m", "32", "--episodes", "1", "--horizon", "4",
                      "--out", tmp_path / RUN_FILES["loact"])
    assert rc == 0, err
    assert set(pd.read_csv(tmp_path / RUN_FILES["loact"])["action"]) <= {0, 1, 2}
    rc, _, err = _cli("gre", *common, "--m", "4", "--horizon", "3", "--out", tmp_path / RUN_FILES["gre"],
                      "--out-returns", tmp_path / "r.csv")
    _one_line_refusal(rc, err, "environments.Acrobot-v1.rewards.range", "--reward-range LOW HIGH")
    rc, _, err = _cli("lore", *common, "--qrange", q, "--m", "16", "--horizon", "1", "--out",
                      tmp_path / RUN_FILES["lore"])
    _one_line_refusal(rc, err, "environments.Acrobot-v1.rewards.range")
    assert not (tmp_path / RUN_FILES["gre"]).exists() and not (tmp_path / RUN_FILES["lore"]).exists()
    # a declared range that the rewards break stops the search that prunes on it (never an unsound bound)
    rc, _, err = _cli("lore", *common, "--qrange", q, "--m", "16", "--horizon", "2", "--reward-range", "0", "1",
                      "--no-progress", "--out", tmp_path / RUN_FILES["lore"])
    _one_line_refusal(rc, err, "reward -1.0 < 0 in a search that prunes")
    assert not (tmp_path / RUN_FILES["lore"]).exists()
    rc, _, err = _cli("gre", *common, "--m", "4", "--horizon", "3", "--reward-range", "0", "1", "--no-progress",
                      "--out", tmp_path / RUN_FILES["gre"], "--out-returns", tmp_path / "r.csv")
    _one_line_refusal(rc, err, "leave [J_min, J_max] = [0, 3] of the declared reward range")
    assert not (tmp_path / RUN_FILES["gre"]).exists()
    rc, _, err = _cli("gre", *common, "--m", "4", "--horizon", "3", "--reward-range", "-1", "0", "--eps-factors", "0",
                      "0.1", "--out", tmp_path / RUN_FILES["gre"], "--out-returns", tmp_path / "r.csv")
    assert rc == 0, err
    g = pd.read_csv(tmp_path / RUN_FILES["gre"])
    assert (g["j_min"] == -3.0).all() and (g["j_max"] == 0.0).all()


# ------------------------------------------------------------------------------------ Atari: Breakout v5

@pytest.mark.slow
def test_breakout_v5_loact_and_gre_at_tiny_m(tmp_path):
    src = _sb3_cnn_zip(tmp_path / "breakout.zip", 4)
    d = tmp_path / "ALE" / "Breakout-v5" / "MyCNN"
    ck = d / "checkpoint" / "model.pt"
    rc, out, err = _cli("import", "--env", "ALE/Breakout-v5", "--algo", "MyCNN", "--file", src, "--eval-episodes", "1",
                        "--arch", '{"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 4}', "--out", ck)
    assert rc == 0, err
    rec = json.loads(ck.with_suffix(".json").read_text())
    assert rec["profile"] == "cleanrl" and rec["net_spec"]["out"] == 4 and rec["imported_from"]["format"] == "sb3"
    run = d / "sigma-0.01"
    common = ["--env", "ALE/Breakout-v5", "--algo", "MyCNN", "--sigma", "0.01", "--checkpoint", ck]
    q = run / RUN_FILES["qrange"]
    rc, _, err = _cli("qrange", *common, "--m", "8", "--episodes", "1", "--horizon", "3", "--out", q)
    assert rc == 0, err
    rc, _, err = _cli("loact", *common, "--qrange", q, "--m", "16", "--episodes", "1", "--horizon", "4", "--out",
                      run / RUN_FILES["loact"])
    assert rc == 0, err
    st = pd.read_csv(run / RUN_FILES["loact"])
    assert len(st) == 4 and set(st["action"]) <= {0, 1, 2, 3} and (st["radius"] >= 0).all()
    rc, _, err = _cli("gre", *common, "--m", "4", "--horizon", "4", "--eps-factors", "0", "0.1",
                      "--out", run / RUN_FILES["gre"], "--out-returns", run / RUN_FILES["gre_returns"])
    assert rc == 0, err
    g = pd.read_csv(run / RUN_FILES["gre"])
    assert (g["j_min"] == -4.0).all() and (g["j_max"] == 4.0).all() and (g["m"] == 4).all()
    r = pd.read_csv(run / RUN_FILES["gre_returns"])["return"]
    assert len(r) == 4 and r.between(-4, 4).all()
    assert (g["expectation_bound"] <= g["mean_return"] + 1e-9).all()
    # the report reads this folder as one run of the namespaced environment
    assert discover_run_folders(tmp_path) == ["ALE/Breakout-v5/MyCNN/sigma-0.01"]
    assert parse_run("ALE/Breakout-v5/MyCNN/sigma-0.01") == ("ALE/Breakout-v5", "MyCNN", "0.01")


# --------------------------------------------------------------------------------- the whole workflow

def _workflow(config: str, work: Path) -> None:
    """The whole workflow on tests/configs/CONFIG in ``work``, on 2 cores; it must succeed."""
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(work),
                        "--cores", "2", "--configfile", str(REPO / "tests/configs" / config)],
                       capture_output=True, text=True, timeout=1200, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]


@pytest.mark.slow
def test_acrobot_whole_workflow_with_a_label_of_its_own(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    sb3_zip(work / "acrobot_dqn.zip", sb3_dqn_state(mlp([6, 64, 64, 3], 0), mlp([6, 64, 64, 3], 1)), sb3_data("DQN"))
    _workflow("own_smoke.yaml", work)
    res = work / "results-own"
    audit = json.loads((res / "audit/audit.json").read_text())
    assert audit["passed"] and audit["violations"] == 0 and audit["integrity_problems"] == 0 and audit["checked"] > 0
    rec = json.loads((res / "Acrobot-v1/MyDQN/checkpoint/model.json").read_text())
    assert rec["source"] == "file" and rec["profile"] == "vector" and rec["net_spec"]["in"] == 6
    run = res / "Acrobot-v1/MyDQN/sigma-0.05"
    g = pd.read_csv(run / RUN_FILES["gre"])
    assert (g["j_min"] == -10.0).all() and (g["j_max"] == 0.0).all()   # H = 10 steps of reward in [-1, 0]
    lore_meta = json.loads((run / meta_name(RUN_FILES["lore"])).read_text())
    assert lore_meta["search"]["pruning"] is False   # Acrobot's rewards are negative: no pruning
    assert "MyDQN" in (res / "tables/Acrobot-v1_mean_radius.md").read_text()
    for stem in ("Acrobot-v1_legend", "Acrobot-v1_stepwise", "Acrobot-v1_all_bounds"):
        assert (res / "figures" / f"{stem}.png").is_file()


# ------------------------------------------------------------------------------ labels in the report

@pytest.mark.slow
def test_own_labels_get_their_own_colour_marker_rows_and_not_in_the_paper(tmp_path):
    import matplotlib
    from matplotlib.colors import to_hex

    from crop.report import figures, style, tables
    from crop.report.metrics import load_runs
    from crop.workflow.config import ALGORITHMS

    from synthetic_results import audit_cli, make_results, runs_of

    own = ["MyDQN", "ppo_v2.1+aug", "Zeta"]
    plan = {"CartPole-v0": {a: [0.1] for a in ["StdTrain", "CARRL", *own]}}
    runs = make_results(tmp_path, plan)
    data = load_runs(tmp_path, runs_of(runs))
    style.register_labels(own)
    styles = {a: (to_hex(style.algo_color(a)), style.algo_marker(a)) for a in ["StdTrain", "CARRL", *own]}
    assert styles["StdTrain"] == (style.ALGO_COLORS["StdTrain"], "o") and styles["CARRL"][1] == "X"  # the nine keep
    assert len(set(styles.values())) == 5 and len({c for c, _ in styles.values()}) == 5
    assert len({m for _, m in styles.values()}) == 5
    assert not {c for c, _ in styles.values() if c not in style.ALGO_COLORS.values()} & set(style.ALGO_COLORS.values())
    assert list(style.ALGO_COLORS) == ALGORITHMS   # the nine's table is not extended
    drawn = set()
    for stem, fig in figures.iter_env_figures("CartPole-v0", data):
        for ax in fig.axes:
            for line in ax.get_lines():
                gid = line.get_gid() or ""
                if gid.startswith("bound:"):
                    a = gid.split(":", 1)[1]
                    assert (to_hex(line.get_color()), line.get_marker()) == styles[a], (stem, gid)
                    drawn.add(a)
        matplotlib.pyplot.close(fig)
    assert drawn == set(styles)
    table, _ = tables.env_tables("CartPole-v0", data, [0.0])["mean_radius"]
    assert list(table["algo"]) == ["StdTrain", "CARRL", "MyDQN", "Zeta", "ppo_v2.1+aug"]   # the nine, then yours
    out = tmp_path / "audit"
    assert audit_cli(tmp_path, "--runs", *runs_of(runs), "--reference", "paper", "--out-dir", out) == 0
    md = (out / "reproduction.md").read_text()
    assert "Not in the paper: `MyDQN`, `Zeta`, `ppo_v2.1+aug`" in md
    assert "| MyDQN | 0.1 | benign_return | — |" in md and "not in the paper |" in md


@pytest.mark.slow
def test_breakout_whole_workflow_in_namespaced_folders(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    _sb3_cnn_zip(work / "breakout.zip", 4)
    _workflow("ale_smoke.yaml", work)
    res = work / "results-ale"
    audit = json.loads((res / "audit/audit.json").read_text())
    assert audit["passed"] and audit["violations"] == 0 and audit["integrity_problems"] == 0
    run = res / "ALE/Breakout-v5/MyCNN/sigma-0.01"
    # rewards.range [0, 1]
    assert json.loads((run / meta_name(RUN_FILES["lore"])).read_text())["search"]["pruning"] is True
    assert (res / "figures/ALE-Breakout-v5_stepwise.png").is_file()
    assert "MyCNN" in (res / "tables/ALE-Breakout-v5_benign_return.md").read_text()


def test_lunar_lander_is_one_line_with_or_without_box2d():
    """Box2D installed: LunarLander-v3 is a vector environment whose world deepcopy cannot copy, so LoRe (and with
    it the workflow) is refused; not installed: the id cannot be made.  One line either way."""
    cfg = {"environments": {"LunarLander-v3": {"source": "file", "files": {"X": {"path": "x.zip"}},
                                               "algorithms": ["X"], "sigmas": [0.1],
                                               "rewards": {"range": [-100.0, 100.0]}}}}
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config: environments.LunarLander-v3: ")
    assert "Box2D" in msg or "LoRe needs faithful snapshots" in msg, msg
