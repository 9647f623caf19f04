"""docs/own-policy.md tested as written: each workflow config on the page validates — with its policy files
made as the page's training scripts save them, opened as the workflow opens them — and a policy network
gets the target the page promises; each architecture line is a network crop builds; each command of "By
hand" parses; the refusal the page quotes is the one `crop import` prints; the page names no path outside
the repository and promises nothing "to be described"."""
import re
import shlex
from pathlib import Path

import pytest
import yaml

from crop.__main__ import main
from crop.envs import default_profile, env_shapes
from crop.models import build_network
from crop.workflow.cli import build_parser
from crop.workflow.config import check_policy_files, load_config, validate_config

from networks import mlp, sb3_data, sb3_dqn_state, sb3_mlp_policy, sb3_zip
from paths import REPO

PAGE = (REPO / "docs" / "own-policy.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE, flags=re.S)


CONFIGS = [b for b in _blocks("yaml") if b.lstrip().startswith("results:")]


def _policy_file(path: Path, env: str) -> None:
    """The file a label names, as the page's scripts save it: an SB3 DQN or an SB3 PPO/A2C archive with the
    library's default MlpPolicy [64, 64] for ``env``."""
    n, (obs,) = env_shapes(env, default_profile(env))
    if "dqn" in path.name:
        sb3_zip(path, sb3_dqn_state(mlp([obs, 64, 64, n], 0), mlp([obs, 64, 64, n], 1)), sb3_data("DQN"))
    else:
        sb3_zip(path, sb3_mlp_policy([obs, 64, 64], [obs, 64, 64], n, seed=0)[0], sb3_data())


def test_the_page_has_a_dqn_and_a_ppo_config():
    assert len(CONFIGS) == 2


@pytest.mark.parametrize("block", CONFIGS, ids=["dqn", "ppo"])
def test_each_config_block_validates_with_its_files(block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(block)
    raw = yaml.safe_load(block)
    for env, ec in raw["environments"].items():
        for entry in ec["files"].values():
            _policy_file(tmp_path / entry["path"], env)
    main(["validate-config", "c.yaml"])
    n = sum(len(ec["algorithms"]) * len(ec["sigmas"]) for ec in raw["environments"].values())
    assert capsys.readouterr().out == f"c.yaml: valid ({n} certification targets)\n"
    cfg = check_policy_files(load_config("c.yaml"))
    for env, ec in cfg["environments"].items():
        # the page: a Q-network smooths q (the default, nothing written), a policy network probs
        policy = any("dqn" not in f["path"] for f in ec["files"].values())
        assert ec.get("target") == ("probs" if policy else None), env


def test_each_architecture_line_is_a_network_crop_builds():
    lines = [ln for b in _blocks("yaml") for ln in b.splitlines() if ln.startswith("architecture:")]
    assert len(lines) == 3
    for line in lines:
        arch = yaml.safe_load(line)["architecture"]
        build_network(arch)
        validate_config({"environments": {"Acrobot-v1": {
            "source": "file", "files": {"M": {"path": "m.pt", "architecture": arch}}, "algorithms": ["M"],
            "sigmas": [0.1], "rewards": {"range": [-1, 0]}}}})


def test_each_command_by_hand_parses():
    by_hand = PAGE.split("## By hand", 1)[1].split("##", 1)[0]
    block = re.search(r"```\n(.*?)```", by_hand, flags=re.S).group(1).replace("\\\n", " ")
    commands = [shlex.split(ln)[1:] for ln in block.splitlines() if ln.startswith("crop ")]
    assert {c[0] for c in commands} == {"import", "qrange", "loact", "gre"} and len(commands) == 6
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv)


def test_the_quoted_refusal_is_what_crop_import_prints(tmp_path, monkeypatch, capsys):
    quoted = re.search(r"```\n(crop import: error: acro\.zip: .*?)\n```", PAGE, flags=re.S).group(1)
    monkeypatch.chdir(tmp_path)
    sb3_zip(tmp_path / "acro.zip", sb3_dqn_state(mlp([6, 64, 64, 3], 0), mlp([6, 64, 64, 3], 1)), sb3_data("DQN"))
    with pytest.raises(SystemExit):
        main(["import", "--env", "CartPole-v0", "--algo", "Mine", "--file", "acro.zip", "--out", "out/model.pt"])
    assert capsys.readouterr().err.strip() == quoted


def test_the_page_promises_only_what_the_code_does():
    assert "/work/" not in PAGE and "DESIGN.md" not in PAGE
    assert "will be described" not in PAGE
    assert "PASS or FAIL" not in PAGE   # the audit's verdict is PASS, WARN or FAIL
    for link in re.findall(r"\]\(([^)#]+\.md)", PAGE):
        assert (REPO / "docs" / link).is_file(), link


def test_the_help_texts_name_policy_networks(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "DQN file" not in top
    assert "a Q-network, a policy network or a continuous-action actor" in " ".join(top.split())
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Import a Q-network (DQN) or a policy network (PPO, A2C" in text
    assert "Stable-Baselines3 DQN, PPO, A2C, SAC, TD3 or DDPG .zip" in text.replace("Stable- ", "Stable-")
