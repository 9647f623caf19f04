"""Audit of a results folder: integrity, soundness, provenance, and agreement with a reference — with
evidence for every verdict.  Writes ``audit.json`` (machine-readable) and ``audit.md`` (for people), and with a
reference also ``reproduction.md`` and one figure per environment (:mod:`crop.audit.reproduction`).

A run folder may hold any subset of the stages (a LoAct-only or GRe-only run): each check runs where its
files are there, and the reference comparison covers every value the run has.

Soundness checks, per (env, algo, σ, ε) (:mod:`crop.audit.checks` and the modules it names, one function each): a
bound rising with ε (deterministic), GRe's bounds against the global PGD returns, LoRe's bound against the local
PGD return from its initial state, LoAct's certified steps that a local attack flipped.  The last three are
chance-based: a certificate holds with probability ≥ 1 − α for the exact smoothed policy, so each records the
p-value of its observation under sound certificates, and a raw failure (``empirical_below``) is not by itself a
violation.

The checks' statuses, the multiple-testing procedure, the verdict (FAIL / WARN / PASS) and the exit status:
:mod:`crop.audit.verdict`; audit.md: :mod:`crop.audit.audit_md`.

Integrity: every file of a run is a regular file of the folder within its kind's size cap before anything
opens it (:func:`crop.report.records.received_file_problems`); every result file's sha256 must match the one
recorded in its ``.meta.json`` (a truncated or edited file is reported, not silently used); every stage must
have used the checkpoint recorded in ``model.json``, and ``model.pt`` must be there with that hash; every
recorded setting must be one the config schema allows; a stage with some but not all of its files, or a run
folder with no result at all, is an integrity problem; a partial run is not.
Provenance (:mod:`crop.audit.provenance`): per run the checkpoint sha256 and source, commits, package
versions, seeds, devices and runtimes, and the hash of the workflow config the audit ran under.
Reference (:mod:`crop.audit.reference`; ``"paper"`` for the paper's published numbers): each value gets a
verdict match / differs / missing (not in the run) / not_in_reference; a value agrees when the published one
lies in the reproduction's confidence interval (:mod:`crop.report.intervals`) widened by the metric's
tolerance.  Replicate folders (``ENV/ALGO/sigma-S/rep-K``) are audited for integrity and provenance and feed
the intervals.

audit.json keys: ``schema_version``, ``results``, ``runs``, ``alpha``, ``verdict``, ``reproduction``,
``statuses``, ``multiple_testing``, ``config_hash``, ``strict``, ``passed`` (verdict ≠ FAIL), ``checked``,
``violations``, ``suspicious``, ``untestable``, ``suspicious_list``, ``untestable_list``, ``empirical_below``,
``integrity_problems``, ``integrity``, ``expected_missing`` (with a config: the files its workflow writes that the
folder lacks), ``incomplete_runs``, ``partial_runs``, ``violation_list``, ``checks``, ``provenance``,
``warnings``, ``mismatches``, ``clipped_runs``, ``reference_missing``, ``reference`` (null, or ``file``, ``name``,
``sha256``, ``tolerances_file``, ``tolerances``, ``counts`` {match, differs, missing}, ``not_in_reference``,
``rows``, ``comparisons``), ``reproduction_report`` (null, or the files of the reproduction report).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crop.audit.audit_md import audit_markdown, plain_verdict, verdict_line
from crop.audit.checks import run_checks
from crop.audit.completeness import recorded_missing
from crop.audit.verdict import (
    STATUSES,
    classify,
    exit_status,
    poisson_binomial_sf,
    pooled_tests,
    tarone_holm,
    unit_level,
    verdict_of,
)
from crop.io import atomic_write_text, received_problem, write_json
from crop.report.clips import reward_clips
from crop.report.integrity import check_integrity, stages_present
from crop.report.metrics import load_runs, namespaced_env, parse_run
from crop.schema import default_of
from crop.workflow.layout import REPLICATE_PREFIX, absent_skippable, replicate_of, run_files, run_target

# The audit's public face: what `crop audit` and the summary call, with the verdict's pieces it decides by.
__all__ = ["audit", "AuditOptions", "discover_runs", "discover_run_folders", "classify", "tarone_holm",
           "pooled_tests", "unit_level", "poisson_binomial_sf", "verdict_of", "exit_status", "verdict_line",
           "plain_verdict", "STATUSES", "SCHEMA_VERSION"]

SCHEMA_VERSION = 8


def discover_runs(results: Path, incomplete: bool = False) -> list[str]:
    """``ENV/ALGO/sigma-S`` folders under ``results`` holding every result file (or, with ``incomplete``,
    those missing some); a skippable stage the folder holds nothing of is one its run went without."""
    return [r for r in discover_run_folders(results) if not replicate_of(r)
            and all((Path(results) / r / f).is_file()
                    for f in run_files(run_target(r), absent_skippable(Path(results) / r)).values()) != incomplete]


def discover_run_folders(results: Path) -> list[str]:
    """Every ``ENV/ALGO/sigma-S`` folder under ``results``, complete or partial (one level deeper for a
    namespaced ENV such as ALE/Breakout-v5), and every replicate folder ``ENV/ALGO/sigma-S/rep-K`` in them
    (config ``replicates``)."""
    results = Path(results)
    found = [d for d in results.glob("*/*/sigma-*") if d.is_dir()]
    found += [d for d in results.glob("*/*/*/sigma-*")
              if d.is_dir() and namespaced_env(*d.relative_to(results).parts[:2])]
    found += [r for d in found for r in d.glob(f"{REPLICATE_PREFIX}*") if r.is_dir()]
    return sorted(str(d.relative_to(results)) for d in found)


@dataclass(frozen=True)
class AuditOptions:
    """What an audit compares against and how (:func:`audit`).

    ``alpha``: the family-wise level of the soundness verdict (:mod:`crop.audit.verdict`).  ``reference``: a
    CSV, or ``"paper"``, for the reproduction report; ``tolerances``: a YAML/JSON tolerances file;
    ``abs_tol``/``rel_tol`` override both for every metric.  ``config_hash``: the hash of the workflow config the
    folder came from (None: a standalone audit, with a warning); ``strict``: recorded in audit.json (the exit
    status reads it).  ``trusted_envs``: the ids of the user's own config, whose ``module:Id`` form may import its
    module (ids read from the folder or the reference import nothing).  ``rerun``: re-run that many stage jobs
    drawn with ``rerun_seed`` and compare (:mod:`crop.audit.rerun`); a differing one FAILs; a job predicted over
    ``rerun_budget`` minutes (None: the module's default) is not started (``not_run``, at best WARN).
    ``config``: the workflow config the folder should come from (a path); the files its jobs write and the
    folder lacks are listed (``expected_missing``, WARN: :func:`crop.audit.completeness.config_missing`).
    ``skipped``: ``(run, stages)`` pairs, the stages (:data:`crop.workflow.layout.SKIPPABLE`) the config skips
    in that run (its ``skip``): absent, they are listed as not run by choice (``skipped_runs``), not as a
    partial run's absent stages, and no check or advice counts on them."""

    alpha: float = default_of("audit.alpha")
    reference: str | Path | None = None
    tolerances: str | Path | None = None
    abs_tol: float | None = None
    rel_tol: float | None = None
    config_hash: str | None = None
    strict: bool = default_of("audit.strict")
    trusted_envs: tuple[str, ...] = ()
    rerun: int = 0
    rerun_seed: int = 0
    rerun_budget: float | None = None
    config: str | Path | None = None
    skipped: tuple[tuple[str, tuple[str, ...]], ...] = ()


def audit(results: Path, out_dir: Path, options: AuditOptions = AuditOptions(), runs=None) -> dict:
    """Audit ``runs`` (default: every run folder under ``results``, complete or partial) under ``options``
    and write ``audit.{json,md}`` — and, with a reference, the reproduction report.

    Raises :class:`crop.audit.reference.ReferenceError` on a malformed reference or tolerances file, before
    writing anything."""
    from crop.envs import untrusted_env_ids

    with untrusted_env_ids(options.trusted_envs):
        return _audit(Path(results), Path(out_dir), runs, options)


def _audit(results: Path, out_dir: Path, runs, o: AuditOptions) -> dict:
    from crop.audit.reference import compare_reference, load_reference, load_tolerances, reference_summary

    ref = load_reference(o.reference) if o.reference is not None else None
    file_tol = load_tolerances(o.tolerances) if o.tolerances is not None else None
    runs = list(runs) if runs else discover_run_folders(results)
    rerun_block = None
    if o.rerun:   # first: a refused re-run (another commit) writes nothing
        from crop.audit.rerun import rerun_jobs

        rerun_block = rerun_jobs(results, runs, o.rerun, o.rerun_seed, tuple(o.trusted_envs), o.rerun_budget)
    items, provs, integrity, warnings, sound_runs = [], [], [], [], []
    clipped: dict = {}   # run → {stage: [low, high]}: the stages whose returns are of clipped rewards
    incomplete, partial, skipped = [], [], []
    for run in runs:
        try:
            r = _audit_run(results, run, o)
        except _UNREADABLE as exc:   # a field of a type no schema names: a problem of the run, never a traceback
            r = {"integrity": [{"run": run, "file": str(results / run),
                                "problem": f"a record of this run cannot be read as the audit reads it "
                                           f"({type(exc).__name__}: {str(exc)[:200]}); its run is not audited"}]}
        integrity += r.get("integrity", [])
        warnings += r.get("warnings", [])
        incomplete += [run] if r.get("incomplete") else []
        partial += [r["partial"]] if r.get("partial") else []
        skipped += [{"run": run, "stages": r["skipped"]}] if r.get("skipped") else []
        if "items" in r:
            provs.append(r["prov"])
            items += r["items"]
            sound_runs.append(run)
        if r.get("clips"):
            clipped[run] = r["clips"]
    integrity += _folder_problems(results)
    expected = _expected_missing(results, o.config, integrity, tuple(o.trusted_envs))
    if o.config_hash is None:
        warnings.append("no config hash given (standalone audit): the config the results came from is not "
                        "identified; pass --config or --config-hash")
    ref_block = None
    if ref is not None:
        data = load_runs(results, sound_runs, partial=True)
        rows = compare_reference(ref, data, file_tol, o.abs_tol, o.rel_tol, level=1 - o.alpha)
        ref_block = reference_summary(o.reference, rows, file_tol, o.tolerances, o.abs_tol, o.rel_tol)
    items, pooled, multiple = classify(items, o.alpha)
    statuses = {s_: sum(i["status"] == s_ for i in items) for s_ in STATUSES}
    violations = [i for i in items if i["status"] == "violation"] + [p for p in pooled if p["violation"]]
    suspicious = sorted((i for i in items if i["status"] == "suspicious"), key=lambda i: i["p_value"])
    untestable = [i for i in items if i["status"] == "untestable"]
    vacuous = [i for i in items if i["status"] == "vacuous"]
    mismatches = ref_block["counts"]["differs"] if ref_block else 0
    verdict = verdict_of({**statuses, "violation": len(violations)}, len(integrity),
                         (rerun_block or {}).get("differ", 0), (rerun_block or {}).get("not_run", 0),
                         expected_missing=len(expected))
    report = {"schema_version": SCHEMA_VERSION, "results": str(results), "runs": runs, "alpha": o.alpha,
              "verdict": verdict,
              "reproduction": None if ref_block is None else {
                  "agree": ref_block["counts"]["match"], "differ": ref_block["counts"]["differs"],
                  "not_in_run": ref_block["counts"]["missing"], "not_in_reference": ref_block["not_in_reference"]},
              "statuses": statuses, "multiple_testing": multiple, "pooled": pooled, "rerun": rerun_block,
              "config_hash": o.config_hash, "strict": bool(o.strict),
              "passed": verdict != "FAIL",
              "checked": len(items), "violations": len(violations), "suspicious": len(suspicious),
              "untestable": len(untestable), "vacuous": len(vacuous), "suspicious_list": suspicious,
              "untestable_list": untestable, "vacuous_list": vacuous,
              "empirical_below": sum(bool(i.get("empirical_below")) for i in items),
              "integrity_problems": len(integrity), "integrity": integrity, "expected_missing": expected,
              "incomplete_runs": incomplete,
              "partial_runs": partial, "skipped_runs": skipped,
              "violation_list": violations, "checks": items, "provenance": provs,
              "warnings": warnings, "mismatches": mismatches, "clipped_runs": clipped,
              "reference_missing": ref_block["counts"]["missing"] if ref_block else 0,
              "reference": ref_block, "reproduction_report": None}
    if ref_block is not None:
        from crop.audit.reproduction import write_reproduction

        report["reproduction_report"] = write_reproduction(ref_block, out_dir, sorted({parse_run(r)[0] for r in runs}))
    write_json(out_dir / "audit.json", report)
    atomic_write_text(out_dir / "audit.md", audit_markdown(report))
    return report


#: What a received record's field of an unexpected type raises where the report reads it.
_UNREADABLE = (TypeError, ValueError, KeyError, AttributeError, IndexError, ArithmeticError)


def _audit_run(results: Path, run: str, o: AuditOptions) -> dict:
    """One run folder's part of the audit: ``integrity`` problems, ``warnings``, ``incomplete`` (some stage
    lacks its files), ``partial`` (stages absent), and for a run whose files are whole its ``prov``, its checks
    (``items``) and its reward ``clips``.  A record the report cannot read
    (:func:`crop.report.records.run_record_problems`) is a problem, and nothing else of the run is read; so is a
    recorded setting the config schema refuses (:func:`_settings_problems`)."""
    from crop.audit.agreement import run_disagreements
    from crop.audit.provenance import run_provenance
    from crop.report.records import run_record_problems

    unreadable = run_record_problems(results / run)
    if unreadable:
        return {"integrity": [{"run": run, **p} for p in unreadable]}
    full, absent, half = stages_present(results / run)
    gone = recorded_missing(results / run)   # written or read by the folder's own records, and gone
    out = {"incomplete": bool(half or not full)}
    if not full:
        out["integrity"] = [{"run": run, "file": str(results / run),
                             "problem": "incomplete run, not audited (no result file)"}] + \
            [{"run": run, **p} for p in gone]
        return out
    problems = (half + check_integrity(results / run, only_present=True) + gone
                + _settings_problems(results / run))
    out["integrity"] = [{"run": run, **p} for p in problems]
    if problems:
        return out
    # A summary its per-step file contradicts FAILs the audit; the checks still run on the files as they are.
    out["integrity"] += [{"run": run, **p} for p in run_disagreements(results / run)]
    declared = {stage.replace("-", "_") for r, stages in o.skipped if r == run for stage in stages}
    if declared & set(absent):   # not run by the config's choice (skip): no partial run for it
        out["skipped"] = [stage for stage in absent if stage in declared]
        absent = [stage for stage in absent if stage not in declared]
    if absent:
        out["partial"] = {"run": run, "stages": full, "absent": absent}
    prov, prov_problems, prov_warnings = run_provenance(results, run)
    prov["config_hash"] = o.config_hash
    out["integrity"] += prov_problems
    out.update(prov=prov, warnings=prov_warnings, items=run_checks(results, run, full),
               clips={k: list(v) for k, v in reward_clips(results / run).items() if v is not None})
    return out


def _settings_problems(run_dir: Path) -> list[dict]:
    """Each stage record of a run folder holding a setting its config schema node refuses (the line a re-run
    would give, :func:`crop.audit.rerun._checked_settings`; a key no node names is the re-run's concern only):
    a value the workflow could not have written is evidence the record was edited, an integrity problem whether
    or not its job is drawn for a re-run."""
    from crop.audit.rerun import _record, _record_name, _schema_line
    from crop.names import ACTION_TARGET, CONTINUOUS_BOUND
    from crop.workflow.layout import split_run_algo
    from crop.workflow.stage_table import STAGES

    # ENV/ALGO@TARGET/sigma-S, or a replicate's ENV/ALGO@TARGET/sigma-S/rep-K
    action = any(split_run_algo(part)[1] == ACTION_TARGET for part in Path(run_dir).parts[-3:])
    problems = []
    for row in STAGES.values():
        rec = _record(Path(run_dir), row)
        if rec is None or not isinstance(rec.get("settings"), dict):
            continue
        # a continuous agent's LoAct records the bound it used, which no --bound chooses
        values = {k: v for k, v in rec["settings"].items()
                  if v is not None and not (action and k == "bound" and v == CONTINUOUS_BOUND)}
        line = _schema_line(values, row, f"{_record_name(row)} settings", whole=False)
        if line:
            problems.append({"file": str(Path(run_dir) / _record_name(row)),
                             "problem": f"{line}: no run of the workflow records such a value (edited after the "
                                        f"run?); rerun the stage (`snakemake --forcerun {row.rule}`)"})
    return problems


def _folder_problems(results: Path) -> list[dict]:
    """The integrity problems of the folder's tables and figures: one whose input is gone
    (:func:`crop.audit.completeness.report_inputs_missing`), a table its runs' files contradict
    (:func:`crop.audit.agreement.table_disagreements`) — over every run folder the folder holds, as
    ``crop aggregate`` reads them."""
    from crop.audit.agreement import table_disagreements
    from crop.audit.completeness import report_inputs_missing

    runs = discover_run_folders(results)
    tables = results / "tables"
    unread = [{"file": str(f), "problem": f"{found}; the audit reads only regular files of the folder within their "
                                          "size cap"}
              for f in (sorted(tables.iterdir()) if tables.is_dir() else []) if f.is_symlink() or not f.is_dir()
              if (found := received_problem(f, kind="text" if f.suffix != ".csv" else None, root=results))]
    if unread:   # the tables are read to compare them with their runs
        return [{"run": FOLDER, **p} for p in report_inputs_missing(results, runs) + unread]
    return [{"run": FOLDER, **p} for p in report_inputs_missing(results, runs) + table_disagreements(results, runs)]


def _expected_missing(results: Path, config, integrity: list[dict], trusted=()) -> list[dict]:
    """The files the workflow of ``config`` (a path; None: none given) writes and ``results`` lacks, less those
    already an integrity problem; ``trusted``: the ``module:Id`` ids the user lets import (``--trust-env``)."""
    if config is None:
        return []
    from crop.audit.completeness import config_missing
    from crop.workflow.config import load_config

    known = {p["file"] for p in integrity}
    return [p for p in config_missing(results, load_config(config, trusted)) if p["file"] not in known]


#: The ``run`` of an integrity problem of the folder's tables and figures (of no one run).
FOLDER = "(tables, figures)"
