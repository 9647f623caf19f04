"""From the audit's checks to statuses and one verdict: the multiple-testing procedure over the chance-based
checks, the pooled counts over runs, and the exit status of ``crop audit``.

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

Exit status of ``crop audit`` (:func:`exit_status`): 1 on FAIL; with ``--strict`` also on WARN and on a
differing reproduced value; 0 with ``--report-only``.
"""
from __future__ import annotations

import numpy as np
from scipy import stats as st

from crop.audit.checks import lore_alpha_exhausted, untestable_reason

__all__ = ["classify", "tarone_holm", "pooled_tests", "unit_level", "poisson_binomial_sf", "verdict_of",
           "exit_status", "STATUSES", "POOLED"]

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
