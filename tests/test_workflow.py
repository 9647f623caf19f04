"""The whole DAG on tests/configs/smoke.yaml: every output exists, is sane, and no attack beats a
certificate; `snakemake --lint` is clean."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from crop.audit.provenance import config_hash
from crop.certify.lore import lore_bound_at
from crop.workflow import layout
from crop.workflow.config import load_config, sigma_label
from crop.workflow.layout import RUN_FILES

from paths import REPO

SMOKE = REPO / "tests" / "configs" / "smoke.yaml"


def snakemake(*args, cwd):
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(cwd), *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("smoke")
    p = snakemake("--cores", "2", "--configfile", str(SMOKE), cwd=work)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cfg = load_config(SMOKE)
    return work / cfg["results"], cfg, work


@pytest.mark.slow
def test_every_output_exists_and_is_sane(smoke_run):
    results, cfg, _ = smoke_run
    plan = {env: (ec["algorithms"], [sigma_label(s) for s in ec["sigmas"]]) for env, ec in cfg["environments"].items()}
    declared = set(layout.aggregate_files(results / "figures", results / "tables", plan))
    assert {p for d in ("figures", "tables") for p in (results / d).iterdir()} == declared  # nothing undeclared
    for env, ec in cfg["environments"].items():
        labels = [sigma_label(s) for s in ec["sigmas"]]
        for f in layout.figure_files(results / "figures", env, labels, ec["algorithms"]):
            assert f.stat().st_size > 1000, f
        for f in layout.table_files(results / "tables", env):
            if f.suffix == ".csv":
                t = pd.read_csv(f)
                assert len(t) >= len(ec["algorithms"]) and t.notna().any().all(), f
        for algo in ec["algorithms"]:
            rec = json.loads(layout.checkpoint_path(results, env, algo).with_suffix(".json").read_text())
            assert rec["clean_greedy_return"]["mean"] >= 195 and rec["clean_greedy_return"]["episodes"] == 100
            for lab in labels:
                d = layout.run_dir(results, env, algo, lab)
                q = json.loads((d / RUN_FILES["qrange"]).read_text())
                assert q["v_min"] < q["v_max"] and q["checkpoint_sha256"] == rec["sha256"]
                st = pd.read_csv(d / RUN_FILES["loact"])
                assert {"episode", "step", "action", "certified", "radius"} <= set(st.columns)
                assert len(st) == ec["loact"]["episodes"] * ec["loact"]["horizon"]  # CartPole survives
                assert (st["radius"] >= 0).all()
                assert (st.loc[~st["certified"], "radius"] == 0).all()
                assert (st.loc[st["certified"], "radius"] > 0).all()
                certified = st.loc[st["certified"]]
                assert (certified["smoothed_top_lower"] > certified["smoothed_others_upper_max"]).all()
                gre = pd.read_csv(d / RUN_FILES["gre"])
                assert {"eps", "expectation_bound", "percentile_bound", "p"} <= set(gre.columns)
                assert len(gre) == len(ec["gre"]["eps_factors"]) * len(ec["gre"]["percentiles"])
                assert gre["expectation_bound"].is_monotonic_decreasing
                lore = pd.read_csv(d / RUN_FILES["lore"])
                assert list(lore.columns) == ["eps", "lower_bound"] and lore["eps"].iloc[0] == 0
                assert lore["lower_bound"].is_monotonic_decreasing
                for name in ("attack_local", "attack_global"):
                    a = pd.read_csv(d / f"{name}.csv")
                    assert {"eps", "episode", "return"} <= set(a.columns) and len(a) > 0
                assert len(pd.read_csv(d / RUN_FILES["gre_returns"])) == ec["gre"]["m"]
    audit = json.loads((results / "audit" / "audit.json").read_text())
    assert audit["checked"] > 0 and audit["integrity_problems"] == 0
    # The workflow passes the hash of the validated config; every run's checkpoint record is found.
    assert audit["config_hash"] == config_hash(cfg)
    for p in audit["provenance"]:
        kind = "derive" if p["run"].split("/")[1] == "CARRL" else "train"   # CARRL wraps StdTrain's network
        assert p["checkpoint_source"] == kind and p["checkpoint"]["file_verified"], p


@pytest.mark.slow
def test_no_attack_beats_a_certificate(smoke_run):
    """GRe percentile bound vs the global attack's median, LoRe vs the local attack from the same s₀."""
    results, cfg, _ = smoke_run
    checked = 0
    for env, algo, lab in [(e, a, sigma_label(s)) for e, ec in cfg["environments"].items()
                           for a in ec["algorithms"] for s in ec["sigmas"]]:
        d = layout.run_dir(results, env, algo, lab)
        gre = pd.read_csv(d / RUN_FILES["gre"])
        ag = pd.read_csv(d / RUN_FILES["attack_global"])
        for eps, g in ag.groupby("eps"):
            row = gre[np.isclose(gre["eps"], eps) & np.isclose(gre["p"], 0.5)]
            if len(row) and row["percentile_certified"].iloc[0]:
                assert g["return"].median() >= row["percentile_bound"].iloc[0], (lab, eps)
                checked += 1
        lore = pd.read_csv(d / RUN_FILES["lore"])
        al = pd.read_csv(d / RUN_FILES["attack_local"])
        for _, r in al[al["same_start_as_lore"]].iterrows():
            assert r["return"] >= lore_bound_at(lore, r["eps"]), (lab, r["eps"])
            checked += 1
        assert al["flips_certified"].sum() == 0
    assert checked >= 10
    assert json.loads((results / "audit" / "audit.json").read_text())["violations"] == 0


@pytest.mark.slow
def test_rerun_has_nothing_to_do(smoke_run):
    _, _, work = smoke_run
    p = snakemake("-n", "--cores", "1", "--configfile", str(SMOKE), cwd=work)
    assert p.returncode == 0 and "Nothing to be done" in p.stdout + p.stderr


def _report_results(html: str) -> dict:
    """The ``results`` object a Snakemake HTML report embeds: {path: {caption, mime_type, …}}."""
    i = html.index("var results = {") + len("var results = ")
    return json.JSONDecoder().raw_decode(html[i:])[0]


@pytest.mark.slow
def test_snakemake_report(smoke_run):
    results, cfg, work = smoke_run
    p = snakemake("--configfile", str(SMOKE), "--report", "report.html", cwd=work)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    html = (work / "report.html").read_text()
    entries = _report_results(html)
    rel = results.relative_to(work)
    pngs = sorted(f"{rel}/figures/{f.name}" for f in (results / "figures").glob("*.png"))
    csvs = sorted(f"{rel}/tables/{f.name}" for f in (results / "tables").glob("*.csv"))
    assert set(pngs + csvs + [f"{rel}/audit/audit.md"]) == set(entries)
    sigmas = ", ".join(sigma_label(s) for s in cfg["environments"]["CartPole-v0"]["sigmas"])
    for path, e in entries.items():
        cap = e["caption"]
        assert len(cap) > 200, path
        name = path.rsplit("/", 1)[1]
        if "legend" not in name and "audit" not in name:
            assert "Theorem" in cap, path  # which theorem
        if name.endswith(".png") and "legend" not in name:
            assert f"σ ∈ {{{sigmas}}}" in cap and "CartPole-v0" in cap, path  # which settings
    assert "m = 1000 noise samples per state" in entries[f"{rel}/figures/CartPole_stepwise.png"]["caption"]
    assert config_hash(cfg) in entries[f"{rel}/audit/audit.md"]["caption"]
    assert "CROP certification workflow" in html and "runtimes_spec" in html


@pytest.mark.slow
def test_standalone_audit_against_a_reference(smoke_run, tmp_path):
    """`crop audit RESULTS --reference FILE` on the smoke run: values taken from its own tables match, a
    planted mismatch differs, and --strict fails on it."""
    results, cfg, _ = smoke_run
    mr = pd.read_csv(results / "tables" / "CartPole_mean_radius.csv").set_index("algo")
    rb = pd.read_csv(results / "tables" / "CartPole_reward_bounds.csv")
    rows = [{"env": "CartPole-v0", "algo": "StdTrain", "sigma": float(c.split("=")[1]), "metric": "mean_radius",
             "eps": None, "value": mr.loc["StdTrain", c]} for c in mr.columns
            if not c.endswith((" lo", " hi", " sd"))]  # the value, not its interval's columns
    r0 = rb.iloc[0]
    rows.append({"env": "CartPole-v0", "algo": r0["algo"], "sigma": r0["sigma"], "metric": "expectation_bound",
                 "eps": r0["eps"], "value": r0["expectation_bound"] + 25.0})  # planted mismatch
    ref = tmp_path / "ref.csv"
    pd.DataFrame(rows).to_csv(ref, index=False)
    args = [sys.executable, "-m", "crop", "audit", str(results), "--reference", str(ref), "--out-dir",
            str(tmp_path / "audit")]
    p = subprocess.run(args + ["--strict"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    rep = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert rep["reference"]["counts"] == {"match": len(rows) - 1, "differs": 1, "missing": 0}
    assert rep["violations"] == 0 and rep["mismatches"] == 1 and "differs: CartPole-v0/StdTrain" in p.stdout
    assert subprocess.run(args, capture_output=True, text=True, timeout=300).returncode == 0


@pytest.mark.slow
def test_audit_rule_takes_the_config_audit_block(tmp_path):
    """audit.reference / strict / alpha reach `crop audit`, with the hash of the validated config; the
    reference is an input of the rule (a missing one stops the workflow before it runs)."""
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["audit"] = {"reference": "ref.csv", "strict": True, "alpha": 0.01}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    p = snakemake("-n", "-p", "--configfile", str(tmp_path / "c.yaml"), cwd=tmp_path)
    assert p.returncode != 0 and "ref.csv" in p.stdout + p.stderr
    (tmp_path / "ref.csv").write_text("env,algo,sigma,metric,eps,value\n")
    p = snakemake("-n", "-p", "--configfile", str(tmp_path / "c.yaml"), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cmd = next(line for line in p.stdout.splitlines() if line.lstrip().startswith("crop audit")
               or "Shell command: crop audit" in line)
    h = config_hash(load_config(tmp_path / "c.yaml"))
    assert f"--config-hash {h}" in cmd and "--alpha 0.01 --reference ref.csv --strict" in cmd


def test_lint_is_clean(tmp_path):
    p = subprocess.run([sys.executable, "-m", "snakemake", "--lint", "-s", str(REPO / "Snakefile")],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert "Congratulations, your workflow is in a good condition!" in p.stdout + p.stderr, p.stdout + p.stderr


@pytest.mark.slow
def test_paper_config_builds_the_full_dag(tmp_path):
    """configs/paper.yaml: every env × algo × σ × stage is planned, by the rule that owns it, and so are
    every policy's checkpoint and the paper's figures and tables; certification jobs ask for a GPU."""
    from crop.agents.registry import resolve_source

    paper = REPO / "configs" / "paper.yaml"
    p = snakemake("--configfile", str(paper), "--summary", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    planned = {}
    for line in p.stdout.splitlines()[1:]:
        cols = line.split("\t")
        if len(cols) >= 6:
            planned[cols[0]] = cols[2]
    cfg = load_config(paper)
    results = Path(cfg["results"])
    stage_rule = {"qrange": "qrange", "loact": "loact", "loact_episodes": "loact", "certified_ratio": "loact",
                  "gre": "gre", "gre_returns": "gre", "lore": "lore", "attack_local": "attack_local",
                  "attack_global": "attack_global"}
    runs = 0
    for env, ec in cfg["environments"].items():
        assert len(ec["sigmas"]) >= 6
        for algo in ec["algorithms"]:
            resolve_source(env, algo, ec["source"])
            assert planned.pop(str(layout.checkpoint_path(results, env, algo))) == "checkpoint", (env, algo)
            for s in ec["sigmas"]:
                d = layout.run_dir(results, env, algo, sigma_label(s))
                for name, rule in stage_rule.items():
                    assert planned.get(str(d / layout.RUN_FILES[name])) == rule, (d, name)
                if layout.needs_frames(env):
                    assert planned.get(str(d / layout.RUN_FILES["frames"])) == "loact", d
                runs += 1
    assert set(cfg["environments"]) == {"PongNoFrameskip-v4", "FreewayNoFrameskip-v4", "CartPole-v0",
                                        "highway-fast-v0"}
    assert runs == 216
    plan = {env: (ec["algorithms"], [sigma_label(s) for s in ec["sigmas"]]) for env, ec in cfg["environments"].items()}
    for f in layout.aggregate_files(results / "figures", results / "tables", plan):
        assert planned.get(str(f)) == "aggregate", f
    # device: auto — each certification and attack job declares one GPU (SLURM: --gpus=1), except GRe, which
    # steps its environments on CPU cores and runs there (gpu=0, --device cpu), and the jobs of an environment
    # whose own device is cpu (CartPole's and highway's small MLPs)
    p = snakemake("--configfile", str(paper), "-n", "-p", cwd=tmp_path)
    jobs = p.stdout.split("\nrule ")[1:]
    gpu_rules = {"qrange", "loact", "gre", "lore", "attack_local", "attack_global"}
    certs = [j for j in jobs if j.split(":", 1)[0] in gpu_rules]
    assert len(certs) == 6 * runs
    cpu_envs = {env for env, ec in cfg["environments"].items() if ec.get("device") == "cpu"}
    assert cpu_envs == {"CartPole-v0", "highway-fast-v0"}
    on_cpu = [j for j in certs if j.startswith("gre:") or any(f"env={e}," in j for e in cpu_envs)]
    assert all("gpu=0" in j and "--device cpu" in j for j in on_cpu)
    assert len(on_cpu) == runs + 5 * sum(len(cfg["environments"][e]["algorithms"]) *
                                         len(cfg["environments"][e]["sigmas"]) for e in cpu_envs)
    assert all("gpu=1" in j and "--device auto" in j for j in certs if j not in on_cpu)
