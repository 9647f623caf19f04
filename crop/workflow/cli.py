"""The crop command: one subcommand per workflow stage.

Each subcommand checks its arguments before doing any work, calls the package, and writes its outputs
atomically with a provenance file beside each.  Exit status 2 means bad input (config, checkpoint,
arguments); nothing is written then.  A stage's outputs and settings are its row of the stage table
(crop/workflow/stage_table.py); each setting takes its type, bounds, default and help from the config schema.  The
workflow passes a stage's settings block once, as --settings; a flag given by hand takes precedence.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys

from crop.io import InputError, json_object
from crop.names import ALPHA_MODES, BOUND_NAMES, DEVICES, TARGET_NAMES
from crop.workflow.certify_config import certify_args
from crop.workflow.stage_table import STAGES, StageRow

__all__ = ["main", "build_parser", "InputError", "BOUND_NAMES"]

# Choices come from the code that implements them, not from the schema's copy of the list.
CHOICES = {"bound": BOUND_NAMES, "alpha_mode": ALPHA_MODES, "device": DEVICES}
POS_INT = {"type": "integer", "minimum": 1}


# ------------------------------------------------------------------------------------- options from the schema

class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Help with each option's default, where it has one."""

    def _get_help_string(self, action):
        if action.default is None or action.required or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _types(node: dict) -> list[str]:
    t = node.get("type", [])
    return [t] if isinstance(t, str) else t


_BOUNDS = [("minimum", ">=", lambda v, b: v >= b), ("exclusiveMinimum", ">", lambda v, b: v > b),
           ("maximum", "<=", lambda v, b: v <= b), ("exclusiveMaximum", "<", lambda v, b: v < b)]


def _check_number(node: dict, v, shown) -> int | float:
    """``v`` checked against a schema number/integer node's bounds; ArgumentTypeError naming ``shown``."""
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {shown}")
    for key, op, ok in _BOUNDS:
        if key in node and not ok(v, node[key]):
            raise argparse.ArgumentTypeError(f"must be {op} {node[key]}, got {shown}")
    return v


def _schema_type(node: dict):
    """An argparse type for a schema number/integer node that enforces its bounds."""
    kind = int if "integer" in _types(node) else float

    def parse(text: str):
        return _check_number(node, kind(text), text)

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value"
    return parse


def _help(node: dict) -> str:
    return " ".join(node.get("description", "").split()).replace("%", "%%")


def _flag(p, option: str, node: dict, **kw) -> None:
    """``--option`` as the schema node describes it: type and bounds, choices, default, help."""
    kw.setdefault("default", node.get("default"))
    kw.setdefault("help", _help(node))
    if option in CHOICES or "enum" in node:
        kw["choices"] = CHOICES.get(option) or node["enum"]
    elif "array" in _types(node):
        n = node.get("minItems")
        kw["nargs"] = n if n and n == node.get("maxItems") else "+"
        kw["type"] = _schema_type(node["items"])
    elif {"integer", "number"} & set(_types(node)):
        kw["type"] = _schema_type(node)
    elif _types(node) == ["boolean"]:
        kw["action"] = argparse.BooleanOptionalAction
    p.add_argument("--" + option.replace("_", "-"), **kw)


def _node(key: str) -> dict:
    """The schema node of a top-level key, or of ``environment.KEY``."""
    from crop.workflow.config import schema as _schema

    schema = _schema()
    if key.startswith("environment."):
        return schema["$defs"]["environment"]["properties"][key.split(".")[1]]
    return schema["properties"][key]


def _env(text: str) -> str:
    """The paper's four ids or any Gymnasium id crop can make (crop.envs.env_family)."""
    from crop.envs import UnknownEnvError, env_family

    try:
        env_family(text)
    except UnknownEnvError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _algo(text: str) -> str:
    """A label as the config's (crop/schemas: $defs.label): the paper's nine or one of your own."""
    import re

    from crop.workflow.config import schema

    label = schema()["$defs"]["label"]
    if not re.fullmatch(label["pattern"], text):
        raise argparse.ArgumentTypeError(f"{text!r} {label['x-message']}")
    return text


def _return_or_none(text: str) -> float | None:
    if text.lower() in ("none", "null"):
        return None
    v = float(text)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number or 'none', got {text}")
    return v


def _accepted(key: str) -> str:
    """What a config accepts for an environment id or an algorithm label (the schema's words), for help."""
    from crop.workflow.config import schema

    node = schema()["$defs"]["env_id" if key == "env" else "label"]
    return " ".join(node.get("description", "").split()) or "see crop/schemas/config.schema.yaml"


#: Why a subcommand takes Discrete actions only (a stage's reason is its row's ``discrete``); the others take
#: Box actions too.  tests/test_help.py asks each command's own check whether Pendulum-v1 passes.
DISCRETE_ONLY = {"train": "it trains Q-networks (Double DQN)", "derive": "it derives Q-networks (CARRL)",
                 "fetch": "the published checkpoints are the paper's Q-networks (crop/agents/registry.yaml)",
                 **{name: row.discrete for name, row in STAGES.items() if row.discrete}}


def _env_help(command: str) -> str:
    """``--env``'s help: the ids a config accepts, narrowed to Discrete actions where ``command`` needs them."""
    why = DISCRETE_ONLY.get(command)
    return _accepted("env") + (f" Discrete actions only: {why}." if why else "")


def _common(p, sigma: bool = True, checkpoint: bool = True) -> None:
    p.add_argument("--env", type=_env, required=True, help=_env_help(p.prog.split()[-1]))
    p.add_argument("--algo", type=_algo, required=True, help=_accepted("algo"))
    if sigma:
        p.add_argument("--sigma", type=_schema_type({"exclusiveMinimum": 0}), required=True,
                       help="standard deviation σ of the smoothing noise")
    if checkpoint:
        p.add_argument("--checkpoint", required=True, help="model.pt (its record model.json must sit beside it)")
    for key in ("seed", "device", "threads", "chunk"):
        _flag(p, key, _node(key))
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars (default: only on a terminal)")


def _train_args(p, budget: bool = True) -> None:
    p.add_argument("--settings", help="the config's train block as JSON (hidden, total_steps, …, dqn, recipes)")
    if budget:
        p.add_argument("--hidden", type=_schema_type(POS_INT), nargs="+", help="hidden layer widths")
        p.add_argument("--total-steps", type=_schema_type(POS_INT), help="most environment steps to train")
        p.add_argument("--min-steps", type=_schema_type({"type": "integer", "minimum": 0}),
                       help="no acceptance test before this many steps")
    p.add_argument("--eval-episodes", type=_schema_type(POS_INT),
                   help="episodes of the greedy acceptance evaluation")
    p.add_argument("--target-return", type=_return_or_none, default=argparse.SUPPRESS,
                   help="acceptance threshold of the greedy mean return (default: the environment's, e.g. "
                        "195 for CartPole-v0; 'none': no threshold, record the return only)")
    p.add_argument("--base-checkpoint",
                   help="derived algorithms (CARRL): the base algorithm's model.pt (model.json beside it)")


def _fetch_args(p) -> None:
    p.add_argument("--mirror", help="mirror: base URL, file:// URL or folder (default: $CROP_CHECKPOINT_MIRROR)")
    p.add_argument("--cache", help="download cache (default: $CROP_CACHE or the user cache)")
    p.add_argument("--lock", default="checkpoints.lock.json",
                   help="lock file pinning first downloads of sources published without a checksum")


def _import_args(p) -> None:
    p.add_argument("--file", help="your policy file: a PyTorch state dict, a CleanRL DQN, PPO, TD3, DDPG or SAC-actor "
                                  "checkpoint, or a Stable-Baselines3 DQN, PPO, A2C, SAC, TD3 or DDPG .zip; a relative "
                                  "path is read from the working directory (docs/own-policy.md)")
    p.add_argument("--arch", default="mlp",
                   help='its architecture: a network spec as JSON ({"arch": "mlp", "in": 4, "hidden": [64, 64], '
                        '"out": 2}; nature_cnn, dueling_cnn) or mlp, sizes read from the weights')
    p.add_argument("--profile", help="the preprocessing profile it was trained with (crop/envs PROFILES; "
                                     "default: the environment's)")
    p.add_argument("--format", default="auto", choices=["auto", "torch", "cleanrl", "sb3"],
                   help="file format (auto: an SB3 zip by its policy.pth, CleanRL by .cleanrl_model)")
    p.add_argument("--file-sha256", help="refuse the file unless it has this sha256")


def cmd_validate_config(args) -> None:
    """The checks the workflow makes before any job: the schema and the registry, then every policy file
    opened as its checkpoint job will open it."""
    from crop.workflow.config import ConfigError, check_policy_files, load_config

    try:
        cfg = check_policy_files(load_config(args.config, args.trust_env), args.config)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    n = sum(len(e["algorithms"]) * len(e["sigmas"]) for e in cfg["environments"].values())
    print(f"{args.config}: valid ({n} certification targets)")


def cmd_calibrate(args) -> None:
    from crop.workflow.calibrate import PAPER_ENVS, calibrate

    try:
        calibrate(args.device, args.env or PAPER_ENVS, args.out)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _plan_table(jobs) -> list[str]:
    """Per rule: jobs, minutes per job (least–most) and the rule's total hours."""
    rows = {}
    for j in jobs:
        rows.setdefault((j.rule, j.device), []).append(j.minutes)
    lines = [f"{'rule':<24}{'device':<7}{'jobs':>6}  {'minutes per job':>19}  {'total h':>9}"]
    for (rule, dev), mins in rows.items():
        per = f"{min(mins):.3g}" if min(mins) == max(mins) else f"{min(mins):.3g}–{max(mins):.3g}"
        lines.append(f"{rule:<24}{dev:<7}{len(mins):>6}  {per:>19}  {sum(mins) / 60:>9.3g}")
    return lines


def cmd_plan(args) -> None:
    import json

    from crop.workflow.config import ConfigError, load_config
    from crop.workflow.cost import CostError, plan, runtime_minutes, stage_gpus

    try:
        cfg = load_config(args.configfile, args.trust_env)
        gpus = args.gpus if args.gpus is not None else stage_gpus(cfg)
        result, extra = plan(cfg, args.cores, gpus, args.nodes, args.calibration)
    except (ConfigError, CostError) as exc:
        raise InputError(str(exc)) from None
    for dev, src in extra["sources"].items():
        print(f"unit costs ({dev}): {src}", file=sys.stderr)
    for j in extra["over_cap"]:
        where = "/".join(str(x) for x in (j.env, j.algo, j.sigma) if x is not None)
        print(f"over slurm.max_runtime = {extra['cap']} min: {j.rule} {where} is predicted {j.minutes:.0f} min "
              f"(asks {runtime_minutes(j.seconds)} with headroom); SLURM will stop it at the cap", file=sys.stderr)
    for j in extra["over_mem"]:
        where = "/".join(str(x) for x in (j.env, j.algo, j.sigma) if x is not None)
        print(f"over slurm.max_mem_mb = {extra['mem_cap']} MB: {j.rule} {where} is predicted {j.mem_mb} MB; it asks "
              "for the cap, and SLURM will stop it if it needs more", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print("\n".join(_plan_table(extra["jobs"])))
    t = result["total"]
    print(f"{t['jobs']} jobs: {t['cpu_hours']:.3g} CPU-hours, {t['gpu_hours']:.3g} GPU-hours; makespan "
          f"{result['makespan_hours']:.3g} h on {args.nodes} × ({args.cores} cores, {gpus} GPU)")


# -------------------------------------------------------------------------------------------------- parser

# subcommand: (one-line help, description); a per-run stage's are its row's, in the stage table's order after
# the checkpoint's subcommands (crop.workflow.stage_table)
COMMANDS = {
    "certify": ("certify your own agent in one command: detect it, write a config, run the workflow, report",
                "Certify a policy file (SB3 or CleanRL DQN, PPO, A2C, SAC, TD3, DDPG, or a state dict) on --env: its "
                "kind is read from the file and checked against the environment's spaces, DIR/config.yaml is "
                "written (snakemake --configfile repeats the run), the workflow runs, and a table per σ, the "
                "audit's verdict and a one-file HTML report follow (docs/own-policy.md)."),
    "train": ("train a Q-network locally (Double DQN and its variants; Discrete actions)",
              "Train a policy with the recipe of its algorithm (crop/train), seeded; the greedy policy must pass "
              "the acceptance test (target return) before model.pt and its record model.json are written."),
    "derive": ("derive a Q-network from another algorithm's checkpoint (CARRL; Discrete actions)",
               "Build a policy from its base algorithm's checkpoint without training (CARRL from StdTrain), "
               "evaluate its greedy return and write model.pt and model.json."),
    "fetch": ("download a published checkpoint (sha256-pinned)",
              "Download a published checkpoint (crop/agents/registry.yaml) through the cache or a mirror, refuse it "
              "unless its sha256 matches the pinned one, check that it loads into its architecture, then write "
              "model.pt and model.json."),
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


# What each subcommand runs (``module:function``, imported when it runs: the parser needs none of them); a
# per-run stage's handler is its row's.
HANDLERS = {"certify": "crop.handlers.certify:cmd_certify",
            "train": "crop.handlers.policies:cmd_train", "derive": "crop.handlers.policies:cmd_derive",
            "fetch": "crop.handlers.policies:cmd_fetch", "checkpoint": "crop.handlers.policies:cmd_checkpoint",
            "import": "crop.handlers.policies:cmd_import", "aggregate": "crop.handlers.stages:cmd_aggregate",
            "audit": "crop.handlers.stages:cmd_audit", "validate-config": "crop.workflow.cli:cmd_validate_config",
            "calibrate": "crop.workflow.cli:cmd_calibrate", "plan": "crop.workflow.cli:cmd_plan"}


def _subcommands() -> dict[str, tuple[str, str, str]]:
    """``{subcommand: (help, description, handler)}`` in ``crop --help``'s order: the checkpoint's, the stage
    table's rows, then the report's and the tools'."""
    first = ("train", "derive", "fetch", "checkpoint", "import")
    rows = {name: (row.help, row.description, row.handler) for name, row in STAGES.items()}
    rest = {name: (*COMMANDS[name], HANDLERS[name]) for name in COMMANDS}
    return {**{name: rest.pop(name) for name in first}, **rows, **rest}


def handler(name: str):
    """The function a ``module:function`` handler names."""
    import importlib

    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)


_METAVARS = {"frames_window": ("START", "END"), "reward_range": ("LOW", "HIGH"), "return_range": ("LOW", "HIGH")}


def _stage_parser(p, row: StageRow) -> None:
    """A stage's options from its row of the stage table: the common ones, its settings (no default here: a
    flag not given takes the --settings block's value, else the schema's default), its outputs."""
    _common(p)
    if row.v_range:
        p.add_argument("--target", choices=TARGET_NAMES, help=_help(_node("environment.target")))
        p.add_argument("--qrange", help="qrange.json of the same env/algo/sigma (the q target only)")
    p.add_argument("--settings", help="the stage's settings block as JSON (option: value; what the workflow "
                                      "passes, crop.workflow.stage_table.stage_settings); flags given as "
                                      "well take precedence")
    for option, (key, node) in row.options.items():
        default = f" (default: {node['default']})" if node.get("default") is not None else ""
        _flag(p, option, node, default=argparse.SUPPRESS, metavar=_METAVARS.get(option),
              help=f"{_help(node)}{default} [config: {key.lstrip('/')}]".lstrip())
    for out in row.outputs:
        p.add_argument("--" + out.option.replace("_", "-"), required=out.required, help=out.help)
    for flag in row.flags:
        p.add_argument("--" + flag.option.replace("_", "-"), type=_schema_type(flag.node), help=flag.help)


def build_parser() -> argparse.ArgumentParser:
    from crop import __version__

    fmt = _Help
    ap = argparse.ArgumentParser(prog="crop", description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 formatter_class=fmt)
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = _subcommands()
    parsers = {name: sub.add_parser(name, help=h, description=d, formatter_class=fmt)
               for name, (h, d, _) in commands.items()}
    for name in ("train", "derive", "fetch", "checkpoint", "import"):
        _common(parsers[name], sigma=False, checkpoint=False)
    parsers["checkpoint"].add_argument("--source", choices=["auto", "train", "published", "file"], default="auto",
                                       help=_help(_node("environment.source")))
    for name in ("train", "derive", "checkpoint"):
        _train_args(parsers[name], budget=name != "derive")
    for name in ("train", "checkpoint"):
        parsers[name].add_argument("--checkpoint-every", type=_schema_type({"exclusiveMinimum": 0}), metavar="SECONDS",
                                   help="seconds between saves of the resumable training state (OUT.resume, "
                                        "also saved on SIGTERM; default: 600, longer for a state that takes "
                                        "long to save)")
    for name in ("fetch", "checkpoint"):
        _fetch_args(parsers[name])
    for name in ("import", "checkpoint"):
        _import_args(parsers[name])
    for name in ("fetch", "import"):
        parsers[name].add_argument("--eval-episodes", type=_schema_type(POS_INT),
                                   help="episodes of the clean greedy return recorded in model.json (default: 10)")
    for name in ("train", "derive", "fetch", "checkpoint", "import"):
        parsers[name].add_argument("--out", required=True, help="model.pt (its record model.json is written beside)")
    for name, row in STAGES.items():
        _stage_parser(parsers[name], row)
    _report_args(parsers["aggregate"], parsers["audit"])
    parsers["validate-config"].add_argument("config", help="the workflow config file (YAML)")
    _plan_args(parsers["plan"], parsers["calibrate"])
    certify_args(parsers["certify"], _algo, _schema_type({"exclusiveMinimum": 0}), _schema_type(POS_INT))
    for name in ("validate-config", "plan"):
        _trust_env_arg(parsers[name], "a module:Id environment id of the config that may import its module, as "
                                      "if the config set import_module: true for it (a received config imports "
                                      "nothing unless you say so)")
    for name, p in parsers.items():
        p.set_defaults(handler=commands[name][2])
    return ap


def _report_args(agg, aud) -> None:
    agg.add_argument("results", nargs="?", help="results folder (every complete run in it, or --runs)")
    agg.add_argument("--results", dest="results_opt", help=argparse.SUPPRESS)
    agg.add_argument("--runs", nargs="+", help="only these ENV/ALGO/sigma-S folders under RESULTS")
    eps_node = _node("report")["properties"]["table_eps_factors"]
    agg.add_argument("--table-eps-factors", type=_schema_type(eps_node["items"]), nargs="+",
                     default=list(eps_node["default"]), help=_help(eps_node))
    agg.add_argument("--figures", help="figures folder (default: RESULTS/figures)")
    agg.add_argument("--tables", help="tables folder (default: RESULTS/tables)")
    aud.add_argument("results", nargs="?", help="results folder (every run folder in it is audited)")
    aud.add_argument("--out-dir", help="where audit.md and audit.json go (default: RESULTS/audit)")
    aud.add_argument("--runs", nargs="*", help="only these ENV/ALGO/sigma-S folders")
    for p in (agg, aud):
        p.add_argument("--inputs", nargs="+", help="the run files themselves (instead of RESULTS)")
    audit_node = _node("audit")["properties"]
    _flag(aud, "alpha", audit_node["alpha"])
    aud.add_argument("--reference", help=_help(audit_node["reference"]))
    aud.add_argument("--tolerances", help=_help(audit_node["tolerances"]))
    for name in ("abs", "rel"):
        aud.add_argument(f"--{name}-tol", type=_schema_type({"minimum": 0}),
                         help=f"{'absolute' if name == 'abs' else 'relative'} tolerance for every metric (overrides)")
    aud.add_argument("--config-hash", help="hash of the workflow config the results came from (the workflow "
                                           "passes it)")
    aud.add_argument("--config", help="workflow config file: validated and hashed (instead of --config-hash)")
    aud.add_argument("--strict", action="store_true", help=_help(audit_node["strict"]))
    aud.add_argument("--rerun", type=_schema_type({"type": "integer", "minimum": 0}), default=0, metavar="K",
                     help="re-run K stage jobs drawn at random from their recorded provenance and compare (CPU: "
                          "byte-identical; a differing job makes the verdict FAIL; docs/audit.md)")
    aud.add_argument("--seed", type=_schema_type({"type": "integer", "minimum": 0}), default=0,
                     help="seed of the draw of --rerun's jobs")
    aud.add_argument("--rerun-budget", type=_schema_type({"type": "number", "exclusiveMinimum": 0}),
                     metavar="MINUTES", help="minutes a --rerun job may be predicted to take (crop plan's cost model "
                                             "on this machine's CPU; default: 10): a job predicted longer is not "
                                             "started, and a started one is ended past 4x its prediction + 2 "
                                             "minutes (not re-run: WARN)")
    _trust_env_arg(aud, "an environment id whose module:Id form may import its module (ids read from the results "
                        "folder or a reference never import anything; --config trusts its ids that set "
                        "import_module: true)")
    aud.add_argument("--report-only", action="store_true",
                     help="exit 0 whatever the verdict (bad input still exits 2): the workflow's audit job, whose "
                          "closing summary states the verdict")


def _trust_env_arg(p, text: str) -> None:
    """--trust-env ID (repeatable): the command line is the user's own, so an id named there may import."""
    p.add_argument("--trust-env", action="append", default=[], metavar="ID", help=text)


def _plan_args(pl, cal) -> None:
    import os

    pl.add_argument("--configfile", required=True, help="the workflow config file (YAML)")
    pl.add_argument("--cores", type=_schema_type(POS_INT), default=os.cpu_count(), help="CPU cores per machine")
    pl.add_argument("--gpus", type=_schema_type({"type": "integer", "minimum": 0}),
                    help="GPUs per machine (default: 1 when any environment's device, else the "
                         "config's, is not cpu; else 0)")
    pl.add_argument("--nodes", type=_schema_type(POS_INT), default=1, help="machines")
    pl.add_argument("--json", action="store_true", help="the plan as JSON: jobs, total, makespan_hours")
    for p in (pl, cal):
        p.add_argument("--calibration" if p is pl else "--out", default=None,
                       help="calibration file (default: $XDG_CACHE_HOME/crop/calibration.json)")
    cal.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="what to measure on")
    cal.add_argument("--env", nargs="+", help="environments (default: the paper's four)")


def _setting(option: str, node: dict, value):
    """A --settings value checked as its flag's would be (type, bounds, choices, length); InputError naming
    it."""
    try:
        if option in CHOICES or "enum" in node:
            choices = CHOICES.get(option) or node["enum"]
            if value not in choices:
                raise argparse.ArgumentTypeError(f"must be one of {list(choices)}, got {value!r}")
            return value
        if "array" in _types(node):
            n = node.get("minItems")
            if not isinstance(value, list) or not value or (n and n == node.get("maxItems") and len(value) != n):
                raise argparse.ArgumentTypeError(f"must be a list of {n or 'one or more'} numbers, got {value!r}")
            return [_setting(option, node["items"], v) for v in value]
        if _types(node) == ["boolean"]:
            if not isinstance(value, bool):
                raise argparse.ArgumentTypeError(f"must be true or false, got {value!r}")
            return value
        integer = "integer" in _types(node)
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            raise argparse.ArgumentTypeError(f"must be {'an integer' if integer else 'a number'}, got {value!r}")
        return _check_number(node, (int if integer else float)(value), value)
    except argparse.ArgumentTypeError as exc:
        raise InputError(f"--settings: {option}: {exc}") from None


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
    for option, (_, node) in row.options.items():
        if option in params:
            continue
        value = given.get(option)
        params[option] = copy.deepcopy(node.get("default")) if value is None else _setting(option, node, value)
    return argparse.Namespace(**params)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args = stage_params(args)
        handler(args.handler)(args)
    except InputError as exc:
        print(f"crop {args.command}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:  # FloatingPointError (NaN Q), CheckpointError, TrainingFailed, …
        from crop.io import OutputError
        from crop.models import CheckpointError

        if isinstance(exc, OutputError):  # full disk, read-only folder: one line, nothing half-written
            print(f"crop {args.command}: error: {exc.strerror}", file=sys.stderr)
            sys.exit(1)
        from crop.smoothing.smoothed import NonFiniteQError
        from crop.train.dqn import TrainingFailed

        if isinstance(exc, (NonFiniteQError, CheckpointError, TrainingFailed)):
            print(f"crop {args.command}: error: {exc}", file=sys.stderr)
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
