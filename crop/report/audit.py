"""Audit of a results folder: integrity, soundness, provenance, and agreement with a reference — with
evidence for every verdict.  Writes ``audit.json`` (machine-readable) and ``audit.md`` (for people), and with a
reference also ``reproduction.md`` and one figure per environment (:mod:`crop.report.reproduction`).

A run folder may hold any subset of the stages (a LoAct-only or GRe-only run): each check runs where its
files are there, and the reference comparison covers every value the run has.

Soundness checks, per (env, algo, σ, ε) (:mod:`crop.report.checks`, one function each): a bound rising with
ε (deterministic), GRe's bounds against the global PGD returns, LoRe's bound against the local PGD return from
its initial state, LoAct's certified steps that a local attack flipped.  The last three are chance-based:
a certificate holds with probability ≥ 1 − α for the exact smoothed policy, so each records the p-value of
its observation under sound certificates, and a raw failure (``empirical_below``) is not by itself a
violation.

Statuses (``status`` of every check; :func:`classify`).  A deterministic check is ``violation`` or ``ok``; so
is a LoRe return below J̲ that no noise explains (``impossible``: its path stayed in LoRe's tree throughout, or
reached a state LoRe did not certify while in it), whatever its p-value.
The chance-based checks are judged by one procedure (:func:`tarone_holm`: Tarone's restriction to the checks
whose smallest achievable p-value ``min_p`` can reach significance, then Holm's step-down at ``alpha``) in
two families:

* the whole audit (every non-vacuous chance-based check of every run and every pooled count): adjusted
  p < ``alpha`` is a ``violation`` — this decides FAIL, with a family-wise error ≤ ``alpha`` for sound results;
* the check's own run (its env, algo and σ): adjusted p < ``alpha`` there, but not over the audit, is
  ``suspicious`` — listed first, worth a rerun, but no cause of WARN: a family per run has no audit-wide
  error control (over R runs, sound certificates leave some run suspicious with chance up to R·α, about
  1 − (1 − α)^R for independent runs), and a verdict must not depend on how the checks are grouped;
* a check left out of the audit's family by Tarone (it could not have been significant there whatever the
  attack did), not suspicious, and whose kind's pooled count is not in the family either, is ``untestable``,
  with ``reason`` and ``testable_with``, as is every LoRe check whose tree spent α ≥ 1 (its ``min_p`` is set
  to 1); never counted as passed;
* every other check is ``ok`` (``tested_by``: ``alone`` or ``pooled``).

Besides each check, one pooled count per kind of check over every run and ε (:func:`pooled_tests`) joins the
audit's family, so a fault shared by the runs is a violation even where no single check could be; a bound that
claims nothing is ``vacuous`` (not tested).  The audit-wide guarantee, P[violation | V′] ≤ ``alpha`` (V′: the
certifiers' statements the tests lean on — GRe's bounds, LoRe's certificates, the V range — never the attacks'
own certificates), and its independence assumption: docs/audit.md, "Pooled counts over runs".

``verdict`` (:func:`verdict_of`): FAIL on a violation, an integrity problem or a differing re-run, WARN on an
untestable check or when nothing was tested, else PASS — soundness and integrity only; the
reference comparison is counted apart (``reproduction``: agree, differ, not_in_run, not_in_reference).
Integrity: every result file's sha256 must match the one recorded in its ``.meta.json`` (a truncated
or edited file is reported, not silently used); every stage must have used the checkpoint recorded in
``model.json`` (and ``model.pt``, when present, must still have that hash); a stage with some but not all of
its files, or a run folder with no result at all, is an integrity problem; a partial run is not.
Provenance (:mod:`crop.report.provenance`): per run the checkpoint sha256 and source, commits, package
versions, seeds, devices and runtimes, and the hash of the workflow config the audit ran under.
Reference (:mod:`crop.report.reference`; ``"paper"`` for the paper's published numbers): each value gets a
verdict match / differs / missing (not in the run) / not_in_reference; a value agrees when the published one
lies in the reproduction's confidence interval (:mod:`crop.report.intervals`) widened by the metric's
tolerance.  Replicate folders (``ENV/ALGO/sigma-S/rep-K``) are audited for integrity and provenance and feed
the intervals.

Exit status of ``crop audit`` (:func:`exit_status`): 1 on FAIL; with ``--strict`` also on WARN and on a
differing reproduced value; 0 with ``--report-only``.

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

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from crop.io import atomic_write_text, write_json
from crop.report.checks import lore_alpha_exhausted, run_checks, untestable_reason
from crop.report.completeness import recorded_missing
from crop.report.integrity import check_integrity, stages_present
from crop.report.markdown import pipe_table
from crop.report.metrics import clip_text, load_runs, namespaced_env, parse_run, reward_clips
from crop.workflow.layout import REPLICATE_PREFIX, replicate_of, run_files, run_target

__all__ = ["audit", "discover_runs", "discover_run_folders", "classify", "tarone_holm", "pooled_tests", "unit_level",
           "poisson_binomial_sf", "verdict_of", "exit_status", "verdict_line", "plain_verdict", "STATUSES",
           "SCHEMA_VERSION"]

SCHEMA_VERSION = 8


def discover_runs(results: Path, incomplete: bool = False) -> list[str]:
    """``ENV/ALGO/sigma-S`` folders under ``results`` holding every result file (or, with ``incomplete``,
    those missing some)."""
    return [r for r in discover_run_folders(results) if not replicate_of(r)
            and all((Path(results) / r / f).is_file() for f in run_files(run_target(r)).values()) != incomplete]


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


def audit(results: Path, out_dir: Path, runs=None, alpha: float = 0.05, *, reference=None, tolerances=None,
          abs_tol: float | None = None, rel_tol: float | None = None, config_hash: str | None = None,
          strict: bool = False, trusted_envs=(), rerun: int = 0, rerun_seed: int = 0,
          rerun_budget: float | None = None, config=None) -> dict:
    """Audit ``runs`` (default: every run folder under ``results``, complete or partial) and write
    ``audit.{json,md}`` — and, with a ``reference`` (a CSV, or ``"paper"``), the reproduction report.

    ``tolerances``: a YAML/JSON tolerances file; ``abs_tol``/``rel_tol`` override both for every metric.
    Raises :class:`crop.report.reference.ReferenceError` on a malformed reference or tolerances file, before
    writing anything.  Environment ids read from the folder or the reference import nothing; ``trusted_envs``
    (the ids of the user's own config) may import the module of a ``module:Id`` id.  ``rerun``: re-run that
    many stage jobs drawn with ``rerun_seed`` and compare (:mod:`crop.report.rerun`); a differing one FAILs;
    a job predicted over ``rerun_budget`` minutes (None: the module's default) is not started (``not_run``,
    at best WARN).
    ``config``: the workflow config the folder should come from (a path); the files its jobs write and the
    folder lacks are listed (``expected_missing``, WARN: :func:`crop.report.completeness.config_missing`).
    """
    from crop.envs import untrusted_env_ids

    with untrusted_env_ids(trusted_envs):
        return _audit(Path(results), Path(out_dir), runs, alpha, reference, tolerances, abs_tol, rel_tol,
                      config_hash, strict, (rerun, rerun_seed, tuple(trusted_envs), rerun_budget), config)


def _audit(results, out_dir, runs, alpha, reference, tolerances, abs_tol, rel_tol, config_hash, strict,
           rerun, config=None) -> dict:
    from crop.report.agreement import run_disagreements
    from crop.report.provenance import run_provenance
    from crop.report.reference import compare_reference, load_reference, load_tolerances, reference_summary

    ref = load_reference(reference) if reference is not None else None
    file_tol = load_tolerances(tolerances) if tolerances is not None else None
    runs = list(runs) if runs else discover_run_folders(results)
    rerun_block = None
    if rerun[0]:   # first: a refused re-run (another commit) writes nothing
        from crop.report.rerun import rerun_jobs

        rerun_block = rerun_jobs(results, runs, rerun[0], rerun[1], rerun[2], rerun[3])
    items, provs, integrity, warnings, sound_runs = [], [], [], [], []
    clipped: dict = {}   # run → {stage: [low, high]}: the stages whose returns are of clipped rewards
    incomplete, partial = [], []
    for run in runs:
        full, absent, half = stages_present(results / run)
        gone = recorded_missing(results / run)   # written or read by the folder's own records, and gone
        if half or not full:
            incomplete.append(run)
        if not full:
            integrity.append({"run": run, "file": str(results / run),
                              "problem": "incomplete run, not audited (no result file)"})
            integrity += [{"run": run, **p} for p in gone]
            continue
        integrity += [{"run": run, **p} for p in half]
        problems = check_integrity(results / run, only_present=True) + gone
        integrity += [{"run": run, **p} for p in problems]
        if problems or half:
            continue
        # A summary its per-step file contradicts FAILs the audit; the checks still run on the files as they are.
        integrity += [{"run": run, **p} for p in run_disagreements(results / run)]
        if absent:
            partial.append({"run": run, "stages": full, "absent": absent})
        prov, prov_problems, prov_warnings = run_provenance(results, run)
        prov["config_hash"] = config_hash
        provs.append(prov)
        integrity += prov_problems
        warnings += prov_warnings
        items += run_checks(results, run, full)
        sound_runs.append(run)
        clips = {k: v for k, v in reward_clips(results / run).items() if v is not None}
        if clips:
            clipped[run] = {k: list(v) for k, v in clips.items()}
    integrity += _folder_problems(results)
    expected = _expected_missing(results, config, integrity, rerun[2])
    if config_hash is None:
        warnings.append("no config hash given (standalone audit): the config the results came from is not "
                        "identified; pass --config or --config-hash")
    ref_block = None
    if ref is not None:
        data = load_runs(results, sound_runs, partial=True)
        rows = compare_reference(ref, data, file_tol, abs_tol, rel_tol, level=1 - alpha)
        ref_block = reference_summary(reference, rows, file_tol, tolerances, abs_tol, rel_tol)
    items, pooled, multiple = classify(items, alpha)
    statuses = {s_: sum(i["status"] == s_ for i in items) for s_ in STATUSES}
    violations = [i for i in items if i["status"] == "violation"] + [p for p in pooled if p["violation"]]
    suspicious = sorted((i for i in items if i["status"] == "suspicious"), key=lambda i: i["p_value"])
    untestable = [i for i in items if i["status"] == "untestable"]
    vacuous = [i for i in items if i["status"] == "vacuous"]
    mismatches = ref_block["counts"]["differs"] if ref_block else 0
    verdict = verdict_of({**statuses, "violation": len(violations)}, len(integrity),
                         (rerun_block or {}).get("differ", 0), (rerun_block or {}).get("not_run", 0),
                         expected_missing=len(expected))
    report = {"schema_version": SCHEMA_VERSION, "results": str(results), "runs": runs, "alpha": alpha,
              "verdict": verdict,
              "reproduction": None if ref_block is None else {
                  "agree": ref_block["counts"]["match"], "differ": ref_block["counts"]["differs"],
                  "not_in_run": ref_block["counts"]["missing"], "not_in_reference": ref_block["not_in_reference"]},
              "statuses": statuses, "multiple_testing": multiple, "pooled": pooled, "rerun": rerun_block,
              "config_hash": config_hash, "strict": bool(strict),
              "passed": verdict != "FAIL",
              "checked": len(items), "violations": len(violations), "suspicious": len(suspicious),
              "untestable": len(untestable), "vacuous": len(vacuous), "suspicious_list": suspicious,
              "untestable_list": untestable, "vacuous_list": vacuous,
              "empirical_below": sum(bool(i.get("empirical_below")) for i in items),
              "integrity_problems": len(integrity), "integrity": integrity, "expected_missing": expected,
              "incomplete_runs": incomplete,
              "partial_runs": partial, "violation_list": violations, "checks": items, "provenance": provs,
              "warnings": warnings, "mismatches": mismatches, "clipped_runs": clipped,
              "reference_missing": ref_block["counts"]["missing"] if ref_block else 0,
              "reference": ref_block, "reproduction_report": None}
    if ref_block is not None:
        from crop.report.reproduction import write_reproduction

        report["reproduction_report"] = write_reproduction(ref_block, out_dir, sorted({parse_run(r)[0] for r in runs}))
    write_json(out_dir / "audit.json", report)
    atomic_write_text(out_dir / "audit.md", _markdown(report))
    return report


def _folder_problems(results: Path) -> list[dict]:
    """The integrity problems of the folder's tables and figures: one whose input is gone
    (:func:`crop.report.completeness.report_inputs_missing`), a table its runs' files contradict
    (:func:`crop.report.agreement.table_disagreements`) — over every run folder the folder holds, as
    ``crop aggregate`` reads them."""
    from crop.report.agreement import table_disagreements
    from crop.report.completeness import report_inputs_missing

    runs = discover_run_folders(results)
    return [{"run": FOLDER, **p} for p in report_inputs_missing(results, runs) + table_disagreements(results, runs)]


def _expected_missing(results: Path, config, integrity: list[dict], trusted=()) -> list[dict]:
    """The files the workflow of ``config`` (a path; None: none given) writes and ``results`` lacks, less those
    already an integrity problem; ``trusted``: the ``module:Id`` ids the user lets import (``--trust-env``)."""
    if config is None:
        return []
    from crop.report.completeness import config_missing
    from crop.workflow.config import load_config

    known = {p["file"] for p in integrity}
    return [p for p in config_missing(results, load_config(config, trusted)) if p["file"] not in known]


#: The ``run`` of an integrity problem of the folder's tables and figures (of no one run).
FOLDER = "(tables, figures)"
STATUSES = ("ok", "violation", "suspicious", "untestable", "vacuous")
POOLED = "pooled:"   # a pooled test's ``check`` is this prefix and the kind it counts


def tarone_holm(tested: list[dict], alpha: float, p_key: str = "p_value") -> tuple[int, list[dict], dict]:
    """Tarone's (1990) restriction of the family to the checks that *can* reach significance, then Holm's
    step-down over them (Hommel & Krummenauer 1998).  A check's ``min_p`` is the smallest p-value its data
    could give (every attacked return at J_min, every attacked step flipped), fixed before the attack ran.
    K is the smallest integer with #{checks: min_p ≤ α/K} ≤ K; those checks form the family, Holm at α over
    them; the others cannot reach α/K and are left out rather than diluting the correction.  The family
    depends on the sample sizes and bounds only, so the family-wise error rate stays ≤ α under any
    dependence among the p-values (Holm's).
    Returns (K, family — at most K checks —, {id(check): Holm-adjusted p} over the family)."""
    mins = np.sort([float(i.get("min_p", 0.0)) for i in tested])
    ks = np.arange(1, len(mins) + 1)
    fits = np.nonzero(np.searchsorted(mins, alpha / ks, side="right") <= ks)[0]
    k = int(ks[fits[0]]) if len(fits) else len(mins)
    family = [i for i in tested if float(i.get("min_p", 0.0)) <= alpha / max(k, 1)]
    adjusted, running = {}, 0.0
    for rank, item in enumerate(sorted(family, key=lambda i: i[p_key])):
        running = max(running, min(1.0, (len(family) - rank) * float(item[p_key])))
        adjusted[id(item)] = running
    return k, family, adjusted


def unit_level(item: dict, alpha: float) -> float:
    """The level at which one chance-based check counts as a failure in its pooled test, and (the value
    returned) an upper bound on the chance of that failure under valid certificates: the largest p-value the
    check can attain at or below max(min_p, α) — an exact binomial tail for a percentile count; the level itself
    for the checks whose p-value is continuous (Hoeffding's, LoRe's α_spent + A, a flip count's Ville test)."""
    level = max(float(item["min_p"]), alpha)
    n, p = (item.get("episodes"), item.get("p")) if item["check"].startswith("gre_percentile") else (None, None)
    if n and p is not None and 0 < p < 1:   # the smallest count whose tail is ≤ level, and that tail
        tails = st.binom.sf(np.arange(n + 1) - 1, n, p)
        return float(tails[np.argmax(tails <= level + 1e-15)]) if (tails <= level + 1e-15).any() else 1.0
    return level


def poisson_binomial_sf(count: int, chances) -> float:
    """P[X₁ + … + X_U ≥ count] for independent Bernoulli X_u of probabilities ``chances`` (exact, by
    convolution): what chance allows for ``count`` failures among units that each fail with probability at
    most its chance — a sum of independent indicators is stochastically below this one (coupling)."""
    if count <= 0:
        return 1.0
    dist = np.array([1.0])
    for c in chances:
        dist = np.convolve(dist, [1.0 - c, c])
    return float(min(1.0, dist[count:].sum()))


def pooled_tests(items: list[dict], alpha: float) -> list[dict]:
    """One count test per kind of chance-based check over every run and ε of the audit: how many of its
    checks failed at their :func:`unit_level` against what chance allows for each (P[Poisson-binomial ≥
    count], :func:`poisson_binomial_sf`).  A systematic fault — every run's LoRe bound beaten, every run's
    attacked returns just under J̲_p — is then a violation where no single check could be.

    The count's p-value assumes the checks of a kind fail independently given the certificates: each is a
    separate attacked episode (or set of them) drawn with the run's own attack seed.  Checks whose run shares
    its attack seed with an earlier run (a copied folder) are left out of the count (``left_out``), since
    that assumption fails for them.  Vacuous checks and those that cannot fail (``min_p`` 1) add nothing."""
    by_kind: dict = {}
    for i in items:
        if i.get("p_value") is not None and not i.get("vacuous") and float(i["min_p"]) < 1.0:
            by_kind.setdefault(i["check"], []).append(i)
    out = []
    for kind, units in sorted(by_kind.items()):
        owner, chances, failed, runs, left_out = {}, [], 0, set(), 0
        for u in units:
            run = (u["env"], u["algo"], u["sigma"])
            if u.get("attack_seed") is not None and owner.setdefault(u["attack_seed"], run) != run:
                left_out += 1
                continue
            c = unit_level(u, alpha)
            chances.append(c)
            failed += bool(u["p_value"] <= c)
            runs.add(run)
        if not chances:
            continue
        out.append({"env": "all", "algo": "all", "sigma": None, "eps": None, "check": POOLED + kind, "kind": kind,
                    "bound": None, "observed": failed, "units": len(chances), "runs": len(runs),
                    "left_out": left_out, "expected": float(sum(chances)),
                    "p_value": poisson_binomial_sf(failed, chances), "min_p": float(np.prod(chances)),
                    "empirical_below": failed > 0, "violation": False})
    return out


def classify(items: list[dict], alpha: float) -> tuple[list[dict], list[dict], dict]:
    """The checks with their ``status`` (new rows; ``items`` is not changed), the pooled tests
    (:func:`pooled_tests`) with theirs, and the ``multiple_testing`` block of audit.json.

    * deterministic checks (a bound rising with ε): ``violation`` or ``ok``; so is a LoRe check whose attacked
      return lies below J̲ where no noise explains it (``impossible``: the path stayed in LoRe's tree to its
      horizon or a terminal state, or reached a state LoRe did not certify while in it) — ``violation`` whatever
      its p-value;
    * a bound that claims nothing (J̲ at J_min; no step certified beyond ε) → ``vacuous``, not tested; a flip
      count whose attack counted no step (``nothing_counted``) → ``vacuous`` too, though left in the family;
    * a LoRe check whose attacked path reached a state LoRe did not certify (``off_lore_states``: p = 1 whatever
      its return) → ``untestable`` with why, left in the family;
    * the audit's family (:func:`tarone_holm` over every non-vacuous chance-based check *and* the pooled
      tests): Holm-adjusted p < α → ``violation`` (FAIL; family-wise error ≤ α for valid certificates);
    * the check's own run (the same procedure over that run's checks): significant there but not over the
      audit → ``suspicious`` (listed, no cause of WARN);
    * outside the audit's family: ``ok`` when its kind's pooled test is in the family (``tested_by``:
      ``pooled`` — it could have caught a fault shared by the runs, not one broken certificate alone), else
      ``untestable`` with ``reason`` and ``testable_with`` (WARN, never counted as passed);
    * every other check: ``ok`` (``tested_by``: ``alone``)."""
    rows = [dict(i) for i in items]
    for i in rows:
        if i["check"] == "lore_vs_pgd_local" and lore_alpha_exhausted(i.get("alpha_spent", 0.0)):
            i["min_p"] = 1.0  # no joint certificate: nothing to test
    tested = [i for i in rows if i.get("p_value") is not None and not i.get("vacuous")]
    pooled = pooled_tests(tested, alpha)
    k, family, adjusted = tarone_holm(tested + pooled, alpha)
    in_family = {id(i) for i in family}
    for i in tested + pooled:
        i["in_audit_family"] = id(i) in in_family
        i["p_adjusted"] = adjusted.get(id(i))
        i["violation"] = bool(i["in_audit_family"] and i["p_adjusted"] < alpha)
    per_run: dict = {}
    for i in tested:
        per_run.setdefault((i["env"], i["algo"], i["sigma"]), []).append(i)
    for group in per_run.values():
        _, _, adj = tarone_holm(group, alpha)
        for i in group:
            i["p_run"] = adj.get(id(i))
    pooled_on = {p["kind"] for p in pooled if p["in_audit_family"]}
    for i in rows:
        if i.get("impossible"):
            # a return no noise explains (a faulty search or a replay that differs): no chance, no adjustment
            i.update(status="violation", violation=True, tested_by="deterministic")
        elif i.get("p_value") is None:
            i["status"] = "violation" if i["violation"] else "ok"
        elif i.get("vacuous"):
            i.update(status="vacuous", violation=False)
        elif i.get("nothing_counted") and not i["violation"]:
            # in the family at p = 1 (its membership was fixed before the attack), yet nothing could fail
            i["status"] = "vacuous"
        elif i.get("off_lore_states") and not i["violation"]:
            i["status"] = "untestable"
            i["reason"], i["testable_with"] = untestable_reason(i, alpha, k)
        elif i["violation"]:
            i["status"] = "violation"
        elif i["p_run"] is not None and i["p_run"] < alpha:
            i["status"] = "suspicious"
        elif i["in_audit_family"]:
            i.update(status="ok", tested_by="alone")
        elif i["check"] in pooled_on and float(i["min_p"]) < 1.0:
            i.update(status="ok", tested_by="pooled")
        else:
            i["status"] = "untestable"
            i["reason"], i["testable_with"] = untestable_reason(i, alpha, k)
    for p in pooled:
        p["status"] = "violation" if p["violation"] else ("ok" if p["in_audit_family"] else "untestable")
    block = {"method": "tarone-holm", "tests": len(tested) + len(pooled), "pooled": len(pooled), "K": k,
             "family": len(family), "untestable": sum(i["status"] == "untestable" for i in rows),
             "rule": "a chance-based check or pooled count is a violation when its Holm-adjusted p-value over the "
                     "audit's family (Tarone: the tests whose smallest achievable p is <= alpha/K) is below alpha; "
                     "suspicious when the same procedure over its own run's checks is below alpha; tested alone "
                     "when in the audit's family, tested pooled when outside it but its kind's count is in it; "
                     "untestable otherwise; vacuous when its bound claims nothing"}
    return rows, pooled, block


def verdict_of(statuses: dict, integrity_problems: int, rerun_differ: int = 0, rerun_not_run: int = 0, *,
               expected_missing: int = 0) -> str:
    """FAIL on a violation (a check or a pooled count), an integrity problem or a re-run that differs; WARN
    on an untestable check, a drawn re-run job that could not be re-run, a file the given config's workflow
    writes and the folder lacks (``expected_missing``: the folder may come from another config), or when
    nothing was tested at all; else PASS.  A suspicious check (significant within its run only) is tested and
    listed, not a cause of WARN: only the audit's family controls the error over the whole audit."""
    if statuses.get("violation") or integrity_problems or rerun_differ:
        return "FAIL"
    tested = statuses.get("ok", 0) + statuses.get("suspicious", 0)
    return "WARN" if statuses.get("untestable") or not tested or rerun_not_run or expected_missing else "PASS"


def exit_status(rep: dict, strict: bool = False, report_only: bool = False) -> int:
    """The exit status of ``crop audit`` (2, bad input, is raised before any audit): 1 on FAIL; with
    ``strict`` also on WARN and on a reproduced value that differs from the reference; 0 otherwise, and 0
    whatever the verdict with ``report_only`` (the workflow's audit job, which keeps its files and lets the
    closing summary state the verdict)."""
    if report_only:
        return 0
    differ = (rep.get("reproduction") or {}).get("differ", 0)
    return int(rep["verdict"] == "FAIL" or (strict and (rep["verdict"] == "WARN" or bool(differ))))


def _short_seed(seed) -> str:
    """A derived seed (up to 19 digits) shortened for reading: its first 8 digits, then an ellipsis."""
    text = "—" if seed is None else str(seed)
    return text if len(text) <= 9 else text[:8] + "…"


def verdict_line(rep: dict) -> str:
    """The one line that states both verdicts apart: soundness/integrity, then reproduction."""
    st_ = rep["statuses"]
    pooled = rep.get("pooled") or []
    line = (f"soundness {rep['verdict']}: {rep['checked']} checks ({st_['ok']} ok, {st_['violation']} violation, "
            f"{st_['suspicious']} suspicious, {st_['untestable']} untestable, {st_.get('vacuous', 0)} vacuous"
            + ")"
            + (f", {len(pooled)} pooled counts ({sum(p['violation'] for p in pooled)} violation)" if pooled else "")
            + f", {rep['integrity_problems']} integrity problem(s)"
            + (f" (first: {rep['integrity'][0]['file']})" if rep.get("integrity") else "")
            + (f", {len(rep['expected_missing'])} file(s) the config expects missing (first: "
               f"{rep['expected_missing'][0]['file']})" if rep.get("expected_missing") else ""))
    rr = rep.get("rerun")
    if rr:
        line += f"; rerun: {rr['checked']} jobs, {rr['differ']} differ" + (
            f", {rr['not_run']} not run" if rr.get("not_run") else "")
    r = rep.get("reproduction")
    if r:
        line += (f"; reproduction: {r['agree']} agree / {r['differ']} differ / {r['not_in_run']} not in the run / "
                 f"{r['not_in_reference']} not in the reference")
    return line


def _where(i: dict) -> str:
    if str(i["check"]).startswith(POOLED):
        return f"counted over {i['runs']} runs"
    return f"in run {i['env']}/{i['algo']}/σ={i['sigma']:g}" + ("" if i.get("eps") is None else f" at ε = {i['eps']:g}")


def plain_verdict(rep: dict) -> str:
    """What the audit showed, in plain words (the first paragraph of audit.md)."""
    st_ = rep["statuses"]
    tested = st_["ok"] + st_["suspicious"]
    alone = sum(i.get("tested_by") == "alone" or i.get("p_value") is None or i["status"] == "suspicious"
                for i in rep["checks"] if i["status"] in ("ok", "suspicious"))
    vac = (f" {st_['vacuous']} bound(s) claim nothing (vacuous: J̲ at J_min, or no step certified beyond ε) "
           "and were not tested." if st_.get("vacuous") else "")
    sus = (f" {st_['suspicious']} of these came out significant within their own run yet within chance over the "
           "audit (suspicious, listed first below; a rerun with more attack episodes tells)."
           if st_["suspicious"] else "")
    if rep["verdict"] == "FAIL":
        parts = []
        if rep["violation_list"]:
            parts.append(f"{len(rep['violation_list'])} soundness violation(s): " + "; ".join(
                f"{i['check']} {_where(i)} (bound {i['bound']}, observed {i['observed']})"
                for i in rep["violation_list"][:3]))
        if rep["integrity"]:
            parts.append(f"{len(rep['integrity'])} integrity problem(s): " + "; ".join(
                f"{p['problem']} ({p['file']})" for p in rep["integrity"][:3]))
        differ = [j for j in (rep.get("rerun") or {}).get("jobs", []) if j["result"] == "differ"]
        if differ:
            parts.append(f"{len(differ)} re-run job(s) differ: " + "; ".join(j["job"] for j in differ[:3]))
        return "**FAIL**: " + ". ".join(parts) + "." + (" " + _expected_text(rep) if rep.get("expected_missing")
                                                        else "")
    expected = _expected_text(rep)
    if not tested:
        return ("**Not decided: nothing was tested.** No check could have caught a broken certificate (no attack "
                "to check a bound against, or every bound vacuous); to decide, run the attacks (local and global "
                "PGD) beside the certificates." + vac + (" " + expected if expected else ""))
    if rep["verdict"] == "WARN":
        fixes = sorted({i.get("testable_with") or "" for i in rep["untestable_list"]} - {""})
        text = "**Not decided**: " + (expected + " " if expected else "")
        if st_["untestable"]:
            text += (f"{st_['untestable']} check(s) could not fail"
                     + (f"; to decide: {'; '.join(fixes)}" if fixes else "") + ". ")
        not_run = [j for j in (rep.get("rerun") or {}).get("jobs", []) if j["result"] == "not_run"]
        if not_run:
            text += (f"{len(not_run)} drawn re-run job(s) could not be re-run: "
                     + "; ".join(f"{j['job']}: {j['note']}" for j in not_run[:3])
                     + ("; …" if len(not_run) > 3 else "") + ". ")
        other = "other " if st_["untestable"] else ""
        return text + f"{tested} {other}check(s) could have caught a broken certificate and none did." + sus + vac
    return (f"**Sound as far as tested**: {tested} checks could have caught a broken certificate and none did "
            f"({alone} on their own, {tested - alone} only as part of a count over runs, which catches a fault "
            "shared by the runs)." + sus + vac)


def _expected_text(rep: dict) -> str:
    """The files the given config's workflow writes and the folder lacks, in a sentence ('' where none)."""
    gone = rep.get("expected_missing") or []
    if not gone:
        return ""
    return (f"{len(gone)} file(s) or folder(s) the config's workflow writes are not in the folder (the folder lacks "
            "what the config expects, or comes from another config): " + "; ".join(p["file"] for p in gone[:3])
            + (f" and {len(gone) - 3} more" if len(gone) > 3 else "") + ".")


def _raw_failures(rep: dict) -> list[dict]:
    """The checks whose attack went below the bound by less than chance allows (not violations)."""
    return [i for i in rep["checks"] if i.get("empirical_below") and i["status"] in ("ok", "untestable")]


def _md_summary(rep: dict) -> list[str]:
    """The verdicts in plain words, the summary line, and their counts."""
    ref = rep["reference"]
    first = plain_verdict(rep)
    r = rep.get("reproduction")
    if r:
        first += (f" **Reproduction** (a separate question: does the run agree with the reference?): {r['agree']} "
                  f"agree, {r['differ']} differ, {r['not_in_run']} not in the run, {r['not_in_reference']} not in "
                  "the reference.")
    lines = ["# CROP audit", "", first, "", f"`{verdict_line(rep)}`", "",
             f"Results folder: `{rep['results']}`; runs audited: {len(rep['runs'])}"
             + (f" ({len(rep['partial_runs'])} partial)" if rep["partial_runs"] else "")
             + f"; config hash: `{rep['config_hash'] or 'not given'}`.", "",
             *_md_clipped(rep),
             "| | |", "|---|---|",
             f"| soundness checks | {rep['checked']} |",
             f"| violations (statistically incompatible with sound certificates at α = {rep['alpha']} over the "
             f"whole audit) | {rep['violations']} |",
             f"| suspicious (significant within their run's checks, not over the whole audit) | "
             f"{rep['suspicious']} |",
             f"| untestable (could not reach significance whatever the attack did; not counted as passed) | "
             f"{rep['untestable']} |",
             f"| vacuous (the bound claims nothing: not tested, no cause of WARN) | {rep['vacuous']} |",
             f"| pooled counts over runs (violations) | {len(rep['pooled'])} "
             f"({sum(p['violation'] for p in rep['pooled'])}) |",
             f"| raw failures within what chance allows (not violations) | {len(_raw_failures(rep))} |",
             f"| integrity problems | {rep['integrity_problems']} |"]
    if rep.get("expected_missing"):
        lines += [f"| files the config's workflow writes, missing (WARN) | {len(rep['expected_missing'])} |"]
    if ref:
        c = ref["counts"]
        lines += [f"| reference values: agree / differ / not in the run / not in the reference | {c['match']} / "
                  f"{c['differs']} / {c['missing']} / {ref['not_in_reference']} |"]
    return lines


def _md_clipped(rep: dict) -> list[str]:
    """The runs whose rewards were clipped (rewards.clip), in a sentence: their certificates are for the return
    of the clipped rewards, not the environment's own; nothing where no run clipped."""
    clipped = rep.get("clipped_runs") or {}
    if not clipped:
        return []
    runs = "; ".join(f"`{run}` ({clip_text(sorted({tuple(c) for c in stages.values()}))}: "
                     f"{', '.join(sorted(stages))})" for run, stages in sorted(clipped.items()))
    return [f"Runs with clipped rewards: {runs}. Their certificates (GRe's bounds) are for the return of the "
            "clipped rewards, not the environment's own, and their benign and attacked returns are of the same "
            "clipped rewards; a bound and a return of different rewards are not compared (untestable).", ""]


def _md_soundness(rep: dict) -> list[str]:
    """The suspicious checks, the violations and the untestable checks (why, and what would make them
    testable)."""
    lines: list[str] = []
    cols = ["env", "algo", "sigma", "eps", "check", "eps_bound", "bound", "observed", "episodes", "steps",
            "expected", "p_value", "p_run", "p_adjusted"]
    if rep["suspicious_list"]:
        lines += ["", "## Suspicious checks", "",
                  "Raw evidence against a certificate: significant at α within the checks of its own run (Holm "
                  "over that run), not over the whole audit. Not a proof of a violation; worth a rerun with more "
                  "attack episodes. Raw p, the run's adjusted p (p_run) and the audit's (p_adjusted; empty where "
                  "the check could not be significant over the audit):", ""]
        lines += [pipe_table(rep["suspicious_list"], cols), ""]
    lines += ["", "## Soundness violations", ""]
    if rep["violation_list"]:
        lines += ["Each row: the check, where, the certified bound, what the attack observed, and the p-value of "
                  "the observation under sound certificates (see “Chance” below).", ""]
        lines += [pipe_table(rep["violation_list"], ["env", "algo", "sigma", "eps", "check", "eps_bound", "bound",
                                                     "observed", "episode", "steps", "expected", "p_value",
                                                     "p_adjusted"]), ""]
    else:
        lines += ["None: no attack went below a certified bound, and no certified action changed within its radius, "
                  "beyond what chance allows; no bound rose with ε.", ""]
    if rep["pooled"]:
        lines += ["## Pooled counts over runs", "",
                  "Per kind of check, over every run and ε: how many checks failed at their own level (`observed`) "
                  "against what chance allows for each (`expected`, the sum of those chances), p-value P[Poisson-"
                  "binomial ≥ observed]. A fault shared by the runs is a violation here even where no single check "
                  "could be (docs/audit.md, \u201cPooled counts\u201d).", ""]
        lines += [pipe_table(rep["pooled"], ["check", "runs", "units", "left_out", "observed", "expected", "p_value",
                                             "min_p", "p_adjusted", "status"]), ""]
    lore = [{**c, "tree_until": "—" if c.get("tree_until") is None else f"{c['tree_until']:.6g}"}
            for c in rep["checks"] if c["check"] == "lore_vs_pgd_local"]
    if lore:
        lines += ["## LoRe bounds compared", "",
                  "Each local attack at ε is checked against LoRe's bound J̲(ε') (ε' ≥ ε, J̲ non-increasing) over "
                  "LoRe's tree for every ε below `tree_until` (—: the whole search), chosen from the "
                  "certificates alone; `p_leave`: the sum of the bounds on leaving that tree along the attacked "
                  "path, up to where it left (docs/audit.md, \u201cWhat chance allows\u201d).", "",
                  pipe_table(lore, ["env", "algo", "sigma", "eps", "eps_bound", "tree_until", "bound", "observed",
                                    "p_leave", "p_value", "status"], limit=50, rest="all in audit.json"), ""]
    if rep["vacuous_list"]:
        df = pd.DataFrame(rep["vacuous_list"])
        lines += ["## Vacuous bounds", "", "These bounds claim nothing (J̲ at J_min, or no step certified beyond ε), "
                  "so nothing could contradict them: not tested, no cause of WARN.", "",
                  pipe_table(df.groupby(["check"]).agg(checks=("eps", "size"),
                                                       runs=("algo", lambda x: len(set(x)))).reset_index()
                             .to_dict("records")), ""]
    if rep["untestable_list"]:
        lines += ["## Untestable checks", "",
                  "These checks could not have failed over this audit whatever the attack observed (their smallest "
                  "possible p-value is above α/K, K = "
                  f"{rep['multiple_testing']['K']}: Tarone's family size bound), or their certificate has no "
                  "joint meaning. They are not counted as passed. Per check kind, why and what would make it "
                  "testable:", ""]
        df = pd.DataFrame(rep["untestable_list"])
        df["run"] = df["env"] + "/" + df["algo"] + "/σ=" + df["sigma"].map(lambda x: f"{x:g}")
        summary = (df.groupby(["check", "testable_with"], dropna=False)
                   .agg(checks=("run", "size"), runs=("run", "nunique"), example=("reason", "first")).reset_index())
        lines += [pipe_table(summary.to_dict("records"), limit=50, rest="all in audit.json"), ""]
    return lines


def _md_integrity(rep: dict) -> list[str]:
    """Integrity problems, re-run jobs and partial runs."""
    lines = ["## Integrity", ""]
    rr = rep.get("rerun")
    if rr:
        lines += [f"Re-execution (`--rerun`, seed {rr['seed']}): {rr['checked']} stage jobs re-run from their "
                  f"recorded provenance: {rr['identical']} identical, {rr['within_interval']} within floating-point "
                  f"reordering (a job that ran off the CPU), {rr['differ']} differ"
                  + (f", {rr['not_run']} drawn but not re-run (WARN)" if rr["not_run"] else "") + "."
                  + (f" {rr['not_eligible']} stage(s) recorded no settings and could not be drawn: "
                     + ", ".join(f"{j['run']} {j['stage']}" for j in rr["not_eligible_list"][:10])
                     + ("…" if rr["not_eligible"] > 10 else "") + "." if rr.get("not_eligible") else ""), "",
                  pipe_table(rr["jobs"], ["run", "stage", "device", "result", "note"]), ""]
    if rep["integrity"]:
        lines += [pipe_table(rep["integrity"], ["run", "file", "problem"]), ""]
    else:
        lines += ["Every result file has the sha256 recorded when it was written, every file the folder's records "
                  "name is there, every summary agrees with the per-step file it was made from and every table "
                  "with the run files it cites, and every stage used the recorded checkpoint.", ""]
    if rep.get("expected_missing"):
        lines += ["## Expected by the config, missing", "",
                  "Files the given config's workflow writes that the folder lacks (WARN: nothing in the folder "
                  "says they were written):", "", pipe_table(rep["expected_missing"], ["file", "problem"], limit=100,
                                                             rest="all in audit.json"), ""]
    if rep["partial_runs"]:
        lines += ["## Partial runs", "", "Audited for the stages they have (not an integrity problem):", ""]
        lines += [pipe_table([{"run": p["run"], "stages": ", ".join(p["stages"]), "absent": ", ".join(p["absent"])}
                              for p in rep["partial_runs"]]), ""]
    return lines


def _md_reference(rep: dict) -> list[str]:
    """The comparison with the reference: tolerances, the rows that differ and match, and counts of the
    values one side lacks."""
    ref = rep["reference"]
    if not ref:
        return []
    lines = ["## Reference comparison", "",
             f"Reference `{ref['name']}` (`{ref['file']}`, sha256 `{ref['sha256'][:16]}…`), tolerances "
             f"{'from `' + ref['tolerances_file'] + '`' if ref['tolerances_file'] else 'built in'}: a "
             "value agrees when the reference lies inside the reproduction's confidence interval "
             "[interval_lo, interval_hi] (over replicates where there are several, else over episodes; the "
             "value itself for bounds and attacks) widened by allowed = max(abs, rel·|reference|); outside = "
             "how far beyond the interval it lies; ratio = reproduced / reference. The LoAct mean radius is "
             "compared in the reference's convention (mean_radius: uncertified steps count 0; "
             "mean_radius_certified: the paper's, certified steps only)."
             + (" Plain-words summary and figures: `reproduction.md`." if rep.get("reproduction") else ""), ""]
    if ref["tolerances"]:
        lines += [pipe_table([{"metric": m, **t} for m, t in ref["tolerances"].items()]), ""]
    lines += _md_reference_clipped(ref["comparisons"])
    cols = ["env", "algo", "sigma", "metric", "eps", "reference", "reproduced", "interval_lo", "interval_hi",
            "replicates", "ratio", "outside", "allowed", "verdict", "note"]
    for verdict_name, title in (("differs", "Differs"), ("match", "Match")):
        rows = [r for r in ref["comparisons"] if r["verdict"] == verdict_name]
        if rows:
            lines += [f"### {title} ({len(rows)})", ""]
            lines += [pipe_table(rows, cols, limit=200, rest="all in audit.json"), ""]
    for verdict_name, title in (("missing", "Missing from these results (not in the run)"),
                                ("not_in_reference", "In the run, not in the reference")):
        rows = [r for r in ref["comparisons"] if r["verdict"] == verdict_name]
        if rows:
            df = pd.DataFrame(rows).fillna({"note": ""})
            absent = df["note"].str.startswith("run not")
            summary = pd.concat([  # runs absent altogether: one line per (env, algo)
                df[absent].groupby(["env", "algo", "note"])
                .agg(sigma=("sigma", lambda x: ", ".join(f"{v:g}" for v in sorted(set(x)))),
                     values=("metric", "size")).reset_index().assign(metric="all"),
                df[~absent].groupby(["env", "algo", "sigma", "metric", "note"], dropna=False)
                .size().rename("values").reset_index()])
            lines += [f"### {title} ({len(rows)})", "", "Counted per run (or per algorithm where its runs are "
                      "absent) and metric; every row is in audit.json.", ""]
            lines += [pipe_table(summary[["env", "algo", "sigma", "metric", "note", "values"]]
                                 .to_dict("records"), limit=100, rest="all in audit.json"), ""]
    return lines


def _md_reference_clipped(rows: list[dict]) -> list[str]:
    """A sentence naming, per run, the reproduced values that are returns of clipped rewards (``reward_clip``
    of a comparison, :func:`crop.report.reference.compare_reference`); nothing where none is."""
    marked: dict = {}
    for r in rows:
        if r.get("reward_clip") and r["verdict"] != "missing":
            marked.setdefault((r["env"], r["algo"], r["sigma"], tuple(r["reward_clip"])), set()).add(r["metric"])
    if not marked:
        return []
    which = "; ".join(f"{env} {algo} σ = {sigma:g}, {clip_text([clip])}: "
                      + ", ".join(f"`{m}`" for m in sorted(metrics))
                      for (env, algo, sigma, clip), metrics in sorted(marked.items()))
    return ["**Returns of clipped rewards.** These reproduced values are returns (or bounds on returns) of "
            f"rewards clipped to a range (`rewards.clip`), not of the environment's own rewards — {which}. A "
            "reference number for the game's own return is not the same quantity; each such row says so in its "
            "note (and `reward_clip` in audit.json). Radii and certified fractions do not depend on the rewards.",
            ""]


def _md_chance(rep: dict) -> list[str]:
    """How chance enters the verdicts, the raw failures within it, and the checks per run."""
    raw = _raw_failures(rep)
    lines = ["## Chance", "",
             "A certificate holds with probability ≥ 1 − α for the *exact* smoothed policy; the attacked policy is "
             "its m-sample estimate, which may take another action inside a valid radius, and a distributional "
             "GRe bound can be undercut by a few attacked episodes. So each count is compared with what chance "
             "allows; an audit runs many such checks "
             f"({(rep.get('multiple_testing') or {}).get('tests', 0)} here), so a count is a violation only when "
             f"its p-value, Holm-adjusted over the audit's family of them (the "
             f"{(rep.get('multiple_testing') or {}).get('family', 0)} that could reach significance: Tarone), is "
             f"below α = {rep['alpha']} (the chance that any valid certificate is called a violation is then at "
             "most α; how each chance is computed: docs/audit.md).", ""]
    if raw:
        lines += ["Raw failures within chance (not violations):", ""]
        lines += [pipe_table(raw, ["env", "algo", "sigma", "eps", "check", "eps_bound", "bound", "observed", "steps",
                                   "expected", "chance", "p_value", "p_adjusted", "note"]), ""]
    else:
        lines += ["No raw failure either.", ""]
    if rep["checks"]:
        df = pd.DataFrame(rep["checks"])
        df = df.assign(**{s_: df["status"] == s_ for s_ in STATUSES})
        summary = df.groupby(["env", "algo", "sigma", "check"]).agg(
            checked=("status", "size"), **{s_: (s_, "sum") for s_ in STATUSES})
        lines += ["## Checks per run", "", pipe_table(summary.reset_index()), ""]
    return lines


def _md_provenance(rep: dict) -> list[str]:
    """Checkpoints, commits, devices, runtimes, seeds and versions per run; then the warnings."""
    lines: list[str] = []
    if rep["provenance"]:
        lines += ["## Provenance", ""]
        rows = [{"env": p["env"], "algo": p["algo"], "sigma": p["sigma"],
                 "checkpoint": (p["checkpoint_sha256"] or "—")[:12], "source": p["checkpoint_source"] or "—",
                 "verified": p["checkpoint"].get("file_verified"),
                 "commit": ", ".join(c[:12] for c in p["git_commits"]),
                 "device": p["device"], "runtime_s": p["runtime_total_s"], "finished_utc": p["finished_utc"]}
                for p in rep["provenance"]]
        lines += [pipe_table(rows, text=("checkpoint", "commit")), ""]
        stages = sorted({s for p in rep["provenance"] for s in p["runtime_s"]})
        lines += ["Runtime per stage (s):", ""]
        lines += [pipe_table([{"run": p["run"], **{s: p["runtime_s"].get(s) for s in stages}}
                              for p in rep["provenance"]]), ""]
        lines += ["Seed per stage (derived from the config's seed and the run's labels; the first 8 digits, every "
                  "seed in full in audit.json):", ""]
        lines += [pipe_table([{"run": p["run"], **{s: _short_seed(p["seeds"].get(s)) for s in stages}}
                              for p in rep["provenance"]]), ""]
        versions = {k: v for p in rep["provenance"] for k, v in (p["versions"] or {}).items()}
        if versions:
            lines += ["Package versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())), ""]
    if rep["warnings"]:
        lines += ["## Warnings", ""] + [f"- {w}" for w in rep["warnings"]] + [""]
    return lines


def _markdown(rep: dict) -> str:
    """audit.md: the verdicts first, then the evidence section by section."""
    return "\n".join(_md_summary(rep) + _md_soundness(rep) + _md_integrity(rep) + _md_reference(rep)
                     + _md_chance(rep) + _md_provenance(rep))
