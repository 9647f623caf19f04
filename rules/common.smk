# Shared set-up: validate the config (before any job is scheduled), input functions, and the helpers the per-run
# rules (rules/certify.smk, rules/attacks.smk) read the stage table (crop/workflow/stage_table.py) through: their
# command lines and what their jobs ask for; every other path comes from crop/workflow/layout.py.
import json
import os
import re
import shlex
import sys

from crop.workflow import layout
from crop.workflow.cost import (
    CostError,
    JobResources,
    job_priority,
    stage_device,
    stage_gpus,
    stage_group,
    stage_threads,
)
from crop.envs import env_spec
from crop.workflow.config import (
    ConfigError,
    certifications,
    check_policy_files,
    train_settings,
    trusted_env_ids,
    validate_config,
)
from crop.agents.registry import checkpoint_source
from crop.audit.provenance import config_hash
from crop.workflow.partial import config_plan, config_run_files
from crop.workflow.stage_table import stage, stage_settings

# Every policy file is opened and checked here too (crop validate-config's checks), before any job; a policy
# network's default target (probs) is filled in from its file.  A module:Id environment imports its module
# (runs its code) only when the config sets import_module: true for it; the parse refuses any other in one line.
# So is the unit-cost table every job's resources are priced from (a calibration file is checked key by key).
try:
    VALID = validate_config(config, "config")
    CFG = check_policy_files(VALID, "config")
    # Every job's SLURM runtime and mem_mb, priced once per job (and again only when what the price reads changed).
    RESOURCES = JobResources(CFG)
except (ConfigError, CostError) as exc:
    # the refusal as one line on stderr and exit status 1, with no frame of this file after it
    sys.exit(str(exc))

R = CFG["results"]

# Recorded by the audit: which configuration the results came from (as written, defaults filled in; the hash
# `crop audit --config FILE` computes).
CONFIG_HASH = config_hash(VALID)
ENVS = list(CFG["environments"])
TRUSTED_ENVS = trusted_env_ids(CFG)


def policy_source(env, algo):
    """The registry entry (with its ``kind``) that the environment's ``source`` setting selects."""
    ec = CFG["environments"][env]
    return checkpoint_source(env, algo, ec["source"], ec.get("files"))


# The certified algorithms, and those whose checkpoints others are derived from (CARRL's StdTrain).
ALGOS = sorted(
    {a for e in CFG["environments"].values() for a in e["algorithms"]}
    | {
        policy_source(e, a)["base"]
        for e, ec in CFG["environments"].items()
        for a in ec["algorithms"]
        if policy_source(e, a)["kind"] == "derive"
    }
)


# {algo} of a run folder is ALGO, or ALGO@TARGET for a smoothing target other than q (crop/workflow/layout.py).
wildcard_constraints:
    env="|".join(map(re.escape, ENVS)),
    algo=layout.run_algo_pattern(ALGOS),
    sigma=r"[0-9][0-9.e+-]*",
    rep=r"[1-9][0-9]*",


def env_cfg(wildcards):
    return CFG["environments"][wildcards.env]


def floats(xs):
    return " ".join(repr(float(x)) for x in xs)


# A run folder and its replicate k >= 1 (config `replicates`) below the results folder, as Snakemake patterns
# (crop.workflow.layout.run_dir; tests/test_rules.py checks the rules' files against the layout).
RUN = "{env}/{algo}/sigma-{sigma}"
REP = "{env}/{algo}/sigma-{sigma}/rep-{rep}"


def predicted(name, key, gpus=None):
    """A resource of a rule's jobs from the cost model (crop/workflow/cost.py): `runtime` (minutes: the prediction
    with headroom, at most slurm.max_runtime) or `mem_mb`."""

    def resource(wildcards, threads):
        g = gpus(wildcards) if callable(gpus) else (GPUS if gpus is None else gpus)
        return RESOURCES(name, wildcards, threads, g)[key]

    return resource


def stage_job_gpus(name):
    """GPUs of a stage's job (Snakemake's standard resource `gpu`, see GPUS): none where it runs on the CPU
    (crop.workflow.cost.stage_device)."""
    r = stage(name).rule

    def gpus(w):
        return GPUS if stage_device(CFG, r, w.env) != "cpu" else 0

    return gpus


def gpu_first(gpus):
    """A rule's `priority:`: a job that holds a GPU before the other ready jobs (crop.workflow.cost.job_priority,
    which the plan's makespan orders by too)."""
    return lambda w: job_priority(gpus(w))


def stage_job_threads(name):
    """Threads of a stage's jobs: those they use (crop.workflow.cost.stage_threads)."""
    r = stage(name).rule
    return lambda w: stage_threads(CFG, r, w.env)


def stage_resources(name):
    """GPUs (stage_job_gpus), memory and minutes of a stage's jobs; a grouped stage's (crop.workflow.cost.stage_group:
    the SLURM profile's `groups`) also one `lane`, which the profile gives each group once (a local resource), so
    that a group runs its members one at a time and asks for the sum of their minutes."""
    r, gpus = stage(name).rule, stage_job_gpus(name)
    lane = {"lane": 1} if stage_group(r) else {}
    return {
        "gpu": gpus,
        "mem_mb": predicted(r, "mem_mb", gpus),
        "runtime": predicted(r, "runtime", gpus),
        **lane,
    }


def stage_args(name, replicate=False):
    """The flags of a stage's command, each a quoted shell word: the run's identity (the algorithm without its
    run folder's @TARGET; a replicate's own derived seed), its settings block once as --settings, its
    inputs and outputs."""
    row = stage(name)

    def args(w, input, output, threads):
        algo, target = layout.split_run_algo(w.algo)
        seed = layout.replicate_seed(CFG["seed"], int(w.rep)) if replicate else CFG["seed"]
        words = ["--env", w.env, "--algo", algo, "--sigma", w.sigma, "--seed", seed]
        words += ["--device", stage_device(CFG, row.rule, w.env)]
        words += ["--chunk", CFG["chunk"], "--threads", threads, "--checkpoint", input.model]
        if row.v_range and target != layout.ACTION_TARGET:  # an actor's target is its file's, never given
            words += ["--target", target, *(["--qrange", input.qrange] if target in layout.QRANGE_TARGETS else [])]
        if row.command == "qrange" and target == layout.AUTO_TARGET:  # the pilot predicts LoAct's radius at its sizes
            loact = stage_settings(CFG, w.env, "loact")
            words += ["--target", target, "--loact-m", loact["m"], "--loact-horizon", loact["horizon"]]
            words += ["--alpha", loact["alpha"], "--alpha-mode", loact["alpha_mode"], "--bound", loact["bound"]]
        words += ["--settings", json.dumps(stage_settings(CFG, w.env, row.command), sort_keys=True)]
        for o in row.outputs:
            words += [f"--{o.option.replace('_', '-')}", output[o.key]]
        return " ".join(shlex.quote(str(x)) for x in words)

    return args


CHECKPOINT = str(layout.checkpoint_path(R, "{env}", "{algo}"))
CHECKPOINT_RECORD = str(layout.checkpoint_record(R, "{env}", "{algo}"))


def run_checkpoint(w):
    """The checkpoint a run folder's stages read: its algorithm's, whatever the smoothing target."""
    return str(layout.checkpoint_path(R, w.env, layout.split_run_algo(w.algo)[0]))


def run_checkpoint_record(w):
    return str(layout.checkpoint_record(R, w.env, layout.split_run_algo(w.algo)[0]))


def qrange_input(w):
    """qrange.json for the targets q and auto (its pilot's choice); nothing for probs and vote (bounded in
    [0, 1]: no qrange job)."""
    if layout.split_run_algo(w.algo)[1] not in layout.QRANGE_TARGETS:
        return []
    rep = int(w.rep) if "rep" in w.keys() else 0  # replicate k >= 1 reads its own V range
    return str(layout.run_dir(R, w.env, w.algo, w.sigma, replicate=rep) / layout.RUN_FILES["qrange"])


def base_checkpoint(w):
    """The checkpoint that (env, algo) is derived from (CARRL: StdTrain's), your own policy file (source:
    file), or nothing."""
    src = policy_source(w.env, w.algo)
    if src["kind"] == "file":
        return {"policy_file": src["path"]}
    if src["kind"] != "derive":
        return {}
    return {
        "base": str(layout.checkpoint_path(R, w.env, src["base"])),
        "base_record": str(layout.checkpoint_record(R, w.env, src["base"])),
    }


def all_run_files():
    """Every result file of every run of the config (frames.npz among them: the Pong periodic figure's), then
    those of replicates 1 … N-1 (none with the default `replicates: 1`)."""
    runs = config_run_files(CFG, R).values()
    return [f for main, _ in runs for f in main] + [f for _, reps in runs for f in reps]


def checkpoint_records():
    return sorted({str(layout.checkpoint_record(R, env, algo)) for env, algo, _ in certifications(CFG)})


# GPUs a certification or attack job asks for, as Snakemake's standard resource `gpu` (the SLURM plugin
# turns gpu=1 into `sbatch --gpus=1`): one wherever the config lets the job use CUDA.  A local run does
# not wait for it unless given `--resources gpu=N`, and `device: auto` runs on the CPU without a GPU.
GPUS = stage_gpus(CFG)


# ---------------------------------------------------------------------------------- checkpoint rule


def checkpoint_mem_mb(w):
    """Memory of a checkpoint job (MB): 1.5 GB, plus an image policy's replay buffer when it is trained here
    (EnvSpec.replay_mb)."""
    if policy_source(w.env, w.algo)["kind"] != "train":
        return 1500
    from crop.train import dqn_config  # the trainer's defaults (no torch)

    dqn = dqn_config(w.env, w.algo, env_cfg(w)["train"].get("dqn"))
    return 1500 + env_spec(w.env).replay_mb(dqn.buffer_size)


def checkpoint_gpus(w):
    """One GPU for a policy trained here on a device other than the CPU (train.dqn.device)."""
    if policy_source(w.env, w.algo)["kind"] != "train":
        return 0
    from crop.train import dqn_config  # the trainer's defaults (no torch)

    return 0 if dqn_config(w.env, w.algo, env_cfg(w)["train"].get("dqn")).device == "cpu" else 1


def import_words(w):
    """`crop import`'s flags for an algorithm whose source is your own file (docs/own-policy.md), else none."""
    src = policy_source(w.env, w.algo)
    if src["kind"] != "file":
        return []
    arch = src["architecture"]  # the validated config's: the schema fills in its default
    words = ["--file", src["path"], "--format", src["format"]]
    words += ["--arch", arch if isinstance(arch, str) else json.dumps(arch, sort_keys=True)]
    if src.get("profile"):
        words += ["--profile", src["profile"]]
    if src.get("sha256"):
        words += ["--file-sha256", src["sha256"]]
    return words


def checkpoint_args(w, input, output, threads):
    """The flags of `crop checkpoint`, each a quoted shell word: the source, the train block's settings for
    this algorithm (its own recipe overrides only), the base checkpoint, the download cache and your own file."""
    c = CFG["checkpoints"]
    words = ["--env", w.env, "--algo", w.algo, "--source", env_cfg(w)["source"], "--seed", CFG["seed"]]
    words += ["--threads", threads, "--settings", json.dumps(train_settings(env_cfg(w), w.algo), sort_keys=True)]
    if "base" in input.keys():
        words += ["--base-checkpoint", input.base]
    words += ["--lock", c["lock"], *[x for k in ("mirror", "cache") if c[k] for x in (f"--{k}", c[k])]]
    words += [*import_words(w), "--out", output.model]
    return " ".join(shlex.quote(str(x)) for x in words)


# ---------------------------------------------------------------------------------- aggregate rule

FIGURES = f"{R}/figures"
TABLES = f"{R}/tables"


def figure_outputs(fmt, family=None):
    """Figure files the aggregate rule writes in format ``fmt`` (of one family of crop.workflow.layout, or all)."""
    out = []
    for env, (algos, labels, skip) in config_plan(CFG).items():
        for fam, stems in layout.figure_families(env, labels, algos, skip).items():
            if family in (None, fam):
                out += [f"{FIGURES}/{stem}.{fmt}" for stem in stems]
    return out


def table_outputs(fmt=None):
    return [
        str(p)
        for env in CFG["environments"]
        for p in layout.table_files(TABLES, env)
        if fmt is None or p.suffix == f".{fmt}"
    ]


def aggregate_outputs():
    return figure_outputs("png") + figure_outputs("pdf") + table_outputs()


def report_figures(family):
    category, sub = REPORT_PLACES[family]
    files = figure_outputs("png", family)
    return report(files, caption=f"../report/{family}.rst", category=category, subcategory=sub)


# ---------------------------------------------------------------------------------- audit rule


def audit_extra_inputs():
    """The reference table and tolerances file named in the config (the audit reruns when they change)."""
    return [CFG["audit"][k] for k in ("reference", "tolerances") if CFG["audit"].get(k)]


def audit_options():
    a = CFG["audit"]
    opts = [f"--alpha {a['alpha']}"]
    if a.get("reference"):
        opts.append(f"--reference {shlex.quote(a['reference'])}")
    if a.get("tolerances"):
        opts.append(f"--tolerances {shlex.quote(a['tolerances'])}")
    if a.get("strict"):
        opts.append("--strict")
    # the module:Id ids the config lets import their module (the parse refused the others); ids read from the
    # results folder never import
    opts += [f"--trust-env {shlex.quote(e)}" for e in ENVS if ":" in e and e in TRUSTED_ENVS]
    return " ".join(opts)


def audit_outputs():
    return [f"{R}/audit/audit.md", f"{R}/audit/audit.json"]
