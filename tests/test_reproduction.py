"""The paper as a reference (the table and its builder), reference comparison of partial runs, the
reproduction report, and the audit's chance-aware soundness checks on planted counts."""
import io
import json
import math
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crop.audit.audit import AuditOptions, audit
from crop.audit.checks import flip_probability_bound
from crop.audit.reference import load_reference
from crop.io import meta_path, read_json, write_json
from crop.reference import PAPER_REFERENCE
from crop.workflow import layout
from crop.workflow.layout import RUN_FILES
from crop.workflow.stage_table import STAGES

from paths import SHARED
from synthetic_results import LORE_ALPHA_SPENT, M_ATTACK, audit_cli, make_results, margins, rewrite_csv, write_reference

TARBALL = SHARED / "reference" / "crop-leaderboard-csv.tar.gz"
ENVS = {"CartPole-v0", "highway-fast-v0", "PongNoFrameskip-v4", "FreewayNoFrameskip-v4"}
STAGE_FILES = {row.rule: list(row.files.values()) for row in STAGES.values()}


def _keep_only(run_dir, stages):
    """Make a partial run: delete every stage's files but those of ``stages``."""
    for stage, files in STAGE_FILES.items():
        if stage in stages:
            continue
        for f in files:
            (run_dir / f).unlink(missing_ok=True)
            meta_path(run_dir / f).unlink(missing_ok=True)


def _certified_only_mean(steps: pd.DataFrame) -> float:
    """The paper's convention, computed here by hand: per step the mean over certified episodes (0 if none)."""
    per_step = []
    for t in sorted(steps["step"].unique()):
        at = steps[(steps["step"] == t) & steps["certified"].astype(bool)]
        per_step.append(at["radius"].mean() if len(at) else 0.0)
    return float(np.mean(per_step))


# ------------------------------------------------------------------------------------------- the builder

def test_reference_builder_refuses_a_link_in_the_tarball_and_writes_nothing(tmp_path, capsys):
    """The fast counterpart of the builder's run on the real tarball: an untrusted archive holding a link (or
    no archive at all) is one error line, exit status 2, and no table."""
    from crop.reference.build import main as build

    tarball, out = tmp_path / "lb.tar.gz", tmp_path / "ref.csv"
    with tarfile.open(tarball, "w:gz") as tar:
        link = tarfile.TarInfo("lb/cartpole.csv")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    assert build(["--tarball", str(tarball), "--out", str(out)]) == 2
    assert build(["--tarball", str(tmp_path / "absent.tar.gz"), "--out", str(out)]) == 2
    assert not out.exists() and capsys.readouterr().err.count("error: ") == 2


@pytest.mark.slow
@pytest.mark.skipif(not TARBALL.is_file(), reason="needs ../shared/reference (the leaderboard's data)")
def test_reference_builder_on_the_real_tarball(tmp_path):
    from crop.reference.build import main as build

    out = tmp_path / "ref.csv"
    assert build(["--tarball", str(TARBALL), "--out", str(out)]) == 0
    assert out.read_bytes() == PAPER_REFERENCE.read_bytes()  # the committed table is the builder's output
    ref = load_reference(out)  # valid as a reference (env ids, algo slugs, metrics, eps)
    assert set(ref["env"]) == ENVS
    for env in ENVS:
        got = set(ref.loc[ref["env"] == env, "metric"])
        assert {"mean_radius_certified", "benign_return", "expectation_bound", "percentile_bound", "lore_bound",
                "pgd_global_mean", "pgd_global_median", "pgd_local_return"} <= got, env
    assert {"SA-MDP-PGD", "SA-MDP-CVX"} <= set(ref["algo"]) and not {"RegPGD", "RegCVX"} & set(ref["algo"])
    assert (ref.loc[ref["metric"] == "mean_radius_certified", "convention"] == "certified_only").all()
    # Values against the raw members, read here directly.
    with tarfile.open(TARBALL) as tar:
        def member(path):
            return pd.read_csv(io.BytesIO(tar.extractfile("lb/" + path).read()))

        row = ref[(ref["env"] == "highway-fast-v0") & (ref["algo"] == "SA-MDP-PGD")
                  & (ref["metric"] == "mean_radius_certified") & np.isclose(ref["sigma"], 0.5)].iloc[0]
        assert math.isclose(row["value"], member(row["source"])["y"].mean(), rel_tol=1e-12)
        clean = ref[(ref["env"] == "CartPole-v0") & (ref["algo"] == "SA-MDP-CVX") & (ref["metric"] == "benign_return")]
        raw = member(clean["source"].iloc[0])
        assert sorted(clean["value"]) == sorted(raw["y"]) and "SA-MDP (CVX)" in clean["source"].iloc[0]
        lore = ref[(ref["env"] == "PongNoFrameskip-v4") & (ref["algo"] == "StdTrain") & (ref["metric"] == "lore_bound")]
        r = lore.iloc[len(lore) // 2]
        curve = member(r["source"]).sort_values("x")
        assert r["value"] == curve[curve["x"] <= r["eps"] + 1e-15]["y"].iloc[-1]  # the step function at ε


def test_paper_reference_is_packaged():
    assert PAPER_REFERENCE.is_file()
    ref = load_reference("paper")
    assert set(ref["env"]) == ENVS and len(ref) > 5000


# ------------------------------------------------------------------- partial runs against a reference

@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    make_results(root, {"CartPole-v0": {"StdTrain": [0.1], "GaussAug": [0.1]}})
    return root


@pytest.mark.slow
def test_loact_only_run_is_compared_row_by_row(results, tmp_path):
    d = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.1")
    _keep_only(d, {"qrange", "loact"})
    steps, eps = pd.read_csv(d / RUN_FILES["loact"]), pd.read_csv(d / RUN_FILES["loact_episodes"])
    certified_only = _certified_only_mean(steps)
    assert not math.isclose(certified_only, steps["radius"].mean())  # the two conventions differ here
    base = dict(env="CartPole-v0", algo="StdTrain", sigma=0.1, eps=None)
    ref = write_reference(tmp_path / "ref.csv", [
        {**base, "metric": "mean_radius_certified", "value": certified_only * 1.05},   # agrees (10 %)
        {**base, "metric": "benign_return", "value": eps["return"].mean() * 2},       # differs, ratio 0.5
        {**base, "metric": "mean_radius", "value": steps["radius"].mean()},           # agrees (uncertified = 0)
        {**base, "metric": "expectation_bound", "eps": 0.005, "value": 10.0},         # GRe not run: missing
    ])
    rep = audit(results, tmp_path / "a", AuditOptions(reference=ref))
    assert rep["integrity_problems"] == 0 and rep["violations"] == 0
    assert rep["partial_runs"] == [{"run": "CartPole-v0/StdTrain/sigma-0.1", "stages": ["qrange", "loact"],
                                    "absent": ["gre", "lore", "attack_local", "attack_global"]}]
    comps = rep["reference"]["comparisons"]
    assert [c["verdict"] for c in comps[:4]] == ["match", "differs", "match", "missing"]
    assert math.isclose(comps[0]["reproduced"], certified_only, rel_tol=1e-12)
    assert math.isclose(comps[1]["ratio"], 0.5, rel_tol=1e-12)
    assert comps[3]["note"] == "stage gre not in this run"
    extra = {(c["algo"], c["metric"]) for c in comps[4:]}
    assert all(c["verdict"] == "not_in_reference" for c in comps[4:])
    assert ("StdTrain", "certified_fraction") in extra and ("GaussAug", "lore_bound") in extra
    assert ("StdTrain", "expectation_bound") not in extra  # the partial run has no GRe values
    assert rep["reference"]["counts"] == {"match": 2, "differs": 1, "missing": 1}
    assert rep["reproduction"]["differ"] == 1 and rep["reproduction"]["agree"] == 2 and rep["verdict"] != "FAIL"
    md = (tmp_path / "a" / "reproduction.md").read_text()
    assert "**2 agree**" in md and "**1 differ**" in md
    row = next(line for line in md.splitlines() if line.startswith("| StdTrain | 0.1 | benign_return |"))
    assert "| 0.5 |" in row and row.endswith("| differs |") and " [" in row  # ratio, verdict, the interval
    assert "| StdTrain | 0.1 | mean_radius_certified |" in md and "| agrees |" in md
    png = tmp_path / "a" / "reproduction_CartPole.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and rep["reproduction_report"]["figures"] == [str(png)]
    assert audit_cli(results, "--reference", ref, "--out-dir", tmp_path / "b") == 0
    assert audit_cli(results, "--reference", ref, "--strict", "--out-dir", tmp_path / "b") == 1


@pytest.mark.slow
def test_gre_only_run_is_compared_and_passes_strict(results, tmp_path):
    d = layout.run_dir(results, "CartPole-v0", "GaussAug", "0.1")
    _keep_only(d, {"gre", "attack_global"})  # no qrange.json either
    gre = pd.read_csv(d / RUN_FILES["gre"])
    e = float(gre["eps"].iloc[1])
    base = dict(env="CartPole-v0", algo="GaussAug", sigma=0.1, eps=e)
    rows = [{**base, "metric": "expectation_bound", "value": float(gre["expectation_bound"].iloc[1]) + 0.5},
            {**base, "metric": "mean_radius", "eps": None, "value": 0.01}]
    ref = write_reference(tmp_path / "ref.csv", rows)
    rep = audit(results, tmp_path / "a", AuditOptions(reference=ref, strict=True))
    assert [c["verdict"] for c in rep["reference"]["comparisons"][:2]] == ["match", "missing"]
    assert rep["reference"]["comparisons"][1]["note"] == "stage loact not in this run"
    assert rep["passed"] and rep["integrity_problems"] == 0
    assert any(c["check"] == "gre_expectation_vs_pgd_mean" and c["algo"] == "GaussAug" for c in rep["checks"])
    assert audit_cli(results, "--reference", ref, "--out-dir", tmp_path / "b") == 0
    # --strict fails on a WARN (here: untestable checks) as on a differing row
    assert audit_cli(results, "--reference", ref, "--strict", "--out-dir", tmp_path / "b") == \
        (1 if rep["verdict"] == "WARN" else 0)
    # A planted difference fails --strict.
    rows.append({**base, "metric": "percentile_bound", "value": float(gre["percentile_bound"].iloc[1]) * 3 + 10})
    ref = write_reference(tmp_path / "ref2.csv", rows)
    assert audit_cli(results, "--reference", ref, "--strict", "--out-dir", tmp_path / "c") == 1


@pytest.mark.slow
def test_half_written_stage_is_an_integrity_problem(results, tmp_path):
    d = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.1")
    (d / RUN_FILES["loact_episodes"]).unlink()
    rep = audit(results, tmp_path / "a")
    assert any(f"stage loact lacks {RUN_FILES['loact_episodes']}" in p["problem"] for p in rep["integrity"])
    assert not rep["passed"]


@pytest.mark.slow
def test_audit_against_the_paper(results, tmp_path):
    assert audit_cli(results, "--reference", "paper", "--out-dir", tmp_path / "a") == 0
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    ref = rep["reference"]
    assert ref["name"] == "paper" and ref["counts"]["missing"] > 1000  # other envs, algos, σ: not in the run
    assert ref["counts"]["match"] + ref["counts"]["differs"] > 20
    compared = {c["metric"] for c in ref["comparisons"] if c["verdict"] in ("match", "differs")}
    assert {"mean_radius_certified", "benign_return", "lore_bound", "pgd_local_return"} <= compared
    assert "mean_radius" not in compared  # the paper has no uncertified-as-0 mean
    md = (tmp_path / "a" / "reproduction.md").read_text()
    assert "certified steps only" in md and "locally trained policies can match the shape" in md


# -------------------------------------------------------------------------- chance-aware soundness

def test_flip_probability_bound_covers_the_monte_carlo_flip_rate():
    rng = np.random.default_rng(0)
    m, n = 400, 20000
    for mu1, mu2 in [(0.6, 0.5), (0.55, 0.5), (0.7, 0.4)]:
        # Two actions with clipped Q-samples in [0, 1]; the bounds are the true means (they hold).
        flips = np.mean(rng.binomial(m, mu2, n) >= rng.binomial(m, mu1, n))
        bound = float(flip_probability_bound(mu1, mu2, 0.0, 1.0, 0.5, 0.0, m, 2))
        assert flips <= bound, (mu1, mu2, flips, bound)
    # Inside the radius the bound grows with ε and reaches 1 at the radius.
    from scipy.stats import norm

    r = 0.25 * (norm.ppf(0.6) - norm.ppf(0.4))  # Theorem 1's radius σ/2·(Φ⁻¹(p_L) − Φ⁻¹(p_U)), σ = 0.5
    b = [float(flip_probability_bound(0.6, 0.4, 0.0, 1.0, 0.5, e, m, 2)) for e in (0.0, 0.05, 0.1, r, 2 * r)]
    assert b == sorted(b) and math.isclose(b[0], math.exp(-m * 0.2 ** 2 / 2)) and b[-2] > 0.999 and b[-1] == 1.0


def _set_attack_steps(d, sigma, eps, radius, flipped):
    """The local attack's steps at ``eps`` all certified at ``radius``, the first ``flipped`` of them (in table
    order) taking the other action; attack_local.csv counts them, and those beyond ε."""
    steps, al = pd.read_csv(d / RUN_FILES["attack_local_steps"]), pd.read_csv(d / RUN_FILES["attack_local"])
    at = np.isclose(steps["eps"], eps)
    steps.loc[at, "certified"], steps.loc[at, "radius"] = True, radius
    for k, v in margins(radius, sigma).items():
        steps.loc[at, k] = v
    steps.loc[at, "action"] = steps.loc[at, "clean_action"]
    flip = steps.index[at][:flipped]
    steps.loc[flip, "action"] = 1 - steps.loc[flip, "clean_action"]
    per_episode = steps.loc[flip].groupby("episode").size() if radius > eps else pd.Series(dtype=int)
    rows = np.isclose(al["eps"], eps)
    al.loc[rows, "flips_certified"] = al.loc[rows, "episode"].map(per_episode).fillna(0).astype(int)
    al.loc[rows, "flips"] = al.loc[rows, "episode"].map(steps.loc[flip].groupby("episode").size()).fillna(0).astype(int)
    rewrite_csv(d / RUN_FILES["attack_local_steps"], steps)
    rewrite_csv(d / RUN_FILES["attack_local"], al)


def _flip_row(rep, eps):
    return next(c for c in rep["checks"] if c["check"] == "loact_certified_steps_not_flipped"
                and c["algo"] == "StdTrain" and math.isclose(c["eps"], eps))


@pytest.mark.slow
def test_flips_within_chance_are_not_violations(results, tmp_path):
    """A flip at a step certified just beyond ε (its flip bound ≈ 1: the m-sample policy may take either
    action) is within chance: a raw failure, listed, not a violation."""
    sigma, eps = 0.1, 0.05
    d = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.1")
    _set_attack_steps(d, sigma, eps, eps * 1.001, flipped=1)
    rep = audit(results, tmp_path / "a")
    row = _flip_row(rep, eps)
    assert row["observed"] == 1 and row["empirical_below"] and not row["violation"]
    assert row["p_value"] == 1.0 and rep["passed"]
    assert "Raw failures within chance" in (tmp_path / "a" / "audit.md").read_text()


@pytest.mark.slow
def test_flips_far_beyond_their_bounds_are_violations(results, tmp_path):
    """Wide margins (radius 3σ at ε = σ/2: each step's flip bound ≈ 0, α = 10⁻³ per state): 6 flips in 12
    attacked steps are a violation; one flip is not."""
    sigma, eps = 0.1, 0.05
    d = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.1")
    bound = float(flip_probability_bound(margins(3 * sigma, sigma)["smoothed_top_lower"],
                                         margins(3 * sigma, sigma)["smoothed_others_upper_max"], 0.0, 10.0, sigma, eps,
                                         M_ATTACK, 2))
    assert bound < 1e-12
    _set_attack_steps(d, sigma, eps, 3 * sigma, flipped=6)
    rep = audit(results, tmp_path / "a")
    row = _flip_row(rep, eps)
    assert row["observed"] == 6 and row["status"] == "violation" and row["p_value"] < 1e-6 and not rep["passed"]
    _set_attack_steps(d, sigma, eps, 3 * sigma, flipped=1)
    row = _flip_row(audit(results, tmp_path / "b"), eps)
    assert row["observed"] == 1 and row["status"] != "violation" and row["p_value"] > 1e-3


def _plant_lore_shortfall(d, eps):
    al = pd.read_csv(d / RUN_FILES["attack_local"])
    lore = pd.read_csv(d / RUN_FILES["lore"])
    bound = float(lore[lore["eps"] <= eps]["lower_bound"].iloc[-1])
    al.loc[np.isclose(al["eps"], eps) & al["same_start_as_lore"], "return"] = bound - 1
    rewrite_csv(d / RUN_FILES["attack_local"], al)


@pytest.mark.slow
@pytest.mark.parametrize("alpha_spent", [0.2, 1e-4])
def test_lore_shortfall_along_a_path_inside_the_tree_fails_whatever_alpha(results, tmp_path, alpha_spent):
    """A return below J̲ along an attacked path that stayed in LoRe's tree to its horizon is impossible for a
    correct search whatever the noise (checks.lore_path_impossible): a violation even where LoRe spent so much α
    that its p-value (still α spent + the leave bound) could not be significant."""
    violation = True
    eps = 0.05
    d = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.1")
    _plant_lore_shortfall(d, eps)
    m = read_json(meta_path(d / RUN_FILES["lore"]))
    m["search"]["alpha_spent"] = alpha_spent  # the α LoRe's own certificates spent
    write_json(meta_path(d / RUN_FILES["lore"]), m)
    rep = audit(results, tmp_path / "a")
    row = next(c for c in rep["checks"] if c["check"] == "lore_vs_pgd_local" and c["algo"] == "StdTrain"
               and math.isclose(c["eps"], eps))
    assert row["empirical_below"] and row["violation"] == violation and row["impossible"]
    assert row["p_leave"] < 1e-6 and math.isclose(row["p_value"], alpha_spent + row["p_leave"])
    assert rep["passed"] != violation


@pytest.mark.slow
def test_lore_shortfall_is_bounded_without_loact(results, tmp_path):
    """The LoRe check bounds the attacked path through LoRe's own recorded states: without LoAct (a partial
    run) a shortfall along a path that stayed in LoRe's tree is still judged, at p = α spent."""
    d = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.1")
    _plant_lore_shortfall(d, 0.05)
    for f in STAGE_FILES["loact"]:
        (d / f).unlink()
        meta_path(d / f).unlink(missing_ok=True)
    rep = audit(results, tmp_path / "a")
    row = next(c for c in rep["checks"] if c["check"] == "lore_vs_pgd_local" and c["algo"] == "StdTrain"
               and math.isclose(c["eps"], 0.05))
    assert row["empirical_below"] and row["p_value"] == pytest.approx(LORE_ALPHA_SPENT)
    assert "stayed in LoRe's tree" in row["note"]
    assert set(RUN_FILES.values()) - set(STAGE_FILES["loact"]) - {RUN_FILES["qrange"]}  # the run is partial


REPLICATES_CONFIG = """# replicates through the workflow, smoke size: CROP's published highway StdTrain network
results: results
seed: 3
replicates: {n}
environments:
  highway-fast-v0:
    source: published
    algorithms: [StdTrain]
    sigmas: [0.5]
    train: {{eval_episodes: 1}}
    qrange: {{m: 100, episodes: 1, horizon: 3}}
    loact: {{m: 200, episodes: 2, horizon: 4}}
    gre: {{m: 8, horizon: 3, eps_factors: [0.0, 0.1]}}
    lore: {{m: 200, horizon: 1}}
    attack: {{local_episodes: 1, local_m_grad: 16, local_eps_factors: [0.0], global_episodes: 2,
              global_eps_factors: [0.0], pgd_steps: 2}}
"""


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "checkpoints").is_dir(), reason="../shared/checkpoints not present")
def test_replicates_through_the_workflow(tmp_path, repo):
    """`replicates: 1` then `replicates: 2` in the same folder: the second run adds replicate 1's qrange and
    LoAct jobs (its own folder and seed) and leaves every file of replicate 0 as it was, byte for byte; the
    tables then show the mean over the two replicates with their spread."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, CROP_CHECKPOINT_MIRROR=str(SHARED / "checkpoints"), CROP_CACHE=str(tmp_path / "cache"))

    def run(n):
        cfg = tmp_path / f"config{n}.yaml"
        cfg.write_text(REPLICATES_CONFIG.format(n=n))
        p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "--directory",
                            str(tmp_path), "--cores", "2", "--configfile", str(cfg)], capture_output=True, text=True,
                           timeout=1200, env=env)
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
        return p.stdout + p.stderr

    run(1)
    d0 = layout.run_dir(tmp_path / "results", "highway-fast-v0", "StdTrain", "0.5")
    before = {f: f.read_bytes() for f in d0.iterdir() if f.is_file()}
    assert not (d0 / "rep-1").exists()
    log = run(2)
    assert "loact_replicate" in log and "rule loact:" not in log and "rule gre:" not in log
    assert {f: f.read_bytes() for f in d0.iterdir() if f.is_file()} == before  # replicate 0 untouched
    d1 = layout.run_dir(tmp_path / "results", "highway-fast-v0", "StdTrain", "0.5", replicate=1)
    assert sorted(p.name for p in d1.iterdir() if not p.name.endswith(".meta.json")) == \
        sorted(RUN_FILES[k] for k in layout.REPLICATE_FILES)
    seeds = [read_json(meta_path(d / RUN_FILES["loact"]))["seed"] for d in (d0, d1)]
    assert seeds[0] != seeds[1]
    radius = [pd.read_csv(d / RUN_FILES["loact"])["radius"].to_numpy() for d in (d0, d1)]
    tab = pd.read_csv(tmp_path / "results" / "tables" / "highway-fast_mean_radius.csv").set_index("algo")
    row = tab.loc["StdTrain"]
    assert math.isclose(row["sigma=0.5"], np.mean([r.mean() for r in radius]), rel_tol=1e-6, abs_tol=1e-12)
    assert math.isclose(row["sigma=0.5 sd"], np.std([r.mean() for r in radius], ddof=1), rel_tol=1e-6,
                        abs_tol=1e-12)
    assert row["sigma=0.5 lo"] <= row["sigma=0.5"] <= row["sigma=0.5 hi"]
    assert "t over replicates (2 replicates" in (tmp_path / "results" / "tables" /
                                                 "highway-fast_mean_radius.md").read_text()
    rep = json.loads((tmp_path / "results" / "audit" / "audit.json").read_text())
    assert "highway-fast-v0/StdTrain/sigma-0.5/rep-1" in rep["runs"] and rep["integrity_problems"] == 0


def test_replicates_key_is_validated_and_derives_independent_seeds():
    from crop.workflow.config import ConfigError, validate_config

    cfg = {"environments": {"CartPole-v0": {"algorithms": ["StdTrain"], "sigmas": [0.1]}}}
    assert validate_config(cfg)["replicates"] == 1
    for bad, message in [(0, r"replicates: 0 must be >= 1"), ("3", r"replicates: '3' is not of type 'integer'")]:
        with pytest.raises(ConfigError, match=message):
            validate_config({**cfg, "replicates": bad})
    # replicate 0 is the run itself (its seed and folder); the others get their own, derived from both
    assert layout.replicate_seed(5, 0) == 5
    assert layout.run_dir("R", "e", "a", "0.1", replicate=0) == Path("R/e/a/sigma-0.1")
    seeds = {layout.replicate_seed(5, k) for k in range(1, 6)} | {layout.replicate_seed(6, 1)}
    assert len(seeds) == 6 and 5 not in seeds and all(0 <= s < 2**31 for s in seeds)
    d = layout.run_dir("R", "e", "a", "0.1", replicate=2)
    assert d == Path("R/e/a/sigma-0.1/rep-2") and layout.replicate_of(d) == 2
    assert layout.base_run(d) == "R/e/a/sigma-0.1"
