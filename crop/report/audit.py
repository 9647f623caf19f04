"""Audit of a results folder: integrity, soundness and provenance, with evidence.

Soundness checks (a *violation* is evidence against a certificate):
  * LoRe bound above the return of the local PGD attack started from the same initial state (LoRe's bound
    is absolute: any such return is a violation);
  * LoAct: the attacked smoothed policy changed its action at a step whose certified radius exceeded ε;
  * a bound that rises with ε;
  * GRe percentile bound J̲_p above the attacked p-quantile, and GRe expectation bound above the attacked
    mean, at the same ε.  These bounds are about the *distribution* of returns, and a few attacked episodes
    can fall below a valid bound by chance; so each GRe row records the raw comparison
    (``empirical_below``) and a test of the bound against the attacked returns — the one-sided binomial
    p-value P[Bin(n, p) ≥ #returns below J̲_p] for the percentile bound, Hoeffding's
    exp(−2n·shortfall²/(J_max − J_min)²) for the expectation bound — and counts as a violation when that
    p-value is below the audit's ``alpha``.
Integrity: every result file's sha256 must match the one recorded in its ``.meta.json`` (a truncated
or edited file is reported, not silently used).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from crop.io import meta_path, read_json, sha256_file, write_json, atomic_write_text
from crop.layout import RUN_FILES
from crop.lore import lore_bound_at

__all__ = ["audit", "discover_runs", "check_integrity"]

TOL = 1e-9


def discover_runs(results: Path) -> list[str]:
    runs = []
    for d in sorted(Path(results).glob("*/*/sigma-*")):
        if d.is_dir() and all((d / f).is_file() for f in RUN_FILES.values()):
            runs.append(str(d.relative_to(results)))
    return runs


def check_integrity(run_dir: Path) -> list[dict]:
    """Files whose content no longer matches the hash recorded when they were written."""
    problems = []
    for name in RUN_FILES.values():
        f = run_dir / name
        if not f.is_file():
            problems.append({"file": str(f), "problem": "missing"})
            continue
        if name.endswith(".json"):
            try:
                read_json(f)
            except ValueError as exc:
                problems.append({"file": str(f), "problem": f"unreadable JSON: {exc}"})
            continue
        m = meta_path(f)
        if not m.is_file():
            problems.append({"file": str(f), "problem": "no provenance file"})
            continue
        rec = read_json(m).get("output", {})
        if rec.get("sha256") != sha256_file(f):
            problems.append({"file": str(f), "problem": "sha256 differs from the one recorded at write time "
                                                         "(truncated or modified)"})
    return problems


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


def _audit_run(results: Path, run: str, alpha: float) -> tuple[list[dict], int, dict]:
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

    q = read_json(d / RUN_FILES["qrange"])
    prov = {**key, "checkpoint_sha256": q.get("checkpoint_sha256"),
            "git_commit": (q.get("provenance") or {}).get("git_commit"),
            "versions": (q.get("provenance") or {}).get("versions"),
            "seeds": {}, "runtime_s": {}, "device": (q.get("provenance") or {}).get("device")}
    for name, f in RUN_FILES.items():
        m = meta_path(d / f) if not f.endswith(".json") else None
        if m is not None and m.is_file():
            mm = read_json(m)
            prov["seeds"][name] = mm.get("seed")
            prov["runtime_s"][name] = mm.get("runtime_s")
    return items, checked, prov


def audit(results: Path, out_dir: Path, runs=None, alpha: float = 0.05) -> dict:
    results = Path(results)
    runs = list(runs) if runs else discover_runs(results)
    items, checked, provs, integrity = [], 0, [], []
    for run in runs:
        problems = check_integrity(results / run)
        integrity += [{"run": run, **p} for p in problems]
        if problems:
            continue
        it, n, prov = _audit_run(results, run, alpha)
        items += it
        checked += n
        provs.append(prov)
    violations = [i for i in items if i["violation"]]
    report = {"results": str(results), "runs": runs, "alpha": alpha, "checked": checked,
              "violations": len(violations),
              "empirical_below": sum(bool(i.get("empirical_below")) for i in items),
              "integrity_problems": len(integrity), "integrity": integrity,
              "violation_list": violations, "checks": items, "provenance": provs}
    out_dir = Path(out_dir)
    write_json(out_dir / "audit.json", report)
    atomic_write_text(out_dir / "audit.md", _markdown(report))
    return report


def _markdown(rep: dict) -> str:
    lines = ["# CROP audit", "", f"Results folder: `{rep['results']}`; runs audited: {len(rep['runs'])}.", "",
             f"- soundness checks: **{rep['checked']}**", f"- violations: **{rep['violations']}**",
             f"- GRe rows where the attacked statistic fell below the bound without significance at "
             f"α = {rep['alpha']} (chance with few attacked episodes, listed below): "
             f"**{rep['empirical_below']}**",
             f"- integrity problems: **{rep['integrity_problems']}**", ""]
    if rep["integrity"]:
        lines += ["## Integrity problems", "", pd.DataFrame(rep["integrity"]).to_markdown(index=False), ""]
    lines += ["## Violations", ""]
    if rep["violation_list"]:
        lines += [pd.DataFrame(rep["violation_list"]).to_markdown(index=False), ""]
    else:
        lines += ["None: no attack went below a certified bound, and no bound rose with ε.", ""]
    below = [i for i in rep["checks"] if i.get("empirical_below") and not i["violation"]]
    if below:
        lines += ["## Below the bound, not significant", "", pd.DataFrame(below).to_markdown(index=False), ""]
    if rep["checks"]:
        df = pd.DataFrame(rep["checks"])
        summary = df.groupby(["env", "algo", "sigma", "check"]).agg(checked=("violation", "size"),
                                                                     violations=("violation", "sum"))
        lines += ["## Checks per run", "", summary.reset_index().to_markdown(index=False), ""]
    if rep["provenance"]:
        lines += ["## Provenance", ""]
        for p in rep["provenance"]:
            lines.append(f"- {p['env']} / {p['algo']} / σ={p['sigma']}: checkpoint sha256 `{p['checkpoint_sha256']}`, "
                         f"commit `{p['git_commit']}`, device {p['device']}")
        lines.append("")
    return "\n".join(lines)
