"""Bad configuration is refused before any work, with a message naming the field."""
import copy
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crop.workflow.config import ConfigError, certifications, load_config, validate_config
from crop.workflow.layout import RUN_FILES

from paths import REPO

BASE = yaml.safe_load((REPO / "config.yaml").read_text())


def _bad(mutate):
    cfg = copy.deepcopy(BASE)
    mutate(cfg)
    return cfg


CASES = [
    ("unknown top-level key", lambda c: c.update(sigmaa=1), r"unknown key.*sigmaa"),
    ("unknown nested key", lambda c: c["environments"]["CartPole-v0"]["loact"].update(mm=3),
     r"environments\.CartPole-v0\.loact: unknown key.*'mm'"),
    ("sigma = 0", lambda c: c["environments"]["CartPole-v0"].update(sigmas=[0.1, 0.0]),
     r"environments\.CartPole-v0\.sigmas\[1\]: 0\.0 must be > 0"),
    ("negative sigma", lambda c: c["environments"]["CartPole-v0"].update(sigmas=[-0.1]),
     r"sigmas\[0\]: -0\.1 must be > 0"),
    ("m < 1", lambda c: c["environments"]["CartPole-v0"]["gre"].update(m=0),
     r"environments\.CartPole-v0\.gre\.m: 0 must be >= 1"),
    ("alpha = 1", lambda c: c.update(alpha=1.0), r"alpha: 1\.0 must be < 1"),
    ("alpha = 0", lambda c: c.update(alpha=0), r"alpha: 0 must be > 0"),
    ("unknown env", lambda c: c["environments"].update({"Nope-v9": c["environments"]["CartPole-v0"]}),
     r"environments\.Nope-v9: unknown environment 'Nope-v9': not a registered Gymnasium id"),
    ("unknown algorithm", lambda c: c["environments"]["CartPole-v0"].update(algorithms=["StdTrain", "Magic"]),
     r"environments\.CartPole-v0\.algorithms\[1\]: 'Magic' is not one of"),
    ("wrong type", lambda c: c["environments"]["CartPole-v0"]["loact"].update(episodes="ten"),
     r"environments\.CartPole-v0\.loact\.episodes: 'ten' is not of type 'integer'"),
    ("target and targets", lambda c: c["environments"]["CartPole-v0"].update(target="vote", targets=["q", "vote"]),
     r"environments\.CartPole-v0: give target or targets, not both"),
    ("probs of a trained Q-network", lambda c: c["environments"]["CartPole-v0"].update(source="train",
                                                                                       target="probs"),
     r"environments\.CartPole-v0\.target: probs .* Q-network: use vote or q"),
    ("probs among targets", lambda c: c["environments"]["CartPole-v0"].update(targets=["q", "probs"]),
     r"environments\.CartPole-v0\.targets: probs .* Q-network"),
]


@pytest.mark.parametrize("name,mutate,pattern", CASES, ids=[c[0] for c in CASES])
def test_schema_names_the_bad_field(name, mutate, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate_config(_bad(mutate))


def test_probs_is_left_to_the_stage_for_a_file_whose_kind_is_not_known_yet():
    env = {"algorithms": ["StdTrain"], "sigmas": [0.1], "source": "file", "targets": ["probs", "vote"],
           "files": {"StdTrain": {"path": "ppo.zip"}}}
    cfg = validate_config({"environments": {"CartPole-v0": env}})
    assert cfg["environments"]["CartPole-v0"]["targets"] == ["probs", "vote"]
    assert validate_config(cfg) == cfg  # a validated config validates again, to itself (no target filled in)


def test_defaults_are_filled_and_targets_listed():
    cfg = validate_config({"environments": {"CartPole-v0": {"algorithms": ["StdTrain"], "sigmas": [0.1, 1]}}})
    assert cfg["alpha"] == 0.05 and cfg["environments"]["CartPole-v0"]["gre"]["m"] == 10000
    assert certifications(cfg) == [("CartPole-v0", "StdTrain", "0.1"), ("CartPole-v0", "StdTrain", "1.0")]


def test_default_and_shipped_configs_are_valid():
    files = ["config.yaml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml")),
             *sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "configs").glob("*.yaml"))]
    assert {"configs/paper.yaml", "configs/cartpole.yaml", "configs/quickstart.yaml",
            "tests/configs/smoke.yaml"} <= set(files)
    for f in files:
        load_config(REPO / f)


@pytest.mark.slow
def test_snakemake_refuses_bad_config_before_any_job(tmp_path):
    cfg = _bad(lambda c: c["environments"]["CartPole-v0"].update(sigmas=[-0.5]))
    cfg["results"] = str(tmp_path / "results")
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(cfg))
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1",
                        "--configfile", str(f), "--directory", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "environments.CartPole-v0.sigmas[0]: -0.5 must be > 0" in p.stdout + p.stderr
    assert not (tmp_path / "results").exists()


SHIPPED = [REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml")),
           *sorted((REPO / "tests/configs").glob("*.yaml"))]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_stage_takes_its_settings_block(path):
    """What the rules hand each stage (crop.workflow.stage_table.stage_settings) becomes that subcommand's own
    parameters: every key is an option, every value passes its type and bounds and arrives unchanged."""
    import json

    from crop.workflow.cli import build_parser, stage_params
    from crop.workflow.stage_table import STAGES, stage_settings

    cfg = load_config(path)
    parser = build_parser()
    for env in cfg["environments"]:
        for stage, row in STAGES.items():
            block = stage_settings(cfg, env, stage)
            argv = [stage, "--env", env, "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", "m.pt",
                    "--settings", json.dumps(block), *(["--qrange", "q"] if row.v_range else [])]
            argv += [x for o in row.outputs if o.required for x in (f"--{o.option.replace('_', '-')}", "f")]
            args = stage_params(parser.parse_args(argv))
            for option, value in block.items():
                assert value is None or getattr(args, option) == value, (path.name, env, stage, option)


def test_resource_requests_come_from_the_environment_spec():
    """GRe never steps more copies than trajectories; CartPole steps the paper's m = 10,000 at once (numpy, no
    copies) and a larger m in blocks of 12,288 (what a killed run keeps), the others a bounded block whose memory
    grows with it; an image policy's replay buffer is budgeted."""
    from crop.envs import ENV_SPECS

    for spec in ENV_SPECS.values():
        assert spec.gre_block(50) <= 50 and spec.gre_block(10_000, 300) == 300
        assert spec.gre_mem_mb(spec.gre_block(10_000), 4) >= spec.gre_mem_mb(spec.gre_block(10), 4)
    assert ENV_SPECS["CartPole-v0"].gre_block(10_000) == 10_000
    assert ENV_SPECS["CartPole-v0"].gre_block(100_000) == 12_288
    assert ENV_SPECS["PongNoFrameskip-v4"].gre_block(10_000) == 1000
    assert ENV_SPECS["PongNoFrameskip-v4"].replay_mb(100_000) * 1e6 >= 100_000 * 2 * 4 * 84 * 84
    assert ENV_SPECS["CartPole-v0"].replay_mb(100_000) == 0


# ------------------------------------------------------------------ hostile values

SMALL = "environments:\n  CartPole-v0: {algorithms: [StdTrain], sigmas: [0.1]}\n"
HOSTILE = [
    # YAML's own spellings of NaN and infinity, at the top level, in a block, in a list, in a nested block
    ("alpha: .nan\n" + SMALL, "alpha: nan is not a finite number"),
    ("audit: {alpha: .NaN}\n" + SMALL, "audit.alpha: nan is not a finite number"),
    (SMALL.replace("sigmas: [0.1]", "sigmas: [0.1, .nan]"), "environments.CartPole-v0.sigmas[1]: nan is not"),
    (SMALL.replace("}", ", gre: {gamma: .nan}}"), "environments.CartPole-v0.gre.gamma: nan is not"),
    (SMALL.replace("}", ", gre: {percentiles: [.nan]}}"), "environments.CartPole-v0.gre.percentiles[0]: nan"),
    (SMALL.replace("}", ", qrange: {quantile: .nan}}"), "environments.CartPole-v0.qrange.quantile: nan"),
    (SMALL.replace("}", ", gre: {eps_factors: [0, .inf]}}"), "environments.CartPole-v0.gre.eps_factors[1]: inf"),
    (SMALL.replace("}", ", lore: {eps_max_factor: .inf}}"), "environments.CartPole-v0.lore.eps_max_factor: inf"),
    (SMALL.replace("}", ", train: {dqn: {lr: -.inf}}}"), "environments.CartPole-v0.train.dqn.lr: -inf is not"),
    ("report: {table_eps_factors: [.inf]}\n" + SMALL, "report.table_eps_factors[0]: inf is not a finite"),
    # path keys: empty, control characters, braces (a Snakemake wildcard)
    ('results: ""\n' + SMALL, "results: '' is not a path"),
    ('results: "  "\n' + SMALL, "results: '  ' is not a path"),
    ('results: "a\\nb"\n' + SMALL, "results: 'a\\nb' contains a control character"),
    ('results: "r\\e[31m"\n' + SMALL, "contains a control character"),
    ('results: "r{env}"\n' + SMALL, "results: 'r{env}' contains a brace"),
    ('checkpoints: {lock: ""}\n' + SMALL, "checkpoints.lock: '' is not a path"),
    ('audit: {tolerances: "t\\tx"}\n' + SMALL, "audit.tolerances: 't\\tx' contains a control character"),
    (SMALL.replace("}", ', source: file, files: {StdTrain: {path: "p{x}.pt"}}}'),
     "environments.CartPole-v0.files.StdTrain.path: 'p{x}.pt' contains a brace"),
]


@pytest.mark.parametrize("text,message", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_validate_config_refuses_hostile_values_in_one_line(text, message, tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    p = subprocess.run([sys.executable, "-m", "crop", "validate-config", str(f)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1 and message in p.stderr, p.stderr


@pytest.mark.slow
def test_snakemake_refuses_nan_before_any_job(tmp_path):
    f = tmp_path / "nan.yaml"
    f.write_text(f"results: {tmp_path / 'results'}\n" + SMALL.replace("sigmas: [0.1]", "sigmas: [.nan]"))
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1",
                        "--configfile", str(f), "--directory", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "environments.CartPole-v0.sigmas[0]: nan is not a finite number" in p.stdout + p.stderr
    assert "MissingInputException" not in p.stdout + p.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_shell_metacharacters_in_paths_are_data(tmp_path, mlp_factory):
    """A real Snakemake run (the checkpoint and qrange jobs) with `$(…)`, backquotes, `;`, quotes and spaces in
    `results:` and in a policy file's path: nothing is executed, and every output lands at the path as written."""
    import torch

    from crop.models import save_network

    results = "r$(touch PWNED1); `touch PWNED2` 'q\" & x"
    policy = tmp_path / "my policy $(touch PWNED3);'.pt"
    save_network(mlp_factory(hidden=(8,)), policy)
    cfg = {"results": results, "environments": {"CartPole-v0": {
        "source": "file", "files": {"StdTrain": {"path": str(policy)}}, "algorithms": ["StdTrain"],
        "sigmas": [0.1], "train": {"eval_episodes": 1}, "qrange": {"m": 10, "episodes": 1, "horizon": 3}}}}
    assert validate_config(cfg)["results"] == results
    f = tmp_path / "hostile.yaml"
    f.write_text(yaml.safe_dump(cfg))
    target = f"{results}/CartPole-v0/StdTrain/sigma-0.1/{RUN_FILES['qrange']}"
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1",
                        "--configfile", str(f), "--directory", str(tmp_path), target],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    made = tmp_path / results / "CartPole-v0" / "StdTrain"
    for out in ("checkpoint/model.pt", "checkpoint/model.json", f"sigma-0.1/{RUN_FILES['qrange']}"):
        assert (made / out).is_file(), out
    assert (tmp_path / results / "logs" / "CartPole-v0" / "StdTrain" / "checkpoint.log").is_file()
    assert json.loads((made / "checkpoint/model.json").read_text())["imported_from"]["path"] == str(policy)
    assert torch.load(made / "checkpoint/model.pt", weights_only=True)
    pwned = list(tmp_path.rglob("PWNED*")) + list(Path.cwd().glob("PWNED*")) + list(REPO.glob("PWNED*"))
    assert not pwned, pwned
    # nothing was written beside the quoted folder (a split word would have made 'r' or 'x')
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        [results, policy.name, "hostile.yaml"])
    # every rule's command (the whole DAG, printed by a dry run): each hostile path is one shell word
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1",
                        "--configfile", str(f), "--directory", str(tmp_path), "-n", "-p", "--forceall"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    commands = [line.split("Shell command:", 1)[1].strip() for line in p.stdout.splitlines()
                if line.startswith("Shell command: crop ")]
    assert {c.split()[1] for c in commands} == {"checkpoint", "qrange", "loact", "gre", "lore", "attack-local",
                                                 "attack-global", "aggregate", "audit"}
    for c in commands:
        words = shlex.split(c)
        hostile = [w for w in words if "PWNED" in w]
        assert hostile and all(w.startswith((results, str(policy))) for w in hostile), (c, hostile)


def test_a_key_that_is_not_a_plain_name_is_named_as_json_in_the_error():
    """A mapping where a string belongs, keyed by a quote and holding inf: the error names the field
    unambiguously (the quote written as JSON in brackets), not a path a reader cannot parse."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg["results"] = {"'": float("inf")}
    message = """invalid configuration: results["'"]: inf is not a finite number"""
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(cfg)


def test_every_reader_takes_the_schema_from_one_accessor_and_one_resolver():
    """crop.schema holds the one accessor of the schema and the one resolver of its ``$ref``s: a key names one
    node (no definition shares a top-level setting's name), an environment's setting comes with its ``$ref``
    merged in and its own keywords, and the stages' options are those nodes."""
    from crop import schema
    from crop.workflow.stage_table import stage_options

    whole = schema.parsed_schema()
    assert not set(whole["properties"]) & set(whole["$defs"])
    node = schema.schema_node("environment.loact.m")
    assert (node["type"], node["minimum"], node["default"]) == ("integer", 1, 10000)
    assert schema.schema_node("label")["pattern"] == whole["$defs"]["label"]["pattern"]
    assert schema.schema_node("report.table_eps_factors") is whole["properties"]["report"]["properties"][
        "table_eps_factors"]
    assert stage_options("loact")["m"] == ("loact.m", node) and stage_options("loact")["alpha"][1] is \
        whole["properties"]["alpha"]
    resolvers = [p.name for p in (REPO / "crop").rglob("*.py") if '"$ref"' in p.read_text()]
    assert resolvers == ["schema.py"], resolvers
