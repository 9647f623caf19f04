"""audit.md, the audit for people: the verdicts in plain words first, then the evidence section by section
(soundness, integrity, the reference comparison, chance, provenance); and the one line that states both
verdicts (:func:`verdict_line`, which ``crop audit`` prints)."""
from __future__ import annotations

import re

import pandas as pd

from crop.audit.verdict import POOLED, STATUSES
from crop.report.clips import clip_text
from crop.report.markdown import md_code, md_text, pipe_table, printable

__all__ = ["audit_markdown", "verdict_line", "plain_verdict"]


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
            + (f" (first: {printable(rep['integrity'][0]['file'])})" if rep.get("integrity") else "")
            + (f", {len(rep['expected_missing'])} file(s) the config expects missing (first: "
               f"{printable(rep['expected_missing'][0]['file'])})" if rep.get("expected_missing") else ""))
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
    return (f"in run {md_text(i['env'])}/{md_text(i['algo'])}/σ={i['sigma']:g}"
            + ("" if i.get("eps") is None else f" at ε = {i['eps']:g}"))


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
                f"{md_text(i['check'])} {_where(i)} (bound {i['bound']}, observed {i['observed']})"
                for i in rep["violation_list"][:3]))
        if rep["integrity"]:
            parts.append(f"{len(rep['integrity'])} integrity problem(s): " + "; ".join(
                f"{md_text(p['problem'])} ({md_text(p['file'])})" for p in rep["integrity"][:3]))
        differ = [j for j in (rep.get("rerun") or {}).get("jobs", []) if j["result"] == "differ"]
        if differ:
            parts.append(f"{len(differ)} re-run job(s) differ: " + "; ".join(md_text(j["job"]) for j in differ[:3]))
        return "**FAIL**: " + ". ".join(parts) + "." + (" " + _expected_text(rep) if rep.get("expected_missing")
                                                        else "")
    expected = _expected_text(rep)
    if not tested:
        why = ("no attack to check a bound against" if _attacks_lacking(rep) or not rep["checks"] else
               "the attacks ran, but every bound they test is vacuous or their episodes too few to reach significance")
        return (f"**Not decided: nothing was tested.** No check could have caught a broken certificate ({why}); to "
                "decide: " + "; ".join(_advice(rep)) + "." + vac + (" " + expected if expected else ""))
    if rep["verdict"] == "WARN":
        fixes = _untestable_fixes(rep)
        text = "**Not decided**: " + (expected + " " if expected else "")
        if st_["untestable"]:
            text += (f"{st_['untestable']} check(s) could not fail"
                     + (f"; to decide: {'; '.join(fixes)}" if fixes else "") + ". ")
        not_run = [j for j in (rep.get("rerun") or {}).get("jobs", []) if j["result"] == "not_run"]
        if not_run:
            text += (f"{len(not_run)} drawn re-run job(s) could not be re-run: "
                     + "; ".join(f"{md_text(j['job'])}: {md_text(j['note'])}" for j in not_run[:3])
                     + ("; …" if len(not_run) > 3 else "") + ". ")
        other = "other " if st_["untestable"] else ""
        return text + f"{tested} {other}check(s) could have caught a broken certificate and none did." + sus + vac
    return (f"**Sound as far as tested**: {tested} checks could have caught a broken certificate and none did "
            f"({alone} on their own, {tested - alone} only as part of a count over runs, which catches a fault "
            "shared by the runs)." + sus + vac)


#: What would make a vacuous check's bound claim something, by the stage whose bound it tests.
_VACUOUS_FIX = {"gre": "GRe bounds above J_min (smaller ε in gre.eps_factors, or more trajectories: gre.m)",
                "lore": "LoRe bounds above J_min (smaller ε, or more noise samples: lore.m)",
                "loact": "steps LoAct certifies beyond the attacked ε (smaller ε in attack.local_eps_factors, or "
                         "more noise samples: loact.m)"}
_ATTACKS = ("attack_local", "attack_global")


def _attacks_lacking(rep: dict) -> list[dict]:
    """The partial runs without an attack stage."""
    return [p for p in rep.get("partial_runs") or [] if set(_ATTACKS) & set(p["absent"])]


def _untestable_fixes(rep: dict) -> list[str]:
    """The untestable checks' ``testable_with``, once each; of the ``KEY ≥ N`` among them the largest N only."""
    fixes = {md_text(i.get("testable_with") or "") for i in rep["untestable_list"]} - {""}
    least: dict = {}
    for f in fixes:
        if (m := re.fullmatch(r"(\S+) ≥ (\d+)", f)):
            least[m[1]] = max(least.get(m[1], 0), int(m[2]))
    return sorted({f for f in fixes if not re.fullmatch(r"\S+ ≥ \d+", f)} | {f"{k} ≥ {n}" for k, n in least.items()})


def _advice(rep: dict) -> list[str]:
    """What would make the audit's checks testable, from what its runs hold: the attacks where a run lacks
    them, each untestable check's ``testable_with`` (more episodes, a tighter bound), and for each vacuous
    bound what would make it claim something — never a stage every run already holds."""
    lacking = _attacks_lacking(rep)
    fixes = [f"run the attacks (local and global PGD) in the {len(lacking)} run(s) that lack them "
             f"(first: {md_text(lacking[0]['run'])})"] if lacking else []
    fixes += _untestable_fixes(rep)
    fixes += sorted({_VACUOUS_FIX[i["check"].split("_")[0]] for i in rep.get("vacuous_list") or []
                     if i["check"].split("_")[0] in _VACUOUS_FIX})
    return fixes or ["run the attacks (local and global PGD) beside the certificates" if not rep["checks"] else
                     "more attacked episodes (attack.global_episodes, attack.local_episodes)"]


def _expected_text(rep: dict) -> str:
    """The files the given config's workflow writes and the folder lacks, in a sentence ('' where none)."""
    gone = rep.get("expected_missing") or []
    if not gone:
        return ""
    return (f"{len(gone)} file(s) or folder(s) the config's workflow writes are not in the folder (the folder lacks "
            "what the config expects, or comes from another config): " + "; ".join(md_text(p["file"]) for p in gone[:3])
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
    lines = ["# CROP audit", "", first, "", md_code(verdict_line(rep)), "",
             f"Results folder: {md_code(rep['results'])}; runs audited: {len(rep['runs'])}"
             + (f" ({len(rep['partial_runs'])} partial)" if rep["partial_runs"] else "")
             + f"; config hash: {md_code(rep['config_hash'] or 'not given')}.", "",
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
    runs = "; ".join(f"{md_code(run)} ({clip_text(sorted({tuple(c) for c in stages.values()}))}: "
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
                     + ", ".join(f"{md_text(j['run'])} {j['stage']}" for j in rr["not_eligible_list"][:10])
                     + ("…" if rr["not_eligible"] > 10 else "") + "." if rr.get("not_eligible") else ""), "",
                  pipe_table(rr["jobs"], ["run", "stage", "device", "result", "note"]), ""]
    if rep["integrity"]:
        lines += [pipe_table(rep["integrity"], ["run", "file", "problem"]), ""]
    else:
        lines += ["Every file the audit read is a regular file of the folder within its size cap, every result file "
                  "has the sha256 recorded when it was written, every file the runs' records name in the folder "
                  "is there, every recorded setting is one the config schema allows, every summary agrees with "
                  "the per-step file it was made from and every table with the run files it cites, and every "
                  "stage used the recorded checkpoint, which is there with its sha256.", ""]
    if rep.get("expected_missing"):
        lines += ["## Expected by the config, missing", "",
                  "Files the given config's workflow writes that the folder lacks (WARN: nothing in the folder "
                  "says they were written):", "", pipe_table(rep["expected_missing"], ["file", "problem"], limit=100,
                                                             rest="all in audit.json"), ""]
    if rep.get("skipped_runs"):
        lines += ["## Stages not run", "",
                  "Not run by the config's choice (its `skip`), so none of their checks ran:", ""]
        lines += [pipe_table([{"run": p["run"], "not run": ", ".join(p["stages"])} for p in rep["skipped_runs"]]),
                  ""]
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
             f"Reference {md_code(ref['name'])} ({md_code(ref['file'])}, sha256 `{ref['sha256'][:16]}…`), "
             f"tolerances {'from ' + md_code(ref['tolerances_file']) if ref['tolerances_file'] else 'built in'}: a "
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
    of a comparison, :func:`crop.audit.reference.compare_reference`); nothing where none is."""
    marked: dict = {}
    for r in rows:
        if r.get("reward_clip") and r["verdict"] != "missing":
            marked.setdefault((r["env"], r["algo"], r["sigma"], tuple(r["reward_clip"])), set()).add(r["metric"])
    if not marked:
        return []
    which = "; ".join(f"{md_text(env)} {md_text(algo)} σ = {sigma:g}, {clip_text([clip])}: "
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
        rows = [{"env": p["env"], "algo": p["algo"], "sigma": p["sigma"], "target": p.get("target"),
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
            lines += ["Package versions: " + ", ".join(f"{md_text(k)} {md_text(v)}"
                                                       for k, v in sorted(versions.items())), ""]
    if rep["warnings"]:
        lines += ["## Warnings", ""] + [f"- {md_text(w)}" for w in rep["warnings"]] + [""]
    return lines


def audit_markdown(rep: dict) -> str:
    """audit.md: the verdicts first, then the evidence section by section."""
    return "\n".join(_md_summary(rep) + _md_soundness(rep) + _md_integrity(rep) + _md_reference(rep)
                     + _md_chance(rep) + _md_provenance(rep))
