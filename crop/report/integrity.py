"""Integrity of result files: each must still have the sha256 recorded in its ``.meta.json`` when it was
written, so a truncated or edited intermediate (half a ``loact.csv``) is caught before anything reads it.

A run folder may hold any subset of the workflow's *stages* (:data:`crop.workflow.stage_table.STAGES`): a LoAct-only
or a GRe-only run is a partial run, audited for what it has.  A stage with some of its files but not all is
half-written — an integrity problem.  A replicate folder (config ``replicates``) is pooled with its run, so each
of its return stages must have run with the run's reward clip (``rewards.clip``): one that did not is a problem
too, never pooled silently."""
from __future__ import annotations

from pathlib import Path

from crop.io import meta_path, read_json, sha256_file
from crop.report.clips import clip_text, reward_clips
from crop.workflow.layout import RUN_FILES
from crop.workflow.stage_table import STAGES

__all__ = ["check_integrity", "IntegrityError", "STAGE_FILES", "stages_present", "replicate_clip_problems"]

# The files each stage writes, by the stage's rule name (the stage table).
STAGE_FILES = {row.rule: tuple(row.files) for row in STAGES.values()}
# The workflow rule (rules/*.smk) that writes each run file, and whether a provenance file sits beside it (a
# JSON result carries its provenance inside).
_RULE = {key: row.rule for row in STAGES.values() for key in row.files}
_META = {o.key: o.meta for row in STAGES.values() for o in row.outputs}
_REPLICATED = {key: row.replicate for row in STAGES.values() for key in row.files}


class IntegrityError(ValueError):
    pass


def stages_present(run_dir: Path) -> tuple[list[str], list[str], list[dict]]:
    """(stages with every file, stages with none, problems of stages with some files but not all), among the
    stages of the run's smoothing target (a probs or vote run has no qrange stage)."""
    from crop.workflow.layout import run_files, run_target

    full, absent, problems = [], [], []
    own = set(run_files(run_target(run_dir)))
    for stage, keys in STAGE_FILES.items():
        if not set(keys) <= own:
            continue
        there = [(RUN_FILES[k], (Path(run_dir) / RUN_FILES[k]).is_file()) for k in keys]
        if all(ok for _, ok in there):
            full.append(stage)
        elif not any(ok for _, ok in there):
            absent.append(stage)
        else:
            missing = ", ".join(f for f, ok in there if not ok)
            problems.append({"file": str(Path(run_dir)),
                             "problem": f"incomplete run: stage {stage} lacks {missing} (half-written stage)"})
    return full, absent, problems


def check_integrity(run_dir: Path, only_present: bool = False) -> list[dict]:
    """Records the report cannot read (:func:`crop.report.records.run_record_problems`: then nothing else is
    checked), files whose content no longer matches the hash recorded when they were written, and (a replicate
    folder) return stages that ran with another reward clip than the run's (:func:`replicate_clip_problems`);
    with ``only_present``, the files of a partial run's stages only (absent stages are not problems)."""
    from crop.report.records import run_record_problems
    from crop.workflow.layout import absent_skippable, run_files, run_target

    problems = run_record_problems(run_dir)
    if problems:   # what follows reads those records
        return problems
    # a probs/vote run has no qrange.json; a stage the run went without (its config's skip) nothing
    for key, name in run_files(run_target(run_dir), absent_skippable(run_dir)).items():
        f = run_dir / name
        if not f.is_file():
            if not only_present:
                problems.append({"file": str(f), "problem": "missing"})
            continue
        if not _META[key]:
            try:
                read_json(f)
            except ValueError as exc:
                rule = _RULE[key]
                problems.append({"file": str(f), "problem": f"unreadable JSON: {exc}; delete it and rerun the "
                                                             f"workflow (or `snakemake --forcerun {rule}`)"})
            continue
        m = meta_path(f)
        if not m.is_file():
            problems.append({"file": str(f), "problem": "no provenance file"})
            continue
        rec = read_json(m).get("output") or {}
        if rec.get("sha256") != sha256_file(f):
            # Snakemake will not recompute a file that exists and is newer than its inputs: say how.
            rule = _RULE[key]
            problems.append({"file": str(f), "problem": "sha256 differs from the one recorded at write time "
                                                         "(truncated or modified); delete it and rerun the workflow "
                                                         f"(or `snakemake --forcerun {rule}`) to recompute it"})
    return problems + _inputs_changed(Path(run_dir)) + replicate_clip_problems(Path(run_dir))


def replicate_clip_problems(run_dir: Path) -> list[dict]:
    """For a replicate folder ``ENV/ALGO/sigma-S/rep-K``: each return stage whose recorded reward clip
    (``reward_clip`` in its meta, none for the environment's own rewards) is not its run's for that stage (or,
    where the run lacks the stage, the one clip its other return stages share).  The tables, intervals and the
    reference comparison pool a replicate's returns with the run's; returns of different rewards must not be
    averaged into one value.  [] for a run folder itself."""
    from crop.workflow.layout import base_run, replicate_of

    if not replicate_of(run_dir):
        return []
    run = Path(base_run(run_dir))
    theirs = reward_clips(run)
    shared = set(theirs.values())
    problems = []
    for stage, clip in reward_clips(run_dir).items():
        if stage in theirs:
            expected = theirs[stage]
        elif len(shared) == 1:
            expected = next(iter(shared))
        else:   # the run has no return stage (nothing to pool with), or disagrees with itself (refused apart)
            continue
        if clip != expected:
            rule = _RULE[stage] + ("_replicate" if _REPLICATED[stage] else "")
            problems.append({"file": str(meta_path(run_dir / RUN_FILES[stage])),
                             "problem": f"replicate stage {stage} ran with {_clip_words(clip)}, its run {run} "
                                        f"with {_clip_words(expected)} (reward_clip; config rewards.clip): returns "
                                        "of different rewards are not pooled; rerun the replicate with the run's "
                                        f"rewards.clip (`snakemake --forcerun {rule}`)"})
    return problems


def _inputs_changed(run_dir: Path) -> list[dict]:
    """A JSON result that carries its provenance inside (qrange.json) has no hash of its own, but every stage
    that read it recorded its sha256: one that no longer matches was edited after use."""
    problems = []
    for key, name in RUN_FILES.items():
        f = run_dir / name
        if _META.get(key, True) or not f.is_file():
            continue
        sha = sha256_file(f)
        readers = sorted({read_json(m).get("stage") or m.name for m in run_dir.glob("*.meta.json")
                          if ((read_json(m).get("inputs") or {}).get(key) or {}).get("sha256") not in (None, sha)})
        if readers:
            problems.append({"file": str(f), "problem": f"sha256 differs from the one {', '.join(readers)} recorded "
                                                        "when it read the file (edited after use); rerun the workflow "
                                                        f"(or `snakemake --forcerun {_RULE[key]}`)"})
    return problems


def _clip_words(clip) -> str:
    return clip_text([clip]) or "the environment's own rewards (no clip)"
