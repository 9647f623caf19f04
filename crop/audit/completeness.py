"""What a received results folder should hold, by its own records, and what it lacks.

A partial run (a stage never run) is no problem: nothing in the folder says the stage ran.  But the folder does
record what it wrote, and a file gone from beside that record is one the sender removed or lost:

* every ``.meta.json`` names the file it was written with (``output.file``) and the files its stage read
  (``inputs``): a written file absent, or a read one of the same run folder (``qrange.json``), is an integrity
  problem (FAIL) — :func:`recorded_missing`;
* the tables and figures (``tables/``, ``figures/``) are drawn from the runs they cite — a table's rows name
  each run's algorithm and σ, a figure's name its environment and σ: a table citing a run that lacks a result
  file, or a figure or table of no run in the folder, has lost its input (FAIL) — :func:`report_inputs_missing`;
* with the workflow's config, the jobs it builds (:func:`crop.workflow.cost.jobs`, the same enumeration as the
  Snakefile's) name every checkpoint, run file and table and figure: one the folder lacks is listed apart
  (``expected_missing``: WARN, for the config may not be the one the folder was made with, and a run that a
  failed job cut short is still a sound account of what finished) — :func:`config_missing`, with the failed
  job and its log where the folder's logs name one.

Each problem is ``{"file", "problem"}`` as :func:`crop.report.integrity.check_integrity`'s.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from crop.io import META_SUFFIX, read_csv, read_json
from crop.workflow import layout
from crop.workflow.layout import (
    FIGURE_FORMATS,
    RUN_FILES,
    absent_skippable,
    base_run,
    replicate_of,
    run_files,
    run_target,
    series_label,
)
from crop.workflow.stage_table import STAGES

__all__ = ["recorded_missing", "report_inputs_missing", "config_missing", "folder_plan", "table_runs"]

# A run file's stage rule (for the rerun hint), by the file's key.
_RULE = {key: row.rule for row in STAGES.values() for key in row.files}
# The run file a provenance file sits beside, by the provenance file's name.
_BY_META = {name.rsplit(".", 1)[0] + META_SUFFIX: name for name in RUN_FILES.values()}


def recorded_missing(run_dir: Path) -> list[dict]:
    """The files a run folder's provenance files record as written (their ``output``) or as read from the folder
    (their ``inputs`` that are run files), which are not there: one problem per absent file, naming the records
    that vouch for it."""
    run_dir = Path(run_dir)
    vouched: dict[str, list[str]] = {}
    for m in sorted(run_dir.glob("*" + META_SUFFIX)):
        try:
            rec = read_json(m)
        except ValueError:
            continue   # an unreadable provenance file is the integrity check's (its output has no record)
        # the file the record sits beside, and the one it names (a forged name does not unvouch the first)
        for out in {_BY_META.get(m.name, ""), Path(str((rec.get("output") or {}).get("file") or "")).name} - {""}:
            vouched.setdefault(out, []).append(f"{m.name} records it as written")
        for key, inp in sorted((rec.get("inputs") or {}).items()):
            if key in RUN_FILES and _in_folder(str((inp or {}).get("path") or ""), run_dir):
                vouched.setdefault(RUN_FILES[key], []).append(f"{m.name} records it as read")
    problems = []
    for name, why in sorted(vouched.items()):
        if (run_dir / name).is_file():
            continue
        key = next((k for k, f in RUN_FILES.items() if f == name), None)
        hint = f" (`snakemake --forcerun {_RULE[key]}`)" if key else ""
        problems.append({"file": str(run_dir / name),
                         "problem": f"missing: {'; '.join(why)}, and the file is gone; rerun its stage{hint}"})
    return problems


def _in_folder(path: str, run_dir: Path) -> bool:
    """Whether a recorded input path names a file of this run folder: its folders end in the run's
    ``ENV/ALGO/sigma-S`` (and ``rep-K``).  A stage run by hand on a file elsewhere read nothing of this folder."""
    depth = 4 if replicate_of(run_dir) else 3
    want = Path(run_dir).parts[-depth:]
    return len(Path(path).parent.parts) >= depth and Path(path).parent.parts[-depth:] == want


def folder_plan(results: Path, runs) -> dict[str, tuple[list[str], list[str], tuple[str, ...]]]:
    """``{env: (run folder algorithms, σ labels, ("lore",) where none of them has LoRe)}`` of the run folders
    ``runs`` (replicates count with their run): what :func:`crop.workflow.layout.aggregate_files` names the
    figures and tables of.  An environment id crop cannot resolve here (an untrusted ``module:Id`` folder name:
    no figure or table can be made of it) is left out."""
    from crop.envs import env_spec
    from crop.report.metrics import parse_run

    plan: dict[str, tuple[list[str], list[str], list[bool]]] = {}
    for run in runs:
        env, algo, lab = parse_run(base_run(run))
        try:
            env_spec(env)
        except (KeyError, ValueError):
            continue
        algos, labels, lore = plan.setdefault(env, ([], [], []))
        algos += [algo] if algo not in algos else []
        labels += [lab] if lab not in labels else []
        lore.append("lore" not in absent_skippable(results / base_run(run)))
    return {env: (algos, sorted(labels, key=float), () if any(lore) else ("lore",))
            for env, (algos, labels, lore) in plan.items()}


def report_inputs_missing(results: Path, runs) -> list[dict]:
    """Figures and tables whose input is gone: a file in ``figures/`` or ``tables/`` that no run folder among
    ``runs`` (the folder's own, complete or partial) draws, and a table row citing a run (its algorithm and σ)
    that is absent or lacks a result file (:func:`crop.workflow.layout.run_files`)."""
    from crop.report.metrics import parse_run

    results = Path(results)
    figures, tables = results / "figures", results / "tables"
    own = [r for r in runs if not replicate_of(r)]
    plan = folder_plan(results, own)
    drawn = {p.name for env, (algos, labels, skip) in plan.items()
             for p in layout.figure_files(figures, env, labels, algos, skip)}
    made = {p.name: env for env in plan for p in layout.table_files(tables, env)}
    # The files of an environment crop cannot resolve here (an untrusted module:Id) cannot be named: where the
    # folder has one, only a file named after a resolved environment can be called lost.
    named = _names_of(plan) if not {parse_run(r)[0] for r in own} <= set(plan) else None
    problems, stems = [], set()
    for f in sorted(figures.glob("*")) if figures.is_dir() else []:
        if named is not None and not f.name.startswith(named):
            continue
        if f.suffix[1:] in FIGURE_FORMATS and f.name not in drawn and f.stem not in stems:
            stems.add(f.stem)   # one problem per figure, in whichever formats it is there
            problems.append({"file": str(f), "problem": "figure of no run in the folder (no run folder of its "
                                                        "environment and σ): its input is gone"})
    cited: dict[str, list[str]] = {}
    for f in sorted(tables.glob("*")) if tables.is_dir() else []:
        if f.suffix[1:] not in ("csv", "md", "tex"):
            continue
        if f.name not in made:
            if named is None or f.name.startswith(named):
                problems.append({"file": str(f), "problem": "table of no run in the folder (no run folder of "
                                                            "its environment): its input is gone"})
        elif f.suffix == ".csv":
            for run in table_runs(f, made[f.name], plan):
                cited.setdefault(run, []).append(f.name)
    for run, names in sorted(cited.items()):
        d = results / run
        gone = ([n for n in run_files(run_target(run), absent_skippable(d)).values() if not (d / n).is_file()]
                if d.is_dir() else [])
        if not d.is_dir() or gone:
            what = f"run folder {run}" if not d.is_dir() else ", ".join(gone)
            problems.append({"file": str(d if not d.is_dir() else d / gone[0]),
                             "problem": f"input of the tables {', '.join(names[:3])}{'…' if len(names) > 3 else ''} "
                                        f"(they cite run {run}) is gone: {what}"})
    return problems


def _names_of(plan: dict) -> tuple[str, ...]:
    """The prefixes ``{Env}_`` and ``{Clean}_`` of the figure and table files of the environments of ``plan``."""
    from crop.envs import env_spec

    return tuple(sorted({f"{n}_" for env in plan for n in (env_spec(env).paper_name, env_spec(env).clean_name)}))


def table_runs(csv: Path, env: str, plan: dict) -> list[str]:
    """The run folders ``ENV/ALGO/sigma-S`` a table CSV cites: its rows' algorithm (as the tables name it,
    :func:`crop.workflow.layout.series_label`) with its ``sigma`` column, or with each ``sigma=S`` column where it has a
    value."""
    try:
        df = read_csv(csv)
    except (ValueError, OSError):
        return []
    if "algo" not in df:
        return []
    names = {series_label(a): a for a in plan.get(env, ([], []))[0]}
    labels = {float(lab): lab for lab in plan.get(env, ([], []))[1]}
    if "sigma" in df:
        pairs = list(zip(df["algo"].astype(str), df["sigma"].astype(float)))
    else:   # an algorithm × σ table: the cells with a value (an algorithm not run at a σ has none)
        columns = [c for c in df.columns if c.startswith("sigma=") and " " not in c]
        pairs = [(str(a), float(c.split("=", 1)[1])) for c in columns for a, v in zip(df["algo"], df[c])
                 if not pd.isna(v)]
    out = []
    for algo, sigma in pairs:
        run = f"{env}/{names.get(algo, algo)}/sigma-{labels.get(sigma, repr(sigma))}"
        out += [run] if run not in out else []
    return out


def config_missing(results: Path, cfg: dict) -> list[dict]:
    """The checkpoints, run files and tables and figures that the workflow's jobs for ``cfg`` (a validated config,
    :func:`crop.workflow.cost.jobs`) write, which are not in ``results``; each says why where the folder's logs
    tell it (:func:`_why`): its job failed (its log), or a job it waits for did."""
    from crop.workflow import cost
    from crop.workflow.layout import aggregate_files, checkpoint_path, run_dir

    results = Path(results)
    jobs = cost.jobs(cfg, gpus=0)
    files: dict[int, list[Path]] = {}   # a job's outputs, by its index in ``jobs``
    plan: dict = {}
    for i, job in enumerate(jobs):
        stage = job.rule.removesuffix("_replicate").replace("_", "-")
        if job.rule == "checkpoint":
            model = checkpoint_path(results, job.env, job.algo)
            files[i] = [model, model.with_suffix(".json")]
        elif stage in STAGES and job.env is not None:
            d = run_dir(results, job.env, job.algo, job.sigma, replicate=job.rep or 0)
            files[i] = [d / f for f in STAGES[stage].files.values()]
            algos, labels, _ = plan.setdefault(job.env, ([], [], tuple(cfg["environments"][job.env].get("skip", ()))))
            algos += [job.algo] if job.algo not in algos else []
            labels += [job.sigma] if job.sigma not in labels else []
    expected = [(p, jobs[i].rule.removesuffix("_replicate"), i) for i, fs in files.items() for p in fs]
    why = _why(results, jobs, files)
    groups: dict[Path, list] = {}
    for p, rule, i in expected:
        groups.setdefault(p.parent, []).append((p, rule, why.get(i, "")))
    out, drawings = [], []
    for env, env_plan in plan.items():   # an environment none of whose figures and tables is there: one line
        drawn = aggregate_files(results / "figures", results / "tables", {env: env_plan})
        if any(p.is_file() for p in drawn):
            for p in drawn:
                groups.setdefault(p.parent, []).append((p, "aggregate", ""))
            continue
        cut = any(why.get(i) for i in files if jobs[i].env == env)
        names = sorted({f"{p.parent}/{p.name.split('_', 1)[0]}_*" for p in drawn})
        drawings.append({"file": ", ".join(names),
                         "problem": f"missing: the config's workflow draws {len(drawn)} figures and tables of {env} "
                                    "here (rule aggregate) and the folder has none of them"
                                    + ("; not drawn: a job of its runs failed (the lines above)" if cut else "")})
    for folder, group in groups.items():   # a folder with none of its files: one line for it
        gone = [g for g in group if not g[0].is_file()]
        if len(gone) == len(group) > 1:
            rules = ", ".join(dict.fromkeys(rule for _, rule, _ in gone))
            causes = "; ".join(dict.fromkeys(w for _, _, w in gone if w))
            out.append({"file": str(folder), "problem": f"missing: the config's workflow writes {len(gone)} files "
                                                        f"here (rules {rules}) and the folder has none of them"
                                                        + (f"; {causes}" if causes else "")})
        else:
            out += [{"file": str(p), "problem": f"missing: the config's workflow writes it (rule {rule})"
                                                + (f"; {w}" if w else "")} for p, rule, w in gone]
    return out + drawings


def _why(results: Path, jobs: list, files: dict[int, list[Path]]) -> dict[int, str]:
    """Why each job whose outputs are missing left them so, as far as the folder's logs tell
    (:func:`crop.workflow.layout.job_log`): its log is there, so it ran and failed (or was stopped); else the first
    job it waits for, directly or not, that ran and failed."""
    from crop.workflow.layout import job_log

    def log(i: int) -> Path:
        j = jobs[i]
        return job_log(results, j.rule.removesuffix("_replicate"), j.env, j.algo, j.sigma, j.rep or 0)

    def name(i: int) -> str:
        j = jobs[i]
        rep = f"/{layout.REPLICATE_PREFIX}{j.rep}" if j.rep else ""
        return f"{j.rule} {j.env}/{j.algo}" + (f"/sigma-{j.sigma}{rep}" if j.sigma else "")

    failed = {i for i, fs in files.items() if not all(p.is_file() for p in fs) and log(i).is_file()}
    why = {}
    for i in (i for i, fs in files.items() if not all(p.is_file() for p in fs)):
        if i in failed:
            why[i] = f"its job {name(i)} failed: log {log(i)}"
            continue
        seen, todo = set(), list(jobs[i].needs)
        while todo:
            k = todo.pop(0)
            if k in failed:
                why[i] = f"not run: job {name(k)} failed (log {log(k)})"
                break
            if k not in seen:
                seen.add(k)
                todo += jobs[k].needs
    return why
