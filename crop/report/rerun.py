"""Re-execution (``crop audit RESULTS --rerun K [--seed S]``): is the results folder reproducible?

K stage jobs are drawn at random (seeded by S) among the run folders' stages that recorded their provenance;
each is run again from that record — every option as the stage ran it (``settings``), hence the same config
settings and seed, against the run's own checkpoint and V range, each verified by the sha256 the stage recorded when it
read them — into a scratch folder, on the CPU, and its outputs are compared with the folder's:

* ``identical``: every output byte-identical (a CSV), or the same values (qrange.json, whose provenance block
  holds times) — required where the job ran on the CPU;
* ``within_interval``: a job that ran on another device agrees within floating-point reordering
  (``np.isclose`` at rtol 1e-5, atol 1e-8 on every number; the same text elsewhere);
* ``differ``: anything else — a result changed after the run, or code that is not deterministic.  A differing
  job makes the audit's verdict FAIL.

Refused before anything runs (one line): a recorded commit other than the installed code's.  A job whose
environment id has the ``module:Id`` form and is not the user's own (``trusted_envs``) is not re-run: re-running
it would import a module named by the folder.  A received folder names nothing the re-run imports: a job whose
recorded env, algo, σ or target is not its run folder's (``ENV/ALGO[@TARGET]/sigma-S``) is not run and counts as
``differ`` (its record contradicts where it lies); the child process runs ``python -I`` (no current directory,
no ``PYTHON*`` variables on its path) from the scratch folder, under :func:`crop.envs.untrusted_env_ids`.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from crop.io import InputError, meta_path, read_json, sha256_file
from crop.layout import checkpoint_path, split_run_algo
from crop.report.metrics import parse_run
from crop.stage_table import STAGES

__all__ = ["rerun_jobs", "RERUN_RESULTS"]

RERUN_RESULTS = ("identical", "within_interval", "differ")

# The re-run's process: isolated (``-I``: neither the current directory nor PYTHON* variables on sys.path) and
# with every environment id but the user's own (argv[1], JSON) importing nothing.
_CHILD = ("import json, sys\nfrom crop.envs import untrusted_env_ids\nfrom crop.cli import main\n"
          "with untrusted_env_ids(json.loads(sys.argv[1])):\n    main(sys.argv[2:])")


def _record(run_dir: Path, row) -> dict | None:
    """The provenance a stage recorded in ``run_dir`` (its main output's meta file, or qrange.json's own
    block), or None."""
    main = run_dir / row.outputs[0].file
    if not main.is_file():
        return None
    if row.outputs[0].meta:
        m = meta_path(main)
        return read_json(m) if m.is_file() else None
    prov = read_json(main).get("provenance")
    return prov if isinstance(prov, dict) else None


def _jobs(results: Path, runs) -> tuple[list[tuple[str, object, dict]], list[dict]]:
    """(the stage jobs that recorded their settings, the stages present without them: not eligible)."""
    jobs, not_eligible = [], []
    for run in runs:
        for row in STAGES.values():
            if not (results / run / row.outputs[0].file).is_file():
                continue
            rec = _record(results / run, row)
            if rec is not None and isinstance(rec.get("settings"), dict):
                jobs.append((run, row, rec))
            else:
                not_eligible.append({"run": run, "stage": row.rule})
    return jobs, not_eligible


def _base(commit) -> str:
    return str(commit or "").removesuffix("-dirty")


def _options(command: str) -> dict:
    """``{dest: argparse action}`` of ``crop COMMAND``'s options."""
    from crop.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions if a.option_strings}


def _same_run(settings: dict, run: str) -> None:
    """ValueError unless the recorded env, algo and σ (and target, where recorded) are the run folder's: the
    command is rebuilt from the record, so a record naming another env would run (and import) that env."""
    env, algo_dir, lab = parse_run(run)
    algo, target = split_run_algo(algo_dir)
    try:
        same_sigma = float(settings.get("sigma")) == float(lab)
    except (TypeError, ValueError):
        same_sigma = False
    wrong = [k for k, ok in (("env", settings.get("env") == env), ("algo", settings.get("algo") == algo),
                             ("sigma", same_sigma),
                             ("target", settings.get("target") in (None, target))) if not ok]
    if wrong:
        raise ValueError(f"the recorded {', '.join(wrong)} ({', '.join(repr(settings.get(k)) for k in wrong)}) "
                         f"not the run folder's {run}: not re-run")


def _argv(rec: dict, row, run_dir: Path, checkpoint: Path, scratch: Path) -> list[str]:
    """The stage's command line rebuilt from the settings it recorded (every option as it ran), with its
    files replaced: the run's checkpoint and qrange.json (each verified against the sha256 the stage
    recorded), the outputs into ``scratch``, the device the CPU."""
    settings = rec.get("settings") or {}
    if settings.get("command") != row.command:
        raise ValueError(f"the recorded settings are not those of `crop {row.command}`")
    inputs = rec.get("inputs") or {}
    files = {"checkpoint": checkpoint, "qrange": run_dir / "qrange.json"}
    outs = {o.option: scratch / o.file for o in row.outputs}
    argv = [row.command]
    for dest, action in _options(row.command).items():
        value = settings.get(dest)
        if dest in files and value is not None:
            recorded = (inputs.get(dest) or {}).get("sha256")
            if not files[dest].is_file() or (recorded and sha256_file(files[dest]) != recorded):
                raise ValueError(f"{files[dest].name} is not the file the stage read (sha256 differs or missing)")
            value = str(files[dest])
        elif dest in outs:
            value = None if value is None else str(outs[dest])
        elif dest == "device":
            value = "cpu"
        elif dest in ("progress", "help", "version") or value is None:
            continue
        if value is None:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else action.option_strings[1])
        elif action.nargs == 0:            # a switch: given when it was on
            argv += [flag] if value else []
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv + ["--no-progress"]


def _same_numbers(a: Path, b: Path) -> bool:
    x, y = pd.read_csv(a), pd.read_csv(b)
    if list(x.columns) != list(y.columns) or len(x) != len(y):
        return False
    for c in x.columns:
        if pd.api.types.is_numeric_dtype(x[c]) and pd.api.types.is_numeric_dtype(y[c]):
            if not np.allclose(x[c].to_numpy(float), y[c].to_numpy(float), rtol=1e-5, atol=1e-8, equal_nan=True):
                return False
        elif not x[c].astype(str).equals(y[c].astype(str)):
            return False
    return True


def _compare(row, run_dir: Path, scratch: Path, cpu: bool) -> tuple[str, str]:
    """(result, note) of one re-run job's outputs against the folder's."""
    worst, notes = "identical", []
    for o in row.outputs:
        old, new = run_dir / o.file, scratch / o.file
        if not old.is_file():
            continue
        if not new.is_file():
            return "differ", f"{o.file}: not written by the re-run"
        if not o.meta:   # JSON with its provenance inside: compare the values
            a, b = ({k: v for k, v in read_json(p).items() if k != "provenance"} for p in (old, new))
            same = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        elif o.file.endswith(".npz"):
            with np.load(old) as a, np.load(new) as b:
                same = sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)
        else:
            same = sha256_file(old) == sha256_file(new)
        if same:
            continue
        if not cpu and o.file.endswith(".csv") and _same_numbers(old, new):
            worst = "within_interval"
            notes.append(f"{o.file}: within floating-point reordering")
            continue
        return "differ", f"{o.file}: differs from the re-run"
    return worst, "; ".join(notes)


def rerun_jobs(results: Path, runs, k: int, seed: int = 0, trusted_envs=()) -> dict:
    """Re-run ``k`` stage jobs drawn at random (``seed``) and compare (see the module docstring).  Returns
    the ``rerun`` block of audit.json: ``checked``, ``identical``, ``within_interval``, ``differ``, ``seed``,
    ``not_run`` (drawn but not re-run: a ``module:Id`` env read from the folder; the verdict is then at best
    WARN), ``not_eligible`` and ``not_eligible_list`` (stages present without recorded settings, never drawn)
    and ``jobs`` (run, stage, result, note).  InputError, before any job runs, when a recorded commit is
    not the installed code's."""
    from crop.io import _git_commit

    results = Path(results).resolve()   # the child runs in its scratch folder
    jobs, not_eligible = _jobs(results, runs)
    rng = np.random.default_rng(seed)
    picked = [jobs[i] for i in sorted(rng.choice(len(jobs), size=min(int(k), len(jobs)), replace=False))] \
        if jobs else []
    installed = _git_commit()
    for run, row, rec in picked:
        if _base(rec.get("git_commit")) != _base(installed):
            raise InputError(f"--rerun: {run} {row.command} was computed at commit {rec.get('git_commit')}, the "
                             f"installed code is {installed}: install that commit to re-run it")
    rows = []
    for run, row, rec in picked:
        env, algo, _ = parse_run(run)
        job = {"run": run, "stage": row.rule, "job": f"{run} {row.rule}", "device": rec.get("device")}
        if ":" in env and env not in set(trusted_envs):
            rows.append({**job, "result": "not_run", "note": "module:Id environment read from the folder: a "
                                                             "re-run would import its module"})
            continue
        scratch = Path(tempfile.mkdtemp(prefix="crop-rerun-"))
        try:
            run_dir = results / run
            _same_run(rec["settings"], run)
            argv = _argv(rec, row, run_dir, checkpoint_path(results, env, split_run_algo(algo)[0]), scratch)
            done = subprocess.run([sys.executable, "-I", "-c", _CHILD, json.dumps(sorted(trusted_envs)), *argv],
                                  capture_output=True, text=True, cwd=scratch)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
                rows.append({**job, "result": "differ", "note": f"the re-run failed: {tail}"})
                continue
            result, note = _compare(row, run_dir, scratch, str(rec.get("device", "cpu")).startswith("cpu"))
            rows.append({**job, "result": result, "note": note})
        except ValueError as exc:
            rows.append({**job, "result": "differ", "note": str(exc)})
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    counts = {r: sum(j["result"] == r for j in rows) for r in RERUN_RESULTS}
    return {"checked": sum(j["result"] != "not_run" for j in rows), **counts, "seed": seed,
            "not_run": sum(j["result"] == "not_run" for j in rows), "not_eligible": len(not_eligible),
            "not_eligible_list": not_eligible, "jobs": rows}
