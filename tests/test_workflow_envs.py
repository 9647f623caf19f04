"""Smoke runs of the whole DAG on the other environment families: an Atari policy (SA-DQN's format)
fetched through a mirror, and CROP's published highway checkpoints through a mirror."""
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from crop.io import meta_name
from crop.models import build_network
from crop.workflow.layout import RUN_FILES, run_dir
from crop.workflow.stage_table import STAGES

from paths import REPO, SHARED


def run_smoke(config: Path, work: Path, mirror: str):
    env = dict(os.environ, CROP_CHECKPOINT_MIRROR=mirror, CROP_CACHE=str(work / "cache"))
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                        str(work), "--cores", "2", "--configfile", str(config)],
                       capture_output=True, text=True, timeout=1200, env=env)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]


@pytest.mark.parametrize("config", ["atari_smoke.yaml", "highway_smoke.yaml"])
def test_the_smoke_configs_plan_every_stage(tmp_path, config):
    """The fast counterpart of the end-to-end runs below: each smoke config's DAG holds every stage's rule
    (a dry run; nothing is fetched)."""
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                        str(tmp_path), "--cores", "1", "--configfile", str(REPO / "tests/configs" / config), "-n"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    planned = set(re.findall(r"^(?:local)?rule (\w+):$", p.stdout + p.stderr, re.M))
    assert planned >= {"checkpoint", *(row.rule for row in STAGES.values()), "aggregate", "audit"}, planned


@pytest.mark.slow
def test_atari_policy_end_to_end(tmp_path, serve):
    site = tmp_path / "site"
    site.mkdir()
    torch.manual_seed(0)
    net = build_network({"arch": "dueling_cnn", "in_channels": 1, "in_size": 84, "out": 4})
    buf = io.BytesIO()
    torch.save(net.state_dict(), buf)
    with tarfile.open(site / "sa-dqn-models.tar.gz", "w:gz") as tf:
        ti = tarfile.TarInfo("models/Pong-natural.model")
        ti.size = len(buf.getvalue())
        tf.addfile(ti, io.BytesIO(buf.getvalue()))
    work = tmp_path / "work"
    run_smoke(REPO / "tests/configs/atari_smoke.yaml", work, serve(site))
    d = run_dir(work / "results-atari", "PongNoFrameskip-v4", "StdTrain", "0.01")
    st = pd.read_csv(d / RUN_FILES["loact"])
    assert len(st) >= 1 and (st["radius"] >= 0).all() and set(st["action"]) <= {0, 1, 2, 3}
    with np.load(d / RUN_FILES["frames"]) as z:
        assert z["frames"].shape[1:] == (210, 160, 3) and len(z["frames"]) == len(st[st.episode == 0])
    rec = json.loads((work / "results-atari/PongNoFrameskip-v4/StdTrain/checkpoint/model.json").read_text())
    assert rec["source"] == "published" and rec["pinned_by"] == "lock file"
    assert "http://download.huan-zhang.com" in (work / "checkpoints.lock.json").read_text()
    assert json.loads((work / "results-atari/audit/audit.json").read_text())["violations"] == 0
    assert json.loads((d / meta_name(RUN_FILES["lore"])).read_text())["search"]["reward_modification"] == "max(r, 0)"


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "checkpoints").is_dir(), reason="../shared/checkpoints not present")
def test_highway_published_checkpoints_end_to_end(tmp_path, serve):
    work = tmp_path / "work"
    run_smoke(REPO / "tests/configs/highway_smoke.yaml", work, serve(SHARED / "checkpoints"))
    for algo in ("StdTrain", "RadialRL"):
        d = run_dir(work / "results-highway", "highway-fast-v0", algo, "0.05")
        for f in (RUN_FILES[k] for k in ("loact", "gre", "lore", "attack_local", "attack_global")):
            assert len(pd.read_csv(d / f)) > 0, f
    audit = json.loads((work / "results-highway/audit/audit.json").read_text())
    assert audit["violations"] == 0 and audit["integrity_problems"] == 0
    assert (work / "results-highway/figures/highway-fast_adasearch_sigma-0.05.png").is_file()
