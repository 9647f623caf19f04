"""The workflow's per-run stages, one row each: what a stage writes, whether it reads the V range, its memory on a
cluster and which config settings it takes.

Every other statement of these facts is derived from this table: the file names of :mod:`crop.layout`, the
rules' outputs, logs, inputs and command lines (``rules/common.smk``), the ``crop`` subcommands' ``--out*``
flags and settings (:mod:`crop.cli`), :class:`crop.stages.Stage`, and the stages a run folder may hold
(:mod:`crop.report.integrity`).  Renaming an output is one edit here.  No torch and no environments: the
Snakefile and ``crop --help`` import it.

A stage's settings are the schema's ``x-stages`` row (``crop/schemas/config.schema.yaml``): ``option: config
key``, where ``/key`` is a top-level key and ``block.key`` a key of an environment's block; the option's type,
bounds, default and help are the schema node of that key.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["Output", "StageRow", "STAGES", "stage", "RUN_FILES", "META_SUFFIX", "meta_name", "stage_options",
           "stage_settings"]

#: The provenance file beside every result: ``loact.csv`` → ``loact.meta.json`` (:func:`crop.io.meta_path`).
META_SUFFIX = ".meta.json"


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
class StageRow:
    """One stage: the ``crop`` subcommand of one rule, run once per (env, algo, σ) run folder."""

    command: str                    # the subcommand ("attack-local"); its rule is :attr:`rule`
    outputs: tuple[Output, ...]     # the first is the stage's main result
    v_range: bool                   # the q target reads its run's qrange.json (and the stage takes --target)
    replicate: bool                 # repeated in each replicate folder (config ``replicates``)
    mem_mb: int | None              # memory of a job; None: the environment's GRe block (EnvSpec.gre_mem_mb);
    #                                 its minutes come from the cost model (crop/cost.py)

    @property
    def rule(self) -> str:
        return self.command.replace("-", "_")

    @property
    def files(self) -> dict[str, str]:
        """``{key: file name}`` of its outputs."""
        return {o.key: o.file for o in self.outputs}

    @property
    def settings(self) -> dict[str, tuple[str, dict]]:
        """``{option: (config key, schema node)}`` (:func:`stage_options`)."""
        return stage_options(self.command)


def _out(key: str, file: str, help: str, option: str = "out", required: bool = True) -> Output:
    return Output(key, file, option, help, required, meta=not file.endswith(".json"))


#: The per-run stages in the order a run folder's files are listed.
STAGES: dict[str, StageRow] = {row.command: row for row in (
    StageRow("qrange", (_out("qrange", "qrange.json", "qrange.json: the V range [V_min, V_max]"),),
             v_range=False, replicate=True, mem_mb=1000),
    StageRow("loact", (
        _out("loact", "loact.csv", "loact.csv: the certified radius of every step"),
        _out("loact_episodes", "loact_episodes.csv", "loact_episodes.csv: per-episode benign returns (optional)",
             "out_episodes", False),
        _out("certified_ratio", "certified_ratio.csv", "certified_ratio.csv: certified ratio per radius (optional)",
             "out_ratio", False),
        _out("frames", "frames.npz", "frames.npz: raw game frames of episode 0 (Atari; optional)", "out_frames",
             False),
    ), v_range=True, replicate=True, mem_mb=1000),
    StageRow("gre", (
        _out("gre", "gre.csv", "gre.csv: the expectation and percentile bounds per ε"),
        _out("gre_returns", "gre_returns.csv", "gre_returns.csv: the m randomized returns", "out_returns"),
    ), v_range=False, replicate=False, mem_mb=None),
    StageRow("lore", (_out("lore", "lore.csv", "lore.csv: the bound at every critical radius"),
                      _out("lore_states", "lore_states.csv", "lore_states.csv: the certificate of every state "
                           "LoRe smoothed (optional)", "out_states", False)),
             v_range=True, replicate=False, mem_mb=1000),
    StageRow("attack-local", (_out("attack_local", "attack_local.csv", "attack_local.csv: returns under PGD per ε"),
                              _out("attack_local_steps", "attack_local_steps.csv", "attack_local_steps.csv: every "
                                   "attacked step's clean certificate and action (optional)", "out_steps", False)),
             v_range=True, replicate=False, mem_mb=1000),
    StageRow("attack-global", (_out("attack_global", "attack_global.csv",
                                    "attack_global.csv: returns under PGD per ε"),),
             v_range=False, replicate=False, mem_mb=1000),
)}

#: ``{key: file name}`` of every file a complete run folder holds.
RUN_FILES: dict[str, str] = {k: f for row in STAGES.values() for k, f in row.files.items()}


def stage(name: str) -> StageRow:
    """The row of a subcommand ("attack-local") or of its rule ("attack_local")."""
    return STAGES[name.replace("_", "-")]


def meta_name(file: str) -> str:
    """The provenance file's name beside a result file."""
    return file.rsplit(".", 1)[0] + META_SUFFIX


# ----------------------------------------------------------------------------------- settings (the schema's)

def _resolve(node: dict, schema: dict) -> dict:
    """A schema node with its ``$ref`` (to ``#/$defs/…``) merged in; the node's own keywords win."""
    if "$ref" not in node:
        return node
    target = schema
    for part in node["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    return {**_resolve(target, schema), **{k: v for k, v in node.items() if k != "$ref"}}


@functools.cache
def stage_options(command: str) -> dict[str, tuple[str, dict]]:
    """``{option: (config key, schema node)}`` of a stage, from the schema's ``x-stages`` row, read once: what
    ``crop COMMAND`` takes, its type, bounds, default and description.  Callers must not change the nodes."""
    from crop.config import schema

    s = schema()
    env_props = s["$defs"]["environment"]["properties"]
    out = {}
    for option, key in s["x-stages"][command].items():
        if key.startswith("/"):
            node = s["properties"][key[1:]]
        else:
            block, name = key.split(".")
            node = env_props[block]["properties"][name]
        out[option] = (key, _resolve(node, s))
    return out


def stage_settings(cfg: dict, env: str, command: str) -> dict:
    """The settings of one stage for one environment of a validated config, keyed by the stage's options (what
    a rule passes as ``--settings``)."""
    out = {}
    for option, (key, _) in stage_options(command).items():
        if key.startswith("/"):
            out[option] = cfg[key[1:]]
        else:
            block, name = key.split(".")
            if block not in cfg["environments"][env]:  # a block without default (rewards) left out
                continue
            out[option] = cfg["environments"][env][block].get(name)
    return out
