"""The crop command's options, built from the config schema: each setting's flag takes its type, bounds,
choices, default and help from the schema node it sets (crop/schemas/config.schema.yaml), and a value, given
as a flag or in --settings, is checked against that node by the jsonschema validator."""
from __future__ import annotations

import argparse
import math

from crop.io import InputError
from crop.names import (
    ALPHA_MODES,
    AUTO_TARGET,
    BOUND_NAMES,
    DEVICES,
    TARGET_NAMES,
)
from crop.schema import resolved, schema_default, schema_node
from crop.workflow.stage_table import STAGES, StageRow

__all__ = ["CHOICES", "POS_INT", "HelpFormatter", "schema_type", "schema_help", "common_args",
           "train_args", "fetch_args", "import_args", "stage_args", "aggregate_args", "audit_args", "trust_env_arg",
           "plan_args", "calibrate_args", "checked_settings"]
# Choices come from the code that implements them, not from the schema's copy of the list.
CHOICES = {"bound": BOUND_NAMES, "alpha_mode": ALPHA_MODES, "device": DEVICES}
POS_INT = {"type": "integer", "minimum": 1}

class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help with each option's default, where it has one."""

    def _get_help_string(self, action):
        if action.default is None or action.required or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _types(node: dict) -> list[str]:
    t = node.get("type", [])
    return [t] if isinstance(t, str) else t


#: A refused bound in a flag's words: ``must be >= 1, got 0``.
_BOUND_WORDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _as_flag(node: dict) -> dict:
    """A setting's node as its flag takes it: a number only, where the config also accepts a word or null for it
    (``auto``, resolved when the config is validated; null, the default)."""
    for kind in ("integer", "number"):
        if kind in _types(node) and "enum" not in node:
            return {**node, "type": kind}
    return node


#: At one place in a value, what is refused first: its shape (type, choices, length), then a number that is not
#: finite, then a bound.
_SHAPE = ("type", "enum", "minItems", "maxItems")


def _refusal(node: dict, value, shown, errors: list, depth: int = 0) -> str | None:
    """Why ``value`` is refused for ``node``, in a flag's words (``must be >= 1, got 0``; ``shown``: how it was
    written), else None: ``errors`` are the jsonschema validator's of ``value`` against the node as its flag
    takes it (:func:`_as_flag`), at ``depth`` in the document validated; the first place in ``value`` with one
    is named.  A number must also be finite, which JSON Schema cannot say."""
    from crop.schema import non_finite

    found = [(tuple(e.absolute_path)[depth:], 0 if e.validator in _SHAPE else 2, e) for e in errors]
    hit = non_finite(value)
    if hit:
        found.append((tuple(hit[0]), 1, None))
    if not found:
        return None
    where, _, err = min(found, key=lambda f: f[:2])
    if err is None:
        return f"must be a finite number, got {shown if not where else hit[1]}"
    return _words(err, node, not where, shown if not where else err.instance)


def _words(err, node: dict, top: bool, shown) -> str:
    """A validation error of a setting's value (``top``: of the value itself, not of an item) as its flag's
    refusal says it."""
    where, value = err.schema, err.instance
    if top and "array" in _types(node) and err.validator in ("type", "minItems", "maxItems"):
        return f"must be a list of {node.get('minItems') or 'one or more'} numbers, got {value!r}"
    if "enum" in where:
        return f"must be one of {list(where['enum'])}, got {value!r}"
    if err.validator in _BOUND_WORDS:
        return f"must be {_BOUND_WORDS[err.validator]} {err.validator_value}, got {shown}"
    if err.validator == "type":
        kinds = _types(where)
        want = ("true or false" if kinds == ["boolean"] else "an integer" if "integer" in kinds else
                "a number" if "number" in kinds else " or ".join(kinds))
        return f"must be {want}, got {value!r}"
    return err.message


def schema_type(node: dict):
    """An argparse type for a schema number/integer node: the text parsed, then checked against the node."""
    kind = int if "integer" in _types(node) else float

    def parse(text: str):
        from crop.schema import node_errors

        value = kind(text)
        refused = _refusal(node, value, text, node_errors(_as_flag(node), value))
        if refused:
            raise argparse.ArgumentTypeError(refused)
        return value

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value"
    return parse


def schema_help(node: dict) -> str:
    return " ".join(node.get("description", "").split()).replace("%", "%%")


def _flag(p, option: str, node: dict, **kw) -> None:
    """``--option`` as the schema node describes it: type and bounds, choices, default, help."""
    kw.setdefault("default", node.get("default"))
    kw.setdefault("help", schema_help(node))
    if option in CHOICES or "enum" in node:
        kw["choices"] = CHOICES.get(option) or node["enum"]
    elif "array" in _types(node):
        n = node.get("minItems")
        kw["nargs"] = n if n and n == node.get("maxItems") else "+"
        kw["type"] = schema_type(node["items"])
    elif {"integer", "number"} & set(_types(node)):
        kw["type"] = schema_type(node)
    elif _types(node) == ["boolean"]:
        kw["action"] = argparse.BooleanOptionalAction
    p.add_argument("--" + option.replace("_", "-"), **kw)


def _env(text: str) -> str:
    """The paper's four ids or any Gymnasium id crop can make (crop.envs.env_family)."""
    from crop.envs import UnknownEnvError, env_family

    try:
        env_family(text)
    except UnknownEnvError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def algo_type(text: str) -> str:
    """A label as the config's (crop/schemas: $defs.label): the paper's nine or one of your own."""
    import re

    label = schema_node("label")
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
    node = schema_node("env_id" if key == "env" else "label")
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


def common_args(p, sigma: bool = True, checkpoint: bool = True, required: bool = True) -> None:
    p.add_argument("--env", type=_env, required=required, help=_env_help(p.prog.split()[-1]))
    p.add_argument("--algo", type=algo_type, required=required, help=_accepted("algo"))
    if sigma:
        p.add_argument("--sigma", type=schema_type(schema_node("environment.sigmas")["items"]), required=True,
                       help="standard deviation σ of the smoothing noise")
    if checkpoint:
        p.add_argument("--checkpoint", required=True, help="model.pt (its record model.json must sit beside it)")
    for key in ("seed", "device", "threads", "chunk"):
        _flag(p, key, schema_node(key))
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars (default: only on a terminal)")


def train_args(p, budget: bool = True) -> None:
    p.add_argument("--settings", help="the config's train block as JSON (hidden, total_steps, …, dqn, recipes)")
    train = {k: resolved(v) for k, v in schema_node("environment.train")["properties"].items()}
    if budget:
        p.add_argument("--hidden", type=schema_type(resolved(train["hidden"]["items"])), nargs="+",
                       help="hidden layer widths")
        p.add_argument("--total-steps", type=schema_type(train["total_steps"]), help="most environment steps to train")
        p.add_argument("--min-steps", type=schema_type(train["min_steps"]),
                       help="no acceptance test before this many steps")
    p.add_argument("--eval-episodes", type=schema_type(train["eval_episodes"]),
                   help="episodes of the greedy acceptance evaluation")
    p.add_argument("--target-return", type=_return_or_none, default=argparse.SUPPRESS,
                   help="acceptance threshold of the greedy mean return (default: the environment's, e.g. "
                        "195 for CartPole-v0; 'none': no threshold, record the return only)")
    p.add_argument("--base-checkpoint",
                   help="derived algorithms (CARRL): the base algorithm's model.pt (model.json beside it)")


def fetch_args(p) -> None:
    p.add_argument("--mirror", help="mirror: base URL, file:// URL or folder (default: $CROP_CHECKPOINT_MIRROR)")
    p.add_argument("--cache", help="download cache (default: $CROP_CACHE or the user cache)")
    p.add_argument("--lock", help="lock file pinning first downloads of sources published without a checksum "
                                  f"(default: {schema_default('checkpoints.lock')})")


def import_args(p) -> None:
    p.add_argument("--file", help="your policy file: a PyTorch state dict, a CleanRL DQN, PPO, TD3, DDPG or SAC-actor "
                                  "checkpoint, or a Stable-Baselines3 DQN, PPO, A2C, SAC, TD3 or DDPG .zip; a relative "
                                  "path is read from the working directory (docs/own-policy.md)")
    file = schema_node("environment.files")["additionalProperties"]["properties"]
    p.add_argument("--arch", default=file["architecture"]["default"],
                   help='its architecture: a network spec as JSON ({"arch": "mlp", "in": 4, "hidden": [64, 64], '
                        '"out": 2}; nature_cnn, dueling_cnn) or mlp, sizes read from the weights')
    p.add_argument("--profile", help="the preprocessing profile it was trained with (crop/envs PROFILES; "
                                     "default: the environment's)")
    p.add_argument("--format", default=file["format"]["default"], choices=file["format"]["enum"],
                   help="file format (auto: an SB3 zip by its policy.pth, CleanRL by .cleanrl_model)")
    p.add_argument("--file-sha256", help="refuse the file unless it has this sha256")


_METAVARS = {"frames_window": ("START", "END"), "reward_range": ("LOW", "HIGH"), "return_range": ("LOW", "HIGH")}


def stage_args(p, row: StageRow) -> None:
    """A stage's options from its row of the stage table: the common ones, its settings (no default here: a
    flag not given takes the --settings block's value, else the schema's default), its outputs."""
    common_args(p)
    if row.v_range:
        p.add_argument("--target", choices=(*TARGET_NAMES, AUTO_TARGET),
                       help=schema_help(schema_node("environment.target")))
        p.add_argument("--qrange", help="qrange.json of the same env/algo/sigma (the targets q and auto)")
    p.add_argument("--settings", help="the stage's settings block as JSON (option: value; what the workflow "
                                      "passes, crop.workflow.stage_table.stage_settings); flags given as "
                                      "well take precedence")
    for option, (key, node) in row.options.items():
        default = f" (default: {node['default']})" if node.get("default") is not None else ""
        _flag(p, option, node, default=argparse.SUPPRESS, metavar=_METAVARS.get(option),
              help=f"{schema_help(node)}{default} [config: {key.lstrip('/')}]".lstrip())
    for out in row.outputs:
        p.add_argument("--" + out.option.replace("_", "-"), required=out.required, help=out.help)
    for flag in row.flags:
        kind = {"choices": flag.node["enum"]} if "enum" in flag.node else {"type": schema_type(flag.node)}
        p.add_argument("--" + flag.option.replace("_", "-"), **kind, help=flag.help)


_INPUTS_HELP = "the run files themselves (instead of RESULTS)"
_CALIBRATION_HELP = "calibration file (default: $XDG_CACHE_HOME/crop/calibration.json)"


def aggregate_args(agg) -> None:
    agg.add_argument("results", nargs="?", help="results folder (every complete run in it, or --runs)")
    agg.add_argument("--results", dest="results_opt", help=argparse.SUPPRESS)
    agg.add_argument("--runs", nargs="+", help="only these ENV/ALGO/sigma-S folders under RESULTS")
    eps_node = schema_node("report.table_eps_factors")
    agg.add_argument("--table-eps-factors", type=schema_type(eps_node["items"]), nargs="+",
                     default=list(eps_node["default"]), help=schema_help(eps_node))
    agg.add_argument("--figures", help="figures folder (default: RESULTS/figures)")
    agg.add_argument("--tables", help="tables folder (default: RESULTS/tables)")
    agg.add_argument("--inputs", nargs="+", help=_INPUTS_HELP)


def audit_args(aud) -> None:
    from crop.workflow.audit_sizes import BUDGET_MINUTES, TIMEOUT_EXTRA_S, TIMEOUT_FACTOR

    aud.add_argument("results", nargs="?", help="results folder (every run folder in it is audited)")
    aud.add_argument("--out-dir", help="where audit.md and audit.json go (default: RESULTS/audit)")
    aud.add_argument("--runs", nargs="*", help="only these ENV/ALGO/sigma-S folders")
    aud.add_argument("--inputs", nargs="+", help=_INPUTS_HELP)
    audit_node = schema_node("audit")["properties"]
    _flag(aud, "alpha", audit_node["alpha"])
    aud.add_argument("--reference", help=schema_help(audit_node["reference"]))
    aud.add_argument("--tolerances", help=schema_help(audit_node["tolerances"]))
    for name in ("abs", "rel"):
        aud.add_argument(f"--{name}-tol", type=schema_type({"minimum": 0}),
                         help=f"{'absolute' if name == 'abs' else 'relative'} tolerance for every metric (overrides)")
    aud.add_argument("--config-hash", help="hash of the workflow config the results came from (the workflow "
                                           "passes it)")
    aud.add_argument("--config", help="workflow config file: validated and hashed (instead of --config-hash)")
    aud.add_argument("--strict", action="store_true", help=schema_help(audit_node["strict"]))
    aud.add_argument("--rerun", type=schema_type({"type": "integer", "minimum": 0}), default=0, metavar="K",
                     help="re-run K stage jobs drawn at random from their recorded provenance and compare (CPU: "
                          "byte-identical; a differing job makes the verdict FAIL; docs/audit.md)")
    aud.add_argument("--seed", type=schema_type({"type": "integer", "minimum": 0}), default=0,
                     help="seed of the draw of --rerun's jobs")
    aud.add_argument("--rerun-budget", type=schema_type({"type": "number", "exclusiveMinimum": 0}),
                     metavar="MINUTES", help="minutes a --rerun job may be predicted to take (crop plan's cost model "
                                             f"on this machine's CPU; default: {BUDGET_MINUTES:g}): a job predicted "
                                             f"longer is not started, and a started one is ended past "
                                             f"{TIMEOUT_FACTOR:g}x its prediction + {TIMEOUT_EXTRA_S / 60:g} "
                                             "minutes (not re-run: WARN)")
    trust_env_arg(aud, "an environment id whose module:Id form may import its module (ids read from the results "
                        "folder or a reference never import anything; --config trusts its ids that set "
                        "import_module: true)")
    aud.add_argument("--report-only", action="store_true",
                     help="exit 0 whatever the verdict (bad input still exits 2): the workflow's audit job, whose "
                          "closing summary states the verdict")


def trust_env_arg(p, text: str) -> None:
    """--trust-env ID (repeatable): the command line is the user's own, so an id named there may import."""
    p.add_argument("--trust-env", action="append", default=[], metavar="ID", help=text)


def plan_args(pl) -> None:
    import os

    pl.add_argument("--configfile", required=True, help="the workflow config file (YAML)")
    pl.add_argument("--cores", type=schema_type(POS_INT), default=os.cpu_count(), help="CPU cores per machine")
    pl.add_argument("--gpus", type=schema_type({"type": "integer", "minimum": 0}),
                    help="GPUs per machine (default: 1 when any environment's device, else the "
                         "config's, is not cpu; else 0)")
    pl.add_argument("--nodes", type=schema_type(POS_INT), default=1, help="machines")
    pl.add_argument("--json", action="store_true", help="the plan as JSON: jobs, total, makespan_hours")
    pl.add_argument("--calibration", default=None, help=_CALIBRATION_HELP)


def calibrate_args(cal) -> None:
    cal.add_argument("--out", default=None, help=_CALIBRATION_HELP)
    cal.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="what to measure on")
    cal.add_argument("--env", nargs="+", help="environments (default: the paper's four)")


def _as_parsed(node: dict, value):
    """A --settings value as its flag's type gives it (a number node's 1 as 1.0)."""
    if "enum" in node or _types(node) == ["boolean"]:
        return value
    if "array" in _types(node):
        return [_as_parsed(node["items"], v) for v in value]
    return int(value) if "integer" in _types(node) else float(value)


def checked_settings(row: StageRow, values: dict) -> dict:
    """A stage's --settings values (``{option: value}``, none null), checked as their flags' would be, in one
    pass of the jsonschema validator over the block; InputError naming the first bad one (in the row's
    order).  Returns them as their flags' types give them."""
    from crop.schema import node_errors

    options = row.options
    errors = node_errors({"type": "object", "properties": {o: _as_flag(options[o][1]) for o in values}}, values)
    for option in (o for o in options if o in values):
        why = _refusal(options[option][1], values[option], values[option],
                       [e for e in errors if list(e.absolute_path)[:1] == [option]], depth=1)
        if why:
            raise InputError(f"--settings: {option}: {why}")
    return {o: _as_parsed(options[o][1], v) for o, v in values.items()}
