"""Bad configuration is refused before any work, with a message naming the field."""
import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crop.config import ConfigError, load_config, targets, validate_config

REPO = Path(__file__).resolve().parents[1]
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
]


@pytest.mark.parametrize("name,mutate,pattern", CASES, ids=[c[0] for c in CASES])
def test_schema_names_the_bad_field(name, mutate, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate_config(_bad(mutate))


def test_defaults_are_filled_and_targets_listed():
    cfg = validate_config({"environments": {"CartPole-v0": {"algorithms": ["StdTrain"], "sigmas": [0.1, 1]}}})
    assert cfg["alpha"] == 0.05 and cfg["environments"]["CartPole-v0"]["gre"]["m"] == 10000
    assert targets(cfg) == [("CartPole-v0", "StdTrain", "0.1"), ("CartPole-v0", "StdTrain", "1.0")]


def test_default_and_shipped_configs_are_valid():
    files = ["config.yaml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml")),
             *sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "configs").glob("*.yaml"))]
    assert {"configs/paper.yaml", "configs/cartpole.yaml", "configs/quickstart.yaml",
            "tests/configs/smoke.yaml"} <= set(files)
    for f in files:
        load_config(REPO / f)


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
    """What the rules hand each stage (crop.config.stage_settings) parses as that subcommand's own options:
    every key is an option, every value passes its type and bounds."""
    import json

    from crop.cli import _with_settings, build_parser
    from crop.config import STAGES, stage_settings

    cfg = load_config(path)
    parser = build_parser()
    for env in cfg["environments"]:
        for stage in STAGES:
            block = stage_settings(cfg, env, stage)
            argv = [stage, "--env", env, "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", "m.pt",
                    "--settings", json.dumps(block), "--out", "o", "--out-returns", "r", "--qrange", "q"]
            if stage not in ("loact", "lore", "attack-local"):
                argv = argv[:-2]
            if stage != "gre":
                argv.remove("--out-returns")
                argv.remove("r")
            args = _with_settings(parser, argv, parser.parse_args(argv))
            for option, value in block.items():
                assert value is None or getattr(args, option) == value, (path.name, env, stage, option)


def test_resource_requests_come_from_the_environment_spec():
    """GRe never steps more copies than trajectories; CartPole steps all m at once (numpy, no copies), the
    others a bounded block whose memory grows with it; an image policy's replay buffer is budgeted."""
    from crop.envs import ENV_SPECS

    for spec in ENV_SPECS.values():
        assert spec.gre_block(50) <= 50 and spec.gre_block(10_000, 300) == 300
        assert spec.gre_mem_mb(spec.gre_block(10_000), 4) >= spec.gre_mem_mb(spec.gre_block(10), 4)
        assert spec.train_minutes(2 * 10**6) > spec.train_minutes(1000) >= 30
    assert ENV_SPECS["CartPole-v0"].gre_block(10_000) == 10_000
    assert ENV_SPECS["PongNoFrameskip-v4"].gre_block(10_000) == 1000
    assert ENV_SPECS["PongNoFrameskip-v4"].replay_mb(100_000) * 1e6 >= 100_000 * 2 * 4 * 84 * 84
    assert ENV_SPECS["CartPole-v0"].replay_mb(100_000) == 0
