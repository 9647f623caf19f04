"""The audit on a small synthetic results folder: planted violations and mismatches are reported with their
place, integrity problems are caught, provenance is recorded, strict mode fails the exit status."""
import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from crop.audit.audit import AuditOptions, audit
from crop.audit.provenance import config_hash
from crop.audit.reference import DEFAULT_TOLERANCES, ReferenceError, load_reference, load_tolerances, tolerance_for
from crop.io import meta_name
from crop.workflow import layout
from crop.workflow.config import load_config
from crop.workflow.layout import RUN_FILES

from synthetic_results import (
    GLOBAL_FACTORS,
    GRE_FACTORS,
    LOCAL_FACTORS,
    audit_cli,
    make_results,
    rewrite_csv,
    rewrite_loact,
    tiny_checkpoint,
    tiny_real_run,
    write_reference,
)

PLAN = {"CartPole-v0": {"StdTrain": [0.05, 0.1], "GaussAug": [0.1]},
        "FreewayNoFrameskip-v4": {"RadialRL": [1.5]}}

AUDIT_KEYS = {"schema_version", "results", "runs", "alpha", "config_hash", "strict", "passed", "checked",
              "violations", "empirical_below", "integrity_problems", "integrity", "incomplete_runs", "partial_runs",
              "skipped_runs",
              "violation_list", "checks", "provenance", "warnings", "mismatches", "reference_missing", "reference",
              "reproduction", "multiple_testing", "verdict", "statuses", "suspicious", "untestable",
              "suspicious_list", "untestable_list", "reproduction_report", "vacuous", "vacuous_list", "pooled", "rerun",
              "clipped_runs", "expected_missing"}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    make_results(root, PLAN)
    return root


@pytest.fixture
def results(pristine, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(pristine, root)
    return root


def _run(root, env="CartPole-v0", algo="StdTrain", lab="0.1"):
    return layout.run_dir(root, env, algo, lab)


def _verdicts(rep):
    """Verdicts of the reference's rows (the run's values the reference lacks come after them)."""
    return [c["verdict"] for c in rep["reference"]["comparisons"] if c["verdict"] != "not_in_reference"]


@pytest.mark.slow
def test_sound_results_pass(results):
    rep = audit(results, results / "audit", AuditOptions(config_hash="abc123"))
    assert set(rep) == AUDIT_KEYS
    assert rep["passed"] and rep["violations"] == 0 and rep["integrity_problems"] == 0
    assert len(rep["runs"]) == 4 and rep["checked"] >= 4 * 10
    # Freeway's LoRe checks too (|A| = 3, no LoAct margin beyond ε): they are bounded along the attacked path
    # through LoRe's own recorded states, not estimated along LoAct's clean episode.
    assert rep["verdict"] == "PASS" and rep["suspicious"] == 0 and rep["untestable"] == 0
    assert rep["statuses"]["ok"] + rep["vacuous"] == rep["checked"]
    assert any(c["algo"] == "RadialRL" and c["check"] == "lore_vs_pgd_local" and c["status"] == "ok"
               for c in rep["checks"])
    assert rep["reproduction"] is None
    kinds = {c["check"] for c in rep["checks"]}
    assert {"lore_vs_pgd_local", "gre_expectation_vs_pgd_mean", "gre_percentile_p0.5_vs_pgd",
            "loact_certified_steps_not_flipped"} <= kinds
    on_disk = json.loads((results / "audit" / "audit.json").read_text())
    assert on_disk["passed"] and on_disk["config_hash"] == "abc123" and on_disk["verdict"] == "PASS"
    md = (results / "audit" / "audit.md").read_text()
    assert md.startswith("# CROP audit\n\n**Sound as far as tested**: ")
    assert "## Untestable checks" not in md and "## Vacuous bounds" in md
    assert audit_cli(results, "--out-dir", results / "a2") == 0
    assert audit_cli(results, "--strict", "--out-dir", results / "a2") == 0


def test_planted_violations_are_listed_with_their_place(results):
    # LoRe: the local PGD from LoRe's own initial state ends below the certified bound at ε = σ.
    d = _run(results)
    al = pd.read_csv(d / RUN_FILES["attack_local"])
    at = np.isclose(al["eps"], 0.1) & al["same_start_as_lore"]
    lore = pd.read_csv(d / RUN_FILES["lore"])
    bound = float(lore[lore["eps"] <= 0.1]["lower_bound"].iloc[-1])
    al.loc[at, "return"] = bound - 1
    rewrite_csv(d / RUN_FILES["attack_local"], al)
    # LoAct: the actions of certified steps flipped under attack, at every attacked step of every episode.
    _plant_flips(d, 0.05)
    # GRe: the expectation bound rises with ε in another run.
    d2 = _run(results, "CartPole-v0", "GaussAug", "0.1")
    gre = pd.read_csv(d2 / RUN_FILES["gre"])
    gre.loc[gre.index[-1], "expectation_bound"] = gre["expectation_bound"].iloc[-2] + 1.0
    rewrite_csv(d2 / RUN_FILES["gre"], gre)

    rep = audit(results, results / "audit")
    assert not rep["passed"] and rep["violations"] == 3 and rep["verdict"] == "FAIL"
    got = {(v["env"], v["algo"], v["sigma"], round(v["eps"], 9), v["check"]) for v in rep["violation_list"]}
    assert got == {("CartPole-v0", "StdTrain", 0.1, 0.05, "loact_certified_steps_not_flipped"),
                   ("CartPole-v0", "StdTrain", 0.1, 0.1, "lore_vs_pgd_local"),
                   ("CartPole-v0", "GaussAug", 0.1, round(float(gre["eps"].iloc[-2]), 9), "gre_expectation_monotone")}
    # The LoRe shortfall lies along a path that stayed in LoRe's tree to its horizon: its p-value (the α LoRe
    # spent, 1e-3) is significant within its run only, yet no noise explains a tree path below the tree's least
    # return — a violation with no chance involved.
    lore_c = next(c for c in rep["checks"] if c["check"] == "lore_vs_pgd_local" and c["empirical_below"])
    assert lore_c["bound"] == bound and lore_c["observed"] == bound - 1
    assert "stayed in LoRe's tree" in lore_c["impossible"]
    assert lore_c["status"] == "violation" and lore_c["p_value"] == pytest.approx(1e-3)
    md = (results / "audit" / "audit.md").read_text()
    assert md.startswith("# CROP audit\n\n**FAIL**: 3 soundness violation(s): ") and "Holm" in md
    violations = md.split("## Soundness violations")[1].split("##")[0]
    assert "loact_certified_steps_not_flipped" in violations and "lore_vs_pgd_local" in violations
    assert audit_cli(results, "--out-dir", results / "a2") == 1  # FAIL exits 1, strict or not
    assert audit_cli(results, "--strict", "--out-dir", results / "a2") == 1


def test_gre_needs_significance_before_a_violation(results):
    d = _run(results, "CartPole-v0", "StdTrain", "0.05")
    gre = pd.read_csv(d / RUN_FILES["gre"])
    ag = pd.read_csv(d / RUN_FILES["attack_global"])
    e1, e2 = sorted(ag["eps"].unique())[1:3]
    pb1 = float(gre.loc[np.isclose(gre["eps"], e1), "percentile_bound"].iloc[0])
    pb2 = float(gre.loc[np.isclose(gre["eps"], e2), "percentile_bound"].iloc[0])
    # At e1 one attacked episode (of 12) falls below J_p: P[Bin(12, 0.5) >= 1] is large, not a violation.
    ag.loc[ag.index[np.isclose(ag["eps"], e1)][0], "return"] = pb1 - 5
    # At e2 every attacked episode falls below J_p: P[Bin(12, 0.5) >= 12] = 2^-12, a violation.
    ag.loc[np.isclose(ag["eps"], e2), "return"] = pb2 - 5
    rewrite_csv(d / RUN_FILES["attack_global"], ag)
    rep = audit(results, results / "audit", AuditOptions(alpha=0.05))
    rows = {round(c["eps"], 9): c for c in rep["checks"] if c["check"] == "gre_percentile_p0.5_vs_pgd"
            and c["algo"] == "StdTrain" and c["sigma"] == 0.05}
    assert rows[round(e1, 9)]["attacked_below"] == 1 and not rows[round(e1, 9)]["violation"]
    assert rows[round(e1, 9)]["p_value"] > 0.05
    assert rows[round(e2, 9)]["violation"] and math.isclose(rows[round(e2, 9)]["p_value"], 0.5 ** 12)
    assert any(v["check"] == "gre_percentile_p0.5_vs_pgd" and math.isclose(v["eps"], e2)
               for v in rep["violation_list"])


def _reference_rows(results):
    """Reference values computed here from the raw files (not by the code under test)."""
    d = _run(results)
    st = pd.read_csv(d / RUN_FILES["loact"])
    ep = pd.read_csv(d / RUN_FILES["loact_episodes"])
    gre = pd.read_csv(d / RUN_FILES["gre"])
    lore = pd.read_csv(d / RUN_FILES["lore"])
    ag = pd.read_csv(d / RUN_FILES["attack_global"])
    e = float(gre["eps"].iloc[1])
    return {
        "radius": dict(env="CartPole-v0", algo="StdTrain", sigma=0.1, metric="mean_radius", eps=None,
                       value=st["radius"].mean()),
        # 3 % above the upper end of the t-interval over its episodes (computed here): outside the interval,
        # within the default 5 % tolerance that widens it
        "benign": dict(env="CartPole-v0", algo="StdTrain", sigma=0.1, metric="benign_return", eps=None,
                       value=(ep["return"].mean() + stats.t.ppf(0.975, len(ep) - 1) * ep["return"].std(ddof=1)
                              / math.sqrt(len(ep))) * 1.03),
        "mismatch": dict(env="CartPole-v0", algo="StdTrain", sigma=0.1, metric="expectation_bound", eps=e,
                         value=float(gre["expectation_bound"].iloc[1]) + 7.5),  # planted: 7.5 reward units off
        "lore": dict(env="CartPole-v0", algo="StdTrain", sigma=0.1, metric="lore_bound", eps=0.07,  # between radii
                     value=float(lore[lore["eps"] <= 0.07]["lower_bound"].iloc[-1])),
        "median": dict(env="CartPole-v0", algo="StdTrain", sigma=0.1, metric="pgd_global_median", eps=e,
                       value=float(ag[np.isclose(ag["eps"], e)]["return"].median())),
        "off_grid": dict(env="CartPole-v0", algo="StdTrain", sigma=0.1, metric="expectation_bound", eps=0.0123,
                         value=1.0),
        "no_run": dict(env="CartPole-v0", algo="StdTrain", sigma=0.7, metric="mean_radius", eps=None, value=0.1),
    }


@pytest.mark.slow
def test_planted_reference_mismatch_is_reported(results):
    rows = _reference_rows(results)
    ref = write_reference(results.parent / "ref.csv", list(rows.values()))
    rep = audit(results, results / "audit", AuditOptions(reference=ref))
    comps = rep["reference"]["comparisons"]
    verdict = dict(zip(rows, (c["verdict"] for c in comps)))
    assert verdict == {"radius": "match", "benign": "match", "mismatch": "differs", "lore": "match",
                       "median": "match", "off_grid": "missing", "no_run": "missing"}
    bad = comps[list(rows).index("mismatch")]
    assert math.isclose(bad["delta"], -7.5, abs_tol=1e-6) and bad["allowed"] < 7.5
    assert rep["reference"]["counts"] == {"match": 4, "differs": 1, "missing": 2}
    assert rep["mismatches"] == 1 and rep["reference_missing"] == 2
    assert rep["violations"] == 0 and rep["verdict"] != "FAIL"  # a mismatch is not a soundness violation
    assert rep["reproduction"] == {"agree": 4, "differ": 1, "not_in_run": 2,
                                   "not_in_reference": rep["reference"]["not_in_reference"]}
    md = (results / "audit" / "audit.md").read_text()
    assert "### Differs (1)" in md and "expectation_bound" in md.split("### Differs (1)")[1].split("###")[0]
    assert md.splitlines()[2].count("**Reproduction**") == 1 and "1 differ" in md.splitlines()[2]
    assert audit_cli(results, "--reference", ref, "--out-dir", results / "a2") == 0
    assert audit_cli(results, "--reference", ref, "--strict", "--out-dir", results / "a2") == 1
    # Missing reference values alone are not a differing row (strict mode still fails here on the WARN).
    only_missing = write_reference(results.parent / "ref2.csv", [rows["radius"], rows["off_grid"], rows["no_run"]])
    assert audit_cli(results, "--reference", only_missing, "--out-dir", results / "a3") == 0
    rep3 = json.loads((results / "a3" / "audit.json").read_text())
    assert rep3["passed"] and rep3["reference"]["counts"] == {"match": 1, "differs": 0, "missing": 2}
    assert rep3["reproduction"]["differ"] == 0


def _set_clip(d, clip, keys=("loact",)):
    """Record in the meta of ``keys``' files in run folder ``d`` that they ran with rewards clipped to ``clip``
    (None: the environment's own rewards); a meta carries no hash of its own, as a rerun with another clip."""
    for key in keys:
        m = d / meta_name(RUN_FILES[key])
        meta = json.loads(m.read_text())
        meta.pop("reward_clip", None)
        m.write_text(json.dumps(meta if clip is None else {**meta, "reward_clip": clip}))


def test_reference_rows_of_clipped_returns_say_so_and_radii_do_not(results):
    """A run whose returns are of clipped rewards (rewards.clip): every compared (or listed) value that is a
    return or a bound on one carries the clip (``reward_clip``, its note, a sentence in audit.md's reference
    section and in reproduction.md); its radii, LoRe's bound (never clipped) and the other runs' values are not
    marked, and no verdict changes."""
    from crop.report.metrics import RETURN_METRICS

    rows = _reference_rows(results)
    ref = write_reference(results.parent / "ref.csv", list(rows.values()))
    before = audit(results, results / "a0", AuditOptions(reference=ref))
    assert "reward_clip" not in json.dumps(before["reference"]) and \
        "Returns of clipped rewards" not in (results / "a0" / "audit.md").read_text()
    run = _run(results)
    _set_clip(run, [-1.0, 3.0], ("loact", "gre", "attack_global"))
    rep = audit(results, results / "a1", AuditOptions(reference=ref))
    comps = rep["reference"]["comparisons"]
    assert [c["verdict"] for c in comps] == [c["verdict"] for c in before["reference"]["comparisons"]]
    named = dict(zip(rows, comps))
    for name in ("benign", "mismatch", "median"):   # benign_return, expectation_bound, pgd_global_median
        assert named[name]["reward_clip"] == [-1.0, 3.0], name
        assert "reproduced from rewards clipped to [-1, 3] (rewards.clip)" in named[name]["note"], name
    for name in ("radius", "lore", "off_grid", "no_run"):   # no return, never clipped, or no reproduced value
        assert "reward_clip" not in named[name] and "clipped" not in named[name]["note"], name
    listed = [c for c in comps if c["verdict"] == "not_in_reference"]
    ours = [c for c in listed if (c["algo"], c["sigma"]) == ("StdTrain", 0.1)]
    assert {c["metric"].split("_p0")[0] for c in ours if "reward_clip" in c} == \
        {m for m in RETURN_METRICS if any(c["metric"].startswith(m) for c in ours)} != set()
    assert not any("reward_clip" in c for c in listed if (c["algo"], c["sigma"]) != ("StdTrain", 0.1))
    md = (results / "a1" / "audit.md").read_text()
    section = md.split("## Reference comparison")[1]
    sentence = next(line for line in section.splitlines() if line.startswith("**Returns of clipped rewards.**"))
    assert "CartPole-v0 StdTrain σ = 0.1, rewards clipped to [-1, 3]: `benign_return`, `expectation_bound`" \
        in sentence and "`pgd_global_median`" in sentence
    assert "mean_radius" not in sentence and "lore_bound" not in sentence and "GaussAug" not in sentence
    differs = section.split("### Differs (1)")[1].split("###")[0]
    assert "| expectation_bound |" in differs and "reproduced from rewards clipped to [-1, 3]" in differs
    repro = (results / "a1" / "reproduction.md").read_text().split("## CartPole-v0")[1].split("\n## ")[0]
    assert "are reproduced from rewards clipped to [-1, 3] (`rewards.clip`)" in repro
    assert "Returns of clipped rewards" not in (results / "a0" / "reproduction.md").read_text()


@pytest.mark.slow
def test_tolerances_file_and_flags(results, tmp_path):
    rows = _reference_rows(results)
    ref = write_reference(tmp_path / "ref.csv", [rows["benign"], rows["mismatch"]])
    # --rel-tol/--abs-tol override every metric: 3 % off is now too much.
    assert audit_cli(results, "--reference", ref, "--rel-tol", "0.01", "--abs-tol", "0",
                     "--out-dir", tmp_path / "a") == 0
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert _verdicts(rep) == ["differs", "differs"]
    # A tolerances file widening one metric (and nothing else).
    tol = tmp_path / "tol.yaml"
    tol.write_text(yaml.safe_dump({"expectation_bound": {"abs": 8.0}, "default": {"rel": 0.0}}))
    rep = audit(results, tmp_path / "b", AuditOptions(reference=ref, tolerances=tol))
    assert _verdicts(rep) == ["match", "match"]
    assert rep["reference"]["tolerances"]["expectation_bound"] == {"abs": 8.0, "rel": 0.0}
    # benign_return: abs from the built-in default (1.0), rel from the file's default (0).
    assert rep["reference"]["tolerances"]["benign_return"] == {"abs": DEFAULT_TOLERANCES["benign_return"]["abs"],
                                                               "rel": 0.0}
    assert tolerance_for("percentile_bound_p0.9", {"percentile_bound": {"rel": 0.2}}) == \
        {"abs": DEFAULT_TOLERANCES["percentile_bound"]["abs"], "rel": 0.2}


def test_empty_reference_value_means_no_bound(results, tmp_path):
    d = _run(results)
    gre = pd.read_csv(d / RUN_FILES["gre"])
    e = float(gre["eps"].iloc[-1])
    gre.loc[gre.index[-1], ["percentile_bound", "percentile_certified"]] = [np.nan, False]
    rewrite_csv(d / RUN_FILES["gre"], gre)
    base = dict(env="CartPole-v0", algo="StdTrain", sigma=0.1, metric="percentile_bound", eps=e)
    ref = write_reference(tmp_path / "ref.csv", [{**base, "value": None},
                                                 {**base, "metric": "percentile_bound_p0.5", "value": 3.0}])
    rep = audit(results, tmp_path / "a", AuditOptions(reference=ref))
    assert _verdicts(rep) == ["match", "differs"]


def test_integrity_problems(results):
    # A result file edited after it was written.
    with open(_run(results) / RUN_FILES["lore"], "a") as f:
        f.write("9,100\n")
    # A checkpoint that is not the one the results were computed from.
    ck = layout.checkpoint_path(results, "FreewayNoFrameskip-v4", "RadialRL")
    ck.write_bytes(b"other weights")
    # A stage computed from another checkpoint.
    d = _run(results, "CartPole-v0", "GaussAug", "0.1")
    meta = json.loads((d / meta_name(RUN_FILES["gre"])).read_text())
    meta["inputs"]["checkpoint"]["sha256"] = "f" * 64
    (d / meta_name(RUN_FILES["gre"])).write_text(json.dumps(meta))
    # An incomplete run folder.
    (results / "CartPole-v0" / "StdTrain" / "sigma-0.3").mkdir()
    rep = audit(results, results / "audit")
    problems = {(p["file"].split("/results/")[-1], p["problem"].split(" (")[0]) for p in rep["integrity"]}
    assert (f"CartPole-v0/StdTrain/sigma-0.1/{RUN_FILES['lore']}",
            "sha256 differs from the one recorded at write time") in problems
    assert ("FreewayNoFrameskip-v4/RadialRL/checkpoint/model.pt",
            "checkpoint sha256 differs from the one recorded in model.json") in problems
    assert any(f == f"CartPole-v0/GaussAug/sigma-0.1/{RUN_FILES['gre']}"
               and "computed from checkpoint ffffffffffff" in p for f, p in problems)
    assert any(f == "CartPole-v0/StdTrain/sigma-0.3" and p.startswith("incomplete run") for f, p in problems)
    assert rep["integrity_problems"] == 4 and not rep["passed"] and rep["violations"] == 0
    assert rep["verdict"] == "FAIL"
    assert "CartPole-v0/StdTrain/sigma-0.1" not in [p["run"] for p in rep["provenance"]]  # not audited
    assert audit_cli(results, "--strict", "--out-dir", results / "a2") == 1


def test_provenance_per_run(results, tmp_path, repo):
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text((repo / "tests" / "configs" / "smoke.yaml").read_text())
    assert audit_cli(results, "--config", cfg_file, "--out-dir", tmp_path / "a") == 0
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert rep["config_hash"] == config_hash(load_config(cfg_file))
    rec = json.loads(layout.checkpoint_record(results, "CartPole-v0", "StdTrain").read_text())
    p = next(p for p in rep["provenance"] if p["run"] == "CartPole-v0/StdTrain/sigma-0.1")
    assert p["checkpoint_sha256"] == rec["sha256"] and p["checkpoint_source"] == "train"
    assert p["checkpoint"]["file_verified"] is True and p["config_hash"] == rep["config_hash"]
    assert set(p["seeds"]) == {"qrange", "loact", "gre", "lore", "attack_local", "attack_global"}
    assert all(isinstance(s, int) for s in p["seeds"].values())
    # audit.md shows seeds shortened (full ones in audit.json): no 19-digit numbers for a reader
    md = (tmp_path / "a" / "audit.md").read_text()
    assert "Seed per stage" in md
    long_seeds = [str(v) for q in rep["provenance"] for v in q["seeds"].values() if len(str(v)) > 9]
    assert all(v not in md and v[:8] + "…" in md for v in long_seeds)
    assert p["runtime_total_s"] == pytest.approx(sum(p["runtime_s"].values()))
    assert p["versions"]["numpy"] == np.__version__ and p["device"] == "cpu"
    assert p["git_commits"]
    # A config hash that does not belong to the config is refused.
    assert audit_cli(results, "--config", cfg_file, "--config-hash", "0" * 64, "--out-dir", tmp_path / "b") == 2


def test_config_hash_is_canonical():
    a = {"x": 1, "y": {"b": [1, 2], "a": "s"}}
    b = {"y": {"a": "s", "b": [1, 2]}, "x": 1}
    assert config_hash(a) == config_hash(b) != config_hash({**a, "x": 2})


@pytest.mark.parametrize("row, message", [
    ("CartPole-v0,StdTrain,0.1,mean_radius,0.5,1", "has no eps"),
    ("CartPole-v0,StdTrain,0.1,lore_bound,,1", "needs an eps"),
    ("CartPole-v0,StdTrain,0.1,radius_mean,,1", "unknown metric"),
    ("Nope-v0,StdTrain,0.1,mean_radius,,1", "unknown env"),
    ("CartPole-v0,Ma gic,0.1,mean_radius,,1", "unknown algo"),
    ("CartPole-v0,StdTrain,0,mean_radius,,1", "sigma must be > 0"),
    ("CartPole-v0,StdTrain,0.1,mean_radius,,1\nCartPole-v0,StdTrain,0.1,mean_radius,,2", "data row 2 repeats"),
])
def test_malformed_reference_is_refused(tmp_path, results, row, message):
    ref = tmp_path / "ref.csv"
    ref.write_text("env,algo,sigma,metric,eps,value\n" + row + "\n")
    with pytest.raises(ReferenceError, match=message):
        load_reference(ref)
    assert audit_cli(results, "--reference", ref, "--out-dir", tmp_path / "a") == 2
    assert not (tmp_path / "a" / "audit.json").exists()


def test_malformed_tolerances_are_refused(tmp_path):
    tol = tmp_path / "tol.yaml"
    for bad, message in [({"mean_radious": {"rel": 0.1}}, "unknown metric"),
                         ({"mean_radius": {"rel": -1}}, "must be a finite number"),
                         ({"mean_radius": {"relative": 0.1}}, "abs.*rel")]:
        tol.write_text(yaml.safe_dump(bad))
        with pytest.raises(ReferenceError, match=message):
            load_tolerances(tol)


def test_shipped_examples_are_valid(repo):
    ref = load_reference(repo / "docs" / "reference_example.csv")
    assert len(ref) >= 5 and ref["metric"].nunique() >= 5
    tol = load_tolerances(repo / "docs" / "tolerances_example.yaml")
    assert "default" in tol


@pytest.mark.parametrize("block, message", [
    ({"alpha": 1.5}, r"audit\.alpha: 1\.5 must be < 1"),
    ({"strict": "yes"}, r"audit\.strict: 'yes' is not of type 'boolean'"),
    ({"referenc": "x.csv"}, r"audit: unknown key"),
])
def test_config_audit_block_is_validated(block, message, repo):
    from crop.workflow.config import ConfigError, validate_config

    cfg = yaml.safe_load((repo / "tests" / "configs" / "smoke.yaml").read_text())
    assert validate_config(cfg)["audit"] == {"alpha": 0.05, "reference": None, "tolerances": None, "strict": False}
    with pytest.raises(ConfigError, match=message):
        validate_config({**cfg, "audit": block})


def test_holm_controls_the_family_of_chance_based_checks():
    """Hundreds of checks at a per-check level α would call valid certificates violations by chance: over the
    audit's family (here every check could reach significance, so Tarone keeps them all) a p-value is a
    violation only when it stays below α after Holm's adjustment; deterministic checks (no p-value) keep their
    verdict."""
    from crop.audit.audit import classify

    rng = np.random.default_rng(0)
    base = {"env": "CartPole-v0", "algo": "StdTrain", "sigma": 0.1, "check": "gre_expectation_vs_pgd_mean",
            "min_p": 0.0, "violation": False}
    items = [{**base, "p_value": float(p)} for p in rng.uniform(size=400)]   # sound: uniform p
    items += [{**base, "p_value": 0.001}]                  # p < α on its own, nothing among 401 checks
    items += [{**base, "check": "gre_expectation_monotone", "violation": v} for v in (True, False)]  # no p-value
    rows, pooled, block = classify(items, 0.05)
    assert rows is not items and all("status" not in i for i in items)  # new rows; the input is unchanged
    assert block["tests"] == block["K"] == block["family"] == 401 + len(pooled)
    assert not any(i["violation"] for i in rows + pooled if "p_value" in i)
    assert [i["status"] for i in rows if "p_value" not in i] == ["violation", "ok"]
    items.append({**base, "p_value": 1e-7})                 # far beyond chance even among 402 checks
    rows, pooled, _ = classify(items, 0.05)
    assert rows[-1]["status"] == "violation" and rows[-1]["p_adjusted"] == pytest.approx((402 + len(pooled)) * 1e-7)
    assert sum(i["violation"] for i in rows if "p_value" in i) == 1


# ------------------------------------------------------------- the default config's CartPole block, 27 runs

ALGOS9 = ["StdTrain", "GaussAug", "AdvTrain", "SA-MDP-PGD", "SA-MDP-CVX", "RadialRL", "CARRL", "NoisyNet", "GradDQN"]
PLAN27 = {"CartPole-v0": {a: [0.01, 0.05, 0.1] for a in ALGOS9}}


@pytest.fixture(scope="module")
def pristine27(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine27")
    make_results(root, PLAN27)
    return root


def _statuses(rep, **where):
    return [c for c in rep["checks"] if all(c.get(k) == v for k, v in where.items())]


def _plant_global(d, eps_index, value_of):
    """Set every global-attack return at the eps_index-th ε to value_of(gre row at that ε)."""
    ag, gre = pd.read_csv(d / RUN_FILES["attack_global"]), pd.read_csv(d / RUN_FILES["gre"])
    e = sorted(ag["eps"].unique())[eps_index]
    row = gre[np.isclose(gre["eps"], e)].iloc[0]
    ag.loc[np.isclose(ag["eps"], e), "return"] = value_of(row)
    rewrite_csv(d / RUN_FILES["attack_global"], ag)
    return float(e)


def _plant_lore(d, every_eps: bool):
    """LoRe's attacked return 1,000 below its certified bound (at ε = σ/2, or at every ε)."""
    al, lore = pd.read_csv(d / RUN_FILES["attack_local"]), pd.read_csv(d / RUN_FILES["lore"])
    rows = al["same_start_as_lore"].astype(bool) & (al["eps"] > 0)
    if not every_eps:
        rows &= np.isclose(al["eps"], sorted(al["eps"].unique())[1])
    for i in al.index[rows]:
        al.loc[i, "return"] = float(lore[lore["eps"] <= al.loc[i, "eps"]]["lower_bound"].iloc[-1]) - 1000
    rewrite_csv(d / RUN_FILES["attack_local"], al)


def _plant_flips(d, eps: float) -> None:
    """Every attacked step at ``eps`` takes another action than its clean state's a₁ (the synthetic steps are
    all certified beyond ε), and attack_local.csv counts them."""
    al, steps = pd.read_csv(d / RUN_FILES["attack_local"]), pd.read_csv(d / RUN_FILES["attack_local_steps"])
    at = np.isclose(steps["eps"], eps)
    steps.loc[at, "action"] = 1 - steps.loc[at, "clean_action"]
    counted = at & steps["certified"] & (steps["radius"] > eps)
    per_episode = steps[counted].groupby("episode").size()
    rows = np.isclose(al["eps"], eps)
    al.loc[rows, "flips_certified"] = al.loc[rows, "episode"].map(per_episode).fillna(0).astype(int)
    al.loc[rows, "flips"] = al.loc[rows, "episode"].map(steps[at].groupby("episode").size()).fillna(0).astype(int)
    rewrite_csv(d / RUN_FILES["attack_local_steps"], steps)
    rewrite_csv(d / RUN_FILES["attack_local"], al)


def _plant_every_run(root, plant):
    for d in sorted(root.glob("CartPole-v0/*/sigma-*")):
        plant(d)


@pytest.mark.slow
def test_planted_violations_in_27_runs(pristine27, tmp_path):
    """The sound 27-run folder PASSes with no untestable check; each planted gross violation comes out
    violation or suspicious; a fault planted in *every* run, which no single check can prove, is a violation
    of its pooled count (FAIL); a LoRe tree with α spent >= 1 is untestable, not passed."""
    def fresh(name):
        root = tmp_path / name
        shutil.copytree(pristine27, root)
        return root, _run(root, "CartPole-v0", "StdTrain", "0.05")

    root, _ = fresh("sound")
    rep = audit(root, root / "audit")
    assert rep["violations"] == rep["suspicious"] == rep["untestable"] == 0 and rep["checked"] == 27 * 16
    assert rep["verdict"] == "PASS" and {p["status"] for p in rep["pooled"]} == {"ok"}
    assert (root / "audit" / "audit.md").read_text().startswith("# CROP audit\n\n**Sound as far as tested**: ")

    # 1. every global-attack return at one ε set to J_min, far below both GRe bounds
    root, d = fresh("jmin")
    e = _plant_global(d, 1, lambda r: r["j_min"])
    rep = audit(root, root / "audit")
    at = _statuses(rep, algo="StdTrain", sigma=0.05)
    exp_c = next(c for c in at if c["check"] == "gre_expectation_vs_pgd_mean" and math.isclose(c["eps"], e))
    pct_c = next(c for c in at if c["check"] == "gre_percentile_p0.5_vs_pgd" and math.isclose(c["eps"], e))
    assert exp_c["status"] == "violation" and rep["verdict"] == "FAIL"
    assert pct_c["status"] in ("violation", "suspicious") and pct_c["p_value"] == pytest.approx(0.5 ** 12)
    assert sum(c["status"] in ("violation", "suspicious") for c in rep["checks"]) == 2  # nothing else flagged

    # 2. every attacked return just below the percentile bound at one ε
    root, d = fresh("just_below")
    e = _plant_global(d, 2, lambda r: r["percentile_bound"] - 1e-3)
    rep = audit(root, root / "audit")
    pct_c = next(c for c in _statuses(rep, algo="StdTrain", sigma=0.05)
                 if c["check"] == "gre_percentile_p0.5_vs_pgd" and math.isclose(c["eps"], e))
    assert pct_c["status"] in ("violation", "suspicious") and pct_c in rep["suspicious_list"] + rep["violation_list"]
    # significant within its run only is listed, not a verdict: the audit-wide family alone controls the error
    assert rep["verdict"] == ("FAIL" if rep["violations"] else "PASS")

    # 2b. the same fault in every run, at every ε: a pooled violation
    root, _ = fresh("just_below_everywhere")
    _plant_every_run(root, lambda d: [_plant_global(d, i, lambda r: r["percentile_bound"] - 1e-3) for i in range(4)])
    rep = audit(root, root / "audit")
    pooled = {p["kind"]: p for p in rep["pooled"]}
    assert rep["verdict"] == "FAIL" and pooled["gre_percentile_p0.5_vs_pgd"]["status"] == "violation"
    assert pooled["gre_percentile_p0.5_vs_pgd"]["observed"] == 27 * 4

    # 3. LoRe's attacked return 1,000 below its bound, at one ε and at every ε: flagged, FAIL where a violation
    for every in (False, True):
        root, d = fresh(f"lore_{every}")
        _plant_lore(d, every)
        rep = audit(root, root / "audit")
        flagged = [c for c in _statuses(rep, algo="StdTrain", sigma=0.05, check="lore_vs_pgd_local")
                   if c["empirical_below"]]
        assert flagged and all(c["status"] in ("violation", "suspicious") for c in flagged)
        assert rep["suspicious"] + rep["violations"] >= len(flagged)
        assert rep["verdict"] == ("FAIL" if rep["violations"] else "PASS")

    # 3b. every run's LoRe bound beaten: no single check can prove it, the pooled count does
    root, _ = fresh("lore_everywhere")
    _plant_every_run(root, lambda d: _plant_lore(d, True))
    rep = audit(root, root / "audit")
    lore_pool = next(p for p in rep["pooled"] if p["kind"] == "lore_vs_pgd_local")
    assert rep["verdict"] == "FAIL" and lore_pool["status"] == "violation" and lore_pool["observed"] == 27 * 3
    assert (root / "audit" / "audit.md").read_text().startswith("# CROP audit\n\n**FAIL**: ")

    # 4. under alpha_mode: state, where a real LoRe tree spends α >= 1: untestable, with the fix — except a
    # return below J̲ along a path that stayed in the tree, which no certificate's chance explains
    root, d = fresh("lore_state")
    meta = json.loads((d / meta_name(RUN_FILES["lore"])).read_text())
    meta["search"]["alpha_spent"] = 3.2
    (d / meta_name(RUN_FILES["lore"])).write_text(json.dumps(meta))  # the meta is not hashed: no integrity problem
    rep = audit(root, root / "audit")
    lore_c = _statuses(rep, algo="StdTrain", sigma=0.05, check="lore_vs_pgd_local")
    assert lore_c and all(c["status"] == "untestable" and "alpha_mode: family" in c["testable_with"]
                          and "no joint meaning" in c["reason"] for c in lore_c)
    _plant_lore(d, True)
    rep = audit(root, root / "audit")
    lore_c = _statuses(rep, algo="StdTrain", sigma=0.05, check="lore_vs_pgd_local")
    assert {c["status"] for c in lore_c if c["empirical_below"]} == {"violation"} and rep["verdict"] == "FAIL"
    assert all("stayed in LoRe's tree" in c["impossible"] for c in lore_c if c["empirical_below"])
    assert {c["status"] for c in lore_c if not c["empirical_below"]} == {"untestable"}

    # 5. every certified attacked step flipped at one ε: the sequential test against each step's flip bound
    root, d = fresh("flipped")
    _plant_flips(d, sorted(pd.read_csv(d / RUN_FILES["attack_local"])["eps"].unique())[1])
    rep = audit(root, root / "audit")
    flipped = [c for c in rep["checks"] if c["check"] == "loact_certified_steps_not_flipped" and c["empirical_below"]]
    assert rep["verdict"] == "FAIL" and len(flipped) == 1 and flipped[0]["status"] == "violation"


@pytest.mark.slow
def test_auto_sizes_make_every_percentile_check_testable(pristine27, tmp_path):
    """attack.global_episodes: auto counts the chance-based tests the audit of the config will have (here
    exactly those of the 27-run folder, pooled counts included) and picks the fewest episodes whose percentile
    checks are in the audit's family on their own (conservatively: Tarone's K is at most that count, so the
    smaller real K may admit one episode fewer)."""
    from crop.audit.audit import tarone_holm
    from crop.workflow.audit_sizes import planned_chance_checks
    from crop.workflow.config import validate_config

    cfg = validate_config({"environments": {"CartPole-v0": {
        "source": "train", "algorithms": ALGOS9, "sigmas": [0.01, 0.05, 0.1],
        "gre": {"eps_factors": list(GRE_FACTORS), "percentiles": [0.5]},
        "attack": {"global_eps_factors": list(GLOBAL_FACTORS), "local_eps_factors": list(LOCAL_FACTORS),
                   "global_episodes": "auto"}}}})
    n = cfg["environments"]["CartPole-v0"]["attack"]["global_episodes"]
    rep = audit(pristine27, tmp_path / "audit")
    tests = rep["checked"] + len(rep["pooled"])
    assert planned_chance_checks(cfg) == tests and isinstance(n, int)
    assert 0.5 ** n <= 0.05 / tests < 0.5 ** (n - 1)
    pct = [c for c in rep["checks"] if c["check"].startswith("gre_percentile")]
    # with n episodes every percentile check is in the family whatever K turns out to be (K <= T)
    items = [{**c, "min_p": 0.5 ** n} if c in pct else c for c in rep["checks"] if c.get("p_value") is not None]
    _, family, _ = tarone_holm(items + rep["pooled"], 0.05)
    assert sum(c["check"].startswith("gre_percentile") for c in family) == len(pct) > 0


def _null_pvalue(check: dict, rng) -> float:
    """A p-value of ``check`` on attacked data drawn *at* its certified bound (the worst sound case)."""
    from crop.audit.checks import _binom_p, _hoeffding_p

    c = check["check"]
    if check.get("vacuous"):   # nothing can fall below a bound that claims nothing
        return 1.0
    if c == "gre_expectation_vs_pgd_mean":  # returns in {J_min, J_max} with mean exactly the bound
        lo, w = check["bound"] - check["shortfall_max"], check["width"]
        q = (check["bound"] - lo) / w
        ret = lo + w * (rng.random(check["episodes"]) < q)
        return _hoeffding_p(check["bound"] - ret.mean(), check["episodes"], w)
    if c.startswith("gre_percentile"):  # each return below J_p with probability exactly p
        return _binom_p(int(rng.binomial(check["episodes"], check["p"])), check["episodes"], check["p"])
    if c in ("lore_vs_pgd_local", "loact_certified_steps_not_flipped"):  # P[p <= t] = t for every t >= min_p
        return max(float(rng.random()), check["min_p"])
    raise AssertionError(c)


@pytest.mark.slow
def test_sound_27_runs_fail_at_most_alpha_over_repeated_draws(pristine27, tmp_path):
    """False FAILs over repeated sound draws: every chance-based check of the 27-run folder redrawn at its
    bound (the attacked data as bad as a valid certificate allows, independently across checks), then the
    audit's families, pooled counts and statuses (crop.audit.verdict.classify).  The share of FAILs stays within
    α (binomial slack); so does it for the real audit of a sound folder.  Per-check testing at α without the
    correction would fail nearly always; a fault shared by every run (each check at its own failure level)
    FAILs every time."""
    from scipy import stats as sst

    from crop.audit.audit import classify, unit_level

    rep = audit(pristine27, tmp_path / "audit")
    assert rep["verdict"] != "FAIL"
    keep = ("env", "algo", "sigma", "eps", "check", "bound", "observed", "episodes", "steps", "chance", "p",
            "alpha_spent", "min_p", "shortfall_max", "width", "attack_seed", "vacuous")
    template = [{k: c[k] for k in keep if k in c} for c in rep["checks"] if c.get("p_value") is not None]
    rng = np.random.default_rng(7)
    draws, alpha, fails, naive = 400, 0.05, 0, 0
    for _ in range(draws):
        items = [{**c, "p_value": _null_pvalue(c, rng), "violation": False} for c in template]
        naive += any(i["p_value"] < alpha for i in items)
        rows, pooled, _ = classify(items, alpha)
        fails += any(i["status"] == "violation" for i in rows + pooled)
    print(f"sound draws FAILed: {fails}/{draws}")
    assert fails <= sst.binom.ppf(0.999, draws, alpha), fails
    assert naive > 0.5 * draws  # the test can fail: without the correction sound results FAIL
    for kind in ("lore_vs_pgd_local", "gre_percentile_p0.5_vs_pgd", "loact_certified_steps_not_flipped"):
        items = [{**c, "violation": False, "p_value": unit_level(c, alpha) if c["check"] == kind else 1.0}
                 for c in template]
        rows, pooled, _ = classify(items, alpha)
        assert [p["status"] for p in pooled if p["kind"] == kind] == ["violation"]
        assert not any(i["status"] == "violation" for i in rows)  # no single check could show it


def test_status_and_exit_codes(results, tmp_path):
    """Exit 0 on PASS/WARN, 1 on FAIL; --strict also 1 on WARN and on a differing reproduction row."""
    d = _run(results)
    gre = pd.read_csv(d / RUN_FILES["gre"])
    gre.loc[gre.index[-1], "expectation_bound"] = gre["expectation_bound"].iloc[-2] + 1.0  # deterministic
    rewrite_csv(d / RUN_FILES["gre"], gre)
    assert audit_cli(results, "--out-dir", tmp_path / "a") == 1
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert rep["verdict"] == "FAIL" and {c["status"] for c in rep["checks"]} <= {"ok", "violation", "suspicious",
                                                                                 "untestable", "vacuous"}
    assert audit_cli(results, "--strict", "--out-dir", tmp_path / "b") == 1
    # the workflow's audit job keeps its files whatever the verdict: the exit policy is exit_status alone
    assert audit_cli(results, "--report-only", "--out-dir", tmp_path / "c") == 0


@pytest.mark.parametrize("value", ["inf", "-inf", "1e400", "-2e300", "nan_text"])
def test_hostile_reference_values_are_refused(results, tmp_path, value):
    ref = tmp_path / "ref.csv"
    v = "abc" if value == "nan_text" else value
    ref.write_text(f"env,algo,sigma,metric,eps,value\nCartPole-v0,StdTrain,0.1,benign_return,,1\n"
                   f"CartPole-v0,StdTrain,0.1,mean_radius,,{v}\n")
    with pytest.raises(ReferenceError, match=r"data row 2, column 'value'") as exc:
        load_reference(ref)
    assert "\n" not in str(exc.value)
    assert audit_cli(results, "--reference", ref, "--strict", "--out-dir", tmp_path / "a") == 2
    assert not (tmp_path / "a").exists()


def test_hostile_reference_files_are_refused(results, tmp_path, capsys):
    ref = tmp_path / "ref.csv"
    ref.write_bytes(b"env,algo,sigma,metric,eps,value\nCartPole-v0,StdTrain,0.1,benign_return,,1\xff\xfe\n")
    assert audit_cli(results, "--reference", ref, "--out-dir", tmp_path / "a") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not UTF-8" in err and "line 2" in err and "Traceback" not in err
    for text, message in [("env,algo,sigma,metric,eps,value\nCartPole-v0,StdTrain,inf,mean_radius,,1\n",
                           "column 'sigma'"),
                          ("env,algo,sigma,metric,eps,value\nCartPole-v0,StdTrain,0.1,lore_bound,1e999,1\n",
                           "column 'eps'"),
                          ("env,algo,sigma,metric,eps,value\nCartPole-v0,StdTrain,,mean_radius,,1\n",
                           "column 'sigma'"),
                          ("env,algo,sigma,metric,eps,value\n\"CartPole-v0,StdTrain,0.1\n", "cannot read")]:
        ref.write_text(text)
        with pytest.raises(ReferenceError, match=message):
            load_reference(ref)
    tol = tmp_path / "tol.yaml"
    tol.write_bytes(b"mean_radius: {rel: 0.1}\n\xff")
    with pytest.raises(ReferenceError, match="not UTF-8"):
        load_tolerances(tol)
    tol.write_text("mean_radius: {rel: 1e301}\n")
    with pytest.raises(ReferenceError, match="finite number"):
        load_tolerances(tol)


def test_untestable_checks_say_why_even_at_the_edges():
    """A bound at J_min (nothing can fall below it) and a LoRe tree with α spent >= 1 are untestable with a
    reason, never a crash and never passed."""
    from crop.audit.audit import classify

    base = {"env": "CartPole-v0", "algo": "StdTrain", "sigma": 0.1, "eps": 0.0, "bound": 0.0, "observed": 1.0,
            "violation": False}
    items = [{**base, "check": "gre_expectation_vs_pgd_mean", "p_value": 1.0, "min_p": 1.0, "episodes": 10,
              "shortfall_max": 0.0, "width": 200.0},
             {**base, "check": "gre_percentile_p0.5_vs_pgd", "p_value": 1.0, "min_p": 1.0, "episodes": 10, "p": 0.5},
             {**base, "check": "lore_vs_pgd_local", "p_value": 0.5, "min_p": 1e-9, "alpha_spent": 2.5},
             {**base, "check": "loact_certified_steps_not_flipped", "p_value": 1.0, "min_p": 1.0, "steps": 20,
              "note": "unassessed (no V range recorded)"},
             {**base, "check": "lore_vs_pgd_local", "p_value": 1.0, "min_p": 1.0, "alpha_spent": 0.05,
              "note": "its return so far secured J̲ at attacked step 1"},
             {**base, "check": "lore_vs_pgd_local", "p_value": 1.0, "min_p": 1.0, "alpha_spent": 0.05,
              "note": "unassessed (no attack_local_steps.csv or lore_states.csv)"}]
    items, pooled, block = classify(items, 0.05)
    assert [i["status"] for i in items] == ["untestable"] * 6 and "V range" in items[3]["reason"]
    assert "J_min" in items[0]["reason"] and "J_min" in items[1]["reason"]
    assert "no joint meaning" in items[2]["reason"] and items[2]["testable_with"].startswith("alpha_mode: family")
    # a LoRe check whose smallest p is 1 by design says so; one whose path could not be read says why not
    assert "smallest p-value is 1" in items[4]["reason"] and "lore.m" in items[4]["testable_with"]
    assert "cannot be bounded" in items[5]["reason"] and "attack_local_steps.csv" in items[5]["reason"]
    assert block["untestable"] == 6 and pooled == []


def test_edited_qrange_is_an_integrity_problem(results):
    """qrange.json carries no hash of its own, but LoAct recorded the sha256 of the one it read: an edit after
    use (a wider V range would loosen every bound) is caught."""
    q = _run(results) / RUN_FILES["qrange"]
    data = json.loads(q.read_text())
    data["v_max"] = data["v_max"] + 5.0
    q.write_text(json.dumps(data))
    rep = audit(results, results / "audit")
    assert rep["verdict"] == "FAIL"
    assert [(p["file"], "edited after use" in p["problem"] and "loact" in p["problem"]) for p in rep["integrity"]] \
        == [(str(q), True)]


def test_a_replicate_of_other_rewards_than_its_run_is_an_integrity_problem(results):
    """A replicate folder is pooled with its run (the tables' intervals, the reference comparison): one whose
    LoAct ran with another reward clip than the run's is an integrity problem naming the folder, the stage and
    both clips (the audit FAILs and leaves it out; the figures and tables refuse it); equal clips pass."""
    from crop.report.integrity import IntegrityError, replicate_clip_problems
    from crop.report.metrics import load_runs

    run = _run(results)
    rep_dir = run / "rep-1"
    rep_dir.mkdir()
    for key in layout.REPLICATE_FILES:
        for name in (RUN_FILES[key], meta_name(RUN_FILES[key])):
            if (run / name).is_file():
                shutil.copy(run / name, rep_dir / name)
    runs = [str(run.relative_to(results)), str(rep_dir.relative_to(results))]
    key = ("CartPole-v0", "StdTrain", "0.1")
    assert audit(results, results / "a0")["integrity_problems"] == 0   # a faithful replicate: pooled
    assert len(load_runs(results, runs)[key]["replicates"]) == 1

    _set_clip(rep_dir, [-1.0, 3.0])
    rep = audit(results, results / "a1")
    assert rep["verdict"] == "FAIL" and rep["integrity_problems"] == 1
    (p,) = rep["integrity"]
    assert p["file"] == str(rep_dir / meta_name(RUN_FILES["loact"])) and p["run"] == runs[1]
    assert p["problem"].startswith(f"replicate stage loact ran with rewards clipped to [-1, 3], its run {run} with "
                                   "the environment's own rewards (no clip) (reward_clip; config rewards.clip)")
    assert runs[1] not in [q["run"] for q in rep["provenance"]]   # not audited, not pooled
    with pytest.raises(IntegrityError, match=r"rep-1/loact\.meta\.json: replicate stage loact .*reward_clip"):
        load_runs(results, runs)

    all_stages = ("loact", "gre", "attack_global")
    _set_clip(run, [-1.0, 3.0], all_stages)   # the run clipped alike: the replicate belongs with it
    assert replicate_clip_problems(rep_dir) == [] and replicate_clip_problems(run) == []
    rep = audit(results, results / "a2")
    assert rep["integrity_problems"] == 0 and runs[1] in [q["run"] for q in rep["provenance"]]
    assert len(load_runs(results, runs)[key]["replicates"]) == 1

    _set_clip(rep_dir, [-1.0, 2.0])   # clipped, to another range
    (p,) = replicate_clip_problems(rep_dir)
    assert "rewards clipped to [-1, 2], its run" in p["problem"] and "with rewards clipped to [-1, 3]" in p["problem"]
    (run / meta_name(RUN_FILES["loact"])).unlink()   # the run lacks the stage: its other return stages' clip
    assert len(replicate_clip_problems(rep_dir)) == 1
    _set_clip(rep_dir, [-1.0, 3.0])
    assert replicate_clip_problems(rep_dir) == []


def test_hostile_folder_names_import_nothing(pristine, tmp_path, monkeypatch):
    """A run folder named after a module:Id id would import that module; read from a results folder it imports
    nothing (only the user's own config may: trusted_envs, as `crop audit --config` passes them)."""
    import sys

    (tmp_path / "lib").mkdir()
    marker = tmp_path / "imported"
    (tmp_path / "lib" / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    root = tmp_path / "received"
    shutil.copytree(_run(pristine), root / "evilmod:CartPole-v1" / "StdTrain" / "sigma-0.1")
    rep = audit(root, root / "audit")
    assert not marker.exists() and "evilmod" not in sys.modules and rep["runs"]
    assert audit_cli(root, "--out-dir", tmp_path / "a") in (0, 1) and not marker.exists()
    # the test can fail: trusted, it runs
    audit(root, root / "audit2", AuditOptions(trusted_envs=("evilmod:CartPole-v1",)))
    assert marker.exists()
    sys.modules.pop("evilmod", None)


def test_yaml_aliases_cannot_blow_up_and_errors_are_capped(tmp_path):
    """A few hundred bytes of aliases repeating aliases (a billion values expanded) are refused at once with
    one short line, as a config, a tolerances file or an already-parsed dict; any error line is capped."""
    import time

    from crop.io import MESSAGE_LIMIT
    from crop.workflow.config import ConfigError, load_config, validate_config

    lol = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))
    (tmp_path / "c.yaml").write_text(lol)
    (tmp_path / "t.yaml").write_text(lol)
    start = time.perf_counter()
    for call, err in ((lambda: load_config(tmp_path / "c.yaml"), ConfigError),
                      (lambda: load_tolerances(tmp_path / "t.yaml"), ReferenceError),
                      (lambda: validate_config(yaml.safe_load(lol)), ConfigError)):
        with pytest.raises(err, match="expands to more than 100,000 values") as info:
            call()
        assert "\n" not in str(info.value) and len(str(info.value)) < 200
    assert time.perf_counter() - start < 5
    long = str(ConfigError("x" * 10 ** 6))
    assert len(long) <= MESSAGE_LIMIT and "1,000,000 characters" in long
    assert len(str(ReferenceError("y\n" * 10 ** 5))) <= MESSAGE_LIMIT


def test_nothing_tested_after_the_attacks_names_what_would_test_never_the_attacks(pristine, tmp_path):
    """Attacks that ran but tested nothing (one global episode per ε, every LoRe and LoAct bound vacuous): the
    audit's advice names more episodes and tighter bounds, never to run the attacks the run holds."""
    root = tmp_path / "results"
    shutil.copytree(pristine, root)
    d = _run(root)
    ag = pd.read_csv(d / RUN_FILES["attack_global"])
    rewrite_csv(d / RUN_FILES["attack_global"], ag[ag["episode"] == 0])
    lore = pd.read_csv(d / RUN_FILES["lore"])
    rewrite_csv(d / RUN_FILES["lore"], lore.assign(lower_bound=-1e6))
    steps = pd.read_csv(d / RUN_FILES["loact"])
    rewrite_loact(d, steps.assign(certified=False, radius=0.0), 0.1)
    for other in [r for r in root.glob("*/*/sigma-*") if r != d]:
        shutil.rmtree(other)
    rep = audit(root, root / "audit")
    assert rep["statuses"]["ok"] == rep["statuses"]["suspicious"] == 0 and rep["verdict"] == "WARN"
    first = (root / "audit" / "audit.md").read_text().split("\n\n")[1]
    assert first.startswith("**Not decided: nothing was tested.**") and "run the attacks" not in first
    need = max(int(i["testable_with"].rsplit(" ", 1)[1]) for i in rep["untestable_list"])
    assert f"attack.global_episodes ≥ {need}" in first and first.count("attack.global_episodes ≥") == 1
    assert "lore.m" in first and "attack.local_eps_factors" in first
    # without its global attack the run is advised to run it
    for f in d.glob("attack_global*"):
        f.unlink()
    audit(root, root / "audit2")
    assert "run the attacks" in (root / "audit2" / "audit.md").read_text().split("\n\n")[1]


def test_nothing_tested_is_not_pass_and_vote_runs_are_complete(pristine, tmp_path):
    """A LoAct-only audit has no check that could fail: WARN, and audit.md says nothing was tested.  A vote
    run without qrange.json lacks nothing (its target needs no V range): not incomplete, not partial."""
    root = tmp_path / "loact_only"
    src = _run(pristine)
    d = root / "CartPole-v0" / "StdTrain" / "sigma-0.1"
    d.mkdir(parents=True)
    for f in (RUN_FILES["loact"], RUN_FILES["loact_episodes"], RUN_FILES["certified_ratio"], RUN_FILES["frames"]):
        for g in (src / f, src / f.replace(".csv", ".meta.json").replace(".npz", ".meta.json")):
            if g.is_file():
                shutil.copy(g, d / g.name)
    checkpoint = src.parent / "checkpoint"   # the one the records cite: part of the evidence
    shutil.copytree(checkpoint, d.parent / "checkpoint")
    rep = audit(root, root / "audit")
    assert rep["checked"] == 0 and rep["verdict"] == "WARN"
    assert "**Not decided: nothing was tested.**" in (root / "audit" / "audit.md").read_text()

    root = tmp_path / "vote"
    shutil.copytree(src, root / "CartPole-v0" / "StdTrain@vote" / "sigma-0.1")
    shutil.copytree(checkpoint, root / "CartPole-v0" / "StdTrain" / "checkpoint")
    (root / "CartPole-v0" / "StdTrain@vote" / "sigma-0.1" / RUN_FILES["qrange"]).unlink()
    rep = audit(root, root / "audit")
    assert rep["incomplete_runs"] == [] and rep["partial_runs"] == [] and rep["integrity_problems"] == 0


def test_global_attack_draws_its_initial_states_per_run_and_eps(tmp_path, monkeypatch):
    """GRe's bounds are about the return from a random initial state, and the audit counts its checks over runs
    and ε as independent: the global attack's episodes start from initial states drawn afresh for every run
    (algo, σ) and every ε — none shared between two of them."""
    import crop.certify.attack
    from crop.__main__ import main

    starts: list = []
    make_env = crop.certify.attack.make_env

    def recording(env_id, profile):
        env = make_env(env_id, profile)
        reset = env.reset
        env.reset = lambda seed=None, **kw: (starts[-1].append(seed), reset(seed=seed, **kw))[1]
        return env

    monkeypatch.setattr(crop.certify.attack, "make_env", recording)
    results = tmp_path / "res"
    seeds = {}
    for algo in ("StdTrain", "GaussAug"):
        ck = tiny_checkpoint(results, algo)
        for sigma in ("0.1", "0.2"):
            starts.append([])
            main(["attack-global", "--env", "CartPole-v0", "--algo", algo, "--sigma", sigma, "--seed", "3",
                  "--device", "cpu", "--checkpoint", str(ck), "--no-progress", "--settings",
                  json.dumps({"episodes": 3, "eps_factors": [0.0, 0.5], "horizon": 2, "n_eot": 2, "pgd_steps": 1}),
                  "--out", str(tmp_path / f"{algo}-{sigma}.csv")])
            seeds[algo, sigma] = starts[-1]
    every = [s for run in seeds.values() for s in run]
    assert len(every) == 4 * 2 * 3 and len(set(every)) == len(every)


@pytest.mark.slow
def test_rerun_catches_a_result_changed_after_the_run(tmp_path, monkeypatch):
    """`--rerun K` re-runs stage jobs from their recorded provenance: a sound folder re-runs byte-identical on
    the CPU; an attacked return changed after the run — with its recorded sha256 forged to match, so no
    integrity check can see it — differs, and the verdict is FAIL."""
    from crop.io import read_json, sha256_file, write_json

    results = tmp_path / "res"
    d = tiny_real_run(results)
    rep = audit(results, tmp_path / "a", AuditOptions(rerun=5, rerun_seed=1))
    rr = rep["rerun"]
    assert (rr["checked"], rr["identical"], rr["differ"]) == (3, 3, 0) and rep["verdict"] != "FAIL"
    assert {j["stage"] for j in rr["jobs"]} == {"qrange", "loact", "attack_global"}
    ag = pd.read_csv(d / RUN_FILES["attack_global"])
    ag.loc[0, "return"] += 1.0
    ag.to_csv(d / RUN_FILES["attack_global"], index=False)
    meta = read_json(d / meta_name(RUN_FILES["attack_global"]))
    meta["output"]["sha256"] = sha256_file(d / RUN_FILES["attack_global"])
    write_json(d / meta_name(RUN_FILES["attack_global"]), meta)
    assert audit(results, tmp_path / "b")["integrity_problems"] == 0      # invisible to the hashes
    assert audit_cli(results, "--rerun", "5", "--out-dir", tmp_path / "c") == 1
    rep = json.loads((tmp_path / "c" / "audit.json").read_text())
    assert rep["verdict"] == "FAIL" and rep["rerun"]["differ"] == 1
    assert [j["stage"] for j in rep["rerun"]["jobs"] if j["result"] == "differ"] == ["attack_global"]
    assert "1 re-run job(s) differ" in (tmp_path / "c" / "audit.md").read_text()
    # code at another commit than the one recorded: refused in one line before anything runs or is written
    import crop.io

    monkeypatch.setattr(crop.io, "_git_commit", lambda: "0" * 40)
    with pytest.raises(crop.io.InputError, match="install that commit"):
        audit(results, tmp_path / "d", AuditOptions(rerun=1))
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_rerun_imports_no_module_the_folder_names(tmp_path, monkeypatch):
    """A received folder whose meta file records another env than its path (``evilmod:Evil-v0`` in a CartPole
    run) re-runs nothing: the job counts as differ, and the planted module — on the current directory, where
    ``python -c`` would find it — is never imported (no marker file)."""
    from crop.io import _git_commit, write_json

    marker = tmp_path / "pwned"
    (tmp_path / "evilmod.py").write_text(f"import pathlib; pathlib.Path({str(marker)!r}).write_text('imported')\n")
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "R"
    d = layout.run_dir(results, "CartPole-v1", "StdTrain", "0.2")
    d.mkdir(parents=True)
    ck = layout.checkpoint_path(results, "CartPole-v1", "StdTrain")
    ck.parent.mkdir(parents=True)
    ck.write_bytes(b"x")
    (d / RUN_FILES["attack_global"]).write_text("eps,episode,return\n0,0,1\n")
    settings = {"command": "attack-global", "env": "evilmod:Evil-v0", "algo": "StdTrain", "sigma": 0.2,
                "checkpoint": "x", "out": "x.csv", "episodes": 1, "horizon": 1}
    write_json(d / meta_name(RUN_FILES["attack_global"]),
               {"settings": settings, "git_commit": _git_commit(), "device": "cpu"})
    rep = audit(results, tmp_path / "a", AuditOptions(rerun=1))
    assert not marker.exists()
    job, = rep["rerun"]["jobs"]
    assert job["result"] == "differ" and "recorded env ('evilmod:Evil-v0')" in job["note"]
    assert rep["verdict"] == "FAIL"
    # the same record with the run's own env: the child starts isolated, so the module on the cwd stays unread
    write_json(d / meta_name(RUN_FILES["attack_global"]), {"settings": {**settings, "env": "CartPole-v1"},
                                               "git_commit": _git_commit(), "device": "cpu"})
    audit(results, tmp_path / "b", AuditOptions(rerun=1))
    assert not marker.exists()


def test_rerun_counts_what_it_cannot_rerun(tmp_path):
    """A stage that recorded no settings cannot be drawn: counted (``not_eligible``) and said in audit.md; a
    drawn job that cannot be re-run (a ``module:Id`` env read from the folder) makes the verdict at best WARN."""
    from crop.io import _git_commit, write_json

    results = tmp_path / "R"
    for env in ("CartPole-v1", "evilmod:Evil-v0"):
        d = layout.run_dir(results, env, "StdTrain", "0.2")
        d.mkdir(parents=True)
        (d / RUN_FILES["attack_global"]).write_text("eps,episode,return\n0,0,1\n")
    write_json(layout.run_dir(results, "CartPole-v1", "StdTrain", "0.2") / meta_name(RUN_FILES["attack_global"]), {})
    write_json(layout.run_dir(results, "evilmod:Evil-v0", "StdTrain", "0.2") / meta_name(RUN_FILES["attack_global"]),
               {"settings": {"command": "attack-global", "env": "evilmod:Evil-v0", "algo": "StdTrain", "sigma": 0.2},
                "git_commit": _git_commit(), "device": "cpu"})
    from crop.audit.audit import verdict_of
    from crop.audit.rerun import rerun_jobs

    rr = rerun_jobs(results, ["CartPole-v1/StdTrain/sigma-0.2", "evilmod:Evil-v0/StdTrain/sigma-0.2"], 5)
    assert (rr["not_eligible"], rr["not_run"], rr["checked"]) == (1, 1, 0)
    assert rr["not_eligible_list"] == [{"run": "CartPole-v1/StdTrain/sigma-0.2", "stage": "attack_global"}]
    assert verdict_of({"ok": 3}, 0, 0, rr["not_run"]) == "WARN" and verdict_of({"ok": 3}, 0, 0, 0) == "PASS"


def test_chances_use_the_planned_horizon_not_the_realised_length():
    """Every min_p is fixed before the attack ran: a flip count's by the planned steps (horizon × episodes), not
    the realised ones (an attack that succeeds may end its episode early); and a LoRe check whose attacked
    horizon is shorter than LoRe's (a return over fewer steps may lie below J̲ inside the tree) is unassessed."""
    from crop.audit.checks import check_certified_steps_not_flipped, check_lore_vs_local_attack, ville_min_p

    h, sigma = 10, 0.1
    steps = pd.DataFrame({"eps": 0.0, "episode": [0], "step": [0], "obs_digest": ["s0"], "clean_action": 0,
                          "action": 1, "certified": True, "radius": 0.5, "smoothed_top_lower": 0.62,
                          "smoothed_others_upper_max": 0.375})
    states = pd.DataFrame({"obs_digest": ["s0"], "step": [0], "smoothed_top_lower": 0.62, "radius_0": 0.0,
                           "radius_1": 0.5})
    chance = {"steps": None, "attack_steps": steps, "lore_states": states, "v_min": 0.0, "v_max": 1.0, "m": 100,
              "alpha": 1e-3, "n_actions": 2, "horizon": h, "lore_horizon": h}
    attack = pd.DataFrame({"eps": 0.0, "episode": [0, 1], "return": [0.0, 10.0], "steps": [1, 10],
                           "flips_certified": [1, 0], "same_start_as_lore": [True, False], "horizon": h})
    lore = pd.DataFrame({"eps": [0.0, 0.3], "lower_bound": [5.0, 0.0]})
    row, = check_certified_steps_not_flipped(attack, chance, sigma)
    assert row["steps"] == 2 * h and row["min_p"] == ville_min_p(2 * h, 1e-3)
    row, = check_lore_vs_local_attack(lore, {"search": {"alpha_spent": 1e-3}}, attack, chance, sigma, j_min=0.0)
    assert row["p_value"] < 0.5 and "left LoRe's tree at attacked step 0" in row["note"]
    longer = {**chance, "lore_horizon": 2 * h}
    row, = check_lore_vs_local_attack(lore, {"search": {"alpha_spent": 1e-3}}, attack, longer, sigma, j_min=0.0)
    assert row["p_value"] == row["min_p"] == 1.0 and "differs from LoRe's" in row["note"]

def test_lore_leave_chance_trusts_loact_only_where_lore_certifies_no_more(results):
    """P[leave] counts a two-action step LoAct did not certify beyond ε as 0 (both actions stay in LoRe's tree)
    only while LoRe's per-state α is at most LoAct's; a LoRe with a larger α may have certified it, and the
    step then counts 1."""
    from crop.audit.check_inputs import chance_inputs
    from crop.audit.checks_lore import lore_leave_chance

    c = chance_inputs(_run(results), "CartPole-v0", 2)
    steps = c["steps"]
    horizon = int((steps["episode"] == steps["episode"].min()).sum())
    nested, note = lore_leave_chance(c, 0.1, 0.0, horizon)
    assert nested < 1.0 and "exceeds" not in note
    wide, note = lore_leave_chance({**c, "lore_alpha": 2 * c["loact_alpha"]}, 0.1, 0.0, horizon)
    assert wide == 1.0 and "exceeds LoAct's" in note


def _near_tie(d, sigma: float) -> None:
    """LoAct episode 0's first step certified at a radius ≈ 0 (a near-tie: the m-sample policy takes either
    action there)."""
    from synthetic_results import margins, rewrite_loact

    steps = pd.read_csv(d / RUN_FILES["loact"])
    first = (steps["episode"] == steps["episode"].min()) & (steps["step"] == 0)
    steps.loc[first, "certified"], steps.loc[first, "radius"] = True, 1e-6 * sigma
    for k, v in margins(1e-6 * sigma, sigma).items():
        steps.loc[first, k] = v
    rewrite_loact(d, steps, sigma)


def _plant_lore_at_zero(d, value: float) -> None:
    """The local attack's return from LoRe's initial state at ε = 0 set to ``value``."""
    al = pd.read_csv(d / RUN_FILES["attack_local"])
    al["return"] = al["return"].astype(float)
    al.loc[al["same_start_as_lore"].astype(bool) & (al["eps"] == 0), "return"] = value
    rewrite_csv(d / RUN_FILES["attack_local"], al)


@pytest.mark.slow
def test_lore_near_tie_is_checked_over_the_piece_of_its_bound(pristine27, tmp_path):
    """A near-tie step on LoRe's initial episode made the ε = 0 LoRe check untestable (P[leave T_0] ≈ 1); J̲ is a
    step function, so the check is made over the tree of J̲(0)'s whole piece, where that step keeps both actions:
    testable, and a return planted below J̲(0) in every run FAILs.  With a tiny attack m (every flip likely)
    every piece whose tree excludes an action at LoRe's s0 costs every attacked path a leave bound near 1 there,
    and the check moves to the whole search's piece, which excludes nothing; a return planted below it in
    every run FAILs too."""
    from crop.audit.check_inputs import chance_inputs
    from crop.audit.checks_lore import lore_leave_chance

    root = tmp_path / "tie"
    shutil.copytree(pristine27, root)
    runs = sorted(root.glob("CartPole-v0/*/sigma-*"))
    sigmas = {d: float(d.name.split("-", 1)[1]) for d in runs}
    for d in runs:
        _near_tie(d, sigmas[d])
    d0 = runs[0]
    assert lore_leave_chance(chance_inputs(d0, "CartPole-v0", 2), sigmas[d0], 0.0, 6)[0] > 0.99  # T_0: untestable
    rep = audit(root, root / "audit")
    at0 = [c for c in rep["checks"] if c["check"] == "lore_vs_pgd_local" and c["eps"] == 0]
    assert len(at0) == 27 and rep["untestable"] == 0 and rep["verdict"] == "PASS"
    for c in at0:
        assert c["status"] == "ok" and c["eps_bound"] == 0 and c["bound"] == 6.0
        assert c["tree_until"] == pytest.approx(0.5 * c["sigma"]) and c["p_leave"] < c["alpha_spent"]
    md = (root / "audit" / "audit.md").read_text()
    assert "## LoRe bounds compared" in md and "tree_until" in md

    for d in runs:
        _plant_lore_at_zero(d, 5.0)  # below J̲(0) = 6
    rep = audit(root, root / "audit")
    lore_pool = next(p for p in rep["pooled"] if p["kind"] == "lore_vs_pgd_local")
    assert rep["verdict"] == "FAIL" and lore_pool["status"] == "violation" and lore_pool["observed"] == 27

    # A tiny attack m: LoRe's s0 excludes the other action from every piece but the last (radius 10 sigma) with a
    # leave bound of about 0.84 that every attacked path pays there, so the check moves to the whole search's
    # piece J(1.5 sigma) = 1, whose tree excludes nothing (A = 0): decisive again, against a weaker bound.
    for d in runs:
        meta = json.loads((d / meta_name(RUN_FILES["attack_local"])).read_text())
        meta["settings"]["m"] = 1
        (d / meta_name(RUN_FILES["attack_local"])).write_text(json.dumps(meta))  # the meta is not hashed
        _plant_lore_at_zero(d, 4.5)  # below J(0) but not below J(1.5 sigma): not counted
    rep = audit(root, root / "audit")
    at0 = [c for c in rep["checks"] if c["check"] == "lore_vs_pgd_local" and c["eps"] == 0]
    assert all(c["eps_bound"] == pytest.approx(1.5 * c["sigma"]) and c["bound"] == 1.0 and c["tree_until"] is None
               and not c["empirical_below"] and c["status"] == "ok" for c in at0)
    for d in runs:
        _plant_lore_at_zero(d, 0.5)  # below J(1.5 sigma) in every run: a systematic fault
    rep = audit(root, root / "audit")
    lore_pool = next(p for p in rep["pooled"] if p["kind"] == "lore_vs_pgd_local")
    assert rep["verdict"] == "FAIL" and lore_pool["status"] == "violation" and lore_pool["observed"] == 27


def test_flip_bounds_count_the_networks_actions_not_the_envs(results):
    """A flip bound sums over every action but the top one: the count comes from the smoothed network's outputs
    (model.json's net_spec), which may exceed the game's action count, and never falls below the radius columns
    LoRe wrote for the smoother it used (model.json is not hashed); with neither, the flip check is unassessed
    with why, never priced with the environment's count."""
    from crop.audit.check_inputs import chance_inputs
    from crop.audit.checks import _network_actions, check_certified_steps_not_flipped

    d = _run(results)
    run = str(d.relative_to(results))
    record = layout.checkpoint_record(results, "CartPole-v0", "StdTrain")
    meta = json.loads(record.read_text())
    assert _network_actions(results, run) == 2
    record.write_text(json.dumps({**meta, "net_spec": {**meta["net_spec"], "out": 18}}))
    assert _network_actions(results, run) == 18 and chance_inputs(d, "CartPole-v0", 18)["n_actions"] == 18
    record.write_text(json.dumps({**meta, "net_spec": {"arch": "mlp"}}))
    assert _network_actions(results, run) is None and chance_inputs(d, "CartPole-v0", None)["n_actions"] == 2
    (d / RUN_FILES["lore_states"]).unlink()
    chance = chance_inputs(d, "CartPole-v0", None)
    assert chance["n_actions"] is None
    rows = check_certified_steps_not_flipped(pd.read_csv(d / RUN_FILES["attack_local"]), chance, 0.1)
    assert rows and all("no network output size" in r["note"] and r["min_p"] == 1.0 for r in rows)
