"""A received config imports nothing: a ``module:Id`` environment id imports ``module`` (runs its code) only when
the config sets ``import_module: true`` for it or the command line says ``--trust-env ID``.  Otherwise
``crop validate-config``, ``crop plan``, ``crop audit --config`` and the workflow's parse refuse it in one line
naming the id, the module and the fix, before anything is imported.  The module here writes a marker file when
imported, so each refusal is checked by the marker's absence, and each acceptance by its presence."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from crop.envs import env_family, untrusted_env_ids
from crop.workflow.config import ConfigError, validate_config
from crop.workflow.cost import shipped_table

from networks import mlp
from paths import REPO

MODULE = "cropmarkmod"
ENV = f"{MODULE}:CartPole-v1"   # the module registers nothing: CartPole-v1 is Gymnasium's own


def _setup(tmp_path: Path, import_module=None) -> tuple[Path, Path, dict]:
    """(config file, marker file, environment for a subprocess): a module on a PYTHONPATH of its own that
    writes the marker when imported, and a valid config of ``module:CartPole-v1`` with a policy file."""
    mods, marker = tmp_path / "mods", tmp_path / "marker"
    mods.mkdir()
    (mods / f"{MODULE}.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n")
    torch.save(mlp([4, 8, 2], 0).state_dict(), tmp_path / "policy.pt")
    ec = {"source": "file", "files": {"Mine": {"path": str(tmp_path / "policy.pt")}}, "algorithms": ["Mine"],
          "sigmas": [0.1], "rewards": {"range": [0.0, 1.0]}, "train": {"eval_episodes": 1},
          "qrange": {"m": 10, "episodes": 1, "horizon": 5}, "loact": {"m": 10, "episodes": 1, "horizon": 5},
          "gre": {"m": 4, "horizon": 5}, "lore": {"m": 10, "horizon": 1},
          "attack": {"pgd_steps": 1, "local_episodes": 1, "global_episodes": 2}}
    if import_module is not None:
        ec["import_module"] = import_module
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"results": str(tmp_path / "results"), "environments": {ENV: ec}}))
    # crop plan prices the id with CartPole-v0's unit costs (no calibration run here)
    table = shipped_table("cpu")
    table["envs"][ENV] = table["envs"]["CartPole-v0"]
    (tmp_path / "calibration.json").write_text(json.dumps({"cpu": table}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(mods)]), XDG_CACHE_HOME=str(tmp_path / "cache"))
    return cfg, marker, env


def _run(argv, env, cwd):
    p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    return p.returncode, p.stdout, p.stderr


def _crop(*args, env, cwd):
    return _run([sys.executable, "-m", "crop", *map(str, args)], env, cwd)


def _snakemake_dry(cfg, env, cwd, *extra):
    return _run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-n", "--cores", "1",
                 "--configfile", str(cfg), "--directory", str(cwd), *extra], env, cwd)


def _refusal(text: str) -> str:
    """The one line naming the id, its module and the two ways to allow it."""
    lines = [ln for ln in text.splitlines() if f'environments."{ENV}"' in ln]
    assert len(lines) == 1, text[-3000:]
    line = lines[0]
    for needle in (f"module {MODULE}, which runs its code", f'environments."{ENV}".import_module: true',
                   f"--trust-env {ENV}"):
        assert needle in line, line
    return line


COMMANDS = {"validate-config": lambda cfg: ["validate-config", cfg],
            "plan": lambda cfg: ["plan", "--configfile", cfg, "--calibration", cfg.parent / "calibration.json"],
            "audit": lambda cfg: ["audit", cfg.parent / "results", "--config", cfg]}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_received_config_imports_nothing(tmp_path, command):
    cfg, marker, env = _setup(tmp_path)
    (tmp_path / "results").mkdir()   # the audit's folder, received with the config
    rc, out, err = _crop(*COMMANDS[command](cfg), env=env, cwd=tmp_path)
    assert not marker.exists(), err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    _refusal(err)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("how", ["import_module", "trust-env"])
def test_an_id_the_user_vouches_for_imports_its_module(tmp_path, command, how):
    """The test can fail: the same config, allowed, runs the module (the marker appears) and passes."""
    cfg, marker, env = _setup(tmp_path, True if how == "import_module" else None)
    (tmp_path / "results").mkdir()
    extra = ["--trust-env", ENV] if how == "trust-env" else []
    rc, out, err = _crop(*COMMANDS[command](cfg), *extra, env=env, cwd=tmp_path)
    assert rc == 0, err
    assert marker.read_text() == "ran"


def test_import_module_false_is_a_refusal_and_a_plain_id_takes_none(tmp_path):
    cfg, marker, _ = _setup(tmp_path, False)
    with pytest.raises(ConfigError) as exc:
        validate_config(yaml.safe_load(cfg.read_text()), "c.yaml")
    assert not marker.exists()
    assert str(exc.value).startswith(f'c.yaml: environments."{ENV}": module:Id imports module {MODULE}')
    with pytest.raises(ConfigError, match=r"environments\.CartPole-v0\.import_module: only a module:Id id"):
        validate_config({"environments": {"CartPole-v0": {"algorithms": ["StdTrain"], "sigmas": [0.1],
                                                          "import_module": True}}})


def test_unittest_main_is_not_run(tmp_path):
    """The review's case: ``unittest.__main__:CartPole-v1`` would run unittest's main (and exit)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"environments": {"unittest.__main__:CartPole-v1": {
        "algorithms": ["StdTrain"], "sigmas": [0.1], "rewards": {"range": [0.0, 1.0]}}}}))
    rc, out, err = _crop("validate-config", cfg, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=tmp_path)
    assert rc == 2 and err.strip().splitlines() == [err.strip()], err
    assert "module unittest.__main__, which runs its code" in err and "Ran 0 tests" not in out + err


def test_trusted_ids_and_narrowing_blocks():
    from crop.workflow.config import trusted_env_ids

    cfg = {"environments": {"a:X-v0": {"import_module": True}, "b:Y-v0": {"import_module": False}, "c:Z-v0": {}}}
    assert trusted_env_ids(cfg) == {"a:X-v0"}
    assert trusted_env_ids(cfg, ["c:Z-v0"]) == {"a:X-v0", "c:Z-v0"}
    assert trusted_env_ids({"environments": "not a mapping"}) == frozenset()
    # a block inside another cannot widen it: what a received folder's reader trusts stays the outer set
    with untrusted_env_ids(["cropnomod:CartPole-v1"]), untrusted_env_ids(["json.tool:CartPole-v1"]):
        with pytest.raises(KeyError, match="unknown environment"):
            env_family("json.tool:CartPole-v1")


@pytest.mark.slow
def test_the_workflow_refuses_it_before_any_job(tmp_path):
    cfg, marker, env = _setup(tmp_path)
    rc, out, err = _snakemake_dry(cfg, env, tmp_path)
    assert not marker.exists(), (out + err)[-3000:]
    assert rc != 0 and not (tmp_path / "results").exists()
    _refusal(out + err)
    # the refusal is the last line: no traceback frame of the Snakefile after it
    assert "common.smk" not in out + err and "Traceback" not in out + err, (out + err)[-3000:]
    assert f'environments."{ENV}"' in (out + err).strip().splitlines()[-1]


@pytest.mark.slow
def test_the_workflow_runs_an_id_the_config_allows(tmp_path):
    """The test can fail: with import_module: true the dry run plans the jobs, the module is imported, and the
    audit job is told to trust that id (and only that one)."""
    cfg, marker, env = _setup(tmp_path, True)
    rc, out, err = _snakemake_dry(cfg, env, tmp_path, "-p")
    assert rc == 0, (out + err)[-3000:]
    assert marker.read_text() == "ran"
    audit = [ln for ln in (out + err).splitlines() if "crop audit --inputs" in ln]
    assert len(audit) == 1 and audit[0].count("--trust-env") == 1 and f"--trust-env {ENV} " in audit[0], audit
