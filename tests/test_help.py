"""What `crop --help` says each command accepts is what its code accepts: a command whose own early check lets
a continuous (Box) action space through (Pendulum-v1) must not claim Discrete actions, and one that refuses it
must say so; a config's relative policy path is read from the working directory, as docs/configuration.md
says, never from the config file's folder."""
import argparse
import os
import re

import pytest
import yaml

from crop.__main__ import main
from crop.workflow.cli import build_parser
from crop.workflow.stage_table import STAGES

from networks import sb3_sac, state_dict_file

BOX, DISCRETE = "Pendulum-v1", "CartPole-v1"


def _subparsers() -> tuple[dict, dict]:
    """({command: its parser}, {command: its line in crop --help})."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices, {a.dest: a.help for a in sub._choices_actions}


def _env_help(parser) -> str | None:
    return next((a.help for a in parser._actions if "--env" in a.option_strings), None)


def _accepts(command: str, env: str, tmp_path) -> bool:
    """Whether ``command``'s own first check lets ``env`` through, asked of the code that makes it (no
    training, fetching or certifying: only the check each runs before any work)."""
    from crop.handlers.stages import resolve_target
    from crop.io import InputError

    if command in STAGES:   # the network of a Box environment is an actor, of a Discrete one a Q-network
        network = "actor" if env == BOX else "q"
        args = argparse.Namespace(command=command, target=None, checkpoint="model.pt")
        try:
            resolve_target(args, {"network": network})
        except InputError:
            return False
        return True
    if command in ("train", "derive"):
        from crop.train import prepare_training

        try:
            prepare_training(env, "StdTrain" if command == "train" else "CARRL")
        except ValueError:
            return False
        return True
    if command == "fetch":   # any published checkpoint for this environment
        from crop.handlers.policies import _source

        ok = False
        for algo in ("StdTrain", "GaussAug", "AdvTrain", "SA-MDP-PGD", "SA-MDP-CVX", "RadialRL", "CARRL",
                     "NoisyNet", "GradDQN"):
            try:
                _source(argparse.Namespace(env=env, algo=algo, file=None), "published", "published")
                ok = True
            except InputError:
                pass
        return ok
    if command in ("import", "checkpoint", "certify"):   # theirs is crop import's check
        from crop.agents.importing import PolicyImportError, check_policy_file
        from crop.envs import default_profile

        if env == BOX:
            path = sb3_sac(tmp_path / "sac.zip")[0]
        else:
            path = state_dict_file(tmp_path / "dqn.pt", (4, 8, 2))
        try:
            check_policy_file(path, "mlp", "auto", None, env, default_profile(env))
        except PolicyImportError:
            return False
        return True
    raise AssertionError(f"crop {command} takes --env: say here how its code accepts an environment")


_DISCRETE_CLAIM = re.compile(r"\bDiscrete\b", re.I)


def test_each_command_help_names_the_action_spaces_its_code_accepts(tmp_path):
    parsers, lines = _subparsers()
    checked = []
    for command, parser in parsers.items():
        env_help = _env_help(parser)
        if env_help is None or command == "calibrate":   # calibrate's --env: measured environments, any id
            continue
        box = _accepts(command, BOX, tmp_path)
        # a command that takes no environment at all would make the probe meaningless
        assert command == "fetch" or _accepts(command, DISCRETE, tmp_path), command
        claim = "Discrete actions only" in env_help
        if box:
            assert not claim and "Box" in env_help, (command, env_help)
            for text in (lines[command], parser.description):
                assert not _DISCRETE_CLAIM.search(text), (command, text)
        else:
            assert claim, (command, env_help)
        checked.append((command, box))
    assert dict(checked)["import"] and dict(checked)["loact"] and not dict(checked)["lore"], checked
    assert {c for c, _ in checked} >= {"train", "derive", "fetch", "checkpoint", "import", *STAGES}


def test_the_documented_rule_for_relative_paths_is_the_readers(tmp_path, capsys, monkeypatch, repo):
    """A config in a subfolder names its policy file by a relative path: validated from a working directory
    that holds the file, it passes; from one that does not, while the config's folder does, it is refused in
    one line naming the path and the working directory.  The schema and docs/configuration.md state that
    rule."""
    sub, elsewhere = tmp_path / "configs", tmp_path / "elsewhere"
    sub.mkdir()
    elsewhere.mkdir()
    cfg = sub / "mine.yaml"
    cfg.write_text(yaml.safe_dump({"results": "results-mine", "environments": {"CartPole-v1": {
        "source": "file", "files": {"Mine": {"path": "dqn.pt"}}, "algorithms": ["Mine"],
        "rewards": {"range": [0.0, 1.0]}, "sigmas": [0.1]}}}))
    state_dict_file(sub / "dqn.pt", (4, 8, 2))             # beside the config: not where the rule looks
    monkeypatch.chdir(elsewhere)
    with pytest.raises(SystemExit) as e:
        main(["validate-config", str(cfg)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert f"files.Mine: dqn.pt: no such policy file (a relative path is read from the working directory, " \
           f"{os.getcwd()})" in err, err
    state_dict_file(elsewhere / "dqn.pt", (4, 8, 2))       # in the working directory: found there
    main(["validate-config", str(cfg)])
    assert "valid (1 certification targets)" in capsys.readouterr().out

    from crop.schema import parsed_schema as schema

    files = schema()["$defs"]["environment"]["properties"]["files"]["additionalProperties"]
    words = " ".join(files["properties"]["path"]["description"].split())
    assert "read from the working directory" in words and "not from the config file's folder" in words, words
    doc = " ".join((repo / "docs/configuration.md").read_text().split())
    assert "relative to the working directory where you run `snakemake`" in doc
