"""Re-execution (``crop audit RESULTS --rerun K [--seed S] [--rerun-budget MINUTES]``): is the results folder
reproducible?

K stage jobs are drawn at random (seeded by S) among the run folders' stages that recorded their provenance;
each is run again from that record — every setting as the stage ran it (``settings``), hence the same config
settings and seed, against the run's own checkpoint and V range, each verified by the sha256 the stage recorded
when it read them — into a scratch folder, on the CPU, and its outputs are compared with the folder's:

* ``identical``: every output byte-identical (a CSV), or the same values (qrange.json, whose provenance block
  holds times) — required where the job ran on the CPU;
* ``within_interval``: a job that ran on another device agrees within floating-point reordering
  (``np.isclose`` at rtol 1e-5, atol 1e-8 on every number; the same text elsewhere);
* ``differ``: anything else — a result changed after the run, or code that is not deterministic.  A differing
  job makes the audit's verdict FAIL.

A received folder steers nothing but values.  Every recorded setting is checked against the config schema's
node of its key (type, range, enum, list elements and length; :func:`crop.workflow.stage_table.stage_options`) and a
key that is no option of the stage's command is refused; the command is then built by this module, one
``--name=value`` word per option, the stage's settings as one ``--settings=JSON`` word (as the workflow passes
them), so no recorded value can become an option.  The checkpoint, the V range and every output are the
re-run's own paths — the run folder's model.pt and qrange.json, each verified by the sha256 the stage recorded
(a missing one is refused), the outputs always in the scratch folder — never the record's.  Each job is bounded
before it starts: ``crop plan``'s cost model (:func:`crop.workflow.cost.price`, this machine's CPU unit costs) predicts
its time and memory from the recorded sizes (episodes, horizon, m, max_nodes, batch: each enters both where it
costs them; GRe's horizon costs no memory, a trajectory keeping its return only), and a job
predicted over the budget (``--rerun-budget``, minutes a job) or over this machine's memory is not started, the
refusal naming the sizes; a started one is ended, its child processes with it, past :data:`TIMEOUT_FACTOR` × its
prediction + :data:`TIMEOUT_EXTRA_S`, and its data segment is capped at :data:`MEM_FACTOR` × its predicted memory
+ :data:`MEM_EXTRA_MB`.

A job that is not re-run counts as ``not_run`` (the verdict is then at best WARN), with one line saying why: a
record that fails the schema (naming the key), a missing sha256, a job predicted over the budget (with its
prediction) or one the cost model cannot price, a job ended at its time limit or stopped by its memory cap, a
recorded thread count above this machine's cores, or a job whose environment id has the ``module:Id`` form and
is not the user's own (``trusted_envs``): re-running it would import a module named by the folder.  Refused
before anything runs (one line): a recorded commit other than the installed code's.  A received folder names
nothing the re-run imports: a job whose recorded env, algo, σ or target is not its run folder's
(``ENV/ALGO[@TARGET]/sigma-S``) is not run and counts as ``differ`` (its record contradicts where it lies); the
child process runs ``python -I`` (no current directory, no ``PYTHON*`` variables on its path) from the scratch
folder, in its own session, under :func:`crop.envs.untrusted_env_ids`.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from crop.io import InputError, load_npz, meta_path, read_json, sha256_file
from crop.names import AUTO_TARGET, TARGET_NAMES
from crop.report.metrics import parse_run
from crop.report.records import error_line, read_table, same_table
from crop.workflow.audit_sizes import BUDGET_MINUTES, TIMEOUT_EXTRA_S, TIMEOUT_FACTOR
from crop.workflow.layout import checkpoint_path, split_run_algo
from crop.workflow.stage_table import STAGES

__all__ = ["rerun_jobs", "RERUN_RESULTS", "BUDGET_MINUTES", "TIMEOUT_FACTOR", "TIMEOUT_EXTRA_S", "MEM_FACTOR",
           "MEM_EXTRA_MB"]

RERUN_RESULTS = ("identical", "within_interval", "differ")

#: A job's data segment (heap and private writable mappings, RLIMIT_DATA) is capped at MEM_FACTOR × its
#: predicted MB + MEM_EXTRA_MB.  Not its address space: torch maps its libraries (gigabytes in a CUDA build)
#: and reserves address space it never touches, so an RLIMIT_AS that fits the job would break the import.
MEM_FACTOR, MEM_EXTRA_MB = 4, 2048

# The re-run's process: isolated (``-I``: neither the current directory nor PYTHON* variables on sys.path) and
# with every environment id but the user's own (argv[1], JSON) importing nothing.
_CHILD = ("import json, sys\nfrom crop.envs import untrusted_env_ids\nfrom crop.__main__ import main\n"
          "with untrusted_env_ids(json.loads(sys.argv[1])):\n    main(sys.argv[2:])")

# What a record may hold besides the stage's settings: the common options (the config schema's top-level nodes),
# what the re-run replaces by its own (paths, the device) or leaves out (flags of how a job ran, not of what it
# computes: GRe's workers, LoRe's save interval; progress bars), checked for their type only.
_COMMON = ("seed", "device", "threads", "chunk")
_PATHS = {"type": ["string", "null"]}


#: How a process that ran out of its memory cap says so (Python, C++, glibc, OpenBLAS).
_OUT_OF_MEMORY = re.compile(r"MemoryError|bad_alloc|[Cc]annot allocate memory|[Mm]emory allocation|[Oo]ut of memory")


class _NotRun(Exception):
    """A drawn job that is not re-run; its message is the one line audit.md gives."""


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


def _record_name(row) -> str:
    """The file a stage's record lies in, as the notes name it."""
    return meta_path(Path(row.outputs[0].file)).name if row.outputs[0].meta else row.outputs[0].file


def _jobs(results: Path, runs) -> tuple[list[tuple[str, object, dict]], list[dict]]:
    """(the stage jobs that recorded their settings, the stages present without them or in a run whose records
    the report cannot read (:func:`crop.report.records.run_record_problems`, the audit's integrity problem):
    not eligible)."""
    from crop.report.records import run_record_problems

    jobs, not_eligible = [], []
    for run in runs:
        if run_record_problems(results / run):
            not_eligible += [{"run": run, "stage": row.rule} for row in STAGES.values()
                             if (results / run / row.outputs[0].file).is_file()]
            continue
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


@functools.cache
def _option_names(command: str) -> set[str]:
    """The ``dest`` of every option of ``crop COMMAND``, and ``command``: what a record may hold."""
    import argparse

    from crop.workflow.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest for a in sub.choices[command]._actions if a.option_strings} | {"command"}


def _record_schema(row) -> dict:
    """The schema a stage's recorded settings must meet: each setting its config key's node, each common
    option its top-level node, each flag its own node; σ a positive number; env and algo strings (compared
    with the run folder's after); paths and the rest strings or null."""
    from crop.schema import parsed_schema

    s = parsed_schema()
    props = {option: node for option, (_, node) in row.options.items()}
    props.update({key: s["properties"][key] for key in _COMMON})
    props.update({f.option: f.node if "enum" in f.node else {"type": "number", **f.node} for f in row.flags})
    props.update({"command": {"const": row.command}, "sigma": {"type": "number", "exclusiveMinimum": 0},
                  "env": {"type": "string"}, "algo": {"type": "string"}, "target": {"type": "string"},
                  "progress": {"type": "boolean"}})
    props.update({o.option: _PATHS for o in row.outputs})
    props.update(dict.fromkeys(("checkpoint", "qrange", "settings", "help"), _PATHS))
    return {"$defs": s["$defs"], "type": "object", "properties": props,
            "required": ["command", "env", "algo", "sigma"]}


def _checked_settings(rec: dict, row) -> dict:
    """The recorded settings that are not null, each checked against its schema node before any command is
    built; :class:`_NotRun` naming the first bad key (``loact.meta.json settings.frames_window[2]: …``).  A null
    setting is left out: the stage took the schema's default for it, as the re-run will."""
    where = f"{_record_name(row)} settings"
    settings = rec["settings"]
    unknown = sorted(set(settings) - _option_names(row.command), key=str)
    if unknown:
        raise _NotRun(f"{where}: unknown key(s) {unknown}: no option of `crop {row.command}`")
    values = {k: v for k, v in settings.items() if v is not None}
    line = _schema_line(values, row, where)
    if line:
        raise _NotRun(line)
    return values


@functools.cache
def _settings_validator(rule: str, whole: bool):
    """The validator of a stage's recorded settings (:func:`_record_schema`); without ``whole``, of the values
    it names only (no key required)."""
    from crop.schema import parsed_schema, validator_for

    row = next(r for r in STAGES.values() if r.rule == rule)
    cls = validator_for(parsed_schema())
    record = _record_schema(row)
    return cls(record if whole else {**record, "required": []})


def _schema_line(values: dict, row, where: str, whole: bool = True) -> str | None:
    """The one line naming the first of ``values`` (settings not null) its schema node refuses, or None."""
    from crop.schema import field_path, non_finite

    hit = non_finite(values)
    if hit:
        return f"{where}.{field_path(hit[0])}: {hit[1]} is not a finite number"
    # per key, its deepest error first: a list element that is no number before the list's length
    errors = sorted(_settings_validator(row.rule, whole).iter_errors(values),
                    key=lambda e: (str(e.absolute_path[0]) if e.absolute_path else "", -len(e.absolute_path),
                                   list(map(str, e.absolute_path)), e.message))
    if not errors:
        return None
    err = errors[0]
    while err.context:
        err = sorted(err.context, key=lambda e: len(e.absolute_path))[-1]
    return f"{where}: {err.message}" if err.validator == "required" else f"{where}.{error_line(err)}"


def _same_run(settings: dict, run: str) -> None:
    """ValueError unless the recorded env, algo and σ (and target, where recorded) are the run folder's: a
    record naming another env contradicts the folder it lies in."""
    env, algo_dir, lab = parse_run(run)
    algo, target = split_run_algo(algo_dir)
    try:
        same_sigma = float(settings.get("sigma")) == float(lab)
    except (TypeError, ValueError):
        same_sigma = False
    wrong = [k for k, ok in (("env", settings.get("env") == env), ("algo", settings.get("algo") == algo),
                             ("sigma", same_sigma),
                             ("target", settings.get("target") in (None, target)
                              or target == AUTO_TARGET and settings.get("target") in TARGET_NAMES)) if not ok]
    if wrong:
        raise ValueError(f"the recorded {', '.join(wrong)} ({', '.join(repr(settings.get(k)) for k in wrong)}) "
                         f"not the run folder's {run}: not re-run")


def _verified(rec: dict, row, name: str, path: Path) -> Path:
    """``path``, a file the stage read (``name``: checkpoint, qrange), once its sha256 is the one the stage
    recorded; :class:`_NotRun` when none is recorded, ValueError (differ) when the file is not that one."""
    inputs = rec.get("inputs")
    entry = inputs.get(name) if isinstance(inputs, dict) else None
    recorded = entry.get("sha256") if isinstance(entry, dict) else None
    if not isinstance(recorded, str) or len(recorded) != 64:
        raise _NotRun(f"{_record_name(row)} inputs.{name}.sha256: not recorded; the re-run verifies "
                      f"{path.name} by it")
    if not path.is_file() or sha256_file(path) != recorded:
        raise ValueError(f"{path.name} is not the file the stage read (sha256 differs or missing)")
    return path


def _argv(rec: dict, values: dict, row, results: Path, run: str, scratch: Path) -> list[str]:
    """The stage's command line, built from checked values (:func:`_checked_settings`): one ``--name=value``
    word per option and the stage's settings as one ``--settings=JSON`` word, as the workflow passes them, so
    no value can become an option; the run folder's own checkpoint and V range (verified), every output into
    ``scratch``, the device the CPU."""
    env, algo_dir, _ = parse_run(run)
    algo, target = split_run_algo(algo_dir)
    checkpoint = _verified(rec, row, "checkpoint", checkpoint_path(results, env, algo))
    argv = [row.command, f"--env={env}", f"--algo={algo}", f"--sigma={float(values['sigma'])!r}", "--device=cpu",
            f"--checkpoint={checkpoint}"]
    argv += [f"--{k}={values[k]}" for k in ("seed", "threads", "chunk") if k in values]
    if row.v_range and target in (*TARGET_NAMES, AUTO_TARGET):
        argv.append(f"--target={target}")
        if target in ("q", AUTO_TARGET):   # auto: the target the pilot chose, read from it
            argv.append(f"--qrange={_verified(rec, row, 'qrange', results / run / 'qrange.json')}")
    if row.command == "qrange" and target == AUTO_TARGET:   # the pilot's flags, each checked by its flag's node
        argv.append(f"--target={AUTO_TARGET}")
        argv += [f"--{f.option.replace('_', '-')}={values[f.option]}" for f in row.flags
                 if f.option != "target" and f.option in values]
    settings = {k: values[k] for k in row.options if k in values}
    argv.append("--settings=" + json.dumps(settings, allow_nan=False))
    argv += [f"--{o.option.replace('_', '-')}={scratch / o.file}" for o in row.outputs]
    return argv + ["--no-progress"]


#: The settings a job's price grows with: a refusal names them, as the record gives them.
_SIZES = ("episodes", "horizon", "m", "max_nodes", "batch", "pgd_steps", "n_eot")


def _sizes(values: dict, row) -> str:
    """The job's sizes by config key (``loact.episodes = 1000000, loact.horizon = 5, loact.m = 100``): the
    recorded value, else the schema's default the stage took."""
    return ", ".join(f"{key.lstrip('/')} = {values.get(option, node.get('default'))}"
                     for option, (key, node) in row.options.items() if option in _SIZES)


def _machine_mb() -> int:
    """This machine's memory (MB)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20


def _priced(values: dict, row, run: str):
    """The job's :class:`crop.workflow.cost.Job` priced by ``crop plan``'s model from the recorded sizes (the schema's
    default where a setting is not recorded, as the stage took it) and this machine's CPU unit costs
    (:func:`crop.workflow.cost.unit_costs`); LoRe's tree at its worst case, since its certified fraction would be read
    from the folder's own loact.csv; an environment without units of its own by its family's
    (:func:`_stand_in_units`).  :class:`_NotRun` when the model cannot price it."""
    from crop.workflow.cost import CostError, Job, price, unit_costs

    env, algo_dir, lab = parse_run(run)
    env_cfg: dict = {}
    cfg = {"environments": {env: env_cfg}}
    for option, (key, node) in row.options.items():
        value = values.get(option, node.get("default"))
        if key.startswith("/"):
            cfg[key[1:]] = value
        else:
            block, name = key.split(".")
            env_cfg.setdefault(block, {})[name] = value
    env_cfg.setdefault("lore", {})["eps_max_factor"] = None
    job = Job(row.rule, env, algo_dir, lab, device="cpu", threads=int(values.get("threads", 1)))
    try:
        return price(cfg, job, _stand_in_units(unit_costs("cpu")[0], env))
    except (CostError, ValueError, KeyError, TypeError) as exc:
        raise _NotRun(f"its time cannot be predicted, so it is not started: {exc}") from None


# The calibrated environments that stand in, per family, for one the unit-cost table has no units of: a job of
# CartPole-v1 or Acrobot-v1 still gets a prediction, so its budget and timeout still bound it.
_STAND_INS = {"vector": ("CartPole-v0",), "highway": ("highway-fast-v0",),
              "atari": ("PongNoFrameskip-v4", "FreewayNoFrameskip-v4")}


def _stand_in_units(table: dict, env: str) -> dict:
    """``table`` with units for ``env``: its own, else each unit the largest among its family's calibrated
    environments (:data:`_STAND_INS`; an id of no such family keeps none, and the job is not priced)."""
    from crop.envs import UnknownEnvError, env_family

    envs = table.get("envs", {})
    if env in envs:
        return table
    try:
        family = env_family(env)
    except UnknownEnvError:
        return table
    known = [envs[e] for e in _STAND_INS.get(family, ()) if e in envs]
    if not known:
        return table
    units = {k: max(u[k] for u in known) for k in known[0]}
    return {**table, "envs": {**envs, env: units}}


def _limit_memory(mb: int):
    """A ``preexec_fn`` capping the child's data segment (RLIMIT_DATA) at ``mb`` MB, below any hard limit."""
    def limit():
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = mb << 20
        cap = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    return limit


def _run_child(argv: list[str], scratch: Path, trusted_envs, job) -> subprocess.CompletedProcess:
    """Run the stage's command in its own session (its process group: the child and any process it starts),
    its data capped (:data:`MEM_FACTOR`, :data:`MEM_EXTRA_MB`); past :data:`TIMEOUT_FACTOR` × the predicted
    seconds + :data:`TIMEOUT_EXTRA_S` the whole group is killed and the job is :class:`_NotRun`, as is one that
    ran out of its memory cap."""
    limit_s = TIMEOUT_FACTOR * job.seconds + TIMEOUT_EXTRA_S
    mem_mb = int(MEM_FACTOR * job.mem_mb + MEM_EXTRA_MB)
    proc = subprocess.Popen([sys.executable, "-I", "-c", _CHILD, json.dumps(sorted(trusted_envs)), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=scratch,
                            start_new_session=True, preexec_fn=_limit_memory(mem_mb))
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise _NotRun(f"ended after {limit_s:.0f} s ({TIMEOUT_FACTOR:g} × its predicted {job.seconds:.0f} s + "
                      f"{TIMEOUT_EXTRA_S:g} s), its processes with it") from None
    if proc.returncode != 0 and _OUT_OF_MEMORY.search(err):
        raise _NotRun(f"stopped by its memory cap of {mem_mb} MB ({MEM_FACTOR} × its predicted {job.mem_mb} MB + "
                      f"{MEM_EXTRA_MB} MB)")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _same_numbers(a: Path, b: Path) -> bool:
    x, y = read_table(a), read_table(b)
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
            with load_npz(old) as a, load_npz(new) as b:
                same = sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)
        elif o.file.endswith(".csv"):
            same = same_table(old, new)
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


def _rerun_one(results: Path, run: str, row, rec: dict, budget_min: float, trusted_envs) -> dict:
    """``{result, note, predicted_s}`` of one drawn job: checked, priced, run within its bounds, compared."""
    env = parse_run(run)[0]
    pred = {"predicted_s": None}
    if ":" in env and env not in set(trusted_envs):
        return {"result": "not_run", "note": "module:Id environment read from the folder: a re-run would import "
                                             "its module (--trust-env it if it is yours)", **pred}
    scratch = Path(tempfile.mkdtemp(prefix="crop-rerun-"))
    try:
        values = _checked_settings(rec, row)
        _same_run(rec["settings"], run)
        threads = int(values.get("threads", 1))
        if threads > (os.cpu_count() or 1):
            raise _NotRun(f"recorded threads {threads}: more than this machine's {os.cpu_count()} cores")
        job = _priced(values, row, run)
        pred["predicted_s"] = round(job.seconds, 1)
        if job.seconds > 60 * budget_min:
            raise _NotRun(f"predicted {job.seconds / 60:.3g} min for {_sizes(values, row)} (crop plan's cost model, "
                          f"CPU), over the re-run budget of {budget_min:g} min a job (--rerun-budget): not started")
        if job.mem_mb > _machine_mb():
            raise _NotRun(f"predicted {job.mem_mb} MB of memory for {_sizes(values, row)}, more than this machine's "
                          f"{_machine_mb()} MB: not started")
        done = _run_child(_argv(rec, values, row, results, run, scratch), scratch, trusted_envs, job)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return {"result": "differ", "note": f"the re-run failed: {tail}", **pred}
        result, note = _compare(row, results / run, scratch, str(rec.get("device", "cpu")).startswith("cpu"))
        return {"result": result, "note": note, **pred}
    except _NotRun as exc:
        return {"result": "not_run", "note": str(exc), **pred}
    except ValueError as exc:
        return {"result": "differ", "note": str(exc), **pred}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def rerun_jobs(results: Path, runs, k: int, seed: int = 0, trusted_envs=(), budget_min: float | None = None) \
        -> dict:
    """Re-run ``k`` stage jobs drawn at random (``seed``), each predicted within ``budget_min`` minutes (None:
    :data:`BUDGET_MINUTES`), and compare (see the module docstring).  Returns the ``rerun`` block of
    audit.json: ``checked``, ``identical``, ``within_interval``, ``differ``, ``seed``, ``budget_min``,
    ``not_run`` (drawn but not re-run, each with its reason; the verdict is then at best WARN),
    ``not_eligible`` and ``not_eligible_list`` (stages present without recorded settings, never drawn) and
    ``jobs`` (run, stage, device, result, note, predicted_s: the cost model's seconds, null where the job was
    not priced).  InputError, before any job runs, when a recorded commit is not the installed code's or the
    budget is not a finite number > 0."""
    from crop.io import _git_commit

    budget_min = BUDGET_MINUTES if budget_min is None else budget_min
    if isinstance(budget_min, bool) or not isinstance(budget_min, (int, float)) or not math.isfinite(budget_min) \
            or budget_min <= 0:
        raise InputError(f"--rerun-budget: must be a finite number of minutes > 0, got {budget_min!r}")
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
    rows = [{"run": run, "stage": row.rule, "job": f"{run} {row.rule}", "device": rec.get("device"),
             **_rerun_one(results, run, row, rec, budget_min, trusted_envs)} for run, row, rec in picked]
    counts = {r: sum(j["result"] == r for j in rows) for r in RERUN_RESULTS}
    return {"checked": sum(j["result"] != "not_run" for j in rows), **counts, "seed": seed, "budget_min": budget_min,
            "not_run": sum(j["result"] == "not_run" for j in rows), "not_eligible": len(not_eligible),
            "not_eligible_list": not_eligible, "jobs": rows}
