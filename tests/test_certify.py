"""`crop certify POLICY --env ID` (docs/own-policy.md, "In one command"): bad input is one line before any
job, with nothing written; the config it writes validates with the budget's sizes; end to end (slow), the
table it prints is the results files' and its config.yaml re-runs as a no-op."""
import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from crop.__main__ import main
from crop.workflow.certify_config import budget_sizes, certify_config
from crop.workflow.config import validate_config

from certify_helpers import cartpole_dqn, refused
from networks import sb3_sac
from paths import REPO


@pytest.mark.parametrize("case", ["missing", "no agent", "actor on Discrete", "Q-network on Box"])
def test_bad_input_is_one_line_and_writes_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = {"missing": (tmp_path / "nothere.zip", "CartPole-v1"),
             "no agent": (tmp_path / "notes.pt", "CartPole-v1"),
             "actor on Discrete": (tmp_path / "sac.zip", "CartPole-v1"),
             "Q-network on Box": (tmp_path / "dqn.zip", "Pendulum-v1")}
    path, env = files[case]
    if case == "no agent":
        path.write_text("not a network")
    elif case == "actor on Discrete":
        sb3_sac(path)
    elif case == "Q-network on Box":
        cartpole_dqn(path)
    before = sorted(tmp_path.rglob("*"))
    err = refused([str(path.name), "--env", env, "--out", "out"], capsys)
    assert str(path) in err, err
    if case.startswith("actor"):
        assert "continuous-action actor" in err and "Discrete" in err, err
    if case.startswith("Q-network"):
        assert "Box" in err, err
    assert sorted(tmp_path.rglob("*")) == before


def test_an_unknown_environment_and_a_missing_reward_range_arerefused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cartpole_dqn(tmp_path / "dqn.zip")
    assert "--env: unknown environment 'NoSuch-v0'" in refused(["dqn.zip", "--env", "NoSuch-v0"], capsys)
    # CartPole-v0 is the paper's: its reward facts are the paper's, a range given for it is refused
    assert "--reward-range" in refused(["dqn.zip", "--env", "CartPole-v0", "--reward-range", "0", "1"], capsys)
    with pytest.raises(SystemExit) as e:   # a flag's own type: argparse's usage and error, exit 2
        main(["certify", "dqn.zip", "--env", "CartPole-v1", "--algo", "sigma-x"])
    assert e.value.code == 2 and "argument --algo: 'sigma-x' is not a valid label" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dqn.zip"]


@pytest.mark.parametrize("env, box", [("CartPole-v1", False), ("Pendulum-v1", True), ("CartPole-v0", False)])
@pytest.mark.parametrize("budget", ["quick", "paper"])
def test_each_budget_writes_a_config_the_workflow_accepts(env, box, budget, tmp_path):
    sizes, sigmas = budget_sizes(budget, env)
    paper = yaml.safe_load((REPO / "configs/paper.yaml").read_text())["environments"]
    if budget == "paper":   # the paper's sizes: the environment's own block, else CartPole's (vector) protocol
        block = paper.get(env, paper["CartPole-v0"])
        assert sigmas == block["sigmas"] and sizes["gre"] == block["gre"] and sizes["loact"] == block["loact"]
    rewards = None if env == "CartPole-v0" else ({"range": [-16.2736045, 0.0]} if box else {"range": [0, 1]})
    cfg = certify_config(env, ("Mine", tmp_path / "p.zip"), tmp_path / "out", sizes, sigmas, rewards, box)
    assert cfg["results"] == str(tmp_path / "out" / "results")
    ec = validate_config(cfg, "crop certify")["environments"][env]
    assert ec["files"]["Mine"]["path"] == str(tmp_path / "p.zip")
    if budget == "quick":   # the global attack at every ε GRe bounds: each row of the table has both
        assert sizes["attack"]["global_eps_factors"] == sizes["gre"]["eps_factors"]
    assert ("lore" in cfg["environments"][env]) != box and ("qrange" in cfg["environments"][env]) != box


def _printed(out: str, sigma: str) -> str:
    return out.split(f"σ = {sigma}", 1)[1].split("σ = ", 1)[0]


@pytest.mark.slow
def test_certify_a_cartpole_dqn_end_to_end(tmp_path):
    cartpole_dqn(tmp_path / "dqn.zip")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "crop", "certify", "dqn.zip", "--env", "CartPole-v1", "--sigma", "0.1",
                        "--out", "mine", "--cores", "2"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out, run = p.stdout, tmp_path / "mine/results/CartPole-v1/Mine@auto/sigma-0.1"
    assert "a Q-network" in out and "sb3 format" in out and "smoothing target auto" in out
    assert "bound clopper_pearson" in out and yaml.safe_load((tmp_path / "mine/config.yaml").read_text())["bound"] \
        == "clopper_pearson"
    chosen = json.loads((run / "qrange.json").read_text())["target_choice"]["chosen"]
    assert f"σ = 0.1 (target auto chose {chosen};" in out
    assert f"logs:   {tmp_path / 'mine/results/logs'}/" in out
    loact = pd.read_csv(run / "loact.csv")
    assert f"LoAct: {loact['certified'].mean():.1%} of {len(loact)} steps certified (radius > 0), mean radius " \
           f"{loact['radius'].mean():.4g}" in out
    table = _printed(out, "0.1")
    gre, attack = pd.read_csv(run / "gre.csv"), pd.read_csv(run / "attack_global.csv")
    assert "return over the first 500 steps (J_min = 0; a bound at J_min is vacuous" in table
    cell = r"(\S+(?: \(vacuous\))?)"
    for _, g in gre.iterrows():
        row = re.search(rf"^\s+{g['eps']:.4g}\s+{cell}\s+{cell}\s+{cell}\s+(\S+)\s+(\S+)$", table, flags=re.M)
        for k, col in ((1, "expectation_bound"), (2, "cdf_expectation_bound"), (3, "percentile_bound")):
            at_floor = g[col] <= g["j_min"] + 1e-9 * max(1.0, abs(g["j_min"]))   # vacuous exactly where at J_min
            want = "none" if pd.isna(g[col]) else f"{g[col]:.4g}" + (" (vacuous)" if at_floor else "")
            assert row and row.group(k) == want, table
        a = attack[(attack["eps"] - g["eps"]).abs() < 1e-12]
        assert row.group(4) == (f"{a['return'].mean():.4g}" if len(a) else "—")
    lore = pd.read_csv(run / "lore.csv")
    assert f"LoRe: return over the first 3 steps >= {lore['lower_bound'].iloc[0]:.4g}" in table
    from crop.audit.audit import verdict_line

    audit = json.loads((tmp_path / "mine/results/audit/audit.json").read_text())
    assert f"audit:  {verdict_line(audit)}" in out and audit["verdict"] in ("PASS", "WARN")
    report = tmp_path / "mine/report.html"
    assert f"report: {report}" in out and report.stat().st_size > 10_000
    # the config repeats the run: from another working directory, Snakemake finds nothing to do
    config = tmp_path / "mine/config.yaml"
    assert yaml.safe_load(config.read_text())["environments"]["CartPole-v1"]["files"]["Mine"]["path"] == \
        str(tmp_path / "dqn.zip")
    again = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1",
                            "--configfile", str(config), "--directory", str(tmp_path / "mine"), "-n"],
                           cwd=tmp_path / "mine" / "results", env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stderr[-2000:]
    # Snakemake's state is the folder's, nothing else was written beside the agent
    assert (tmp_path / "mine/.snakemake").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["dqn.zip", "mine"]
    # and crop certify itself, again: the same agent's folder, where Snakemake finds nothing to do
    p2 = subprocess.run([sys.executable, "-m", "crop", "certify", "dqn.zip", "--env", "CartPole-v1", "--sigma", "0.1",
                         "--out", "mine", "--cores", "2"], cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=600)
    assert p2.returncode == 0 and "Nothing to be done" in p2.stdout + p2.stderr, p2.stderr[-2000:]
