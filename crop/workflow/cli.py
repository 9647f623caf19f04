"""The crop command: one subcommand per workflow stage.

Each subcommand checks its arguments before doing any work, calls the package, and writes its outputs
atomically with a provenance file beside each.  Exit status 2 means bad input (config, checkpoint,
arguments); nothing is written then.  A stage's outputs and settings are its row of the stage table
(crop/workflow/stage_table.py); each setting takes its type, bounds, default and help from the config schema.  The
workflow passes a stage's settings block once, as --settings; a flag given by hand takes precedence.  The
function each subcommand runs is the entry point's (crop/__main__.py): this module imports no handler.  A
command line builds its own subcommand's options only (every subcommand is listed, for crop --help and the
choices of a mistyped one).
"""
from __future__ import annotations

import argparse
import copy
import sys
from functools import partial

from crop.io import InputError, json_object
from crop.names import BOUND_NAMES
from crop.workflow.cli_options import (
    POS_INT,
    HelpFormatter,
    aggregate_args,
    algo_type,
    audit_args,
    calibrate_args,
    checked_settings,
    common_args,
    fetch_args,
    import_args,
    plan_args,
    schema_help,
    schema_node,
    schema_type,
    stage_args,
    train_args,
    trust_env_arg,
)
from crop.workflow.stage_table import STAGES

__all__ = ["run", "build_parser", "stage_params", "InputError", "BOUND_NAMES"]


# -------------------------------------------------------------------------------------------------- parser

# subcommand: (one-line help, description); a per-run stage's are its row's, in the stage table's order after
# the checkpoint's subcommands (crop.workflow.stage_table)
COMMANDS = {
    "certify": ("certify your own agent in one command: detect it, write a config, run the workflow, report",
                "Certify a policy file (SB3 or CleanRL DQN, PPO, A2C, SAC, TD3, DDPG, or a state dict) on --env: its "
                "kind is read from the file and checked against the environment's spaces, DIR/config.yaml is "
                "written (snakemake --configfile repeats the run) into a new or empty --out, or one crop certify "
                "made for the same agent (else --force), the workflow runs, and a table per σ, the audit's "
                "verdict and a one-file HTML report follow (docs/own-policy.md)."),
    "train": ("train a Q-network locally (Double DQN and its variants; Discrete actions)",
              "Train a policy with the recipe of its algorithm (crop/train), seeded; the greedy policy must pass "
              "the acceptance test (target return) before model.pt and its record model.json are written."),
    "derive": ("derive a Q-network from another algorithm's checkpoint (CARRL; Discrete actions)",
               "Build a policy from its base algorithm's checkpoint without training (CARRL from StdTrain), "
               "evaluate its greedy return and write model.pt and model.json."),
    "fetch": ("download a published checkpoint (sha256-pinned), or every one a config needs into the cache",
              "Download a published checkpoint (crop/agents/registry.yaml) through the cache or a mirror, refuse it "
              "unless its sha256 matches the pinned one, check that it loads into its architecture, then write "
              "model.pt and model.json. With --configfile: download every published checkpoint a workflow config "
              "fetches into the cache, once each, for compute nodes without internet."),
    "checkpoint": ("obtain a checkpoint from the configured source (train, fetch, derive or import)",
                   "Obtain a policy's checkpoint from the source the config selects: train it here, fetch the "
                   "published one, derive it from its base checkpoint, or import your own policy file (the "
                   "workflow's checkpoint rule)."),
    "import": ("import your own policy (a Q-network, a policy network or a continuous-action actor) as a "
               "checkpoint",
               "Import a Q-network (DQN) or a policy network (PPO, A2C: its actor, the value branch dropped) "
               "trained elsewhere — a PyTorch state dict, a CleanRL checkpoint or a Stable-Baselines3 .zip — into "
               "model.pt and its record model.json (sha256 of the file and of the result, architecture, network "
               "q, policy or actor, preprocessing profile, clean greedy return). A policy network is smoothed "
               "through its probabilities (target probs, its default) or votes. A continuous-action agent (SB3 "
               "SAC, TD3, DDPG, PPO/A2C on a Box action space; CleanRL TD3, DDPG, SAC) is imported as its "
               "deterministic actor (network actor), its squashing and bounds read from the file; LoAct (per "
               "action dimension, percentile smoothing), GRe and the global attack certify it, the stages that "
               "need a finite set of actions refuse it."),
    "aggregate": ("tables and figures named as in the paper",
                  "Tables (CSV, Markdown, LaTeX) and the paper's figures (PDF, PNG) from the runs of a results "
                  "folder."),
    "audit": ("soundness, integrity, provenance and reference audit of a results folder",
              "Audit a results folder; writes OUT_DIR/audit.md and OUT_DIR/audit.json. Exit status: 0 PASS or "
              "WARN, 1 FAIL (a soundness violation or an integrity problem) and, with --strict, also WARN (an "
              "untestable check) or a reproduced value that differs from the reference, 2 bad "
              "input."),
    "calibrate": ("measure this machine's unit costs for crop plan",
                  "Measure the cost model's unit costs on this machine (per environment: the smoothed step per "
                  "state and noise sample, a PGD gradient, an environment step, LoRe's snapshot, GRe's path, a "
                  "training step; a job's start) in a few minutes, best of several repetitions, and store them "
                  "with the machine in $XDG_CACHE_HOME/crop/calibration.json, which crop plan then uses."),
    "plan": ("predict every job's minutes, the CPU- and GPU-hours and the makespan of a config",
             "Before anything runs: every job of the DAG Snakemake would build for the config, its predicted "
             "minutes and device (unit costs: this machine's calibration file, else the shipped table), the "
             "totals in CPU- and GPU-hours and the makespan on NODES machines of CORES cores and GPUS GPUs; the "
             "jobs whose prediction exceeds slurm.max_runtime or slurm.max_mem_mb are named. A calibration file "
             "(--calibration, else this machine's) is checked key by key first; a bad one is refused in one "
             "line."),
    "validate-config": ("check a workflow config and its policy files, as the workflow does before any job",
                        "Validate a workflow config against crop/schemas/config.schema.yaml and the registry, and "
                        "open every files.<label> policy file as its checkpoint job will (a regular file, its "
                        "sha256, safe to read, a network that fits the environment); one line naming the first "
                        "bad field, exit status 2. A relative policy path is read from the working directory, as the "
                        "workflow reads it, not from the config file's folder."),
}


def _subcommands() -> dict[str, tuple[str, str]]:
    """``{subcommand: (help, description)}`` in ``crop --help``'s order: the checkpoint's, the stage table's rows,
    then the report's and the tools'."""
    first = ("train", "derive", "fetch", "checkpoint", "import")
    rows = {name: (row.help, row.description) for name, row in STAGES.items()}
    rest = dict(COMMANDS)
    return {**{name: rest.pop(name) for name in first}, **rows, **rest}


def _checkpoint_args(p, name: str) -> None:
    """The options of a subcommand that writes a checkpoint (train, derive, fetch, checkpoint, import)."""
    from crop.train.defaults import CHECKPOINT_EVERY, EVAL_EPISODES_ALONE

    common_args(p, sigma=False, checkpoint=False, required=name != "fetch")
    if name == "checkpoint":
        source = schema_node("environment.source")
        p.add_argument("--source", choices=source["enum"], default=source["default"], help=schema_help(source))
    if name in ("train", "derive", "checkpoint"):
        train_args(p, budget=name != "derive")
    if name in ("train", "checkpoint"):
        p.add_argument("--checkpoint-every", type=schema_type({"exclusiveMinimum": 0}), metavar="SECONDS",
                       help="seconds between saves of the resumable training state (OUT.resume, also saved on "
                            f"SIGTERM; default: {CHECKPOINT_EVERY:g}, longer for a state that takes long to save)")
    if name in ("fetch", "checkpoint"):
        fetch_args(p)
    if name in ("import", "checkpoint"):
        import_args(p)
    if name in ("fetch", "import"):
        p.add_argument("--eval-episodes", type=schema_type(POS_INT),
                       help="episodes of the clean greedy return recorded in model.json (default: "
                            f"{EVAL_EPISODES_ALONE})")
    p.add_argument("--out", required=name != "fetch", help="model.pt (its record model.json is written beside)")
    if name == "fetch":
        p.add_argument("--configfile", metavar="FILE",
                       help="instead of --env, --algo and --out: fill the cache with every published checkpoint the "
                            "workflow config FILE fetches (its checkpoints block's mirror, cache and lock unless given "
                            "here), e.g. on a login node for compute nodes without internet (docs/hpc.md)")


def _certify_args(p) -> None:
    from crop.workflow.certify_config import certify_args

    certify_args(p, algo_type, schema_type({"exclusiveMinimum": 0}), schema_type(POS_INT))


def _config_args(p, name: str) -> None:
    """validate-config's and plan's options: the config file, and the ids it may import."""
    if name == "plan":
        plan_args(p)
    else:
        p.add_argument("config", help="the workflow config file (YAML)")
    trust_env_arg(p, "a module:Id environment id of the config that may import its module, as if the config set "
                     "import_module: true for it (a received config imports nothing unless you say so)")


#: ``{subcommand: function(parser) adding its options}`` for those that are not per-run stages (a stage's are
#: its row's: :func:`crop.workflow.cli_options.stage_args`).
OPTIONS = {
    **{name: partial(_checkpoint_args, name=name) for name in ("train", "derive", "fetch", "checkpoint", "import")},
    "certify": _certify_args,
    "aggregate": aggregate_args,
    "audit": audit_args,
    "calibrate": calibrate_args,
    "plan": partial(_config_args, name="plan"),
    "validate-config": partial(_config_args, name="validate-config"),
}


def chosen(argv: list[str]) -> str:
    """The subcommand ``argv`` names: its first word that is not an option (crop's own options, --help and
    --version, take no value), else "" (crop's own help and errors need no subcommand's options)."""
    return next((word for word in argv if not word.startswith("-")), "")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """``crop``'s parser: every subcommand listed, with its options; with ``only``, only that subcommand's
    options are built (what one command line needs; "": none, for ``crop --help``, which lists the subcommands
    without theirs)."""
    from crop import __version__

    fmt = HelpFormatter
    ap = argparse.ArgumentParser(prog="crop", description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 formatter_class=fmt)
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {name: sub.add_parser(name, help=h, description=d, formatter_class=fmt)
               for name, (h, d) in _subcommands().items()}
    for name, p in parsers.items():
        if only is None or name == only:
            if name in STAGES:
                stage_args(p, STAGES[name])
            else:
                OPTIONS[name](p)
    ap.subcommand_parsers = parsers   # for _unknown: a mistyped flag gets its subcommand's usage
    return ap


def _unknown(sub: argparse.ArgumentParser, extra: list[str]) -> None:
    """Arguments the subcommand does not know: its own usage and error (not crop's), naming the closest flag of
    each mistyped one (exit status 2)."""
    import difflib

    flags = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    for x in extra:
        close = difflib.get_close_matches(x.split("=", 1)[0], flags, n=1, cutoff=0.6) if x.startswith("-") else []
        hints.append(f"{x} (did you mean {close[0]}?)" if close else x)
    sub.error(f"unrecognized arguments: {' '.join(hints)}")


def stage_params(args) -> argparse.Namespace:
    """A stage's parameters in one step: a flag given by hand, else the --settings block's value, else the
    schema's default; nothing else reads --settings."""
    if args.command not in STAGES:
        return args
    row = STAGES[args.command]
    given = json_object(args.settings, "option: value")
    unknown = sorted(set(given) - set(row.options))
    if unknown:
        raise InputError(f"--settings: unknown setting(s) {unknown}; known: {sorted(row.options)}")
    params = vars(args).copy()
    taken = checked_settings(row, {o: v for o, v in given.items() if o not in params and v is not None})
    for option, (_, node) in row.options.items():
        if option not in params:
            params[option] = taken[option] if option in taken else copy.deepcopy(node.get("default"))
    return argparse.Namespace(**params)


def run(handlers: dict, argv=None) -> None:
    """Parse ``argv`` (the command line's by default) and call its subcommand's function of ``handlers``
    (``{subcommand: function}``: the ``crop`` command's, :data:`crop.__main__.HANDLERS`); bad input is one line
    on stderr and exit status 2, nothing written."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(chosen(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:
        _unknown(parser.subcommand_parsers[args.command], extra)
    if args.command not in handlers:
        parser.error(f"{args.command}: no function runs this subcommand (crop.__main__.HANDLERS)")
    try:
        args = stage_params(args)
        handlers[args.command](args)
    except InputError as exc:
        print(f"crop {args.command}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:  # FloatingPointError (NaN Q), CheckpointError, TrainingFailed, …
        from crop.io import OutputError
        from crop.models import CheckpointError

        if isinstance(exc, OutputError):  # full disk, read-only folder: one line, nothing half-written
            print(f"crop {args.command}: error: {exc.strerror}", file=sys.stderr)
            sys.exit(1)
        from crop.smoothing.smoothed import NonFiniteOutputError
        from crop.train.dqn import TrainingFailed

        if isinstance(exc, (NonFiniteOutputError, CheckpointError, TrainingFailed)):
            print(f"crop {args.command}: error: {exc}", file=sys.stderr)
            sys.exit(1)
        raise
