"""`crop certify`'s --out (docs/own-policy.md, "In one command"): it writes only into a new or empty folder, or
one it made for the same agent, environment and label (crop-certify.json says so); anything else is refused in
one line naming the folder and --force, before anything is written, with every file there byte for byte as it
was; Snakemake's own state lives in --out.  And a newcomer's errors: a mistyped flag gets certify's usage and
the closest flag; a missing file is refused before torch is imported."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crop.__main__ import main
from crop.workflow.certify_config import MARKER

from certify_helpers import cartpole_dqn, refused
from networks import box_space, mlp, sb3_data, sb3_mlp_policy, sb3_sac, sb3_zip
from paths import REPO


def _tree(root: Path) -> dict:
    """Every file under ``root`` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def agent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return cartpole_dqn(tmp_path / "dqn.zip")


@pytest.fixture
def workflow(monkeypatch):
    """Snakemake's calls, recorded instead of run (the first fails, so certify stops after writing its config)."""
    calls = []

    def fake(out, *argv):
        calls.append((out, argv))
        return subprocess.CompletedProcess(argv, 1)

    monkeypatch.setattr("crop.handlers.certify.snakemake", fake)
    return calls


def _user_folder(root: Path) -> Path:
    (root / "results").mkdir(parents=True)
    (root / "config.yaml").write_text("results: mine\n# my own config\n")
    (root / "report.html").write_text("<html>my report</html>")
    (root / "results" / "mydata.csv").write_text("a,b\n1,2\n")
    return root


@pytest.mark.parametrize("case", ["user folder", "working directory", "another agent", "another environment"])
def test_a_folder_of_someone_else_is_refused_and_left_byte_for_byte(case, agent, tmp_path, capsys, workflow):
    out = _user_folder(tmp_path / "mine")
    if case == "another agent":     # made by crop certify, for a file of other bytes
        (out / MARKER).write_text(json.dumps({"env": "CartPole-v1", "algo": "Mine", "policy": "/x/other.zip",
                                              "sha256": "0" * 64}))
    if case == "another environment":
        main_args = ["dqn.zip", "--env", "CartPole-v0", "--out", "mine"]
        (out / MARKER).write_text(json.dumps({"env": "CartPole-v1", "algo": "Mine", "policy": str(agent),
                                              "sha256": hashlib.sha256(agent.read_bytes()).hexdigest()}))
    before = _tree(tmp_path)
    argv = (["dqn.zip", "--env", "CartPole-v1", "--out", "."] if case == "working directory" else
            main_args if case == "another environment" else ["dqn.zip", "--env", "CartPole-v1", "--out", "mine"])
    err = refused(argv, capsys)
    named = tmp_path if case == "working directory" else out
    assert f"--out {named}:" in err and "--force" in err, err
    assert _tree(tmp_path) == before and not workflow
    assert not (tmp_path / ".snakemake").exists()


@pytest.mark.parametrize("under", [False, True])
def test_out_naming_a_file_is_one_line(under, agent, tmp_path, capsys, workflow):
    (tmp_path / "notes.txt").write_text("mine")
    before = _tree(tmp_path)
    err = refused(["dqn.zip", "--env", "CartPole-v1", "--out", "notes.txt/sub" if under else "notes.txt"], capsys)
    assert "is a file, not a folder" in err and str(tmp_path / "notes.txt") in err, err
    assert _tree(tmp_path) == before and not workflow


@pytest.mark.parametrize("case", ["new", "empty", "same agent", "force"])
def test_a_new_empty_own_or_forced_folder_is_written_and_snakemake_runs_in_it(case, agent, tmp_path, workflow):
    out = tmp_path / "deep" / "mine"
    if case == "empty":
        out.mkdir(parents=True)
    if case == "force":
        _user_folder(out)
    if case == "same agent":   # a first certify made it; the second writes the same config and marker
        with pytest.raises(SystemExit):
            main(["certify", "dqn.zip", "--env", "CartPole-v1", "--out", str(out)])
        (out / "results").mkdir()
        (out / "results" / "done.csv").write_text("kept\n")
    before = _tree(out) if out.exists() else {}
    with pytest.raises(SystemExit) as e:
        main(["certify", "dqn.zip", "--env", "CartPole-v1", "--out", str(out), *["--force"][:case == "force"]])
    assert e.value.code == 1    # the (fake) workflow failed, after the config was written
    marker = json.loads((out / MARKER).read_text())
    assert marker["env"] == "CartPole-v1" and marker["algo"] == "Mine" and marker["policy"] == str(agent)
    after = _tree(out)
    if case == "same agent":
        assert after == before
    if case == "force":     # only config.yaml (and the marker) replaced; the user's data left as it was
        assert {k for k in before if before[k] != after.get(k)} == {"config.yaml"}
    # Snakemake's state (.snakemake/) is the folder's: every call runs with --directory OUT
    assert workflow and workflow[-1][0] == out
    assert "--directory " + str(out) in (out / "config.yaml").read_text().splitlines()[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "dqn.zip"]


def test_a_mistyped_flag_gets_certifys_usage_and_the_closest_flag(agent, capsys):
    with pytest.raises(SystemExit) as e:
        main(["certify", "dqn.zip", "--env", "CartPole-v1", "--sigmas", "0.1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: crop certify"), err
    assert "--sigmas (did you mean --sigma?)" in err.splitlines()[-1]


def test_a_missing_file_is_refused_before_torch_is_imported(tmp_path):
    code = ("import sys\nfrom crop.__main__ import main\n"
            "try:\n    main(['certify', 'nothere.zip', '--env', 'CartPole-v1'])\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules, 'pandas' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.stdout.split() == ["2", "False", "False"], p.stdout + p.stderr
    assert p.stderr.strip() == f"crop certify: error: {tmp_path / 'nothere.zip'}: no such file"
    assert list(tmp_path.iterdir()) == []


def _linear_sac(path: Path) -> Path:
    """An SB3 SAC on Pendulum-v1 with no hidden layer: action = 2·tanh(0.5·cos θ), whose slope 0.8–1 makes the
    percentile interval at ε = 0 narrow and each one at ε > 0 wider by about ε·slope on both sides."""
    import torch

    mu, log_std = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    with torch.no_grad():
        mu.weight.copy_(torch.tensor([[0.5, 0.0, 0.0]]))
        mu.bias.zero_()
    state = {**{f"actor.mu.{k}": v for k, v in mu.state_dict().items()},
             **{f"actor.log_std.{k}": v for k, v in log_std.state_dict().items()},
             **{f"critic.qf0.{k}": v for k, v in mlp([4, 16, 1], 20).state_dict().items()}}
    data = {"action_space": box_space([-2.0], [2.0]), "policy_kwargs": {"net_arch": [], "n_critics": 1},
            "policy_class": {":type:": "<class 'abc.ABCMeta'>", "__module__": "stable_baselines3.sac.policies"}}
    return sb3_zip(path, state, data)


def test_a_box_agent_of_radius_0_at_every_step_certifies_no_step(tmp_path):
    """A tolerance between every step's interval width at ε = 0 and at the grid's first ε > 0 gives radius 0 at
    every step: no step is certified — in loact.csv, in the line crop certify prints, in the report's
    certified fraction and its mean radius of the certified steps."""
    import pandas as pd

    from crop.handlers.certify import loact_line
    from crop.report.metrics import _per_step, metric_value
    from crop.workflow.layout import RUN_FILES

    main(["import", "--env", "Pendulum-v1", "--algo", "SAC", "--file", str(_linear_sac(tmp_path / "sac.zip")),
          "--eval-episodes", "1", "--out", str(tmp_path / "model.pt")])
    f = {k: tmp_path / RUN_FILES[k] for k in ("loact", "loact_episodes", "certified_ratio")}

    def loact(tolerance):
        main(["loact", "--env", "Pendulum-v1", "--algo", "SAC", "--sigma", "0.1", "--checkpoint",
              str(tmp_path / "model.pt"), "--m", "2000", "--episodes", "2", "--horizon", "10", "--action-tolerance",
              str(tolerance), "--out", str(f["loact"]), "--out-episodes", str(f["loact_episodes"]),
              "--out-ratio", str(f["certified_ratio"])])
        return pd.read_csv(f["loact"])

    wide = loact(4.0)    # the intervals do not depend on the tolerance (same noise): only the radius does
    at_0, at_1 = wide["upper_e0"] - wide["lower_e0"], wide["upper_e0.25"] - wide["lower_e0.25"]
    assert at_0.max() < at_1.min(), (at_0.max(), at_1.min())
    table = loact(float(at_0.max() + at_1.min()) / 2)
    np.testing.assert_array_equal(table["upper_e0"], wide["upper_e0"])
    assert (table["radius"] == 0).all() and not table["certified"].any()
    line = loact_line(table, box=True)
    assert f"LoAct: 0.0% of {len(table)} steps certified (radius > 0), mean radius 0;" in line, line
    run = {"loact": table}
    _per_step(run)
    assert metric_value(run, "certified_fraction") == 0.0 and metric_value(run, "mean_radius") == 0.0
    assert pd.read_csv(f["loact_episodes"])["certified_fraction"].eq(0).all()
    assert wide["certified"].all() and (wide["radius"] > 0).all()   # at a wide tolerance, every step is


@pytest.mark.parametrize("env, horizon", [("CartPole-v1", 500), ("MountainCar-v0", 200), ("Pendulum-v1", 200),
                                          ("CartPole-v0", 200), ("highway-fast-v0", 50)])
def test_the_quick_horizon_is_the_episode_capped_and_flags_replace_it(env, horizon):
    from crop.workflow.certify_config import QUICK_MAX_HORIZON, budget_sizes, quick_horizon

    sizes, _ = budget_sizes("quick", env)
    assert {sizes[s]["horizon"] for s in ("qrange", "loact", "gre")} == {horizon} == {quick_horizon(env)[0]}
    assert horizon <= QUICK_MAX_HORIZON
    for budget in ("quick", "paper"):
        sizes, _ = budget_sizes(budget, env, horizon=7, episodes=3, m=123)
        assert {sizes[s]["horizon"] for s in ("qrange", "loact", "gre") if s in sizes} == {7}
        assert sizes["loact"]["episodes"] == 3 and {sizes[s]["m"] for s in ("loact", "gre", "lore")} == {123}
        assert sizes["lore"]["horizon"] != 7    # LoRe's depth is its own


def test_an_episode_longer_than_the_cap_is_cut_to_it():
    import gymnasium as gym

    from crop.workflow.certify_config import QUICK_MAX_HORIZON, quick_horizon

    gym.register("CropLongCartPole-v1", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                 max_episode_steps=10 * QUICK_MAX_HORIZON)
    try:
        h, why = quick_horizon("CropLongCartPole-v1")
    finally:
        del gym.registry["CropLongCartPole-v1"]
    assert h == QUICK_MAX_HORIZON and f"episode of {10 * QUICK_MAX_HORIZON} steps, capped" in why


def test_a_box_agents_captions_quote_no_stage_that_never_ran():
    """A continuous-action agent runs no LoRe and no local attack: no rendered caption of the report
    (report/{family}.rst) quotes their settings; a discrete agent's still do."""
    import jinja2

    from crop.report.captions import caption_settings
    from crop.workflow.config import validate_config
    from crop.workflow.layout import FIGURE_FAMILIES

    ec = {"source": "file", "files": {"Mine": {"path": "a.pt"}}, "algorithms": ["Mine"], "sigmas": [0.1]}
    for env, box in (("Pendulum-v1", True), ("CartPole-v0", False)):
        cfg = validate_config({"environments": {env: {**ec, **({"rewards": {"range": [-16.3, 0.0]}} if box else {})}}})
        params = {"settings": caption_settings(cfg), "alpha": cfg["alpha"]}
        texts = [jinja2.Template((REPO / "report" / f"{f}.rst").read_text()).render(snakemake={"params": params})
                 for f in FIGURE_FAMILIES]
        lore = caption_settings(cfg)[env]["lore"] if not box else "horizon H = "
        assert any(lore in t for t in texts) != box and any("local (from LoRe" in t for t in texts) != box
        assert ("LoRe m = " in params["settings"].text) != box


def test_the_target_is_auto_unless_target_says_otherwise(agent, tmp_path, capsys, workflow):
    """A Q-network's config gets target auto, or --target's; a target the network has not, or any --target
    for a Box agent, is refused in one line naming --target, before anything is written."""
    import yaml

    for given, want in ((None, "auto"), ("vote", "vote"), ("q", "q")):
        out = tmp_path / f"out-{want}"
        flags = ["--target", given] if given else []
        with pytest.raises(SystemExit):
            main(["certify", "dqn.zip", "--env", "CartPole-v1", "--out", str(out), *flags])
        assert yaml.safe_load((out / "config.yaml").read_text())["environments"]["CartPole-v1"]["target"] == want
        assert f"smoothing target {want}" in capsys.readouterr().out
    sb3_zip(tmp_path / "ppo.zip", sb3_mlp_policy([4, 64, 64], [4, 64, 64], 2, 0)[0], sb3_data("PPO"))
    sb3_sac(tmp_path / "sac.zip")
    before = _tree(tmp_path)
    err = refused(["ppo.zip", "--env", "CartPole-v1", "--target", "q", "--out", "new"], capsys)
    assert err.startswith("crop certify: error: --target: q for Mine, which has no Q-values"), err
    err = refused(["sac.zip", "--env", "Pendulum-v1", "--target", "vote", "--out", "new"], capsys)
    assert err.startswith("crop certify: error: --target: Pendulum-v1 has continuous actions"), err
    assert _tree(tmp_path) == before
