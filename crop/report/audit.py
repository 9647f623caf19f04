"""Audit of a results folder: integrity, soundness, provenance, and agreement with a reference — with
evidence for every verdict.  Writes ``audit.json`` (machine-readable) and ``audit.md`` (for people).

Soundness checks (a *violation* is evidence against a certificate), per (env, algo, σ, ε):
  * LoRe bound above the return of the local PGD attack started from the same initial state (LoRe's bound
    is absolute: any such return is a violation);
  * LoAct: the attacked smoothed policy changed its action at a step whose certified radius exceeded ε;
  * a bound (J̲_E, J̲_p, J̲) that rises with ε;
  * GRe percentile bound J̲_p above the attacked p-quantile, and GRe expectation bound above the attacked
    mean, at the same ε.  These bounds are about the *distribution* of returns, and a few attacked episodes
    can fall below a valid bound by chance; so each GRe row records the raw comparison
    (``empirical_below``) and a test of the bound against the attacked returns — the one-sided binomial
    p-value P[Bin(n, p) ≥ #returns below J̲_p] for the percentile bound, Hoeffding's
    exp(−2n·shortfall²/(J_max − J_min)²) for the expectation bound — and counts as a violation when that
    p-value is below the audit's ``alpha``.
Integrity: every result file's sha256 must match the one recorded in its ``.meta.json`` (a truncated
or edited file is reported, not silently used); every stage must have used the checkpoint recorded in
``model.json`` (and ``model.pt``, when present, must still have that hash); a run folder missing result
files is reported as incomplete.
Provenance (:mod:`crop.report.provenance`): per run the checkpoint sha256 and source, commits, package
versions, seeds, devices and runtimes, and the hash of the workflow config the audit ran under.
Reference (:mod:`crop.report.reference`): each value of a reference table gets a verdict match / differs /
missing within per-metric tolerances.

``passed`` is true when there is no violation, no integrity problem and no reference value that differs;
``crop audit --strict`` exits with status 1 otherwise.  Reference values the results folder does not have
(``missing``) are listed and counted but do not fail the audit: a reference usually covers more settings
than one run.

audit.json keys: ``schema_version``, ``results``, ``runs``, ``alpha``, ``config_hash``, ``strict``,
``passed``, ``checked``, ``violations``, ``empirical_below``, ``integrity_problems``, ``integrity``,
``incomplete_runs``, ``violation_list``, ``checks``, ``provenance``, ``warnings``, ``mismatches``,
``reference_missing``, ``reference`` (null, or ``file``, ``sha256``, ``tolerances_file``, ``tolerances``,
``counts`` {match, differs, missing}, ``rows``, ``comparisons``).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from crop.io import atomic_write_text, meta_path, read_json, sha256_file, write_json
from crop.layout import RUN_FILES
from crop.report.integrity import check_integrity
from crop.lore import lore_bound_at

__all__ = ["audit", "discover_runs", "check_integrity", "SCHEMA_VERSION"]

TOL = 1e-9
SCHEMA_VERSION = 2


def discover_runs(results: Path, incomplete: bool = False) -> list[str]:
    """``ENV/ALGO/sigma-S`` folders under ``results`` holding every result file (or, with ``incomplete``,
    those missing some)."""
    runs = []
    for d in sorted(Path(results).glob("*/*/sigma-*")):
        if d.is_dir() and all((d / f).is_file() for f in RUN_FILES.values()) != incomplete:
            runs.append(str(d.relative_to(results)))
    return runs


def _hoeffding_p(shortfall: float, n: int, width: float) -> float:
    """P[mean of n returns in an interval of ``width`` falls ``shortfall`` below its expectation] ≤ this."""
    if shortfall <= 0 or n == 0:
        return 1.0
    return float(math.exp(-2.0 * n * shortfall ** 2 / max(width, 1e-300) ** 2))


def _binom_p(n_below: int, n: int, p: float) -> float:
    """P[Bin(n, p) ≥ n_below]: how surprising n_below attacked returns under a valid p-th percentile bound are."""
    return float(st.binom.sf(n_below - 1, n, p)) if n else 1.0


def _monotone(xs, ys) -> list[tuple[float, float, float]]:
    """(ε, bound, next bound) wherever a bound rises with ε."""
    pairs = [(x, y) for x, y in sorted(zip(xs, ys)) if not (isinstance(y, float) and math.isnan(y))]
    return [(a[0], a[1], b[1]) for a, b in zip(pairs, pairs[1:]) if b[1] > a[1] + TOL]


def _audit_run(results: Path, run: str, alpha: float) -> tuple[list[dict], int]:
    d = results / run
    env, algo, sig = Path(run).parts
    key = {"env": env, "algo": algo, "sigma": float(sig[len("sigma-"):])}
    items, checked = [], 0

    def add(kind, eps, bound, observed, violation, **extra):
        nonlocal checked
        checked += 1
        items.append({**key, "check": kind, "eps": eps, "bound": bound, "observed": observed,
                      "violation": bool(violation), **extra})

    gre = pd.read_csv(d / RUN_FILES["gre"])
    ag = pd.read_csv(d / RUN_FILES["attack_global"])
    for eps, g in ag.groupby("eps"):
        rows = gre[np.isclose(gre["eps"], eps)]
        if rows.empty:
            continue
        ret = g["return"].to_numpy()
        eb = float(rows["expectation_bound"].iloc[0])
        width = float(rows["j_max"].iloc[0] - rows["j_min"].iloc[0])
        pv = _hoeffding_p(eb - ret.mean(), len(ret), width)
        add("gre_expectation_vs_pgd_mean", float(eps), eb, float(ret.mean()), pv < alpha,
            empirical_below=bool(ret.mean() < eb - TOL), episodes=len(ret), p_value=pv)
        for _, r in rows.iterrows():
            if not bool(r["percentile_certified"]):
                continue
            pb, p = float(r["percentile_bound"]), float(r["p"])
            q = float(np.quantile(ret, p, method="inverted_cdf"))
            below = int((ret < pb - TOL).sum())
            pv = _binom_p(below, len(ret), p)
            add(f"gre_percentile_p{p:g}_vs_pgd", float(eps), pb, q, pv < alpha,
                empirical_below=bool(q < pb - TOL), attacked_below=below, episodes=len(ret), p_value=pv)
    for p, g in gre.groupby("p"):
        for eps, b, nb in _monotone(g["eps"], g["percentile_bound"].astype(float)):
            add(f"gre_percentile_p{p:g}_monotone", eps, b, nb, True)
    for eps, b, nb in _monotone(gre["eps"], gre["expectation_bound"]):
        add("gre_expectation_monotone", eps, b, nb, True)

    lore = pd.read_csv(d / RUN_FILES["lore"])
    lmeta = read_json(meta_path(d / RUN_FILES["lore"])) if meta_path(d / RUN_FILES["lore"]).is_file() else {}
    valid_until = (lmeta.get("search") or {}).get("valid_until_eps")
    valid_until = math.inf if valid_until is None else float(valid_until)
    al = pd.read_csv(d / RUN_FILES["attack_local"])
    same = al[al["same_start_as_lore"].astype(bool)]
    for _, r in same.iterrows():
        b = lore_bound_at(lore, float(r["eps"]), valid_until)
        if math.isnan(b):
            continue
        add("lore_vs_pgd_local", float(r["eps"]), b, float(r["return"]), float(r["return"]) < b - TOL,
            episode=int(r["episode"]))
    for eps, b, nb in _monotone(lore["eps"], lore["lower_bound"]):
        add("lore_monotone", eps, b, nb, True)
    for _, r in al.iterrows():
        add("loact_certified_steps_not_flipped", float(r["eps"]), 0, int(r["flips_certified"]),
            int(r["flips_certified"]) > 0, episode=int(r["episode"]))
    return items, checked


def audit(results: Path, out_dir: Path, runs=None, alpha: float = 0.05, *, reference=None, tolerances=None,
          abs_tol: float | None = None, rel_tol: float | None = None, config_hash: str | None = None,
          strict: bool = False) -> dict:
    """Audit ``runs`` (default: every run folder under ``results``) and write ``audit.{json,md}``.

    ``reference``: a reference CSV (see :mod:`crop.report.reference`); ``tolerances``: a YAML/JSON
    tolerances file; ``abs_tol``/``rel_tol`` override both for every metric.  Raises
    :class:`crop.report.reference.ReferenceError` on a malformed reference or tolerances file, before
    writing anything.
    """
    from crop.report.metrics import load_runs
    from crop.report.provenance import run_provenance
    from crop.report.reference import compare_reference, load_reference, load_tolerances, reference_summary

    results = Path(results)
    ref = load_reference(reference) if reference is not None else None
    file_tol = load_tolerances(tolerances) if tolerances is not None else None
    incomplete = [] if runs else discover_runs(results, incomplete=True)
    runs = list(runs) if runs else discover_runs(results)
    items, checked, provs, integrity, warnings, sound_runs = [], 0, [], [], [], []
    for run in incomplete:
        missing = [f for f in RUN_FILES.values() if not (results / run / f).is_file()]
        integrity.append({"run": run, "file": str(results / run),
                          "problem": f"incomplete run, not audited (missing {', '.join(missing)})"})
    for run in runs:
        problems = check_integrity(results / run)
        integrity += [{"run": run, **p} for p in problems]
        if problems:
            continue
        prov, prov_problems, prov_warnings = run_provenance(results, run)
        prov["config_hash"] = config_hash
        provs.append(prov)
        integrity += prov_problems
        warnings += prov_warnings
        it, n = _audit_run(results, run, alpha)
        items += it
        checked += n
        sound_runs.append(run)
    if config_hash is None:
        warnings.append("no config hash given (standalone audit): the config the results came from is not "
                        "identified; pass --config or --config-hash")
    ref_block = None
    if ref is not None:
        data = load_runs(results, sound_runs)
        rows = compare_reference(ref, data, file_tol, abs_tol, rel_tol)
        ref_block = reference_summary(reference, rows, file_tol, tolerances, abs_tol, rel_tol)
    violations = [i for i in items if i["violation"]]
    mismatches = ref_block["counts"]["differs"] if ref_block else 0
    report = {"schema_version": SCHEMA_VERSION, "results": str(results), "runs": runs, "alpha": alpha,
              "config_hash": config_hash, "strict": bool(strict),
              "passed": not violations and not integrity and not mismatches,
              "checked": checked, "violations": len(violations),
              "empirical_below": sum(bool(i.get("empirical_below")) for i in items),
              "integrity_problems": len(integrity), "integrity": integrity, "incomplete_runs": incomplete,
              "violation_list": violations, "checks": items, "provenance": provs, "warnings": warnings,
              "mismatches": mismatches,
              "reference_missing": ref_block["counts"]["missing"] if ref_block else 0,
              "reference": ref_block}
    out_dir = Path(out_dir)
    write_json(out_dir / "audit.json", report)
    atomic_write_text(out_dir / "audit.md", _markdown(report))
    return report


def _md_table(rows, columns=None, limit: int | None = None) -> list[str]:
    df = pd.DataFrame(rows)
    if columns:
        df = df[[c for c in columns if c in df.columns]]
    more = []
    if limit is not None and len(df) > limit:
        more = [f"", f"… and {len(df) - limit} more rows (all in audit.json)."]
        df = df.head(limit)
    return [df.to_markdown(index=False, floatfmt=".6g", missingval="—"), *more, ""]


def _markdown(rep: dict) -> str:
    ref = rep["reference"]
    verdict = "PASS" if rep["passed"] else "FAIL"
    why = []
    if rep["violations"]:
        why.append(f"{rep['violations']} soundness violation(s)")
    if rep["integrity_problems"]:
        why.append(f"{rep['integrity_problems']} integrity problem(s)")
    if rep["mismatches"]:
        why.append(f"{rep['mismatches']} reference value(s) outside tolerance")
    lines = ["# CROP audit", "",
             f"**{verdict}**" + (f": {'; '.join(why)}." if why else
                                 ": no attack beat a certificate, no bound rose with ε, every result file is "
                                 "intact" + (", and every reproduced reference value is within tolerance."
                                             if ref else ".")), "",
             f"Results folder: `{rep['results']}`; runs audited: {len(rep['runs'])}; "
             f"config hash: `{rep['config_hash'] or 'not given'}`.", "",
             "| | |", "|---|---|",
             f"| soundness checks | {rep['checked']} |",
             f"| violations | {rep['violations']} |",
             f"| attacked statistic below a GRe bound, not significant at α = {rep['alpha']} | "
             f"{rep['empirical_below']} |",
             f"| integrity problems | {rep['integrity_problems']} |"]
    if ref:
        c = ref["counts"]
        lines += [f"| reference values: match / differs / missing | {c['match']} / {c['differs']} / {c['missing']} |"]
    lines += ["", "## Soundness violations", ""]
    if rep["violation_list"]:
        lines += ["Each row: the check, where, the certified bound, what the attack observed.", ""]
        lines += _md_table(rep["violation_list"], ["env", "algo", "sigma", "eps", "check", "bound", "observed",
                                                   "episode", "p_value"])
    else:
        lines += ["None: no attack went below a certified bound, no certified action changed within its radius, "
                  "and no bound rose with ε.", ""]
    lines += ["## Integrity", ""]
    if rep["integrity"]:
        lines += _md_table(rep["integrity"], ["run", "file", "problem"])
    else:
        lines += ["Every result file has the sha256 recorded when it was written, and every stage used the "
                  "recorded checkpoint.", ""]
    if ref:
        lines += ["## Reference comparison", "",
                  f"Reference `{ref['file']}` (sha256 `{ref['sha256'][:16]}…`), tolerances "
                  f"{'from `' + ref['tolerances_file'] + '`' if ref['tolerances_file'] else 'built in'}: a "
                  "value matches when |reproduced − reference| ≤ max(abs, rel·|reference|).", ""]
        if ref["tolerances"]:
            lines += _md_table([{"metric": m, **t} for m, t in ref["tolerances"].items()])
        cols = ["env", "algo", "sigma", "metric", "eps", "reference", "reproduced", "delta", "allowed", "verdict",
                "note"]
        for verdict_name, title in (("differs", "Differs"), ("missing", "Missing from these results"),
                                    ("match", "Match")):
            rows = [r for r in ref["comparisons"] if r["verdict"] == verdict_name]
            if rows:
                lines += [f"### {title} ({len(rows)})", ""]
                lines += _md_table(rows, cols, limit=200)
    below = [i for i in rep["checks"] if i.get("empirical_below") and not i["violation"]]
    if below:
        lines += ["## Below a GRe bound, not significant", "",
                  f"A distributional bound can be undercut by a few attacked episodes by chance; these rows were "
                  f"not significant at α = {rep['alpha']} (p-value of the one-sided test).", ""]
        lines += _md_table(below, ["env", "algo", "sigma", "eps", "check", "bound", "observed", "episodes",
                                   "p_value"])
    if rep["checks"]:
        df = pd.DataFrame(rep["checks"])
        summary = df.groupby(["env", "algo", "sigma", "check"]).agg(checked=("violation", "size"),
                                                                     violations=("violation", "sum"))
        lines += ["## Checks per run", "", summary.reset_index().to_markdown(index=False), ""]
    if rep["provenance"]:
        lines += ["## Provenance", ""]
        rows = [{"env": p["env"], "algo": p["algo"], "sigma": p["sigma"],
                 "checkpoint": (p["checkpoint_sha256"] or "—")[:12], "source": p["checkpoint_source"] or "—",
                 "verified": p["checkpoint"].get("file_verified"), "commit": ", ".join(c[:12] for c in p["git_commits"]),
                 "device": p["device"], "runtime_s": p["runtime_total_s"], "finished_utc": p["finished_utc"]}
                for p in rep["provenance"]]
        lines += _md_table(rows)
        stages = sorted({s for p in rep["provenance"] for s in p["runtime_s"]})
        lines += ["Runtime per stage (s):", ""]
        lines += _md_table([{"run": p["run"], **{s: p["runtime_s"].get(s) for s in stages}}
                            for p in rep["provenance"]])
        lines += ["Seed per stage (derived from the config's seed and the run's labels):", ""]
        lines += _md_table([{"run": p["run"], **{s: str(p["seeds"].get(s)) for s in stages}}
                            for p in rep["provenance"]])
        versions = {k: v for p in rep["provenance"] for k, v in (p["versions"] or {}).items()}
        if versions:
            lines += ["Package versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())), ""]
    if rep["warnings"]:
        lines += ["## Warnings", ""] + [f"- {w}" for w in rep["warnings"]] + [""]
    return "\n".join(lines)
