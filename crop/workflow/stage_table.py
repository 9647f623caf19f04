"""The workflow's per-run stages, one row each: everything about a stage — what it writes, whether it reads the
V range, the config settings it takes, its ``crop`` subcommand's help, its extra flags,
what its jobs cost and ask of a cluster (its cost, memory and device functions), whether it is replicated, what the
report's captions quote of its settings.

Every other statement of these facts is derived from this table: the per-run rules' command lines, threads and
resources (``rules/common.smk``; the rules themselves, one per row and a replicate rule where the row says so, are
written out in ``rules/certify.smk`` and ``rules/attacks.smk`` with their files, which tests/test_rules.py checks
against this table), the file names of :mod:`crop.workflow.layout`, the ``crop`` subcommands with their ``--out*``
flags and settings (:mod:`crop.workflow.cli`), :class:`crop.handlers.stages.StageRun`, the stages a run folder may hold
(:mod:`crop.report.integrity`), the jobs of the cost model (:mod:`crop.workflow.cost`), the report's captions
(:mod:`crop.report.captions`) and the rules/flags table of
docs/layout.md (:func:`layout_table`).  Adding a per-run stage is its row (:func:`add_stage`), its rule, its handler
(the function of :data:`crop.__main__.HANDLERS` its subcommand runs), its cost function and its algorithm
module (and, for a stage on one thread, its rule in the SLURM profile's ``groups``, where the plan prices it as
grouped: :func:`crop.workflow.cost.stage_group`).  No torch and no environments: the Snakefile and ``crop
--help`` import it (a row names its cost, memory and device functions as ``module:function``, imported when a
job is priced).

A stage's settings are ``option: config key``, where ``/key`` is a top-level key and ``block.key`` a key of
an environment's block; the option's type, bounds, default and help are the config schema's node of that key
(``crop/schemas/config.schema.yaml``).  A key of another stage's block is a borrowing, stated here and nowhere
else: the local attack attacks the smoothed policy LoAct certifies (``loact.m`` noise samples) over LoRe's tree
(``lore.horizon``, ``lore.gamma``), so its returns compare with LoRe's bound; the global attack plays GRe's
trajectories (``gre.horizon``, ``gre.gamma``).  The ``rewards`` block (an environment's reward facts) has no
default: its keys are left out of ``--settings`` when the config has no such block.  A stage with settings of
its own brings their block (``block``: its name and schema node), which joins the environment blocks of the
schema a config is validated against (:func:`config_schema`; the loaded schema itself is never changed).
"""
from __future__ import annotations

import functools
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from crop.io import META_SUFFIX, meta_name
from crop.names import ALPHA_MODES, BOUND_NAMES
from crop.schema import parsed_schema, schema_node

__all__ = ["Output", "Flag", "StageRow", "STAGES", "stage", "add_stage", "RUN_FILES", "META_SUFFIX", "meta_name",
           "stage_options", "stage_settings", "config_schema", "caption", "layout_table",
           "with_layout_table"]


@dataclass(frozen=True)
class Output:
    """One file a stage writes into its run folder."""

    key: str                # its name in :data:`RUN_FILES` and in the rule's output block
    file: str               # its file name in the run folder
    option: str             # the ``crop`` flag that names it (``out`` → ``--out``)
    help: str
    required: bool = True   # the subcommand refuses to run without the flag
    meta: bool = True       # a provenance file beside it (a JSON result carries its provenance inside)


@dataclass(frozen=True)
class Flag:
    """A flag of a stage's subcommand that is no config setting: a user may give it; the rule passes it only
    where a run needs it (qrange's pilot flags, for ``target: auto``)."""

    option: str             # ``checkpoint_every`` → ``--checkpoint-every``
    node: dict              # its type and bounds, as a schema node
    help: str


@dataclass(frozen=True, eq=False)
class StageRow:
    """One stage: the ``crop`` subcommand of one rule, run once per (env, algo, σ, target) run folder."""

    command: str                    # the subcommand ("attack-local"); its rule is :attr:`rule`
    title: str                      # what it computes, with the paper's result (the rule's heading)
    help: str                       # ``crop --help``'s line
    description: str                # ``crop COMMAND --help``'s paragraph
    outputs: tuple[Output, ...]     # the first is the stage's main result
    settings: dict[str, str]        # ``{option: config key}`` (the module docstring)
    v_range: bool                   # the q target reads its run's qrange.json (and the stage takes --target)
    replicate: bool                 # repeated in each replicate folder (config ``replicates``)
    cost: str | Callable            # ``module:function`` (cfg, job, units) -> (seconds, note): its work priced
    #                                 from the unit costs (crop/workflow/stage_costs.py); cost.py adds the rest
    memory: int | str | Callable    # MB of a job, or ``module:function`` (cfg, job, units) -> MB
    device: str | Callable          # ``module:function`` (cfg, env) -> its jobs' ``--device``; a GPU where not "cpu"
    reads: str | Callable | None = None   # ``module:function`` (cfg, job) -> the file its price reads, or None
    block: tuple[str, dict] | None = None  # (name, schema node) of an environment block of its own settings
    flags: tuple[Flag, ...] = field(default=())
    caption: str | None = None      # what the report's captions quote of its settings (:func:`caption`)
    discrete: str | None = None     # why it needs a finite set of actions: a continuous-action agent's runs
    #                                 (target action, crop.workflow.layout.run_stages) do not have it
    parallel: bool = False          # its job spreads its work over the config's ``threads`` (worker processes)
    #                                 and asks for them; any other stage's job runs on one thread and asks for one
    saves: bool = False             # its job saves its finished work as it goes and on SIGTERM (GRe's blocks)

    def __post_init__(self):
        for name in ("cost", "memory", "device"):
            value = getattr(self, name)
            if not (callable(value) or isinstance(value, str) and _is_function(value)
                    or name == "memory" and isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"stage {self.command}: {name} = {value!r} names no {_WANT[name]}")

    @property
    def rule(self) -> str:
        return self.command.replace("-", "_")

    @property
    def resumable(self) -> bool:
        """Whether its job saves its state (as it goes, or every ``--checkpoint-every`` seconds, and on SIGTERM)
        and a rerun resumes from it: a job stopped at its time limit loses nothing but the wait for its retry."""
        return self.saves or any(f.option == "checkpoint_every" for f in self.flags)

    @property
    def files(self) -> dict[str, str]:
        """``{key: file name}`` of its outputs."""
        return {o.key: o.file for o in self.outputs}

    @property
    def options(self) -> dict[str, tuple[str, dict]]:
        """``{option: (config key, schema node)}`` of its settings (:func:`stage_options`)."""
        return stage_options(self.command)


_WANT = {"cost": "cost function (module:function: a job's seconds from the unit costs)",
         "memory": "memory (MB > 0, or module:function: a job's MB)",
         "device": "device function (module:function: its jobs' --device)"}


def _is_function(spec: str) -> bool:
    """Whether ``spec`` reads ``module:function`` (both dotted names)."""
    module, _, name = spec.partition(":")
    return all(part.isidentifier() for part in [*module.split("."), name])


def _out(key: str, file: str, help: str, option: str = "out", required: bool = True) -> Output:
    return Output(key, file, option, help, required, meta=not file.endswith(".json"))


def _cost(name: str) -> str:
    return f"crop.workflow.stage_costs:{name}"


_POS_INT = {"type": "integer", "minimum": 1}
_ENV_DEVICE = _cost("env_device")

#: The qrange stage's flags of ``target: auto`` (crop/certify/pilot.py): the pilot predicts LoAct's radius at
#: LoAct's own sizes; the rules pass them for an auto run only (a run of a fixed target has none).
_PILOT_FLAGS = (
    Flag("target", {"enum": ["auto"]}, "auto: after the V range, choose the run's smoothing target by a pilot "
                                      "on this stage's states and noise (config: target auto)"),
    Flag("loact_m", _POS_INT, "LoAct's m, the samples per state the pilot predicts radii for (--target auto)"),
    Flag("loact_horizon", _POS_INT, "LoAct's horizon H, for its per-state alpha (--target auto)"),
    Flag("alpha", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, "LoAct's alpha (--target auto)"),
    Flag("alpha_mode", {"enum": list(ALPHA_MODES)}, "LoAct's alpha_mode (--target auto)"),
    Flag("bound", {"enum": list(BOUND_NAMES)}, "LoAct's confidence bound (--target auto)"),
)

#: The per-run stages in the order a run folder's files are listed.
STAGES: dict[str, StageRow] = {row.command: row for row in (
    StageRow(
        "qrange", "estimate V_min, V_max of the network under σ-noise (Appendix B.1)",
        "estimate V_min, V_max (Appendix B.1)",
        "Estimate the range [V_min, V_max] of the network's outputs under σ-noise by rolling the smoothed policy "
        "(Appendix B.1); the certifiers clip to it.",
        (_out("qrange", "qrange.json", "qrange.json: the V range [V_min, V_max]"),),
        {"m": "qrange.m", "episodes": "qrange.episodes", "horizon": "qrange.horizon", "method": "qrange.method",
         "quantile": "qrange.quantile"},
        v_range=False, replicate=True, cost=_cost("qrange_seconds"), memory=_cost("rollout_memory"),
        device=_ENV_DEVICE, flags=_PILOT_FLAGS,
        discrete="the V range bounds Q-values over a finite set of actions"),
    StageRow(
        "loact", "LoAct: certified radius of every step of clean episodes (Algorithm 1, Theorem 1)",
        "LoAct: per-state certified radii (Algorithm 1)",
        "LoAct (Algorithm 1, Theorem 1): the certified radius of the smoothed policy's action at every step of "
        "clean episodes, the benign returns and the certified ratio. For a continuous-action agent: per step and "
        "action dimension, the certified interval of its median-smoothed action (Chiang et al. 2020) and the "
        "largest ε keeping it within --action-tolerance.",
        (_out("loact", "loact.csv", "loact.csv: the certified radius of every step"),
         _out("loact_episodes", "loact_episodes.csv", "loact_episodes.csv: per-episode benign returns (optional)",
              "out_episodes", False),
         _out("certified_ratio", "certified_ratio.csv", "certified_ratio.csv: certified ratio per radius (optional)",
              "out_ratio", False),
         _out("frames", "frames.npz", "frames.npz: raw game frames of episode 0 (Atari; optional)", "out_frames",
              False)),
        {"m": "loact.m", "episodes": "loact.episodes", "horizon": "loact.horizon", "frames_window": "loact.frames",
         "alpha": "/alpha", "bound": "/bound", "alpha_mode": "/alpha_mode",
         "action_tolerance": "loact.action_tolerance", "reward_range": "rewards.range",
         "clip_rewards": "rewards.clip"},
        v_range=True, replicate=True, cost=_cost("loact_seconds"), memory=_cost("rollout_memory"),
        device=_ENV_DEVICE,
        caption="m = {m} noise samples per state, {episodes} clean episodes of at most {horizon} steps"),
    StageRow(
        "gre", "GRe: expectation and percentile bounds from m σ-randomized trajectories (Algorithm 2)",
        "GRe: expectation and percentile bounds (Algorithm 2)",
        "GRe (Algorithm 2, Theorems 2-3): lower bounds of the expected return and of its percentiles under any ℓ2 "
        "attack of budget ε, from m σ-randomized trajectories; resumable (its finished blocks of trajectories).",
        (_out("gre", "gre.csv", "gre.csv: the expectation and percentile bounds per ε"),
         _out("gre_returns", "gre_returns.csv", "gre_returns.csv: the m randomized returns", "out_returns")),
        {"m": "gre.m", "horizon": "gre.horizon", "gamma": "gre.gamma", "percentiles": "gre.percentiles",
         "eps_factors": "gre.eps_factors", "batch": "gre.batch", "alpha": "/alpha", "reward_range": "rewards.range",
         "return_range": "rewards.return_range", "clip_rewards": "rewards.clip"},
        v_range=False, replicate=False, cost=_cost("gre_seconds"), memory=_cost("gre_memory"),
        device=_cost("cpu_device"),
        flags=(Flag("workers", _POS_INT, "processes stepping the environments (default: --threads)"),), parallel=True,
        saves=True,
        caption="m = {m} randomized trajectories of H = {horizon} steps, γ = {gamma}, ε/σ ∈ {{{eps_factors:eps}}}"),
    StageRow(
        "lore", "LoRe: absolute lower bound of the return by adaptive tree search (Algorithm 3, Theorem 4)",
        "LoRe: adaptive search for the absolute reward bound (Algorithm 3)",
        "LoRe (Algorithm 3, Theorem 4): the smallest return of the smoothed policy under any ℓ2 attack of budget "
        "ε, by an adaptive search over the tree of actions the attack can force; resumable.",
        (_out("lore", "lore.csv", "lore.csv: the bound at every critical radius"),
         _out("lore_states", "lore_states.csv", "lore_states.csv: the certificate of every state LoRe smoothed "
              "(optional)", "out_states", False)),
        {"m": "lore.m", "horizon": "lore.horizon", "gamma": "lore.gamma", "eps_max_factor": "lore.eps_max_factor",
         "alpha": "/alpha", "bound": "/bound", "alpha_mode": "lore.alpha_mode", "reward_range": "rewards.range",
         "max_nodes": "lore.max_nodes", "order": "lore.order", "report_double": "lore.report_double"},
        v_range=True, replicate=False, cost=_cost("lore_seconds"), memory=_cost("lore_memory"),
        device=_ENV_DEVICE, reads=_cost("lore_reads"),
        flags=(Flag("checkpoint_every", {"exclusiveMinimum": 0},
                    "seconds between saves of the resumable search state (OUT.resume; default: LoRe's)"),),
        caption="m = {m} noise samples per state, horizon H = {horizon}, γ = {gamma}",
        discrete="LoRe searches a tree that branches over a finite set of actions"),
    StageRow(
        "attack-local", "ℓ2 PGD at every step against the smoothed policy (LoAct/LoRe tightness, §5)",
        "PGD against the locally smoothed policy",
        "ℓ2 PGD at every step against the smoothed policy (LoAct/LoRe's), over LoRe's horizon: how tight the "
        "certified radii and LoRe's bound are.",
        (_out("attack_local", "attack_local.csv", "attack_local.csv: returns under PGD per ε"),
         _out("attack_local_steps", "attack_local_steps.csv", "attack_local_steps.csv: every attacked step's clean "
              "certificate and action (optional)", "out_steps", False)),
        {"m": "loact.m", "horizon": "lore.horizon", "gamma": "lore.gamma", "episodes": "attack.local_episodes",
         "m_grad": "attack.local_m_grad", "pgd_steps": "attack.pgd_steps", "eps_factors": "attack.local_eps_factors",
         "alpha": "/alpha", "bound": "/bound", "alpha_mode": "/alpha_mode"},
        v_range=True, replicate=False, cost=_cost("attack_local_seconds"), memory=_cost("attack_local_memory"),
        device=_ENV_DEVICE,
        caption="local (from LoRe's initial state and others): {episodes} episodes, ε/σ ∈ {{{eps_factors:eps}}}",
        discrete="the local attack targets LoAct's smoothed argmax over a finite set of actions"),
    StageRow(
        "attack-global", "ℓ2 PGD at every step against the σ-randomized policy (GRe tightness, §5)",
        "PGD against the σ-randomized policy",
        "ℓ2 PGD at every step against the σ-randomized policy (expectation over transformation): how tight GRe's "
        "bounds are.",
        (_out("attack_global", "attack_global.csv", "attack_global.csv: returns under PGD per ε"),),
        {"horizon": "gre.horizon", "gamma": "gre.gamma", "episodes": "attack.global_episodes",
         "n_eot": "attack.global_n_eot", "pgd_steps": "attack.pgd_steps", "eps_factors": "attack.global_eps_factors",
         "reward_range": "rewards.range", "clip_rewards": "rewards.clip"},
        v_range=False, replicate=False, cost=_cost("attack_global_seconds"), memory=_cost("attack_global_memory"),
        device=_ENV_DEVICE,
        caption="{pgd_steps}-step ℓ2 PGD; global: {episodes} episodes, ε/σ ∈ {{{eps_factors:eps}}}"),
)}

#: ``{key: file name}`` of every file a complete run folder holds.
RUN_FILES: dict[str, str] = {k: f for row in STAGES.values() for k, f in row.files.items()}


#: The environment blocks of the stages :func:`add_stage` added (``{name: schema node}``): kept here, beside the
#: table, and merged into a copy of the loaded schema by :func:`config_schema`, never into the loaded schema.
_BLOCKS: dict[str, dict] = {}


def config_schema() -> dict:
    """The schema a config is validated against: the loaded one (:func:`crop.schema.parsed_schema`), with the
    added stages' blocks among an environment's where there are any — then a copy along the path to them, so
    the loaded schema is never changed.  Read it, never change it."""
    loaded = parsed_schema()
    if not _BLOCKS:
        return loaded
    env = loaded["$defs"]["environment"]
    return {**loaded, "$defs": {**loaded["$defs"], "environment": {**env, "properties": {**env["properties"],
                                                                                          **_BLOCKS}}}}


def add_stage(row: StageRow) -> None:
    """Add a per-run stage after the others: its subcommand, its files, its rule's command line and its jobs'
    price follow from the row, and its ``block`` (settings of its own) joins the environment blocks of the
    schema configs are validated against (:func:`config_schema`); its rule is written like those of
    ``rules/certify.smk``.  Call it before the Snakefile is read and before :mod:`crop.workflow.layout` or the
    report is imported (they keep what they derive from the table); refuses then, and refuses a name, a file or
    a block another stage has."""
    import sys

    early = [m for m in ("crop.workflow.layout", "crop.report.integrity") if m in sys.modules]
    if early:
        raise RuntimeError(f"stage {row.command}: add it before importing {', '.join(early)}")
    clash = ({row.command} & set(STAGES)) | (set(row.files) & set(RUN_FILES)) | \
        (set(row.files.values()) & set(RUN_FILES.values()))
    if clash:
        raise ValueError(f"stage {row.command}: {sorted(clash)} already in the stage table")
    if row.block:
        if row.block[0] in config_schema()["$defs"]["environment"]["properties"]:
            raise ValueError(f"stage {row.command}: environment block {row.block[0]!r} already in the config schema")
        _BLOCKS[row.block[0]] = row.block[1]
    STAGES[row.command] = row
    RUN_FILES.update(row.files)


def stage(name: str) -> StageRow:
    """The row of a subcommand ("attack-local") or of its rule ("attack_local")."""
    return STAGES[name.replace("_", "-")]


# ----------------------------------------------------------------------------------- settings (the schema's)

@functools.cache
def _options(command: str, keys: tuple[tuple[str, str], ...]) -> dict[str, tuple[str, dict]]:
    schema = config_schema()
    return {option: (key, schema_node(key[1:] if key.startswith("/") else f"environment.{key}", schema))
            for option, key in keys}


def stage_options(command: str) -> dict[str, tuple[str, dict]]:
    """``{option: (config key, schema node)}`` of a stage, from its row's settings and the schema, read once:
    what ``crop COMMAND`` takes, its type, bounds, default and description.  Callers must not change the
    nodes."""
    return _options(command, tuple(STAGES[command].settings.items()))


def stage_settings(cfg: dict, env: str, command: str) -> dict:
    """The settings of one stage for one environment of a validated config, keyed by the stage's options (what
    a rule passes as ``--settings``)."""
    out = {}
    for option, key in STAGES[command].settings.items():
        if key.startswith("/"):
            out[option] = cfg[key[1:]]
        else:
            block, name = key.split(".")
            if block not in cfg["environments"][env]:  # a block without default (rewards) left out
                continue
            out[option] = cfg["environments"][env][block].get(name)
    return out


class _CaptionFormatter(string.Formatter):
    """``{option}`` as ``str`` would print it; ``{option:eps}``: a list of budgets as ``0, 0.5, 1``."""

    def format_field(self, value, spec):
        if spec == "eps":
            return ", ".join(f"{x:g}" for x in value)
        return super().format_field(value, spec)


def caption(command: str, settings: dict) -> str:
    """A stage's caption (its row's template) with the settings it ran with (:func:`stage_settings`)."""
    return _CaptionFormatter().format(STAGES[command].caption, **settings)


# ------------------------------------------------------------------------------------- docs/layout.md's table

#: The lines around the generated table in docs/layout.md.
TABLE_BEGIN = ("<!-- the stage table (crop/workflow/stage_table.py); regenerate: "
               "python -m crop.workflow.stage_table docs/layout.md -->")
TABLE_END = "<!-- end of the stage table -->"


def layout_table() -> str:
    """The rules/flags table of docs/layout.md, one line per row: its rule(s), what it computes, subcommand,
    files, inputs, settings (flag: config key), the flags a user may add, its memory and device functions."""
    def code(xs):
        return ", ".join(f"`{x}`" for x in xs) or "—"

    lines = ["| rule | what it computes | `crop` subcommand | writes (flag: file) | reads | "
             "settings (flag: config key) | flags the rule leaves out | a job's memory, device | priced by |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in STAGES.values():
        rules = [row.rule, *([f"{row.rule}_replicate"] if row.replicate else [])]
        writes = [f"--{o.option.replace('_', '-')}: {o.file}" + ("" if o.required else " (optional)")
                  for o in row.outputs]
        reads = ["--checkpoint", *(["--target", "--qrange: qrange.json (q target)"] if row.v_range else [])]
        settings = [f"--{o.replace('_', '-')}: {k.lstrip('/')}" for o, k in row.settings.items()]
        flags = [f"--{f.option.replace('_', '-')}" for f in row.flags]
        memory = f"{row.memory} MB" if isinstance(row.memory, int) else f"`{_name(row.memory)}`"
        lines.append(f"| {code(rules)} | {row.title} | `crop {row.command}` | {code(writes)} | "
                     f"{code(reads)} | {code(settings)} | {code(flags)} | {memory}, "
                     f"`{_name(row.device)}` | `{_name(row.cost)}` |")
    return "\n".join([TABLE_BEGIN, *lines, TABLE_END])


def _name(function) -> str:
    """A row's function as ``module:function``."""
    return function if isinstance(function, str) else f"{function.__module__}:{function.__qualname__}"


def with_layout_table(text: str) -> str:
    """``text`` (docs/layout.md) with its generated table replaced by :func:`layout_table`'s."""
    head, rest = text.split(TABLE_BEGIN, 1)
    return head + layout_table() + rest.split(TABLE_END, 1)[1]


if __name__ == "__main__":
    import sys
    from pathlib import Path

    doc = Path(sys.argv[1])
    doc.write_text(with_layout_table(doc.read_text()))
