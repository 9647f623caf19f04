"""The HPC paths, run for real on one small target (one σ of tests/configs/smoke.yaml: checkpoint, qrange,
LoAct, GRe, LoRe and both attacks — 7 jobs):

* SLURM: a one-node cluster (ci/slurm-up.sh: munged, slurmctld, slurmd on 127.0.0.1, one fake GPU) runs
  the target through profiles/slurm; every job must have gone through sbatch (and the certification
  and attack jobs must have been given the GPU), and the results must equal a local run's.
* Containers: the steps of containers/crop.def built into a podman image (ci/container-build.sh) run the
  target through `snakemake --sdm apptainer`, with a podman stand-in for apptainer
  (ci/apptainer-podman.py); the results must equal a local run's.

Both need root and Debian packages (slurm-wlm munge; podman runc debootstrap).  Where they are missing
the tests are skipped with the reason, unless CROP_REQUIRE_HPC=1 (.ci/run sets it after installing
them): then a missing piece fails the test.

"Equal" is byte-equality of every result file under results-smoke/CartPole-v0/ (the CSVs, model.pt),
except that
* JSON files (qrange.json, model.json and every .meta.json) are compared after dropping the provenance
  keys that legitimately differ between two runs of the same computation (VOLATILE: timestamps, CPU times,
  durations and rates, argv, platform, git commit, the interpreter's patch version);
* frames.npz is compared by its arrays: its zip headers depend on the Python that wrote it (3.11.2 in
  the image writes other zip64 header fields than 3.11.7);
* so the sha256 (and size) that a .meta.json records for a JSON or .npz file it read or wrote is checked
  against that file in its own run instead of across runs.
Everything else — settings, seeds, the checkpoint's and every output's sha256 and row count, package
versions, the device used — must match.
"""
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from crop.io import meta_name, sha256_file
from crop.workflow import layout
from crop.workflow.config import load_config
from crop.workflow.layout import RUN_FILES

from paths import REPO

SMOKE = REPO / "tests" / "configs" / "smoke.yaml"
PAPER = REPO / "configs" / "paper.yaml"
REHEARSAL = REPO / "configs" / "paper-rehearsal.yaml"
ENV, ALGO, SIGMA = "CartPole-v0", "StdTrain", "0.1"
CERTIFICATION_RULES = {"qrange", "loact", "gre", "lore", "attack_local", "attack_global"}
GROUPED_RULES = CERTIFICATION_RULES - {"gre"}   # one SLURM job per environment and algorithm (profiles/slurm)
SIGNAL = "--signal=TERM@300"   # training's and GRe's: they save their state on it (a group's members ask for none)
SIGNALLED_RULES = {"checkpoint", "gre"}
REQUIRE = os.environ.get("CROP_REQUIRE_HPC") == "1"
# Provenance keys that legitimately differ between two runs of the same computation: when and how fast
# (*_utc, runtime_s, *_per_s), how it was called (argv: the absolute path of the `crop` script), where
# (platform; git_commit: none inside the container), and which build of the interpreter (versions.python:
# the image's Debian python3 is 3.11.2, the host's may be another 3.11.x).
VOLATILE = {"argv", "runtime_s", "platform", "git_commit", "python"}
VOLATILE_SUFFIXES = ("_utc", "_per_s", "cpu_s")   # cpu_s: training and evaluation CPU time
SBIN = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin"])


def need(ok: bool, reason: str):
    if not ok:
        if REQUIRE:
            pytest.fail(f"{reason} (CROP_REQUIRE_HPC=1)")
        pytest.skip(reason)


def need_root_and(*tools: str, packages: str):
    need(os.geteuid() == 0, "needs root (daemons, debootstrap, rootful podman)")
    path = os.environ.get("PATH", "") + os.pathsep + SBIN
    missing = [t for t in tools if shutil.which(t, path=path) is None]
    need(not missing, f"{', '.join(missing)} not installed: apt-get install {packages}")


def run_env(**extra) -> dict:
    """The environment of a run: this interpreter's scripts (`crop`, `snakemake`) first on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", ""), SBIN])
    return dict(os.environ, PATH=path, **extra)


def snakemake(work: Path, cfg: Path, *args: str, env: dict | None = None, timeout: int = 900, command=None):
    """Run Snakemake on this workflow in `work` with config `cfg`: `command` (default ``snakemake -s
    REPO/Snakefile``; run from REPO, so relative paths in it are the README's) followed by `args`."""
    command = command or ["snakemake", "-s", str(REPO / "Snakefile")]
    assert command[0] == "snakemake", command
    # --configfile takes several values: --directory after it ends them, so `args` may begin with targets
    p = subprocess.run([sys.executable, "-m", *command, "--configfile", str(cfg), "--directory", str(work), *args],
                       capture_output=True, text=True, timeout=timeout, env=env or run_env(), cwd=REPO)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return p.stdout + p.stderr


def readme_slurm_command() -> list[str]:
    """The SLURM command of the README (and of docs/hpc.md and the profile's header, which must agree), as
    argv, without its --configfile (the tests run their own small config)."""
    pattern = r"^\s*#?\s*(snakemake --profile profiles/slurm\b[^\n]*?)\s*$"
    found = {}
    for doc in ("README.md", "docs/hpc.md", "profiles/slurm/config.yaml"):
        lines = re.findall(pattern, (REPO / doc).read_text(), flags=re.M)
        found[doc] = {line for line in lines if "--sdm" not in line}   # the container variant adds --sdm
    assert found["README.md"] and all(v == found["README.md"] for v in found.values()), found
    (line,) = found["README.md"]
    argv = shlex.split(line)
    i = argv.index("--configfile")
    return argv[:i] + argv[i + 2:]


def target_files(cfg: dict) -> list[str]:
    run = f"{cfg['results']}/{ENV}/{ALGO}/sigma-{SIGMA}"
    return [f"{run}/{name}" for name in layout.RUN_FILES.values()]


def _volatile(key: str) -> bool:
    return key in VOLATILE or key.endswith(VOLATILE_SUFFIXES)


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if not _volatile(k)}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def _hashed_files(meta: dict, path: Path, work: Path):
    """(record, file) for every file whose sha256 the record `meta` (in `path`) keeps."""
    for rec in meta.get("inputs", {}).values():
        if isinstance(rec, dict) and "path" in rec:
            yield rec, work / rec["path"]
    out = meta.get("output")
    if isinstance(out, dict) and "file" in out:
        yield out, path.parent / out["file"]


def _check_then_drop_hashes(meta: dict, path: Path, work: Path):
    """A stage's record of a file it read or wrote that is compared by content, not bytes (a JSON result
    such as qrange.json hashes its own provenance; a .npz's zip headers depend on the Python version that
    wrote it): its sha256 (and size) is checked against that file in the same run, then left out.  The
    records of the checkpoint and of every CSV keep theirs, compared across runs like everything else."""
    for rec, file in _hashed_files(meta, path, work):
        if file.suffix in (".json", ".npz") and "sha256" in rec:
            assert rec.pop("sha256") == sha256_file(file), (path, rec)
            rec.pop("bytes", None)


def digest(path: Path, root: Path) -> str:
    """What must be equal between two runs: see the module docstring."""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        for rec in (data, data.get("provenance", {})):
            _check_then_drop_hashes(rec, path, root)
        return hashlib.sha256(json.dumps(_strip(data), sort_keys=True).encode()).hexdigest()
    if path.suffix == ".npz":
        h = hashlib.sha256()
        with np.load(path) as z:
            for name in sorted(z.files):
                a = z[name]
                h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
                h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()
    return sha256_file(path)


def result_digests(work: Path, cfg: dict) -> dict[str, str]:
    root = work / cfg["results"] / ENV
    return {str(p.relative_to(root)): digest(p, work) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hpc_config(tmp_path_factory):
    """smoke.yaml with `device: auto`, so that the certification and attack jobs ask for a GPU (and, on
    a node without CUDA, run on the CPU)."""
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["device"] = "auto"
    path = tmp_path_factory.mktemp("hpc-config") / "hpc.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path, cfg


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, hpc_config):
    path, cfg = hpc_config
    work = tmp_path_factory.mktemp("local")
    snakemake(work, path, "--cores", "2", *target_files(cfg))
    digests = result_digests(work, cfg)
    assert {f"StdTrain/sigma-{SIGMA}/{n}" for n in layout.RUN_FILES.values()} <= set(digests)
    assert {"StdTrain/checkpoint/model.pt", "StdTrain/checkpoint/model.json"} <= set(digests)
    return digests


# --- cheap checks, everywhere -------------------------------------------------------------------------

def test_the_docs_give_one_slurm_command_and_the_profile_needs_no_accounting():
    """README, docs/hpc.md and the profile name the same command; the profile asks job states of squeue,
    which works without SLURM's accounting database (sacct waits forever there)."""
    assert readme_slurm_command()[:3] == ["snakemake", "--profile", "profiles/slurm"]
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["executor"] == "slurm" and profile["slurm-status-command"] == "squeue"
    # the plugin may switch to sacct when MinJobAge < 3 × this: keep that window small
    assert 1 <= profile["slurm-init-seconds-before-status-checks"] <= 40


def test_the_profile_groups_exactly_the_rules_the_plan_groups():
    """The profile's `groups` (a cluster run's; a local run groups nothing) are the rules crop plan prices as
    grouped (crop.workflow.cost.stage_group), each in its environment and algorithm's group, joined whole
    (group-components) and run one at a time (the local resource `lane`)."""
    from crop.workflow.cost import stage_group
    from crop.workflow.stage_table import STAGES

    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    rules = [row.rule + s for row in STAGES.values() for s in (("", "_replicate") if row.replicate else ("",))]
    want = {r: stage_group(r) for r in rules if stage_group(r)}
    assert dict(g.split("=", 1) for g in profile["groups"]) == want
    assert set(want) == {r for r in rules if not r.startswith("gre")} and stage_group("checkpoint") is None
    assert profile["group-components"] == [f"{g}=100000" for g in set(want.values())]
    assert profile["resources"] == ["lane=1"] and profile["set-resource-scopes"] == ["lane=local"]


def _planned_resources(cfg_path: Path, cfg: dict, tmp_path: Path) -> dict[str, str]:
    out = snakemake(tmp_path, cfg_path, "-n", *target_files(cfg), command=readme_slurm_command())
    # the profile's constant disk_mb spares Snakemake sizing the inputs while it builds the DAG, which
    # printed "RuntimeWarning: coroutine 'InputFiles._predicated_size_files.<locals>.sizes' was never awaited"
    assert "never awaited" not in out, out[-3000:]
    # a group's jobs are listed indented under "Group job ENV~ALGO"
    rules = re.findall(r"^[ \t]*(?:local)?rule (\w+):\n(?:.*\n)*?\s+resources: (.*)$", out, flags=re.M)
    assert rules, out[-3000:]
    return dict(rules)


@pytest.mark.parametrize("device, gpus", [("cpu", 0), pytest.param("auto", 1, marks=pytest.mark.slow),
                                          pytest.param("cuda", 1, marks=pytest.mark.slow)])
def test_certification_rules_ask_for_a_gpu_only_where_they_may_use_one(device, gpus, tmp_path):
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["device"] = device
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    planned = _planned_resources(path, cfg, tmp_path)
    assert set(planned) == CERTIFICATION_RULES | {"checkpoint"}
    for rule, res in planned.items():
        fields = dict(kv.split("=", 1) for kv in res.split(", "))
        # gre steps environments on CPU cores and asks for no GPU (crop.workflow.cost.stage_device)
        assert int(fields.get("gpu", 0)) == (gpus if rule in CERTIFICATION_RULES - {"gre"} else 0), (rule, res)
        assert int(fields["mem_mb"]) > 0 and int(fields["runtime"]) > 0, (rule, res)
        # a training and GRe get SIGTERM 300 s before their time limit, to save their state for the retry (the plugin
        # accepts the flag in slurm_extra); a group's members ask alike, for none (LoRe resumes from its periodic save)
        assert fields.get("slurm_extra") == (SIGNAL if rule in SIGNALLED_RULES else None), (rule, res)
        # a grouped rule's jobs take the group's one lane each: the group runs them one at a time
        assert fields.get("lane") == ("1" if rule in GROUPED_RULES else None), (rule, res)
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    validate_slurm_extra(SimpleNamespace(resources=SimpleNamespace(slurm_extra=SIGNAL)))


def test_comparison_sees_results_and_settings_not_run_provenance(tmp_path):
    """The equality the HPC tests assert is not vacuous: a changed number or setting shows, a changed
    timestamp, argv or recorded hash of a JSON input (checked against its file) does not."""
    cfg = {"results": "r"}

    def write(work: Path, value="1.5", m=1000, when="2026-01-01T00:00:00Z", argv="/a/crop"):
        run = work / "r" / ENV / ALGO / f"sigma-{SIGMA}"
        run.mkdir(parents=True)
        q = {"v_min": 0.0, "provenance": {"finished_utc": when, "argv": [argv]}}
        (run / RUN_FILES["qrange"]).write_text(json.dumps(q))
        (run / RUN_FILES["loact"]).write_text(f"eps,radius\n0,{value}\n")
        meta = {"settings": {"m": m}, "runtime_s": 1.0, "finished_utc": when, "argv": [argv],
                "inputs": {"qrange": {"path": f"r/{ENV}/{ALGO}/sigma-{SIGMA}/{RUN_FILES['qrange']}",
                                      "sha256": sha256_file(run / RUN_FILES["qrange"])}},
                "output": {"file": RUN_FILES["loact"], "sha256": sha256_file(run / RUN_FILES["loact"])}}
        (run / meta_name(RUN_FILES["loact"])).write_text(json.dumps(meta))
        return result_digests(work, cfg)

    base = write(tmp_path / "a")
    assert write(tmp_path / "b", when="2026-01-02T00:00:01Z", argv="/b/crop") == base
    assert write(tmp_path / "c", value="1.6") != base
    assert write(tmp_path / "d", m=999) != base


# --- SLURM --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    need_root_and("munged", "slurmctld", "slurmd", "sbatch", packages="slurm-wlm munge")
    state = tmp_path_factory.mktemp("slurm")
    up = subprocess.run(["bash", str(REPO / "ci" / "slurm-up.sh"), str(state)], capture_output=True, text=True,
                        timeout=120, env=run_env())
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield state
    finally:  # every daemon started, stopped by its PID, whether the bring-up or a test failed or not
        down = subprocess.run(["bash", str(REPO / "ci" / "slurm-down.sh"), str(state)], capture_output=True,
                              text=True, timeout=120, env=run_env())
        print(down.stdout + down.stderr)


def slurm_jobs(name: str) -> list[dict]:
    """Jobs the controller still knows (MinJobAge = 7200 s, ci/slurm-up.sh) named `name`, as dicts of their fields."""
    out = subprocess.run(["scontrol", "show", "job", "--oneliner"], capture_output=True, text=True,
                         check=True, env=run_env()).stdout
    jobs = [dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in out.splitlines() if line]
    return [j for j in jobs if j.get("JobName") == name]


@pytest.mark.slow
def test_slurm_profile_runs_the_target_through_sbatch_with_local_results(slurm_cluster, hpc_config, local_run,
                                                                         tmp_path):
    path, cfg = hpc_config
    # the README's command as written (no flags added: this cluster has no accounting database, and the
    # profile must work on it as on one with accounting), on the test's config and target
    # (before the profile asked squeue, this hung: the plugin's default, sacct, never saw a job finish here)
    out = snakemake(tmp_path, path, *target_files(cfg), command=readme_slurm_command())
    assert "never awaited" not in out, out[-3000:]
    run_id = re.search(r"SLURM run ID: (\S+)", out).group(1)
    jobs = slurm_jobs(run_id)
    dag = dag_jobs(load_config(path))
    rules = [[rule for rule, _, _ in _slurm_job_keys(j, dag)] for j in jobs]
    assert sorted(r for rs in rules for r in rs) == sorted(CERTIFICATION_RULES | {"checkpoint"}), (rules, out[-3000:])
    assert sorted(rules) == sorted([["checkpoint"], ["gre"], sorted(GROUPED_RULES)]), rules   # one group
    for j, rule in zip(jobs, rules):
        assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0" and j["BatchFlag"] == "1", j
        assert j["NodeList"] == "crop-ci", j
        assert ("gpu:1" in j.get("TresPerJob", "")) == (set(rule) <= GROUPED_RULES), j
    assert result_digests(tmp_path, cfg) == local_run


# --- the paper's DAG, rehearsed ---------------------------------------------------------------------

def dag_jobs(cfg: dict) -> set[tuple]:
    """(rule, env, algo) of every job Snakemake builds for a validated config (crop.workflow.cost.jobs, which
    tests/test_cost.py checks against `snakemake -n`); the aggregate and the audit have no env or algo."""
    from crop.workflow.cost import jobs

    return {(j.rule, j.env, j.algo) for j in jobs(cfg)}


def test_the_rehearsal_has_every_rule_environment_and_algorithm_of_the_papers_dag():
    """configs/paper-rehearsal.yaml is configs/paper.yaml's DAG at small sizes: the same rules on the same
    environments and algorithms (one σ each), the same sources where it can (highway's published StdTrain
    and RadialRL), LoRe's node budgets set (and hit), the global settings that decide devices and rules."""
    from crop.envs import env_spec
    from crop.workflow.cost import lore_nodes

    paper, rehearsal = load_config(PAPER), load_config(REHEARSAL)
    assert dag_jobs(rehearsal) == dag_jobs(paper)
    for key in ("device", "alpha", "bound", "alpha_mode", "replicates"):
        assert rehearsal[key] == paper[key], key
    for env, ec in rehearsal["environments"].items():
        p = paper["environments"][env]
        assert ec["algorithms"] == p["algorithms"] and len(ec["sigmas"]) == 1 and ec["sigmas"][0] in p["sigmas"]
        assert ec.get("device") == p.get("device"), env   # the same devices, so the same GPU requests
        assert set(ec) >= set(p) - {"source"} and (ec["source"] == p["source"] or env.endswith("NoFrameskip-v4"))
        assert (ec["lore"]["max_nodes"] is None) == (p["lore"]["max_nodes"] is None), env
        if ec["lore"]["max_nodes"]:   # smaller than the tree: the rehearsal runs the truncated search
            tree = lore_nodes(ec["lore"]["horizon"], env_spec(env).n_actions, 0.0, None)
            assert ec["lore"]["max_nodes"] < tree, env


def _slurm_job_keys(job: dict, dag: set) -> list[tuple]:
    """(rule, env, algo) of the jobs one SLURM job ran, from its comment: a job's own (the plugin writes
    rule_RULE[_wildcards_W1_W2_…]; no environment id or algorithm of these configs holds an underscore), or a
    group's (rule_ENV~ALGO_RULE_RULE…: its environment and algorithm's grouped jobs, crop.workflow.cost.stage_group)."""
    from crop.workflow.cost import stage_group

    group = re.fullmatch(r"rule_(.+?)~([^_]+)_.+", job["Comment"])
    if group:
        return sorted(k for k in dag if k[1:] == group.groups() and stage_group(k[0]))
    rule, wildcards = re.fullmatch(r"rule_(\w+?)(?:_wildcards_(.+))?", job["Comment"]).groups()
    env, algo = (wildcards.split("_") + [None])[:2] if wildcards else (None, None)
    return [(rule, env, algo)]


@pytest.mark.slow
def test_the_paper_rehearsal_runs_every_rule_on_every_environment_through_sbatch(slurm_cluster, tmp_path):
    """configs/paper-rehearsal.yaml through the README's SLURM command: every job of the paper's DAG (every
    rule × environment × algorithm) ran as a batch job that completed, and the audit finished."""
    cfg = yaml.safe_load(REHEARSAL.read_text())
    mirror = (REPO / cfg["checkpoints"]["mirror"]).resolve()
    need(mirror.is_dir(), f"{mirror} (../shared/checkpoints: CROP's published highway checkpoints) is missing")
    cfg["checkpoints"]["mirror"] = str(mirror)   # relative to the working directory: the repository's
    # One fake GPU on this node would queue the ~60 Atari certification and attack jobs one by one (the smoke
    # test above checks that they ask for it); on the CPU they share the node's cores.
    cfg["device"] = "cpu"
    path = tmp_path / "rehearsal.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    work = tmp_path / "work"
    out = snakemake(work, path, command=readme_slurm_command(), timeout=3600)
    run_id = re.search(r"SLURM run ID: (\S+)", out).group(1)
    jobs = slurm_jobs(run_id)
    for j in jobs:
        assert j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0" and j["BatchFlag"] == "1", j
    dag = dag_jobs(load_config(path))
    ran = [key for j in jobs for key in _slurm_job_keys(j, dag)]
    assert len(ran) == len(set(ran)) and set(ran) == dag, out[-3000:]
    assert {env for _, env, _ in ran} == set(load_config(PAPER)["environments"]) | {None}
    audit = json.loads((work / cfg["results"] / "audit" / "audit.json").read_text())
    assert audit["verdict"] in ("PASS", "WARN", "FAIL"), audit.get("verdict")
    # every rule on every environment and algorithm: the folder's files are all there and agree
    assert audit["integrity_problems"] == 0, audit["integrity"][:3]
    highway = work / cfg["results"] / "highway-fast-v0"
    for algo in ("StdTrain", "RadialRL"):   # fetched from the mirror, as the paper's run downloads them
        assert json.loads((highway / algo / "checkpoint" / "model.json").read_text())["source"] == "published"


# --- containers ---------------------------------------------------------------------------------------

IMAGE = "localhost/crop-ci:test"


@pytest.fixture(scope="module")
def container_image(tmp_path_factory):
    need_root_and("podman", "runc", "debootstrap", packages="podman runc debootstrap")
    work = tmp_path_factory.mktemp("container")
    env = run_env(CONTAINERS_CONF=str(work / "containers.conf"), CONTAINERS_STORAGE_CONF=str(work / "storage.conf"),
                  PYTHON=sys.executable)  # whose pip fills the wheelhouse
    try:
        b = subprocess.run(["bash", str(REPO / "ci" / "container-build.sh"), str(work), IMAGE], capture_output=True,
                           text=True, timeout=1800, env=env)
        assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-5000:]
        print(b.stdout)
        yield env
    finally:  # the image store lives in `work`: empty it with podman (it holds overlay mounts), then delete
        subprocess.run(["podman", "rmi", "--all", "--force"], capture_output=True, env=env, timeout=300)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.slow
def test_container_runs_the_target_via_sdm_apptainer_with_local_results(container_image, hpc_config, local_run,
                                                                       tmp_path):
    path, cfg = hpc_config
    shim = tmp_path / "bin"
    shim.mkdir()
    podman_shim = REPO / "ci" / "apptainer-podman.py"
    (shim / "apptainer").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{podman_shim}" "$@"\n')
    (shim / "apptainer").chmod(0o755)
    log = tmp_path / "apptainer-calls.jsonl"
    env = dict(container_image, CROP_PODMAN_IMAGE=IMAGE, CROP_APPTAINER_LOG=str(log))
    env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    work = tmp_path / "work"
    snakemake(work, path, "--sdm", "apptainer", "--cores", "2", *target_files(cfg), env=env)

    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 7 and {c["image"] for c in calls} == {str(REPO / "containers" / "crop.sif")}
    assert all(c["command"][0] == "bash" and "crop " in c["command"][-1] for c in calls)
    assert result_digests(work, cfg) == local_run
    # nothing left in the working folder, which Snakemake makes the container's home (matplotlib's cache
    # goes to MPLCONFIGDIR, set by the Snakefile)
    assert not (work / ".cache").exists() and not (work / ".config").exists(), sorted(os.listdir(work))
    # ...and the steps ran on the image's interpreter, not this one
    image_python = subprocess.run(["podman", "run", "--rm", "--network=none", IMAGE, "python", "-c",
                                   "import platform; print(platform.python_version())"], capture_output=True,
                                  text=True, check=True, env=container_image).stdout.strip()
    run = work / cfg["results"] / ENV / ALGO / f"sigma-{SIGMA}"
    meta = json.loads((run / meta_name(RUN_FILES["loact"])).read_text())
    assert meta["versions"]["python"] == image_python
