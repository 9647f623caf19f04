"""Errors that say what to do: each bad input is one line on stderr, exit status 2, that
names the problem and the fix, and no traceback."""
import subprocess
import sys

import pytest
import yaml

from crop.__main__ import main
from crop.workflow.config import ConfigError, load_config, validate_config

from paths import REPO

SMOKE = REPO / "tests" / "configs" / "smoke.yaml"


def _one_line_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_validate_config_of_a_missing_file(capsys):
    err = _one_line_error(["validate-config", "/nonexistent.yaml"], capsys)
    assert "/nonexistent.yaml: no such config file" in err and "configs/" in err


def test_validate_config_as_a_command_has_no_traceback(tmp_path):
    p = subprocess.run([sys.executable, "-m", "crop", "validate-config", str(tmp_path / "nope.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "no such config file" in p.stderr


@pytest.mark.slow
def test_a_misspelt_key_is_named_with_its_close_match(tmp_path):
    cfg = yaml.safe_load(SMOKE.read_text())
    ec = cfg["environments"]["CartPole-v0"]
    ec["sigmaz"] = ec.pop("sigmas")
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    msg = str(e.value)
    assert "environments.CartPole-v0: unknown key 'sigmaz' (did you mean 'sigmas'?)" in msg, msg
    assert "required" not in msg
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["environments"]["CartPol-v0"] = cfg["environments"].pop("CartPole-v0")   # any registered id is valid
    with pytest.raises(ConfigError, match=r"unknown environment 'CartPol-v0' \(did you mean 'CartPole-v0'\?\)"):
        validate_config(cfg)
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["environments"]["CartPole-v0"]["algorithms"] = ["StdTrian"]
    with pytest.raises(ConfigError, match=r"'StdTrian' is not one of .* \(did you mean 'StdTrain'\?\)"):
        validate_config(cfg)


def test_bad_yaml_is_one_line(tmp_path):
    (tmp_path / "c.yaml").write_text("environments:\n  CartPole-v0: [\n")
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "c.yaml")
    assert "not valid YAML" in str(e.value) and "\n" not in str(e.value)


def test_a_missing_checkpoint_file_is_named(capsys, tmp_path):
    err = _one_line_error(["qrange", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint",
                           "/nonexistent/model.pt", "--out", str(tmp_path / "q.json")], capsys)
    assert "/nonexistent/model.pt: no such checkpoint file" in err and "crop import" in err
    assert not (tmp_path / "q.json").exists()


def test_a_checkpoint_without_its_record_says_how_to_make_one(capsys, tmp_path, mlp_factory):
    from crop.models import save_network

    save_network(mlp_factory(hidden=(16,)), tmp_path / "model.pt")
    err = _one_line_error(["qrange", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint",
                           str(tmp_path / "model.pt"), "--out", str(tmp_path / "q.json")], capsys)
    assert "no checkpoint record model.json beside it" in err and "crop import --file" in err
