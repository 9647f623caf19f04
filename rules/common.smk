# Shared set-up: validate the config (before any job is scheduled) and name every file.
import os
import re
import shlex

from crop import layout
from crop.config import ConfigError, sigma_label, targets, validate_config

try:
    CFG = validate_config(config, "config")
except ConfigError as exc:
    raise WorkflowError(str(exc))

R = CFG["results"]
ENVS = list(CFG["environments"])
ALGOS = sorted({a for e in CFG["environments"].values() for a in e["algorithms"]})
SIGMAS = sorted({t[2] for t in targets(CFG)}, key=float)


wildcard_constraints:
    env="|".join(map(re.escape, ENVS)),
    algo="|".join(map(re.escape, ALGOS)),
    sigma=r"[0-9][0-9.e+-]*",


def env_cfg(wildcards):
    return CFG["environments"][wildcards.env]


def common_args(wildcards, threads=1):
    """Flags every certification subcommand takes."""
    return (f"--env {wildcards.env} --algo {shlex.quote(wildcards.algo)} --sigma {wildcards.sigma} "
            f"--seed {CFG['seed']} --device {CFG['device']} --chunk {CFG['chunk']}")


def floats(xs):
    return " ".join(repr(float(x)) for x in xs)


def run_file(name):
    """A per-run result file; names in crop/layout.py."""
    return f"{R}/{{env}}/{{algo}}/sigma-{{sigma}}/{layout.RUN_FILES[name]}"


def meta_file(name):
    stem = layout.RUN_FILES[name].rsplit(".", 1)[0]
    return f"{R}/{{env}}/{{algo}}/sigma-{{sigma}}/{stem}.meta.json"


CHECKPOINT = f"{R}/{{env}}/{{algo}}/checkpoint/model.pt"
CHECKPOINT_RECORD = f"{R}/{{env}}/{{algo}}/checkpoint/model.json"


def run_dirs():
    return [f"{env}/{algo}/sigma-{sig}" for env, algo, sig in targets(CFG)]


def all_run_files():
    return [f"{R}/{d}/{name}" for d in run_dirs() for name in layout.RUN_FILES.values()]


FIGURES = f"{R}/figures"
TABLES = f"{R}/tables"


def figure_outputs(fmt):
    return [
        str(p)
        for env, ec in CFG["environments"].items()
        for p in layout.figure_files(FIGURES, env, [sigma_label(s) for s in ec["sigmas"]])
        if p.suffix == f".{fmt}"
    ]


def table_outputs():
    return [str(p) for env in CFG["environments"] for p in layout.table_files(TABLES, env)]


def aggregate_outputs():
    return figure_outputs("png") + figure_outputs("pdf") + table_outputs()


def audit_outputs():
    return [f"{R}/audit/audit.md", f"{R}/audit/audit.json"]


# GPUs a certification or attack job asks for, as Snakemake's standard resource `gpu` (the SLURM plugin
# turns gpu=1 into `sbatch --gpus=1`): one wherever the config lets the job use CUDA.  A local run does
# not wait for it unless given `--resources gpu=N`, and `device: auto` runs on the CPU without a GPU.
GPUS = 0 if CFG["device"] == "cpu" else 1


# Memory of a GRe job (MB): the process (measured ≤ 350 MB), about 100 MB per worker process (threads),
# and its m environment copies, measured at 2.6 MB per Atari and 0.45 MB per highway environment (CartPole
# steps all m in numpy arrays), with 2× headroom: a few GB for highway and about 50 GB for Atari at the
# paper's m = 10,000.
GRE_MB_PER_ENV = {"CartPole-v0": 0.0, "highway-fast-v0": 0.45, "PongNoFrameskip-v4": 2.6,
                  "FreewayNoFrameskip-v4": 2.6}


def gre_mem_mb(wildcards, threads):
    return int(2 * (350 + 100 * threads + GRE_MB_PER_ENV[wildcards.env] * env_cfg(wildcards)["gre"]["m"]))
