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

Statuses (``status`` of every check; :func:`classify`).  A deterministic check is ``violation`` or ``ok``.
The chance-based checks are judged by one procedure (:func:`tarone_holm`: Tarone's restriction to the checks
whose smallest achievable p-value ``min_p`` can reach significance, then Holm's step-down at ``alpha``) in
two families:

* the whole audit (every chance-based check of every run): adjusted p < ``alpha`` is a ``violation`` — this
  decides FAIL, with a family-wise error ≤ ``alpha`` for sound results;
* the check's own run (its env, algo and σ): adjusted p < ``alpha`` there, but not over the audit, is
  ``suspicious`` — this decides WARN;
* a check left out of the audit's family by Tarone (it could not have been significant there whatever the
  attack did) and not suspicious is ``untestable``, with ``reason`` and ``testable_with``, as is every LoRe
  check whose tree spent α ≥ 1 (its ``min_p`` is set to 1); never counted as passed;
* every other check is ``ok``.

``verdict``: FAIL on a violation or an integrity problem, WARN on a suspicious or untestable check, else
PASS — soundness and integrity only; the reference comparison is counted apart (``reproduction``: agree,
differ, not_in_run, not_in_reference).
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

Exit status of ``crop audit``: 1 on FAIL; with ``--strict`` also on WARN and on a differing reproduced value.

audit.json keys: ``schema_version``, ``results``, ``runs``, ``alpha``, ``verdict``, ``reproduction``,
``statuses``, ``multiple_testing``, ``config_hash``, ``strict``, ``passed`` (verdict ≠ FAIL), ``checked``,
``violations``, ``suspicious``, ``untestable``, ``suspicious_list``, ``untestable_list``, ``empirical_below``,
``integrity_problems``, ``integrity``, ``incomplete_runs``, ``partial_runs``, ``violation_list``, ``checks``,
``provenance``, ``warnings``, ``mismatches``, ``reference_missing``, ``reference`` (null, or ``file``,
``name``, ``sha256``, ``tolerances_file``, ``tolerances``, ``counts`` {match, differs, missing},
``not_in_reference``, ``rows``, ``comparisons``), ``reproduction_report`` (null, or the files of the
reproduction report).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from crop.io import atomic_write_text, write_json
from crop.layout import REPLICATE_PREFIX, replicate_of, run_files, run_target
from crop.report.checks import run_checks, untestable_reason
from crop.report.integrity import check_integrity, stages_present
from crop.report.markdown import pipe_table
from crop.report.metrics import load_runs, namespaced_env, parse_run

__all__ = ["audit", "discover_runs", "discover_run_folders", "classify", "tarone_holm", "verdict_line", "STATUSES",
           "SCHEMA_VERSION"]

SCHEMA_VERSION = 4


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
          strict: bool = False) -> dict:
    """Audit ``runs`` (default: every run folder under ``results``, complete or partial) and write
    ``audit.{json,md}`` — and, with a ``reference`` (a CSV, or ``"paper"``), the reproduction report.

    ``tolerances``: a YAML/JSON tolerances file; ``abs_tol``/``rel_tol`` override both for every metric.
    Raises :class:`crop.report.reference.ReferenceError` on a malformed reference or tolerances file, before
    writing anything.
    """
    from crop.report.provenance import run_provenance
    from crop.report.reference import compare_reference, load_reference, load_tolerances, reference_summary

    results = Path(results)
    ref = load_reference(reference) if reference is not None else None
    file_tol = load_tolerances(tolerances) if tolerances is not None else None
    runs = list(runs) if runs else discover_run_folders(results)
    items, provs, integrity, warnings, sound_runs = [], [], [], [], []
    incomplete, partial = [], []
    for run in runs:
        full, absent, half = stages_present(results / run)
        if absent or half:
            incomplete.append(run)
        if not full:
            integrity.append({"run": run, "file": str(results / run),
                              "problem": "incomplete run, not audited (no result file)"})
            continue
        integrity += [{"run": run, **p} for p in half]
        problems = check_integrity(results / run, only_present=True)
        integrity += [{"run": run, **p} for p in problems]
        if problems or half:
            continue
        if absent:
            partial.append({"run": run, "stages": full, "absent": absent})
        prov, prov_problems, prov_warnings = run_provenance(results, run)
        prov["config_hash"] = config_hash
        provs.append(prov)
        integrity += prov_problems
        warnings += prov_warnings
        items += run_checks(results, run, full)
        sound_runs.append(run)
    if config_hash is None:
        warnings.append("no config hash given (standalone audit): the config the results came from is not "
                        "identified; pass --config or --config-hash")
    ref_block = None
    if ref is not None:
        data = load_runs(results, sound_runs, partial=True)
        rows = compare_reference(ref, data, file_tol, abs_tol, rel_tol, level=1 - alpha)
        ref_block = reference_summary(reference, rows, file_tol, tolerances, abs_tol, rel_tol)
    multiple = classify(items, alpha)
    violations = [i for i in items if i["status"] == "violation"]
    suspicious = sorted((i for i in items if i["status"] == "suspicious"), key=lambda i: i["p_value"])
    untestable = [i for i in items if i["status"] == "untestable"]
    mismatches = ref_block["counts"]["differs"] if ref_block else 0
    verdict = "FAIL" if violations or integrity else ("WARN" if suspicious or untestable else "PASS")
    report = {"schema_version": SCHEMA_VERSION, "results": str(results), "runs": runs, "alpha": alpha,
              "verdict": verdict,
              "reproduction": None if ref_block is None else {
                  "agree": ref_block["counts"]["match"], "differ": ref_block["counts"]["differs"],
                  "not_in_run": ref_block["counts"]["missing"], "not_in_reference": ref_block["not_in_reference"]},
              "statuses": {s: sum(i["status"] == s for i in items) for s in STATUSES},
              "multiple_testing": multiple,
              "config_hash": config_hash, "strict": bool(strict),
              "passed": verdict != "FAIL",
              "checked": len(items), "violations": len(violations), "suspicious": len(suspicious),
              "untestable": len(untestable), "suspicious_list": suspicious, "untestable_list": untestable,
              "empirical_below": sum(bool(i.get("empirical_below")) for i in items),
              "integrity_problems": len(integrity), "integrity": integrity, "incomplete_runs": incomplete,
              "partial_runs": partial, "violation_list": violations, "checks": items, "provenance": provs,
              "warnings": warnings, "mismatches": mismatches,
              "reference_missing": ref_block["counts"]["missing"] if ref_block else 0,
              "reference": ref_block, "reproduction_report": None}
    out_dir = Path(out_dir)
    if ref_block is not None:
        from crop.report.reproduction import write_reproduction

        report["reproduction_report"] = write_reproduction(ref_block, out_dir, sorted({parse_run(r)[0] for r in runs}))
    write_json(out_dir / "audit.json", report)
    atomic_write_text(out_dir / "audit.md", _markdown(report))
    return report


STATUSES = ("ok", "violation", "suspicious", "untestable")


def tarone_holm(tested: list[dict], alpha: float, p_key: str = "p_value") -> tuple[int, list[dict], list[dict]]:
    """Tarone's (1990) restriction of the family to the checks that *can* reach significance, then Holm's
    step-down over them (Hommel & Krummenauer 1998).  A check's ``min_p`` is the smallest p-value its data
    could give (every attacked return at J_min, every attacked step flipped), fixed before the attack ran.
    K is the smallest integer with #{checks: min_p ≤ α/K} ≤ K; those checks form the family, Holm at α over
    them; the others cannot reach α/K and are left out rather than diluting the correction.  The family
    depends on the sample sizes and bounds only, so the family-wise error rate stays ≤ α.
    Returns (K, family — at most K checks —, left out); sets ``_adj`` (the Holm-adjusted p) on the family."""
    mins = np.sort([float(i.get("min_p", 0.0)) for i in tested])
    ks = np.arange(1, len(mins) + 1)
    fits = np.nonzero(np.searchsorted(mins, alpha / ks, side="right") <= ks)[0]
    k = int(ks[fits[0]]) if len(fits) else len(mins)
    family = [i for i in tested if float(i.get("min_p", 0.0)) <= alpha / max(k, 1)]
    left = [i for i in tested if float(i.get("min_p", 0.0)) > alpha / max(k, 1)]
    running = 0.0
    for rank, item in enumerate(sorted(family, key=lambda i: i[p_key])):
        running = max(running, min(1.0, (len(family) - rank) * float(item[p_key])))
        item["_adj"] = running
    return k, family, left


def classify(items: list[dict], alpha: float) -> dict:
    """Give every check its ``status`` (see the module docstring, "Statuses"):

    * deterministic checks (a bound rising with ε): ``violation`` or ``ok``;
    * chance-based checks, family 1 — the whole audit (:func:`tarone_holm` over every chance-based check):
      Holm-adjusted p < α → ``violation`` (the FAIL verdict; family-wise error ≤ α for sound results);
    * family 2 — the check's own run (the same procedure over that run's chance-based checks): significant
      there but not over the audit → ``suspicious`` (WARN; raw evidence against a certificate that the whole
      audit's correction cannot confirm; per-run error ≤ α, so about α·runs false WARNs at worst);
    * a check left out of the audit's family (it could not reach significance there whatever the attack did)
      and not suspicious → ``untestable``, with ``reason`` and ``testable_with``; a LoRe tree that spent
      α ≥ 1 is always untestable.  Never counted as passed.
    Returns the ``multiple_testing`` block of audit.json."""
    tested = [i for i in items if i.get("p_value") is not None]
    for i in items:
        if i.get("p_value") is None:
            i["status"] = "violation" if i["violation"] else "ok"
    for i in tested:
        if i["check"] == "lore_vs_pgd_local" and i.get("alpha_spent", 0.0) >= 1.0:
            i["min_p"] = 1.0  # no joint certificate: nothing to test
    k, family, _ = tarone_holm(tested, alpha)
    family = {id(i) for i in family}
    for i in tested:
        i["in_audit_family"] = id(i) in family
        i["p_adjusted"] = i.pop("_adj", None) if i["in_audit_family"] else None
        i["violation"] = bool(i["in_audit_family"] and i["p_adjusted"] < alpha)
    runs: dict = {}
    for i in tested:
        runs.setdefault((i["env"], i["algo"], i["sigma"]), []).append(i)
    for group in runs.values():
        _, fam, _ = tarone_holm(group, alpha)
        fam = {id(i) for i in fam}
        for i in group:
            i["p_run"] = i.pop("_adj", None) if id(i) in fam else None
    for i in tested:
        if i["violation"]:
            i["status"] = "violation"
        elif i["p_run"] is not None and i["p_run"] < alpha:
            i["status"] = "suspicious"
        elif not i["in_audit_family"]:
            i["status"] = "untestable"
            i["reason"], i["testable_with"] = untestable_reason(i, alpha, k)
        else:
            i["status"] = "ok"
    return {"method": "tarone-holm", "tests": len(tested), "K": k, "family": len(family),
            "untestable": sum(i["status"] == "untestable" for i in tested),
            "rule": "a chance-based check is a violation when its Holm-adjusted p-value over the audit's family "
                    "(Tarone: the checks whose smallest achievable p is <= alpha/K) is below alpha; suspicious "
                    "when the same procedure over its own run's checks is below alpha; untestable when it is "
                    "outside the audit's family and not suspicious"}


def _short_seed(seed) -> str:
    """A derived seed (up to 19 digits) shortened for reading: its first 8 digits, then an ellipsis."""
    text = "—" if seed is None else str(seed)
    return text if len(text) <= 9 else text[:8] + "…"


def verdict_line(rep: dict) -> str:
    """The one line that states both verdicts apart: soundness/integrity, then reproduction."""
    st_ = rep["statuses"]
    line = (f"soundness {rep['verdict']}: {rep['checked']} checks ({st_['ok']} ok, {st_['violation']} violation, "
            f"{st_['suspicious']} suspicious, {st_['untestable']} untestable), {rep['integrity_problems']} "
            "integrity problem(s)")
    r = rep.get("reproduction")
    if r:
        line += (f"; reproduction: {r['agree']} agree / {r['differ']} differ / {r['not_in_run']} not in the run / "
                 f"{r['not_in_reference']} not in the reference")
    return line


def _raw_failures(rep: dict) -> list[dict]:
    """The checks whose attack went below the bound by less than chance allows (not violations)."""
    return [i for i in rep["checks"] if i.get("empirical_below") and i["status"] in ("ok", "untestable")]


def _md_summary(rep: dict) -> list[str]:
    """The verdicts and their counts."""
    ref = rep["reference"]
    verdict = rep["verdict"]
    why = []
    if rep["violations"]:
        why.append(f"{rep['violations']} soundness violation(s)")
    if rep["integrity_problems"]:
        why.append(f"{rep['integrity_problems']} integrity problem(s)")
    if verdict == "WARN":
        why += ([f"{rep['suspicious']} suspicious check(s) (listed first below)"] if rep["suspicious"] else []) + \
               ([f"{rep['untestable']} check(s) that could not fail (untestable: see why and what would make them "
                 "testable below)"] if rep["untestable"] else [])
    first = (f"**Soundness and integrity: {verdict}**"
             + (f": {'; '.join(why)}." if why else
                ": no attack beat a certificate beyond what chance allows, no bound rose with ε, every chance-based "
                "check could have failed, and every result file is intact."))
    r = rep.get("reproduction")
    if r:
        first += (f" **Reproduction** (a separate question: does the run agree with the reference?): {r['agree']} "
                  f"agree, {r['differ']} differ, {r['not_in_run']} not in the run, {r['not_in_reference']} not in "
                  "the reference.")
    lines = ["# CROP audit", "", first, "", f"`{verdict_line(rep)}`", "",
             f"Results folder: `{rep['results']}`; runs audited: {len(rep['runs'])}"
             + (f" ({len(rep['partial_runs'])} partial)" if rep["partial_runs"] else "")
             + f"; config hash: `{rep['config_hash'] or 'not given'}`.", "",
             "| | |", "|---|---|",
             f"| soundness checks | {rep['checked']} |",
             f"| violations (statistically incompatible with sound certificates at α = {rep['alpha']} over the "
             f"whole audit) | {rep['violations']} |",
             f"| suspicious (significant within their run's checks, not over the whole audit) | "
             f"{rep['suspicious']} |",
             f"| untestable (could not reach significance whatever the attack did; not counted as passed) | "
             f"{rep['untestable']} |",
             f"| raw failures within what chance allows (not violations) | {len(_raw_failures(rep))} |",
             f"| integrity problems | {rep['integrity_problems']} |"]
    if ref:
        c = ref["counts"]
        lines += [f"| reference values: agree / differ / not in the run / not in the reference | {c['match']} / "
                  f"{c['differs']} / {c['missing']} / {ref['not_in_reference']} |"]
    return lines


def _md_soundness(rep: dict) -> list[str]:
    """The suspicious checks, the violations and the untestable checks (why, and what would make them
    testable)."""
    lines: list[str] = []
    cols = ["env", "algo", "sigma", "eps", "check", "bound", "observed", "episodes", "steps", "expected",
            "p_value", "p_run", "p_adjusted"]
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
        lines += [pipe_table(rep["violation_list"], ["env", "algo", "sigma", "eps", "check", "bound", "observed",
                                                     "episode", "steps", "expected", "p_value", "p_adjusted"]), ""]
    else:
        lines += ["None: no attack went below a certified bound, and no certified action changed within its radius, "
                  "beyond what chance allows; no bound rose with ε.", ""]
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
    """Integrity problems and partial runs."""
    lines = ["## Integrity", ""]
    if rep["integrity"]:
        lines += [pipe_table(rep["integrity"], ["run", "file", "problem"]), ""]
    else:
        lines += ["Every result file has the sha256 recorded when it was written, and every stage used the "
                  "recorded checkpoint.", ""]
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
        lines += [pipe_table(raw, ["env", "algo", "sigma", "eps", "check", "bound", "observed", "steps", "expected",
                                   "chance", "p_value", "p_adjusted", "note"]), ""]
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
