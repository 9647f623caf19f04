"""Smoothing targets in the workflow: a config's `target` / `targets` give each target its own runs
(q in today's folders, another in ENV/ALGO@TARGET/sigma-S), tables and figure lines "StdTrain (vote)", and an
audit of each against attacks on its own policy; probs and vote run every stage without a qrange job.  At
smoke size: an SB3-format PPO file, a CleanRL PPO file and a Q-network under `target: vote`."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from crop.io import meta_name
from crop.workflow import layout
from crop.workflow.config import ConfigError, run_targets, validate_config
from crop.workflow.layout import RUN_FILES

from networks import CleanRLAgent, sb3_data, sb3_mlp_policy, sb3_zip
from paths import REPO

ENV = "CartPole-v0"


def _config(tmp_path, files: dict, **env) -> Path:
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "smoke.yaml").read_text())
    cfg["results"] = str(tmp_path / "results")
    ec = cfg["environments"][ENV]
    ec.update(source="file", files={a: {"path": str(p)} for a, p in files.items()}, algorithms=list(files),
              sigmas=[0.2], train={"eval_episodes": 2}, qrange={"m": 200, "episodes": 1, "horizon": 20},
              loact={"m": 400, "episodes": 2, "horizon": 20},
              gre={"m": 200, "horizon": 20, "eps_factors": [0.0, 0.05]}, lore={"m": 400, "horizon": 3},
              attack={"local_episodes": 2, "local_m_grad": 16, "local_eps_factors": [0.0, 1.0],
                      "global_episodes": 2, "global_eps_factors": [0.0, 0.1], "pgd_steps": 3}, **env)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _snakemake(cfg: Path, *args):
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(cfg.parent), "--configfile", str(cfg), *args], capture_output=True, text=True,
                          timeout=900)


def _check_runs(results: Path, expected: dict) -> None:
    """Every run of ``expected`` {(algo, target): network} is complete for its target, has no qrange.json
    (probs, vote), certifies with its own target, and is audited with its checkpoint found; the tables name
    it "ALGO (TARGET)"; nothing ran a qrange job."""
    assert not list(results.rglob(RUN_FILES["qrange"])) and not list((results / "logs").rglob("qrange.log"))
    for (algo, target), network in expected.items():
        d = layout.run_dir(results, ENV, algo, "0.2", target)
        assert d == results / ENV / f"{algo}@{target}" / "sigma-0.2"
        assert all((d / f).is_file() for f in layout.run_files(target).values())
        meta = json.loads((d / meta_name(RUN_FILES["loact"])).read_text())
        assert meta["target"] == target and (meta["v_min"], meta["v_max"]) == (0.0, 1.0)
        assert set(meta["inputs"]) == {"checkpoint"}
        lore_meta = json.loads((d / meta_name(RUN_FILES["lore"])).read_text())
        assert lore_meta["settings"]["target"] == target
        rec = json.loads(layout.checkpoint_record(results, ENV, algo).read_text())
        assert rec["network"] == network
    table = pd.read_csv(results / "tables" / "CartPole_mean_radius.csv")
    assert sorted(table["algo"]) == sorted(f"{a} ({t})" for a, t in expected)
    assert "(vote)" in (results / "tables" / "CartPole_benign_return.md").read_text()
    audit = json.loads((results / "audit" / "audit.json").read_text())
    assert audit["violations"] == 0 and audit["integrity_problems"] == 0 and audit["checked"] > 0
    assert sorted(audit["runs"]) == sorted(f"{ENV}/{a}@{t}/sigma-0.2" for a, t in expected)
    for p in audit["provenance"]:
        assert p["checkpoint"]["file_verified"], p


@pytest.mark.slow
def test_sb3_ppo_file_runs_through_the_workflow_with_probs_and_vote(tmp_path):
    state, _ = sb3_mlp_policy([4, 64, 64], [4, 64, 64], 2, seed=1)
    cfg = _config(tmp_path, {"StdTrain": sb3_zip(tmp_path / "ppo_cartpole.zip", state,
                                                 sb3_data())}, targets=["probs", "vote"])
    p = _snakemake(cfg, "--cores", "2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    _check_runs(tmp_path / "results", {("StdTrain", "probs"): "policy", ("StdTrain", "vote"): "policy"})


@pytest.mark.slow
def test_target_vote_runs_every_stage_without_qrange_for_a_q_network_and_a_cleanrl_ppo(tmp_path):
    torch.manual_seed(0)
    q = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    torch.save(q.state_dict(), tmp_path / "q.pt")
    src = tmp_path / "runs" / "CartPole-v1__ppo__1__1" / "ppo.cleanrl_model"
    src.parent.mkdir(parents=True)
    torch.save(CleanRLAgent().state_dict(), src)
    cfg = _config(tmp_path, {"StdTrain": tmp_path / "q.pt", "GaussAug": src}, target="vote")
    p = _snakemake(cfg, "--cores", "2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    _check_runs(tmp_path / "results", {("StdTrain", "vote"): "q", ("GaussAug", "vote"): "policy"})


@pytest.mark.slow
def test_q_and_vote_side_by_side_plan_qrange_for_q_only(tmp_path):
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).state_dict(),
               tmp_path / "q.pt")
    cfg = _config(tmp_path, {"StdTrain": tmp_path / "q.pt"}, targets=["q", "vote"])
    p = _snakemake(cfg, "-n", "-p")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    loact = [ln for ln in p.stdout.splitlines() if "crop loact " in ln]
    assert len(loact) == 2
    q_cmd = next(c for c in loact if "--target q" in c)
    vote_cmd = next(c for c in loact if "--target vote" in c)
    assert "--qrange" in q_cmd and "--qrange" not in vote_cmd and "StdTrain@vote/sigma-0.2" in vote_cmd
    assert "--algo StdTrain " in vote_cmd   # the run folder's @vote is not part of the algorithm
    qrange = [ln for ln in p.stdout.splitlines() if "crop qrange " in ln]
    assert len(qrange) == 1 and f"StdTrain/sigma-0.2/{RUN_FILES['qrange']}" in qrange[0]


def test_config_targets_and_layout():
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "smoke.yaml").read_text())
    ec = cfg["environments"][ENV]
    assert {t for *_, t in run_targets(validate_config(cfg))} == {"q"}   # default: today's runs
    ec["targets"] = ["q", "vote"]
    assert sorted({t for *_, t in run_targets(validate_config(cfg))}) == ["q", "vote"]
    ec["targets"] = ["vote", "logits"]
    with pytest.raises(ConfigError, match="targets"):
        validate_config(cfg)
    # q keeps today's folder; another target's cannot be any method label's (labels have no '@')
    assert layout.run_dir("R", ENV, "SA-MDP-PGD", "0.1") == Path("R", ENV, "SA-MDP-PGD", "sigma-0.1")
    for label in ("StdTrain", "my-method_v1.2+x"):
        for t in ("probs", "vote"):
            name = layout.run_algo(label, t)
            assert layout.split_run_algo(name) == (label, t) and layout.series_label(name) == f"{label} ({t})"
            assert layout.run_target(layout.run_dir("R", ENV, label, "0.1", t)) == t
    assert layout.split_run_algo("my-method_v1.2+x") == ("my-method_v1.2+x", "q")
    assert "qrange" not in layout.run_files("vote") and layout.run_files("q") == layout.RUN_FILES


def test_the_rules_algo_wildcard_matches_every_run_folder_name_and_no_other():
    """rules/common.smk's {algo} constraint (layout.run_algo_pattern): each algorithm alone (q) and with each
    target a folder's name spells; no other label, target or separator."""
    import re

    from crop.names import ACTION_TARGET, AUTO_TARGET, TARGET_NAMES

    labels = ("StdTrain", "my-method_v1.2+x")
    pattern = re.compile(layout.run_algo_pattern(labels))
    for label in labels:
        for t in (*TARGET_NAMES, AUTO_TARGET, ACTION_TARGET):
            assert pattern.fullmatch(layout.run_algo(label, t)), (label, t)
    for other in ("GaussAug", "StdTrain@logits", "StdTrain@q", "StdTrain@", "my-method_v1.2xx", "StdTrain-vote"):
        assert not pattern.fullmatch(other), other
