"""The `crop` command on its own: help for every option, --version, stage settings from the schema (one
source for the workflow and for hand use), optional outputs."""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import crop
from crop.__main__ import main
from crop.io import meta_name, sha256_file, write_json
from crop.models import save_network
from crop.schema import load_schema
from crop.workflow.cli import build_parser
from crop.workflow.config import ALGORITHMS, load_config
from crop.workflow.layout import RUN_FILES
from crop.workflow.stage_table import STAGES, stage_options, stage_settings

from networks import random_mlp
from paths import REPO


def _subparsers(parser):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_subcommand_and_option_has_help():
    subs = _subparsers(build_parser())
    assert set(subs) >= {"train", "derive", "fetch", "checkpoint", "qrange", "loact", "gre", "lore", "attack-local",
                         "attack-global", "aggregate", "audit", "validate-config"}
    for name, p in subs.items():
        assert p.description and len(p.description) > 20, name
        for a in p._actions:
            if a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
                continue
            assert a.help and a.help.strip(), f"crop {name} {a.option_strings or a.dest}: no help"
        p.format_help()  # every help string formats (a stray % would raise here)


def test_top_level_help_has_no_markup_and_version_prints_the_package_version():
    out = subprocess.run([sys.executable, "-m", "crop", "--help"], capture_output=True, text=True, check=True)
    assert "``" not in out.stdout and ":func:" not in out.stdout
    ver = subprocess.run([sys.executable, "-m", "crop", "--version"], capture_output=True, text=True, check=True)
    assert ver.stdout.split() == ["crop", crop.__version__]


def test_the_command_and_its_parser_import_no_torch():
    # every handler is imported by the entry point: they import torch (and pandas) only when they run
    code = ("import sys; from crop.__main__ import HANDLERS; from crop.workflow.cli import build_parser; "
            "build_parser(); print(sorted({'torch', 'pandas'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_command_line_builds_its_subcommand_alone_with_the_same_options_and_help():
    """``crop X …`` builds X's options only: X's help and flags are those of the parser of every subcommand,
    the others are listed without theirs, and ``crop --help`` is the same either way."""
    from crop.workflow.cli import chosen

    top = build_parser()
    full = _subparsers(top)
    assert chosen(["--version"]) == "" and chosen(["-h", "loact", "--m", "3"]) == "loact"
    for name, p in full.items():
        alone = build_parser(name)
        subs = _subparsers(alone)
        assert subs[name].format_help() == p.format_help(), name
        assert [a.dest for a in subs[name]._actions] == [a.dest for a in p._actions], name
        assert all(len(q._actions) == 1 for other, q in subs.items() if other != name)   # -h only
        assert alone.format_help() == top.format_help() == build_parser("").format_help()


def test_every_subcommand_has_its_function_and_every_function_a_subcommand():
    from crop.__main__ import HANDLERS

    assert set(HANDLERS) == set(_subparsers(build_parser()))
    assert all(callable(f) and f.__module__.startswith(("crop.handlers.", "crop.workflow.")) for f in HANDLERS.values())


def test_a_subcommand_without_its_function_is_refused_in_one_line(capsys):
    from crop.workflow.cli import run

    with pytest.raises(SystemExit) as exc:
        run({}, ["validate-config", "config.yaml"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == \
        "crop: error: validate-config: no function runs this subcommand (crop.__main__.HANDLERS)"


def test_derive_lists_only_its_own_options():
    derive = _subparsers(build_parser())["derive"].format_help()
    assert "--base-checkpoint" in derive and "--eval-episodes" in derive
    for training_only in ("--hidden", "--total-steps", "--min-steps", "--mirror"):
        assert training_only not in derive


def test_stage_defaults_and_choices_come_from_the_schema_and_the_code():
    from crop.names import ALPHA_MODES, BOUND_NAMES

    schema = load_schema()
    assert schema["properties"]["bound"]["enum"] == list(BOUND_NAMES)
    assert schema["properties"]["alpha_mode"]["enum"] == list(ALPHA_MODES)
    from crop.workflow.cli import stage_params

    parser = build_parser()
    subs = _subparsers(parser)
    for stage in STAGES:
        actions = {a.dest: a for a in subs[stage]._actions}
        argv = [stage, "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", "m.pt",
                *[x for o in STAGES[stage].outputs if o.required for x in (f"--{o.option.replace('_', '-')}", "f")]]
        params = stage_params(parser.parse_args(argv))  # no --settings, no flags: the schema's defaults
        for option, (key, node) in stage_options(stage).items():
            assert getattr(params, option) == node.get("default"), (stage, option)
            assert key.lstrip("/").split(".")[-1] in load_schema_keys(schema), (stage, key)
        if "bound" in actions:
            assert list(actions["bound"].choices) == list(BOUND_NAMES)


def load_schema_keys(schema):
    env = schema["$defs"]["environment"]["properties"]
    return set(schema["properties"]) | {k for b in env.values() for k in b.get("properties", {})}


def test_the_local_attack_borrows_explicitly(repo):
    """attack_local attacks LoAct's smoothed policy over LoRe's tree: the schema says so, and the settings
    the workflow hands it follow those blocks."""
    opts = stage_options("attack-local")
    assert (opts["m"][0], opts["horizon"][0], opts["gamma"][0]) == ("loact.m", "lore.horizon", "lore.gamma")
    cfg = load_config(repo / "tests/configs/smoke.yaml")
    s = stage_settings(cfg, "CartPole-v0", "attack-local")
    env = cfg["environments"]["CartPole-v0"]
    assert (s["m"], s["horizon"]) == (env["loact"]["m"], env["lore"]["horizon"])
    assert stage_settings(cfg, "CartPole-v0", "attack-global")["horizon"] == env["gre"]["horizon"]


def _policy(d: Path):
    d.mkdir(parents=True, exist_ok=True)
    net = random_mlp(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0)
    save_network(net, d / "model.pt")
    write_json(d / "model.json", {"env": "CartPole-v0", "algo": "StdTrain", "profile": "vector",
                                  "net_spec": {"arch": "mlp", "in": 4, "hidden": [16], "out": 2},
                                  "sha256": sha256_file(d / "model.pt")})
    write_json(d / RUN_FILES["qrange"], {"env": "CartPole-v0", "algo": "StdTrain", "sigma": 0.1, "v_min": -4.0,
                                   "v_max": 4.0})
    return ["--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", str(d / "model.pt"),
            "--qrange", str(d / RUN_FILES["qrange"]), "--no-progress"]


def test_settings_block_equals_the_flags_and_a_flag_wins(tmp_path):
    base = _policy(tmp_path)
    settings = {"m": 200, "episodes": 1, "horizon": 5, "alpha": 0.1, "bound": "hoeffding", "alpha_mode": "state",
                "frames_window": [0, 3]}
    main(["loact", *base, "--settings", json.dumps(settings), "--out", str(tmp_path / "a.csv")])
    main(["loact", *base, "--m", "200", "--episodes", "1", "--horizon", "5", "--alpha", "0.1", "--frames-window",
          "0", "3", "--out", str(tmp_path / "b.csv")])
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    meta = [json.loads((tmp_path / f"{n}.meta.json").read_text())["settings"] for n in "ab"]
    assert {k: v for k, v in meta[0].items() if k != "out"} == {k: v for k, v in meta[1].items() if k != "out"}
    assert "settings" not in meta[0] and meta[0]["m"] == 200
    # A flag given by hand wins over the block.
    main(["loact", *base, "--settings", json.dumps(settings), "--horizon", "3", "--out", str(tmp_path / "c.csv")])
    assert pd.read_csv(tmp_path / "c.csv")["step"].max() < 3


def test_loact_writes_only_the_outputs_asked_for(tmp_path):
    base = _policy(tmp_path)
    main(["loact", *base, "--m", "100", "--episodes", "1", "--horizon", "3", "--out",
          str(tmp_path / RUN_FILES["loact"])])
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("loact")) == [RUN_FILES["loact"],
                                                                                         meta_name(RUN_FILES["loact"])]
    assert not list(tmp_path.glob("*.npz"))


@pytest.mark.parametrize("bad, words", [({"m": 100, "horizn": 3}, "unknown setting(s) ['horizn']"),
                                        ({"m": 0}, "--settings: m: must be >= 1, got 0"),
                                        ({"m": 2.5}, "--settings: m: must be an integer, got 2.5"),
                                        ({"m": True}, "--settings: m: must be an integer, got True"),
                                        ({"alpha": "0.1"}, "--settings: alpha: must be a number"),
                                        ({"bound": "wald"}, "--settings: bound: must be one of"),
                                        ({"frames_window": [1]}, "--settings: frames_window: must be a list of 2"),
                                        ({"alpha": 1e999}, "not a finite number"),
                                        ("[1, 2]", "JSON object")])
def test_bad_settings_are_refused_in_one_line(tmp_path, capsys, bad, words):
    base = _policy(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["loact", *base, "--settings", bad if isinstance(bad, str) else json.dumps(bad),
              "--out", str(tmp_path / "x.csv")])
    assert e.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_help_and_version_import_nothing_heavy_and_read_the_schema_once():
    """`crop --help`/`--version`/`crop loact --help` answer without torch, numpy or the environments, and the
    500-line schema is parsed at most once per process (it was parsed 53 times: most of the 1.7 s `--version`
    took); `crop --help` builds no subcommand's options, so it needs no schema."""
    code = ("import sys, yaml; n = [0]; load = yaml.load\n"
            "def counted(*a, **k):\n    n[0] += 1\n    return load(*a, **k)\n"
            "yaml.load = counted\n"
            "from crop.__main__ import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'numpy', 'pandas', 'gymnasium', 'matplotlib') if m in sys.modules)\n"
            "print(n[0], heavy, file=sys.stderr)")
    for argv, parsed in ((["--help"], "0"), (["--version"], "0"), (["loact", "--help"], "1")):
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
        assert out.stderr.split("\n")[-2] == f"{parsed} []", (argv, out.stderr)


def test_env_and_algo_help_list_what_they_accept():
    schema = load_schema()
    qrange = _subparsers(build_parser())["qrange"].format_help().replace("\n", " ")
    qrange = " ".join(qrange.split())
    paper_envs = ("CartPole-v0", "highway-fast-v0", "PongNoFrameskip-v4", "FreewayNoFrameskip-v4")
    for name in (*paper_envs, *ALGORITHMS):
        assert name in qrange, name
    assert "Acrobot-v1" in qrange and "your own" in qrange  # and what else each accepts
    assert schema["$defs"]["env_id"]["pattern"] and schema["$defs"]["label"]["pattern"]


@pytest.mark.parametrize("argv, words", [
    (["aggregate", "r", "--table-eps-factors", "0", "nan"], "--table-eps-factors: must be a finite number"),
    (["lore", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "inf", "--checkpoint", "c", "--qrange", "q",
      "--out", "o"], "--sigma: must be a finite number"),
    (["lore", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", "c", "--qrange", "q",
      "--checkpoint-every", "nan", "--out", "o"], "--checkpoint-every: must be a finite number"),
    (["train", "--env", "CartPole-v0", "--algo", "StdTrain", "--settings", '{"dqn": {"lr": NaN}}', "--out", "o"],
     "--settings: NaN is not a finite number"),
    (["gre", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", "c",
      "--settings", '{"eps_factors": [0, Infinity]}', "--out", "o", "--out-returns", "r"],
     "--settings: Infinity is not a finite number"),
    (["train", "--env", "CartPole-v0", "--algo", "StdTrain", "--target-return=-inf", "--out", "o"],
     "--target-return: must be a finite number"),
])
def test_every_cli_number_is_finite(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err, err
    assert not list(tmp_path.iterdir())


def test_loact_of_a_discrete_agent_refuses_clipped_rewards_in_one_line(tmp_path, capsys):
    """A discrete agent's benign returns sit beside LoRe's bound and the local attack's returns, of the
    environment's own rewards: --clip-rewards is refused before any work, nothing written."""
    base = _policy(tmp_path)
    with pytest.raises(SystemExit):
        main(["loact", *base, "--m", "50", "--episodes", "1", "--horizon", "3", "--reward-range", "0", "1",
              "--clip-rewards", "--out", str(tmp_path / "a.csv")])
    err = capsys.readouterr().err.strip()
    assert "--clip-rewards: a discrete-action agent's benign returns" in err and "\n" not in err
    assert not (tmp_path / "a.csv").exists()


def test_the_workflow_crop_certify_runs_is_the_checkout_or_the_folder_crop_workflow_names(tmp_path):
    code = "from crop.handlers.certify import workflow_snakefile; print(workflow_snakefile())"
    env = {k: v for k, v in os.environ.items() if k != "CROP_WORKFLOW"}
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert Path(here.stdout.strip()) == REPO / "Snakefile" and (REPO / "Snakefile").is_file()
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**env, "CROP_WORKFLOW": str(tmp_path)})
    assert Path(there.stdout.strip()) == tmp_path / "Snakefile"


def test_a_setting_past_its_bound_is_refused_alike_as_a_flag_and_in_the_settings_block(capsys):
    """A flag and the --settings block are checked against the same schema node by the jsonschema validator:
    a number just past each stage setting's bound is refused by both, in the same words."""
    from crop.io import InputError
    from crop.workflow.cli import stage_params

    parser = build_parser()
    past = {"minimum": -1, "exclusiveMinimum": 0, "maximum": 1, "exclusiveMaximum": 0}
    checked = 0
    for name, row in STAGES.items():
        base = [name, "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", "m.pt",
                *[x for o in row.outputs if o.required for x in (f"--{o.option.replace('_', '-')}", "f")]]
        for option, (_, node) in row.options.items():
            if "array" in node.get("type", []) or "enum" in node:
                continue
            for bound, step in past.items():
                if bound not in node:
                    continue
                bad = node[bound] + step
                with pytest.raises(SystemExit):
                    parser.parse_args([*base, f"--{option.replace('_', '-')}", str(bad)])
                flag = capsys.readouterr().err.strip().splitlines()[-1]
                with pytest.raises(InputError) as e:
                    stage_params(parser.parse_args([*base, "--settings", json.dumps({option: bad})]))
                words = f"must be {'>' if 'inimum' in bound else '<'}{'=' if 'exclusive' not in bound else ''} " \
                        f"{node[bound]}, got {bad}"
                assert str(e.value) == f"--settings: {option}: {words}", (name, option)
                assert flag.endswith(f"argument --{option.replace('_', '-')}: {words}"), (name, option, flag)
                checked += 1
    assert checked >= 20, checked
