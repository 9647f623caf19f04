"""Audit of a results folder: integrity, soundness, provenance, and agreement with a reference — with
evidence for every verdict.  Writes ``audit.json`` (machine-readable) and ``audit.md`` (for people), and with a
reference also ``reproduction.md`` and one figure per environment (:mod:`crop.report.reproduction`).

A run folder may hold any subset of the stages (a LoAct-only or GRe-only run): each check runs where its
files are there, and the reference comparison covers every value the run has.

Soundness checks, per (env, algo, σ, ε).  A *violation* is a count the audit can show is statistically
incompatible with sound certificates (see "Statuses" below); a raw failure within what chance allows is
listed (``empirical_below``) but is not a violation:

* **a bound rising with ε** (J̲_E, J̲_p, J̲): deterministic, always a violation;
* **GRe** percentile bound J̲_p above the attacked p-quantile, and expectation bound above the attacked mean:
  these bounds are about the *distribution* of returns; p-values P[Bin(n, p) ≥ #returns below J̲_p] and
  Hoeffding's exp(−2n·shortfall²/(J_max − J_min)²);
* **LoAct: a certified step whose action a local attack flipped** (``flips_certified``).  The certificate
  (Theorem 1) is for the exact smoothed policy and holds with probability ≥ 1 − α per state; the attacked
  policy is its m-sample estimate, which may take another action inside a valid radius.  If the clean
  state's bounds L(a₁) (``q_top_lower``) and max U(a) (``q_others_upper_max``) hold, Lemma 3 (σΦ⁻¹ of the
  clipped smoothed Q is 1-Lipschitz) gives, for ‖δ‖ ≤ ε, Q̃(s+δ, a₁) − Q̃(s+δ, a) ≥
  Δ = w·(Φ(Φ⁻¹(p_L) − ε/σ) − Φ(Φ⁻¹(p_U) + ε/σ)) with p = (bound − V_min)/w, w = V_max − V_min; and by
  Hoeffding (each sample of Q̃(·, a) − Q̃(·, a₁) lies in [−w, w]) the m-sample argmax is not a₁ with
  probability ≤ (|A| − 1)·exp(−m·Δ²/(2w²)) (:func:`flip_probability_bound`).  A counted flip thus has
  probability ≤ α + that bound per step.  attack_local.csv records only per-episode counts, not the attacked
  steps' margins, so the per-step chance is *estimated* on LoAct's own steps certified beyond ε (the mean of
  α + bound over them; 1 when LoAct has none: unassessed) and the count over all N attacked steps at that ε
  is tested against Bin(N, chance) — conservative in N (every attacked step counted, certified or not) and
  in the tail (a Poisson-binomial count is no more spread above its mean than the binomial of the same mean,
  Hoeffding 1956);
* **LoRe bound above the local PGD return** from LoRe's own initial state.  LoRe's bound (Theorem 4) holds
  for every trajectory of the exact smoothed policy under ‖δ‖ ≤ ε with probability ≥ 1 − α_spent (the α the
  search spent, ``lore.meta.json``); the attacked episode leaves that tree only where its m-sample action
  is one LoRe excluded.  The chance of an attacked return below the bound is ≤ α_spent + P[leave], with
  P[leave] = 1 − Π_t(1 − p_t) estimated along LoAct episode 0 (the same initial state): p_t the flip bound
  above where step t is certified beyond ε; 0 where it is not and |A| = 2 (both actions are in the tree);
  1 where it is not and |A| > 2 (the other actions' margins are not recorded), and for steps beyond LoAct
  episode 0.  That chance is the row's p-value when the return is below the bound.

Statuses (``status`` of every check; :func:`classify`): deterministic checks are ``violation`` or ``ok``.
Chance-based checks are judged in two families.  Over the whole audit, Tarone's restriction (only the checks
whose smallest achievable p-value ``min_p`` — fixed by sample size and bound before the attack ran — could
reach significance) then Holm's step-down at ``alpha``: adjusted p < alpha is a ``violation`` (family-wise
error ≤ alpha for sound results).  Within the check's own run, the same procedure: significant there but not
over the audit is ``suspicious``.  A check outside the audit's family and not suspicious is ``untestable``
(with ``reason`` and ``testable_with``), as is every LoRe check whose tree spent α ≥ 1; it is never counted
as passed.  ``verdict``: FAIL on a violation or an integrity problem, WARN on a suspicious or untestable
check, else PASS — soundness and integrity only; the reference comparison is counted apart
(``reproduction``: agree, differ, not_in_run, not_in_reference).
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

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from crop.envs import env_spec
from crop.io import atomic_write_text, meta_path, read_json, write_json
from crop.layout import REPLICATE_PREFIX, RUN_FILES, replicate_of, run_files, run_target
from crop.lore import lore_bound_at
from crop.report.integrity import check_integrity, stages_present
from crop.report.markdown import pipe_table

__all__ = ["audit", "discover_runs", "discover_run_folders", "check_integrity", "flip_probability_bound",
           "loact_flip_chance", "lore_leave_chance", "SCHEMA_VERSION"]

TOL = 1e-9
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
    from crop.report.metrics import namespaced_env

    results = Path(results)
    found = [d for d in results.glob("*/*/sigma-*") if d.is_dir()]
    found += [d for d in results.glob("*/*/*/sigma-*")
              if d.is_dir() and namespaced_env(*d.relative_to(results).parts[:2])]
    found += [r for d in found for r in d.glob(f"{REPLICATE_PREFIX}*") if r.is_dir()]
    return sorted(str(d.relative_to(results)) for d in found)


def _hoeffding_p(shortfall: float, n: int, width: float) -> float:
    """P[mean of n returns in an interval of ``width`` falls ``shortfall`` below its expectation] ≤ this."""
    if shortfall <= 0 or n == 0:
        return 1.0
    return float(math.exp(-2.0 * n * shortfall ** 2 / max(width, 1e-300) ** 2))


def _binom_p(n_below: int, n: int, p: float) -> float:
    """P[Bin(n, p) ≥ n_below]: how surprising n_below events of probability ≤ p each are among n."""
    if n_below <= 0:
        return 1.0
    return float(st.binom.sf(n_below - 1, n, min(max(p, 0.0), 1.0))) if n else 1.0


def _monotone(xs, ys) -> list[tuple[float, float, float]]:
    """(ε, bound, next bound) wherever a bound rises with ε."""
    pairs = [(x, y) for x, y in sorted(zip(xs, ys)) if not (isinstance(y, float) and math.isnan(y))]
    return [(a[0], a[1], b[1]) for a, b in zip(pairs, pairs[1:]) if b[1] > a[1] + TOL]


def flip_probability_bound(q_top_lower, q_others_upper_max, v_min: float, v_max: float, sigma: float,
                           eps: float, m: int, n_actions: int) -> np.ndarray:
    """Upper bound on P[the m-sample smoothed action at s + δ is not a₁], for every ‖δ‖₂ ≤ ε, given that the
    clean state's bounds L(a₁) = ``q_top_lower`` and max_{a≠a₁} U(a) = ``q_others_upper_max`` hold.

    Lemma 3 (Φ⁻¹ of the normalised clipped smoothed Q moves by at most ‖δ‖/σ) bounds the true gap at s + δ
    below by Δ = w·(Φ(Φ⁻¹(p_L) − ε/σ) − Φ(Φ⁻¹(p_U) + ε/σ)); Hoeffding on the m differences of clipped
    samples (each in [−w, w]) and a union over the |A| − 1 other actions give (|A| − 1)·exp(−mΔ²/(2w²)).
    Where Δ ≤ 0 (ε reaches the radius) the bound is 1."""
    w = float(v_max - v_min)
    pl = np.clip((np.asarray(q_top_lower, float) - v_min) / w, 0.0, 1.0)
    pu = np.clip((np.asarray(q_others_upper_max, float) - v_min) / w, 0.0, 1.0)
    with np.errstate(invalid="ignore"):
        gap = w * (st.norm.cdf(st.norm.ppf(pl) - eps / sigma) - st.norm.cdf(st.norm.ppf(pu) + eps / sigma))
    gap = np.where(np.isnan(gap), 0.0, np.maximum(gap, 0.0))
    return np.minimum(1.0, (n_actions - 1) * np.exp(-m * gap ** 2 / (2.0 * w ** 2)))


def _chance_inputs(d: Path, env: str) -> dict:
    """What the chance estimates need, from the run's files; missing entries are None."""
    def meta(key):
        f = meta_path(d / RUN_FILES[key])
        return read_json(f) if f.is_file() else {}

    lm, am = meta("loact"), meta("attack_local")
    q = read_json(d / RUN_FILES["qrange"]) if (d / RUN_FILES["qrange"]).is_file() else {}
    v_min = lm.get("v_min", q.get("v_min"))
    v_max = lm.get("v_max", q.get("v_max"))
    a_set = am.get("settings") or {}
    return {"steps": pd.read_csv(d / RUN_FILES["loact"]) if (d / RUN_FILES["loact"]).is_file() else None,
            "v_min": v_min, "v_max": v_max, "m": a_set.get("m"),
            "alpha": am.get("per_state_alpha", a_set.get("alpha")), "n_actions": env_spec(env).n_actions}


def _margins_ok(c: dict) -> str:
    """Why the chance of a flip cannot be estimated ('' when it can)."""
    if c["steps"] is None:
        return "no loact.csv: no recorded margins"
    if not {"q_top_lower", "q_others_upper_max"} <= set(c["steps"].columns):
        return "loact.csv lacks q_top_lower / q_others_upper_max"
    if c["v_min"] is None or c["v_max"] is None or not c["v_max"] > c["v_min"]:
        return "no V range recorded"
    if c["m"] is None or c["alpha"] is None:
        return "attack_local.meta.json lacks the attack's m or alpha"
    return ""


def _step_flip_bounds(c: dict, sigma: float, eps: float, steps: pd.DataFrame) -> np.ndarray:
    return flip_probability_bound(steps["q_top_lower"], steps["q_others_upper_max"], c["v_min"], c["v_max"],
                                  sigma, eps, int(c["m"]), c["n_actions"])


def loact_flip_chance(c: dict, sigma: float, eps: float) -> tuple[float, str]:
    """(per-step chance of a counted flip at ε, note): the mean of α + :func:`flip_probability_bound` over
    LoAct's steps certified beyond ε; 1 when it cannot be estimated."""
    why = _margins_ok(c)
    if why:
        return 1.0, f"unassessed ({why})"
    s = c["steps"]
    beyond = s[s["certified"].astype(bool) & (s["radius"] > eps)]
    if beyond.empty:
        return 1.0, "unassessed (no LoAct step certified beyond this eps)"
    p = np.minimum(1.0, float(c["alpha"]) + _step_flip_bounds(c, sigma, eps, beyond))
    return float(p.mean()), f"estimated on {len(beyond)} LoAct steps certified beyond eps"


def lore_leave_chance(c: dict, sigma: float, eps: float, horizon: int) -> tuple[float, str]:
    """(P[the attacked episode leaves LoRe's tree] estimated along LoAct episode 0's first ``horizon``
    steps, note); see the module docstring."""
    why = _margins_ok(c)
    if why:
        return 1.0, f"unassessed ({why})"
    s = c["steps"]
    ep0 = s[s["episode"] == s["episode"].min()].sort_values("step").head(horizon)
    if len(ep0) < horizon:
        return 1.0, f"LoAct episode 0 has {len(ep0)} < {horizon} steps"
    beyond = ep0["certified"].astype(bool).to_numpy() & (ep0["radius"].to_numpy(float) > eps)
    p = np.where(beyond, _step_flip_bounds(c, sigma, eps, ep0), 0.0 if c["n_actions"] == 2 else 1.0)
    return float(1.0 - np.prod(1.0 - p)), f"estimated along LoAct episode 0 ({horizon} steps)"


def _lore_alpha(lmeta: dict) -> float:
    """The α LoRe's search spent (union over its smoothed states); 1 when not recorded."""
    search = lmeta.get("search") or {}
    if search.get("alpha_spent") is not None:
        return float(search["alpha_spent"])
    a, n = (lmeta.get("settings") or {}).get("alpha"), search.get("distinct_states_smoothed")
    return float(a) * int(n) if a is not None and n is not None else 1.0


def _env_of(run: str) -> str:
    from crop.report.metrics import parse_run

    return parse_run(run)[0]


def _audit_run(results: Path, run: str, alpha: float, stages: list[str]) -> tuple[list[dict], int]:
    from crop.report.metrics import parse_run

    d = results / run
    env, algo, lab = parse_run(run)
    sigma = float(lab)
    key = {"env": env, "algo": algo, "sigma": sigma}
    if replicate_of(run):
        key["replicate"] = replicate_of(run)
    items, checked = [], 0

    def add(kind, eps, bound, observed, violation, **extra):
        nonlocal checked
        checked += 1
        items.append({**key, "check": kind, "eps": eps, "bound": bound, "observed": observed,
                      "violation": bool(violation), **extra})

    gre = pd.read_csv(d / RUN_FILES["gre"]) if "gre" in stages else None
    if gre is not None and "attack_global" in stages:
        ag = pd.read_csv(d / RUN_FILES["attack_global"])
        for eps, g in ag.groupby("eps"):
            rows = gre[np.isclose(gre["eps"], eps)]
            if rows.empty:
                continue
            ret = g["return"].to_numpy()
            eb = float(rows["expectation_bound"].iloc[0])
            width = float(rows["j_max"].iloc[0] - rows["j_min"].iloc[0])
            j_min = float(rows["j_min"].iloc[0])
            pv = _hoeffding_p(eb - ret.mean(), len(ret), width)
            add("gre_expectation_vs_pgd_mean", float(eps), eb, float(ret.mean()), pv < alpha,
                empirical_below=bool(ret.mean() < eb - TOL), episodes=len(ret), p_value=pv,
                min_p=_hoeffding_p(eb - j_min, len(ret), width), shortfall_max=eb - j_min, width=width)
            for _, r in rows.iterrows():
                if not bool(r["percentile_certified"]):
                    continue
                pb, p = float(r["percentile_bound"]), float(r["p"])
                q = float(np.quantile(ret, p, method="inverted_cdf"))
                below = int((ret < pb - TOL).sum())
                pv = _binom_p(below, len(ret), p)
                add(f"gre_percentile_p{p:g}_vs_pgd", float(eps), pb, q, pv < alpha,
                    empirical_below=bool(q < pb - TOL), attacked_below=below, episodes=len(ret), p_value=pv,
                    min_p=_binom_p(len(ret), len(ret), p) if pb > j_min + TOL else 1.0, p=p)
    if gre is not None:
        for p, g in gre.groupby("p"):
            for eps, b, nb in _monotone(g["eps"], g["percentile_bound"].astype(float)):
                add(f"gre_percentile_p{p:g}_monotone", eps, b, nb, True)
        for eps, b, nb in _monotone(gre["eps"], gre["expectation_bound"]):
            add("gre_expectation_monotone", eps, b, nb, True)

    al = pd.read_csv(d / RUN_FILES["attack_local"]) if "attack_local" in stages else None
    chance = _chance_inputs(d, env) if al is not None else None
    if "lore" in stages:
        lore = pd.read_csv(d / RUN_FILES["lore"])
        lmeta = read_json(meta_path(d / RUN_FILES["lore"])) if meta_path(d / RUN_FILES["lore"]).is_file() else {}
        valid_until = (lmeta.get("search") or {}).get("valid_until_eps")
        valid_until = math.inf if valid_until is None else float(valid_until)
        if al is not None:
            a_lore = _lore_alpha(lmeta)
            for _, r in al[al["same_start_as_lore"].astype(bool)].iterrows():
                eps = float(r["eps"])
                b = lore_bound_at(lore, eps, valid_until)
                if math.isnan(b):
                    continue
                below = float(r["return"]) < b - TOL
                leave, note = lore_leave_chance(chance, sigma, eps, int(r["steps"]))
                allowed = min(1.0, a_lore + leave)
                pv = allowed if below else 1.0
                add("lore_vs_pgd_local", eps, b, float(r["return"]), pv < alpha, empirical_below=below,
                    episode=int(r["episode"]), p_value=pv, chance=allowed, alpha_spent=a_lore, p_leave=leave,
                    note=note, min_p=allowed)
        for eps, b, nb in _monotone(lore["eps"], lore["lower_bound"]):
            add("lore_monotone", eps, b, nb, True)
    if al is not None:
        for eps, g in al.groupby("eps"):
            flips, n = int(g["flips_certified"].sum()), int(g["steps"].sum())
            per_step, note = loact_flip_chance(chance, sigma, float(eps))
            pv = _binom_p(flips, n, per_step)
            add("loact_certified_steps_not_flipped", float(eps), 0, flips, pv < alpha, empirical_below=flips > 0,
                episodes=len(g), steps=n, chance=per_step, expected=n * per_step, p_value=pv, note=note,
                min_p=_binom_p(n, n, per_step) if n else 1.0)
    return items, checked


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
    from crop.report.reference import (
        compare_reference,
        load_partial_runs,
        load_reference,
        load_tolerances,
        reference_summary,
    )

    results = Path(results)
    ref = load_reference(reference) if reference is not None else None
    file_tol = load_tolerances(tolerances) if tolerances is not None else None
    runs = list(runs) if runs else discover_run_folders(results)
    items, checked, provs, integrity, warnings, sound_runs = [], 0, [], [], [], []
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
        it, n = _audit_run(results, run, alpha, full)
        items += it
        checked += n
        sound_runs.append(run)
    if config_hash is None:
        warnings.append("no config hash given (standalone audit): the config the results came from is not "
                        "identified; pass --config or --config-hash")
    ref_block = None
    if ref is not None:
        data = load_partial_runs(results, sound_runs)
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
              "checked": checked, "violations": len(violations), "suspicious": len(suspicious),
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

        report["reproduction_report"] = write_reproduction(ref_block, out_dir, sorted({_env_of(r) for r in runs}))
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


def _untestable_reason(item: dict, alpha: float, k: int) -> tuple[str, str]:
    """(why a check cannot reach significance in a family of k, what would make it testable)."""
    level = alpha / max(k, 1)
    c = item["check"]
    if c == "lore_vs_pgd_local" and item.get("alpha_spent", 0.0) >= 1.0:
        return (f"LoRe's tree spent α = {item['alpha_spent']:.3g} ≥ 1: its bound has no joint meaning",
                "alpha_mode: family (the whole tree at α)")
    if c == "lore_vs_pgd_local":
        return (f"a single attacked return: smallest p = α spent + P[leave] = {item['min_p']:.3g} > α/K = "
                f"{level:.3g}", "alpha_mode: family or a smaller alpha for LoRe; more LoAct margins beyond ε")
    if c == "gre_expectation_vs_pgd_mean":
        if not item["shortfall_max"] > 0:
            return "the bound is at or below J_min: no attacked mean can fall below it", "a tighter bound"
        need = math.ceil(math.log(1 / level) * item["width"] ** 2 / (2 * max(item["shortfall_max"], 1e-300) ** 2))
        return (f"{item['episodes']} attacked episodes: smallest p {item['min_p']:.3g} > α/K = {level:.3g}",
                f"attack.global_episodes ≥ {need}")
    if c.startswith("gre_percentile"):
        p = float(item.get("p", 0.5))
        if item["min_p"] >= 1.0:
            return "the bound is at J_min: no return can fall below it", "a tighter bound (more GRe samples)"
        need = math.ceil(math.log(level) / math.log(p))
        return (f"{item['episodes']} attacked episodes: smallest p = p^n = {item['min_p']:.3g} > α/K = "
                f"{level:.3g}", f"attack.global_episodes ≥ {need}")
    if c == "loact_certified_steps_not_flipped":
        note = item.get("note") or ""
        if item.get("chance", 1.0) >= 1.0:
            return note or "the chance of a flip could not be estimated", "LoAct steps certified beyond this ε"
        return (f"{item.get('steps')} attacked steps: smallest p {item['min_p']:.3g} > α/K = {level:.3g}",
                "attack.local_episodes larger")
    return f"smallest p {item['min_p']:.3g} > α/K = {level:.3g}", ""


def classify(items: list[dict], alpha: float) -> dict:
    """Give every check its ``status`` (see the module docstring, "Families"):

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
            i["reason"], i["testable_with"] = _untestable_reason(i, alpha, k)
        else:
            i["status"] = "ok"
    return {"method": "tarone-holm", "tests": len(tested), "K": k, "family": len(family),
            "untestable": sum(i["status"] == "untestable" for i in tested),
            "rule": "a chance-based check is a violation when its Holm-adjusted p-value over the audit's family "
                    "(Tarone: the checks whose smallest achievable p is <= alpha/K) is below alpha; suspicious "
                    "when the same procedure over its own run's checks is below alpha; untestable when it is "
                    "outside the audit's family and not suspicious"}


def holm(items: list[dict], alpha: float) -> int:
    """Holm's step-down correction over every chance-based check (those with a ``p_value``): an audit runs
    hundreds of them, so a per-check level α would flag valid certificates by chance alone (with 400 checks,
    about 20 at α = 0.05 if their p-values were uniform).  Sets ``p_adjusted`` and ``violation`` (adjusted
    p < α) on those items, leaves the deterministic checks (a bound rising with ε) as they are; returns the
    number of chance-based checks.  The family-wise error rate — P[any valid certificate is called a
    violation] — is then ≤ α."""
    tested = sorted((i for i in items if i.get("p_value") is not None), key=lambda i: i["p_value"])
    n, running = len(tested), 0.0
    for rank, item in enumerate(tested):
        running = max(running, min(1.0, (n - rank) * float(item["p_value"])))
        item["p_adjusted"] = running
        item["violation"] = running < alpha
    return n


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


def _markdown(rep: dict) -> str:
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
             f"| raw failures within what chance allows (not violations) | "
             f"{sum(1 for i in rep['checks'] if i.get('empirical_below') and i['status'] in ('ok', 'untestable'))} |",
             f"| integrity problems | {rep['integrity_problems']} |"]
    if ref:
        c = ref["counts"]
        lines += [f"| reference values: agree / differ / not in the run / not in the reference | {c['match']} / "
                  f"{c['differs']} / {c['missing']} / {ref['not_in_reference']} |"]
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
    lines += ["## Integrity", ""]
    if rep["integrity"]:
        lines += [pipe_table(rep["integrity"], ["run", "file", "problem"]), ""]
    else:
        lines += ["Every result file has the sha256 recorded when it was written, and every stage used the "
                  "recorded checkpoint.", ""]
    if rep["partial_runs"]:
        lines += ["## Partial runs", "", "Audited for the stages they have (not an integrity problem):", ""]
        lines += [pipe_table([{"run": p["run"], "stages": ", ".join(p["stages"]), "absent": ", ".join(p["absent"])}
                              for p in rep["partial_runs"]]), ""]
    if ref:
        lines += ["## Reference comparison", "",
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
    raw = [i for i in rep["checks"] if i.get("empirical_below") and i["status"] in ("ok", "untestable")]
    lines += ["## Chance", "",
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
    if rep["provenance"]:
        lines += ["## Provenance", ""]
        rows = [{"env": p["env"], "algo": p["algo"], "sigma": p["sigma"],
                 "checkpoint": (p["checkpoint_sha256"] or "—")[:12], "source": p["checkpoint_source"] or "—",
                 "verified": p["checkpoint"].get("file_verified"),
                 "commit": ", ".join(c[:12] for c in p["git_commits"]),
                 "device": p["device"], "runtime_s": p["runtime_total_s"], "finished_utc": p["finished_utc"]}
                for p in rep["provenance"]]
        lines += [pipe_table(rows), ""]
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
    return "\n".join(lines)
