"""A stage an environment's config skips (``skip``; `crop certify --skip`, or LoRe on an environment it cannot
snapshot): the workflow does not ask for it, the figures, tables and captions show only the stages that ran,
and the audit lists it as not run, neither missing nor checked — while a stage the config did not skip and the
folder lacks stays missing."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from crop.__main__ import main
from crop.io import meta_name
from crop.report import aggregate as agg
from crop.report.captions import caption_settings
from crop.workflow import cost, layout
from crop.workflow.config import ConfigError, validate_config
from crop.workflow.partial import config_plan, config_run_files
from crop.workflow.stage_table import STAGES

from certify_helpers import cartpole_dqn, refused
from networks import mlp, sb3_data, sb3_dqn_state, sb3_zip
from paths import REPO
from synthetic_results import audit_cli, make_results

ENV, RUN = "CartPole-v0", "CartPole-v0/StdTrain/sigma-0.1"


def _config(tmp_path, skip) -> dict:
    """The quick start's config for StdTrain at σ = 0.1 on CartPole-v0, results in tmp_path/results, with
    ``skip`` (None: no such key)."""
    cfg = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    ec = cfg["environments"][ENV]
    ec["algorithms"], ec["sigmas"] = ["StdTrain"], [0.1]
    if skip is not None:
        ec["skip"] = skip
    cfg["results"] = str(tmp_path / "results")
    return cfg


def _without(tmp_path, stage: str):
    """A synthetic results folder whose one run never ran ``stage`` (no file of it, no record of it)."""
    root = tmp_path / "results"
    make_results(root, {ENV: {"StdTrain": [0.1]}})
    for name in STAGES[stage].files.values():
        for f in (root / RUN / name, root / RUN / meta_name(name)):
            f.unlink(missing_ok=True)
    return root


@pytest.fixture
def without_lore(tmp_path):
    return _without(tmp_path, "lore")


def test_the_skip_field_is_the_schema_s_and_the_layout_s():
    node = yaml.safe_load((REPO / "crop/schemas/config.schema.yaml").read_text())["$defs"]["environment"]
    assert tuple(node["properties"]["skip"]["items"]["enum"]) == layout.SKIPPABLE == ("lore", "attack-local")


def test_a_skipped_lore_is_not_asked_for_drawn_quoted_or_called_missing(without_lore, tmp_path):
    cfg = validate_config(_config(tmp_path, ["lore"]), "config")
    files = [f for main_files, _ in config_run_files(cfg, without_lore).values() for f in main_files]
    assert files and not any(f.endswith("/lore.csv") for f in files)   # the workflow's targets
    assert "lore" not in {j.rule for j in cost.jobs(cfg, gpus=0)}      # its jobs (crop plan's prices)
    # the figures and tables: exactly what the Snakefile expects of the config (no adasearch figure)
    written = agg.aggregate(without_lore, [RUN], table_eps_factors=[0.0, 0.1], figures_dir=without_lore / "figures",
                            tables_dir=without_lore / "tables")
    assert set(written) == set(layout.aggregate_files(without_lore / "figures", without_lore / "tables",
                                                      config_plan(cfg)))
    assert not any("adasearch" in p.name for p in written)
    bounds = pd.read_csv(next(p for p in written if p.name.endswith("_reward_bounds.csv")))
    assert "lore_bound" not in bounds or bounds["lore_bound"].isna().all()
    words = caption_settings(cfg)
    assert "skip: lore" in words[ENV]["no_lore"] and words[ENV]["lore"] == "not run" and "; LoRe " not in words.text
    # the audit, given the config's run files as the audit rule gives them: LoRe not run, neither missing nor partial
    out = tmp_path / "audit"
    assert audit_cli("--inputs", *files, "--out-dir", out) == 0
    rep = json.loads((out / "audit.json").read_text())
    assert rep["skipped_runs"] == [{"run": RUN, "stages": ["lore"]}] and rep["partial_runs"] == []
    assert rep["verdict"] == "PASS" and rep["integrity"] == [] and rep["expected_missing"] == []
    assert not any(c["check"].startswith("lore") for c in rep["checks"])   # nothing counted as checked
    md = (out / "audit.md").read_text()
    assert "## Stages not run" in md and "missing" not in md.split("## Stages not run")[1].split("##")[0]
    # the same folder against the config, with its skip: nothing expected is missing
    (tmp_path / "skip.yaml").write_text(yaml.safe_dump(_config(tmp_path, ["lore"])))
    assert audit_cli(without_lore, "--config", tmp_path / "skip.yaml", "--out-dir", out) == 0
    rep = json.loads((out / "audit.json").read_text())
    assert rep["verdict"] == "PASS" and rep["expected_missing"] == [] and rep["skipped_runs"]


def test_a_skipped_local_attack_is_neither_drawn_nor_advised(tmp_path):
    root = _without(tmp_path, "attack-local")
    cfg = validate_config(_config(tmp_path, ["attack-local"]), "config")
    files = [f for main_files, _ in config_run_files(cfg, root).values() for f in main_files]
    written = agg.aggregate(root, [RUN], table_eps_factors=[0.0, 0.1], figures_dir=root / "figures",
                            tables_dir=root / "tables")
    assert set(written) == set(layout.aggregate_files(root / "figures", root / "tables", config_plan(cfg)))
    assert any("adasearch" in p.name for p in written)   # LoRe's bound drawn, without the local attack's line
    out = tmp_path / "audit"
    assert audit_cli("--inputs", *files, "--out-dir", out) == 0
    rep = json.loads((out / "audit.json").read_text())
    assert rep["skipped_runs"] == [{"run": RUN, "stages": ["attack_local"]}] and rep["partial_runs"] == []
    assert rep["integrity"] == [] and not any(c["check"].startswith("lore_vs") for c in rep["checks"])
    assert "run the attacks" not in (out / "audit.md").read_text()


def test_a_lore_the_config_does_not_skip_stays_missing(without_lore, tmp_path):
    agg.aggregate(without_lore, [RUN], table_eps_factors=[0.0, 0.1], figures_dir=without_lore / "figures",
                  tables_dir=without_lore / "tables")
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(_config(tmp_path, None)))
    out = tmp_path / "audit"
    audit_cli(without_lore, "--config", tmp_path / "full.yaml", "--out-dir", out)
    rep = json.loads((out / "audit.json").read_text())
    missing = {p["file"] for p in rep["expected_missing"]}
    assert str(without_lore / RUN / "lore.csv") in missing and rep["verdict"] == "WARN"
    assert rep["skipped_runs"] == [] and rep["partial_runs"][0]["absent"] == ["lore"]


@pytest.mark.parametrize("skip, field", [(["qrange"], "skip[0]"), (["gre"], "skip[0]"), ("lore", "skip"),
                                         (["lore", "lore"], "skip"), (["$(touch pwned)"], "skip[0]"),
                                         ([{"lore": 1}], "skip[0]")])
def test_a_hostile_or_invalid_skip_is_refused_naming_the_field(skip, field, tmp_path):
    with pytest.raises(ConfigError) as e:
        validate_config(_config(tmp_path, skip), "config")
    assert f"environments.{ENV}.{field}:" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "pwned").exists()


def test_lore_on_an_environment_it_cannot_snapshot_needs_skip(tmp_path):
    pytest.importorskip("Box2D")
    ec = {"algorithms": ["Mine"], "sigmas": [0.1], "source": "file", "files": {"Mine": {"path": "p.zip"}},
          "rewards": {"range": [-200.0, 200.0]}}
    with pytest.raises(ConfigError) as e:
        validate_config({"environments": {"LunarLander-v3": ec}}, "config")
    said = str(e.value)
    assert "environments.LunarLander-v3: LoRe needs faithful snapshots" in said and "skip: [lore]" in said
    validate_config({"environments": {"LunarLander-v3": {**ec, "skip": ["lore"]}}}, "config")


@pytest.mark.parametrize("given, said", [("nope", "no such stage"), ("gre", "GRe always runs"),
                                         ("qrange", "the V range always runs"), ("lore,attack", "no such stage"),
                                         (",", "names no stage")])
def test_certify_refuses_a_stage_it_cannot_skip_in_one_line(given, said, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cartpole_dqn(tmp_path / "dqn.zip")
    err = refused(["dqn.zip", "--env", "CartPole-v1", "--out", "out", "--skip", given], capsys)
    assert said in err and "may skip: lore, attack-local" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dqn.zip"]


def _config_only(monkeypatch):
    """crop certify up to its config: the workflow's run is replaced by a failure (exit 1)."""
    monkeypatch.setattr("crop.handlers.certify.snakemake", lambda *a: subprocess.CompletedProcess(a, 1))


def test_certify_skip_writes_it_into_the_config(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cartpole_dqn(tmp_path / "dqn.zip")
    _config_only(monkeypatch)
    with pytest.raises(SystemExit):
        main(["certify", "dqn.zip", "--env", "CartPole-v1", "--out", "out", "--skip", "lore", "--skip", "lore"])
    text = (tmp_path / "out/config.yaml").read_text()
    assert yaml.safe_load(text)["environments"]["CartPole-v1"]["skip"] == ["lore"] and "--skip lore" in text
    assert "skip:   lore (--skip): not run" in capsys.readouterr().out


def _lunar_dqn(path):
    """An untrained LunarLander DQN as Stable-Baselines3 saves it (8 observations, 4 actions)."""
    return sb3_zip(path, sb3_dqn_state(mlp([8, 64, 64, 4], 0), mlp([8, 64, 64, 4], 1)), sb3_data("DQN"))


def test_certify_skips_lore_where_it_cannot_snapshot_saying_why(tmp_path, capsys, monkeypatch):
    pytest.importorskip("Box2D")
    monkeypatch.chdir(tmp_path)
    _lunar_dqn(tmp_path / "ll.zip")
    _config_only(monkeypatch)
    with pytest.raises(SystemExit):
        main(["certify", "ll.zip", "--env", "LunarLander-v3", "--out", "out", "--reward-range", "-200", "200"])
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("skip:")]
    assert len(said) == 1 and "LoRe needs faithful snapshots of LunarLander-v3" in said[0], said
    cfg = yaml.safe_load((tmp_path / "out/config.yaml").read_text())
    assert cfg["environments"]["LunarLander-v3"]["skip"] == ["lore"]


@pytest.mark.slow
def test_certify_a_lunar_lander_dqn_end_to_end_without_lore(tmp_path):
    pytest.importorskip("Box2D")
    _lunar_dqn(tmp_path / "ll.zip")
    p = subprocess.run([sys.executable, "-m", "crop", "certify", "ll.zip", "--env", "LunarLander-v3", "--sigma", "0.1",
                        "--horizon", "30", "--m", "100", "--episodes", "1", "--reward-range", "-200", "200",
                        "--out", "mine", "--cores", "2"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "skip:   lore: LoRe needs faithful snapshots of LunarLander-v3" in p.stdout
    results = tmp_path / "mine/results"
    run = results / "LunarLander-v3/Mine@auto/sigma-0.1"
    assert (run / "gre.csv").is_file() and (run / "attack_local.csv").is_file() and not (run / "lore.csv").exists()
    assert "LoRe:" not in p.stdout.split("σ = 0.1", 1)[1]
    assert not list((results / "figures").glob("*adasearch*")) and list((results / "figures").glob("*all_bounds*"))
    audit = json.loads((results / "audit/audit.json").read_text())
    assert audit["skipped_runs"] == [{"run": "LunarLander-v3/Mine@auto/sigma-0.1", "stages": ["lore"]}]
    assert audit["partial_runs"] == [] and audit["expected_missing"] == [] and audit["integrity"] == []
    assert (tmp_path / "mine/report.html").stat().st_size > 10_000
