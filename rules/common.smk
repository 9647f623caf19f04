# Shared set-up: validate the config (before any job is scheduled) and name every file.
import json
import os
import re
import shlex

from crop import layout
from crop.config import (
    ConfigError,
    run_targets,
    sigma_label,
    smoothing_targets,
    stage_settings,
    targets,
    train_settings,
    validate_config,
)
from crop.registry import checkpoint_source
from crop.report.provenance import config_hash

try:
    CFG = validate_config(config, "config")
except ConfigError as exc:
    raise WorkflowError(str(exc))

R = CFG["results"]

# A run killed with SIGKILL leaves Snakemake's lock behind; clear it when its owner is provably gone, so
# rerunning the same command resumes (a live run's lock still stops a second workflow).  Once, in the main
# process, before Snakemake takes its lock (onstart would be too late); not in the jobs' own processes.
if workflow.is_main_process:
    from crop.runlock import clear_stale_lock

    _cleared = clear_stale_lock()
    if _cleared:
        logger.warning(_cleared)


onstart:
    # Before any job: a read-only, unwritable or full results folder is one clear error.
    from crop.io import OutputError, check_writable
    from crop.runlock import record_owner

    record_owner()
    try:
        check_writable(R)
    except OutputError as exc:
        raise WorkflowError(exc.strerror)


CONFIG_HASH = config_hash(CFG)  # recorded by the audit: which configuration the results came from
ENVS = list(CFG["environments"])


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
SIGMAS = sorted({t[2] for t in targets(CFG)}, key=float)


# {algo} of a run folder is ALGO, or ALGO@TARGET for a smoothing target other than q (crop/layout.py).
wildcard_constraints:
    env="|".join(map(re.escape, ENVS)),
    algo="(?:" + "|".join(map(re.escape, ALGOS)) + ")(?:@(?:probs|vote))?",
    sigma=r"[0-9][0-9.e+-]*",
    rep=r"[1-9][0-9]*",


def env_cfg(wildcards):
    return CFG["environments"][wildcards.env]


def common_args(wildcards, threads=1):
    """Flags every certification subcommand takes (the algorithm without its run folder's @TARGET)."""
    algo = layout.split_run_algo(wildcards.algo)[0]
    return (
        f"--env {shlex.quote(wildcards.env)} --algo {shlex.quote(algo)} --sigma {wildcards.sigma} "
        f"--seed {CFG['seed']} --device {CFG['device']} --chunk {CFG['chunk']}"
    )


def replicate_args(wildcards, threads=1):
    """common_args of replicate k >= 1: the same flags with the replicate's own derived seed."""
    seed = layout.replicate_seed(CFG["seed"], int(wildcards.rep))
    return common_args(wildcards, threads).replace(f"--seed {CFG['seed']} ", f"--seed {seed} ", 1)


def floats(xs):
    return " ".join(repr(float(x)) for x in xs)


def run_file(name):
    """A per-run result file; names in crop/layout.py."""
    return f"{R}/{{env}}/{{algo}}/sigma-{{sigma}}/{layout.RUN_FILES[name]}"


def meta_file(name):
    stem = layout.RUN_FILES[name].rsplit(".", 1)[0]
    return f"{R}/{{env}}/{{algo}}/sigma-{{sigma}}/{stem}.meta.json"


# Replicate k >= 1 of a run (config `replicates`): its rep-{k} folder, from crop.layout.run_dir.
REPLICATE_DIR = str(layout.run_dir(R, "{env}", "{algo}", "{sigma}", replicate="{rep}"))


def replicate_file(name):
    return f"{REPLICATE_DIR}/{layout.RUN_FILES[name]}"


def replicate_meta(name):
    stem = layout.RUN_FILES[name].rsplit(".", 1)[0]
    return f"{REPLICATE_DIR}/{stem}.meta.json"


CHECKPOINT = f"{R}/{{env}}/{{algo}}/checkpoint/model.pt"
CHECKPOINT_RECORD = f"{R}/{{env}}/{{algo}}/checkpoint/model.json"


def run_checkpoint(w):
    """The checkpoint a run folder's stages read: its algorithm's, whatever the smoothing target."""
    return str(layout.checkpoint_path(R, w.env, layout.split_run_algo(w.algo)[0]))


def run_checkpoint_record(w):
    return str(layout.checkpoint_record(R, w.env, layout.split_run_algo(w.algo)[0]))


def qrange_input(w):
    """qrange.json for the q target; nothing for probs and vote (bounded in [0, 1]: no qrange job)."""
    if layout.split_run_algo(w.algo)[1] != "q":
        return []
    if "rep" in w.keys():  # replicate k >= 1 reads its own V range
        return replicate_file("qrange").format(**dict(w.items()))
    return f"{R}/{w.env}/{w.algo}/sigma-{w.sigma}/{layout.RUN_FILES['qrange']}"


def target_args(w):
    """--target of LoAct, LoRe and the local attack, with --qrange for the q target."""
    target = layout.split_run_algo(w.algo)[1]
    if target != "q":
        return f"--target {shlex.quote(target)}"
    return f"--target q --qrange {shlex.quote(qrange_input(w))}"


def base_checkpoint(w):
    """The checkpoint that (env, algo) is derived from (CARRL: StdTrain's), your own policy file (source:
    file), or nothing."""
    src = policy_source(w.env, w.algo)
    if src["kind"] == "file":
        return {"policy_file": src["path"]}
    if src["kind"] != "derive":
        return {}
    return {
        "base": f"{R}/{w.env}/{src['base']}/checkpoint/model.pt",
        "base_record": f"{R}/{w.env}/{src['base']}/checkpoint/model.json",
    }


def checkpoint_runtime(w):
    """Minutes a checkpoint job may take (SLURM): downloads and derivations are short; training is budgeted
    from the environment's step rate (crop/envs EnvSpec.train_minutes)."""
    from crop.envs import env_spec  # here, not at the top: gymnasium need not load for every parse

    if policy_source(w.env, w.algo)["kind"] != "train":
        return 30
    return env_spec(w.env).train_minutes(env_cfg(w)["train"]["total_steps"])


def checkpoint_mem_mb(w):
    """Memory of a checkpoint job (MB): 1.5 GB, plus an image policy's replay buffer when it is trained here
    (EnvSpec.replay_mb)."""
    from crop.envs import env_spec

    if policy_source(w.env, w.algo)["kind"] != "train":
        return 1500
    return 1500 + env_spec(w.env).replay_mb(env_cfg(w)["train"].get("dqn", {}).get("buffer_size", 100_000))


def checkpoint_gpus(w):
    """One GPU for a policy trained here on a device other than the CPU (train.dqn.device)."""
    if policy_source(w.env, w.algo)["kind"] != "train":
        return 0
    return 0 if env_cfg(w)["train"].get("dqn", {}).get("device", "cpu") == "cpu" else 1


def import_args(w):
    """`crop import`'s flags for an algorithm whose source is your own file (docs/own-policy.md), else ''."""
    src = policy_source(w.env, w.algo)
    if src["kind"] != "file":
        return ""
    arch = src.get("architecture", "mlp")
    args = [
        f"--file {shlex.quote(src['path'])}",
        f"--format {shlex.quote(src.get('format', 'auto'))}",
        f"--arch {shlex.quote(arch if isinstance(arch, str) else json.dumps(arch, sort_keys=True))}",
    ]
    if src.get("profile"):
        args.append(f"--profile {shlex.quote(src['profile'])}")
    if src.get("sha256"):
        args.append(f"--file-sha256 {shlex.quote(src['sha256'])}")
    return " ".join(args)


def train_settings_arg(w):
    """The train block's settings for this algorithm (its own recipe overrides only), as a shell word."""
    return shlex.quote(json.dumps(train_settings(env_cfg(w), w.algo), sort_keys=True))


def stage_settings_arg(stage):
    """The settings block of a stage subcommand (crop.config.stage_settings: the schema's x-stages table), as
    a shell word for its --settings."""
    return lambda w: shlex.quote(json.dumps(stage_settings(CFG, w.env, stage), sort_keys=True))


def run_dirs():
    return [f"{env}/{layout.run_algo(algo, t)}/sigma-{sig}" for env, algo, sig, t in run_targets(CFG)]


def replicate_files():
    """The files of replicates 1 … N-1 of every run (none with the default `replicates: 1`); no V range for
    the targets bounded in [0, 1]."""
    return [
        str(layout.run_dir(R, env, algo, sig, t, replicate=k) / layout.RUN_FILES[name])
        for env, algo, sig, t in run_targets(CFG)
        for k in range(1, CFG["replicates"])
        for name in layout.REPLICATE_FILES
        if name in layout.run_files(t)
    ]


def all_run_files():
    return [f"{R}/{d}/{name}" for d in run_dirs() for name in layout.run_files(layout.run_target(d)).values()] + (
        replicate_files()
    )


FIGURES = f"{R}/figures"
TABLES = f"{R}/tables"


def plan():
    """{env: (algorithms, σ labels)} of the config: what the aggregate rule draws and tabulates."""
    return {
        env: (
            [layout.run_algo(a, t) for a in ec["algorithms"] for t in smoothing_targets(ec)],
            [sigma_label(s) for s in ec["sigmas"]],
        )
        for env, ec in CFG["environments"].items()
    }


def figure_outputs(fmt, family=None):
    """Figure files the aggregate rule writes in format ``fmt`` (of one family of crop.layout, or all)."""
    out = []
    for env, (algos, labels) in plan().items():
        for fam, stems in layout.figure_families(env, labels, algos).items():
            if family in (None, fam):
                out += [f"{FIGURES}/{stem}.{fmt}" for stem in stems]
    if family in (None, "legend"):
        out += [f"{FIGURES}/{stem}.{fmt}" for stem in layout.GLOBAL_FIGURES]
    return out


def table_outputs(fmt=None):
    return [
        str(p)
        for env in CFG["environments"]
        for p in layout.table_files(TABLES, env)
        if fmt is None or p.suffix == f".{fmt}"
    ]


def aggregate_inputs():
    """Every run's result files (frames.npz among them: the Pong periodic-pattern figure's frames)."""
    return all_run_files()


def aggregate_outputs():
    return figure_outputs("png") + figure_outputs("pdf") + table_outputs()


def checkpoint_records():
    return sorted({f"{R}/{env}/{algo}/checkpoint/model.json" for env, algo, _ in targets(CFG)})


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
    return " ".join(opts)


def caption_settings():
    """Per environment, the settings the report captions quote (as text)."""

    def eps(xs):
        return ", ".join(f"{x:g}" for x in xs)

    out = {}
    for env, ec in CFG["environments"].items():
        lo, gr, lr, at = ec["loact"], ec["gre"], ec["lore"], ec["attack"]
        out[env] = {
            "algorithms": ", ".join(ec["algorithms"]),
            "sigmas": ", ".join(sigma_label(x) for x in ec["sigmas"]),
            "loact": (
                f"m = {lo['m']} noise samples per state, {lo['episodes']} clean episodes of at most "
                f"{lo['horizon']} steps"
            ),
            "gre": (
                f"m = {gr['m']} randomized trajectories of H = {gr['horizon']} steps, γ = {gr['gamma']}, "
                f"ε/σ ∈ {{{eps(gr['eps_factors'])}}}"
            ),
            "lore": f"m = {lr['m']} noise samples per state, horizon H = {lr['horizon']}, γ = {lr['gamma']}",
            "attack": (
                f"{at['pgd_steps']}-step ℓ2 PGD; global: {at['global_episodes']} episodes, ε/σ ∈ "
                f"{{{eps(at['global_eps_factors'])}}}; local (from LoRe's initial state and others): "
                f"{at['local_episodes']} episodes, ε/σ ∈ {{{eps(at['local_eps_factors'])}}}"
            ),
        }
    return out


def audit_outputs():
    return [f"{R}/audit/audit.md", f"{R}/audit/audit.json"]


# GPUs a certification or attack job asks for, as Snakemake's standard resource `gpu` (the SLURM plugin
# turns gpu=1 into `sbatch --gpus=1`): one wherever the config lets the job use CUDA.  A local run does
# not wait for it unless given `--resources gpu=N`, and `device: auto` runs on the CPU without a GPU.
GPUS = 0 if CFG["device"] == "cpu" else 1


def gre_mem_mb(wildcards, threads):
    """Memory of a GRe job (MB): its block of environment copies (crop/envs EnvSpec.gre_mem_mb)."""
    from crop.envs import env_spec

    g, spec = env_cfg(wildcards)["gre"], env_spec(wildcards.env)
    return spec.gre_mem_mb(spec.gre_block(g["m"], g["batch"]), threads)
