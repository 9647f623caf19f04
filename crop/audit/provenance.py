"""Where each result came from: the config hash, and per run the checkpoint, commits, versions, seeds,
devices and runtimes recorded in its ``.meta.json`` files — with the inconsistencies among them.

Kept free of heavy imports: the Snakefile imports :func:`config_hash` when it parses the workflow.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

__all__ = ["config_hash", "run_provenance"]


def config_hash(cfg: dict) -> str:
    """sha256 of the validated config (defaults filled in) as canonical JSON (sorted keys, no spaces).

    Two runs with the same hash asked for the same computation; it changes with any key, ``results``
    included.
    """
    text = json.dumps(cfg, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _short(h):
    return None if h is None else str(h)[:12]


def run_provenance(results, run: str) -> tuple[dict, list[dict], list[str]]:
    """(provenance record, integrity problems, warnings) of one ``ENV/ALGO/sigma-S`` run folder.

    Problems (evidence that the results do not belong together): a stage computed from another checkpoint
    than the one recorded in ``model.json`` (or than the other stages), and a ``model.pt`` that is missing or
    whose sha256 is not the recorded one, wherever the records cite a checkpoint.  Warnings: no checkpoint
    record, uncommitted code, several commits or package-version sets among the stages.
    """
    from crop.io import meta_path, read_json, sha256_file
    from crop.report.metrics import parse_run
    from crop.workflow.layout import RUN_FILES, checkpoint_path, split_run_algo

    results = Path(results)
    env, algo, lab = parse_run(run)
    d = results / run
    problems, warnings = [], []
    stages = {}
    q = read_json(d / RUN_FILES["qrange"]) if (d / RUN_FILES["qrange"]).is_file() else {}  # partial runs
    if isinstance(q.get("provenance"), dict):
        stages["qrange"] = {**q["provenance"], "_file": RUN_FILES["qrange"],
                            "_checkpoint": q.get("checkpoint_sha256")}
    metas = {}
    for name, fname in RUN_FILES.items():
        if fname.endswith(".json"):
            continue
        m = meta_path(d / fname)
        if not m.is_file():
            continue
        meta = metas[fname] = read_json(m)
        stage = meta.get("stage") or name
        ck = ((meta.get("inputs") or {}).get("checkpoint") or {}).get("sha256")
        stages.setdefault(stage, {**meta, "_file": fname, "_checkpoint": ck})
    target, target_problems = _run_target(run, d, split_run_algo(algo)[1], q, metas)
    problems += target_problems

    ckpt = checkpoint_path(results, env, split_run_algo(algo)[0])  # StdTrain@vote reads StdTrain's
    rec_file = ckpt.with_suffix(".json")
    record = read_json(rec_file) if rec_file.is_file() else None
    used = {s: v["_checkpoint"] for s, v in stages.items() if v.get("_checkpoint")}
    recorded = (record or {}).get("sha256")
    if record is None:
        warnings.append(f"{run}: no checkpoint record {rec_file} (source of the policy unknown)")
    reference_sha = recorded or (sorted(set(used.values()))[0] if used else None)
    for stage, sha in sorted(used.items()):
        if reference_sha is not None and sha != reference_sha:
            what = "the recorded checkpoint" if recorded else "the other stages"
            problems.append({"run": run, "file": str(d / stages[stage]["_file"]),
                             "problem": f"stage {stage} was computed from checkpoint {_short(sha)}, not "
                                        f"{what} ({_short(reference_sha)})"})
    file_verified = None
    if reference_sha is not None:   # the run's records cite a checkpoint: it is part of the evidence
        if not ckpt.is_file():
            problems.append({"run": run, "file": str(ckpt),
                             "problem": f"missing: the checkpoint {_short(reference_sha)} that "
                                        f"{rec_file.name + ' records' if recorded else 'the stages record'} is not "
                                        "in the folder, so nothing shows the results came from it"})
        else:
            file_verified = sha256_file(ckpt, kind="checkpoint") == reference_sha
            if not file_verified:
                where = rec_file.name if recorded else "the stages' records"
                problems.append({"run": run, "file": str(ckpt),
                                 "problem": f"checkpoint sha256 differs from the one recorded in {where}"})

    commits = sorted({str(v.get("git_commit")) for v in stages.values() if v.get("git_commit")})
    if any(c.endswith("-dirty") for c in commits):
        warnings.append(f"{run}: computed from uncommitted code ({', '.join(commits)})")
    if len(commits) > 1:
        warnings.append(f"{run}: stages were computed at {len(commits)} different commits")
    version_sets = {json.dumps(v.get("versions"), sort_keys=True) for v in stages.values() if v.get("versions")}
    if len(version_sets) > 1:
        warnings.append(f"{run}: stages were computed with {len(version_sets)} different package-version sets")
    runtimes = {s: v.get("runtime_s") for s, v in sorted(stages.items())}
    ck_info = {"sha256": reference_sha, "record": str(rec_file) if record is not None else None,
               "file_verified": file_verified}
    if record is not None:
        for k in ("source", "recipe", "profile", "url", "net_spec"):
            if k in record:
                ck_info[k] = record[k]
        rp = record.get("provenance") or {}
        ck_info["trained_at_commit"] = rp.get("git_commit")
        if isinstance(record.get("clean_greedy_return"), dict):
            ck_info["clean_greedy_return"] = record["clean_greedy_return"].get("mean")
    latest = max((str(v.get("finished_utc")) for v in stages.values() if v.get("finished_utc")), default=None)
    prov = {"run": run, "env": env, "algo": algo, "sigma": float(lab), "target": target, "checkpoint": ck_info,
            "checkpoint_sha256": reference_sha, "checkpoint_source": ck_info.get("source"),
            "git_commits": commits, "git_commit": commits[0] if len(commits) == 1 else (commits or [None])[-1],
            "versions": next((v.get("versions") for v in stages.values() if v.get("versions")), None),
            "seeds": {s: v.get("seed") for s, v in sorted(stages.items())},
            "devices": {s: v.get("device") for s, v in sorted(stages.items())},
            "device": ", ".join(sorted({str(v.get("device")) for v in stages.values() if v.get("device")})) or None,
            "runtime_s": runtimes,
            "runtime_total_s": round(sum(float(t) for t in runtimes.values() if t is not None), 3),
            "finished_utc": latest}
    return prov, problems, warnings


def _run_target(run: str, d: Path, target: str, q: dict, metas: dict) -> tuple[str, list[dict]]:
    """(the run's smoothing target as the audit shows it, problems): the folder's target, or for a
    ``target: auto`` run "auto: T" with T the target its pilot chose (qrange.json's ``target_choice``), which
    every stage that records a target must have certified — a received folder whose LoAct says ``vote``
    beside a pilot that chose ``q`` does not belong together."""
    from crop.io import meta_name
    from crop.names import AUTO_TARGET, TARGET_NAMES
    from crop.workflow.layout import RUN_FILES

    if target != AUTO_TARGET:
        return target, []
    chosen = (q.get("target_choice") or {}).get("chosen")   # records checked: crop.report.records
    if q and chosen not in TARGET_NAMES:
        return AUTO_TARGET, [{"run": run, "file": str(d / RUN_FILES["qrange"]),
                              "problem": f"target_choice.chosen is {chosen!r}, not one of {', '.join(TARGET_NAMES)}: "
                                         "the target this auto run certified is not recorded"}]
    problems = []
    for fname, meta in sorted(metas.items()):
        used = (meta.get("settings") or {}).get("target")
        if used is not None and chosen is not None and used != chosen:
            problems.append({"run": run, "file": str(d / meta_name(fname)),
                             "problem": f"settings.target is {used!r}, but this auto run's pilot chose {chosen!r} "
                                        f"({RUN_FILES['qrange']})"})
    return (f"{AUTO_TARGET}: {chosen}" if chosen else AUTO_TARGET), problems
