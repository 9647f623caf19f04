"""A received folder's records, checked before the report reads them: every stage's ``.meta.json``, a run's
``qrange.json`` and its checkpoint's ``model.json`` must be JSON objects whose fields the report reads have the
JSON type it reads them as.  A record that is not one is an integrity problem naming the file and its first
bad field (``loact.meta.json: settings.horizon: 'x' is not an integer``), and nothing of its run is read
further: a folder written by someone else cannot turn the audit into a traceback.

Fields the schemas do not name may hold anything (the report does not read them); a named field may be absent.

A run's tables are read by :func:`read_table`, under their columns' current names (an older folder's names for
LoAct's smoothed-output columns included: :func:`crop.columns.current_names`).
"""
from __future__ import annotations

import collections
import functools
import os
from pathlib import Path

from crop.columns import current_names
from crop.io import META_SUFFIX, ReceivedFileError, meta_name, open_received, read_csv, read_json, received_problem

__all__ = ["record_problem", "run_record_problems", "received_files", "received_file_problems", "error_line",
           "SCHEMAS", "read_table", "same_table"]


def _of(*types: str, **more) -> dict:
    return {"type": list(types) if len(types) > 1 else types[0], **more}


_NUM, _INT, _STR, _BOOL, _OBJ = _of("number", "null"), _of("integer", "null"), _of("string", "null"), \
    _of("boolean", "null"), _of("object", "null")
_NUMBERS = _of("array", "null", items=_of("number"))
_PAIR = _of("array", "null", items=_of("number"), minItems=2, maxItems=2)

#: The settings a stage records (its command line's values) that the report reads, by their JSON type (the
#: re-run checks every setting against its config node itself, :mod:`crop.audit.rerun`).
SETTINGS = _of("object", properties={
    "env": _STR, "algo": _STR, "target": _STR, "sigma": _NUM, "alpha": _NUM, "gamma": _NUM, "m": _INT,
    "horizon": _INT, "reward_range": _PAIR, "return_range": _PAIR})

#: What every stage records of how it ran (crop.io's provenance), in a meta file or qrange.json's block.
_PROVENANCE = {
    "stage": _STR, "seed": _INT, "device": _STR, "git_commit": _STR, "finished_utc": _STR, "runtime_s": _NUM,
    "platform": _STR, "argv": _of("array", "null", items=_of("string")),
    "versions": _of("object", "null", additionalProperties=_STR), "settings": SETTINGS,
    "inputs": _of("object", "null", additionalProperties=_of("object", "null", properties={"path": _STR,
                                                                                          "sha256": _STR})),
}

#: ``target: auto``'s record of the pilot's choice (crop.certify.pilot).
_CHOICE = _of("object", "null", properties={"chosen": _STR, "pilot_seed": _INT,
                                            "candidates": _of("array", "null", items=_of("string")),
                                            "predicted": _OBJ})

_META = _of("object", properties={
    **_PROVENANCE,
    "output": _of("object", properties={"file": _STR, "sha256": _STR, "rows": _INT, "bytes": _INT}),
    "target": _STR, "target_choice": _CHOICE, "reward_clip": _PAIR, "reward_modification": _STR,
    "alpha_mode": _STR, "confidence": _OBJ,
    **dict.fromkeys(("v_min", "v_max", "per_state_alpha", "per_bound_alpha", "exact_below_eps", "j_min", "j_max",
                     "percentile"), _NUM),
    "nodes": _INT, "truncated": _BOOL, "eps_factors": _NUMBERS,
    "search": _of("object", "null", properties={
        **dict.fromkeys(("alpha_spent", "exact_below_eps", "per_state_alpha", "per_state_alpha_first",
                         "per_state_alpha_last", "eps_max", "valid_until_eps", "runtime_s"), _NUM),
        **dict.fromkeys(("nodes", "max_nodes", "leaves", "transitions", "explored_nodes", "known_nodes",
                         "distinct_states_smoothed"), _INT),
        "truncated": _BOOL, "pruning": _BOOL, "reward_modification": _STR, "double_budget": _OBJ}),
})

_QRANGE = _of("object", properties={
    "env": _STR, "algo": _STR, "sigma": _NUM, "v_min": _NUM, "v_max": _NUM, "checkpoint_sha256": _STR,
    "states": _INT, "samples_per_state": _INT, "episodes": _INT, "method": _STR, "quantile": _NUM,
    "returns": _NUMBERS, "target_choice": _CHOICE, "provenance": _of("object", "null", properties=_PROVENANCE)})

_MODEL = _of("object", properties={
    **dict.fromkeys(("env", "algo", "sha256", "source", "recipe", "profile", "url", "network"), _STR),
    "net_spec": _OBJ, "hyperparameters": _OBJ, "training": _OBJ, "imported_from": _OBJ,
    "provenance": _of("object", "null", properties=_PROVENANCE),
    "clean_greedy_return": _of("object", "null", properties={"mean": _NUM, "min": _NUM, "std": _NUM,
                                                             "episodes": _INT})})

#: The schema of a record by its file name (every ``*.meta.json`` has the meta schema).
SCHEMAS = {"qrange.json": _QRANGE, "model.json": _MODEL}

_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "array": "a list",
               "boolean": "true or false", "null": "null", "object": "a mapping"}


def _shown(value) -> str:
    """A received value as a line shows it: its repr, cut at 200 characters (a record may hold a long list)."""
    text = repr(value)
    return text if len(text) <= 200 else text[:199] + "…"


def error_line(err) -> str:
    """One line for a schema error of a record: its path and what is wrong, in the config's words."""
    from crop.schema import as_list, error_message, field_path

    if err.validator == "type":
        want = " or ".join(_TYPE_WORDS.get(t, t) for t in as_list(err.validator_value))
        return f"{field_path(err.absolute_path)}: {_shown(err.instance)} is not {want}"
    if err.validator == "const":
        return f"{field_path(err.absolute_path)}: {_shown(err.instance)} is not {err.validator_value!r}"
    return error_message(err)


@functools.cache
def _validator(kind: str):
    """The validator of a kind of record (:data:`SCHEMAS`'s name, or the meta files' suffix), made once."""
    from crop.schema import validator_for

    schema = _META if kind == META_SUFFIX else SCHEMAS.get(kind, _of("object"))
    return validator_for(schema)(schema)


def record_problem(path: Path, root: Path | None = None) -> str | None:
    """What keeps the report from reading the record at ``path``, in one line, or None: not a regular file
    within a record's cap (a link leaving ``root``, when given: :func:`crop.io.open_received`), not JSON, or its
    first field (the shallowest, then in order) whose value is not of the type the report reads."""
    path = Path(path)
    try:
        rec = read_json(path, root=root)
    except ReceivedFileError as exc:
        return str(exc).removeprefix(f"{path}: ")
    except (ValueError, OSError) as exc:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return f"not readable as JSON ({type(exc).__name__}: {exc})"
    kind = META_SUFFIX if path.name.endswith(META_SUFFIX) else path.name
    errors = sorted(_validator(kind).iter_errors(rec),
                    key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    return error_line(errors[0]) if errors else None


def _checkpoint_dir(run_dir: Path) -> Path:
    """``ENV/ALGO/checkpoint`` of a run (or replicate) folder ``ENV/ALGO[@TARGET]/sigma-S[/rep-K]``."""
    from crop.workflow.layout import base_run, split_run_algo

    base = Path(base_run(run_dir))
    return base.parent.parent / split_run_algo(base.parent.name)[0] / "checkpoint"


def received_files(run_dir: Path) -> list[Path]:
    """The files of a run (or replicate) folder the report or a re-run may open, wherever a name is there
    (a link to nothing included): its result files and their records, its other ``*.json`` records, and its
    checkpoint folder's ``model.pt`` and ``model.json``."""
    from crop.workflow.layout import RUN_FILES

    run_dir = Path(run_dir)
    names = {n for f in RUN_FILES.values() for n in (f, meta_name(f))}
    ckpt = _checkpoint_dir(run_dir)
    found = {run_dir / n for n in names} | set(run_dir.glob("*.json")) | {ckpt / "model.pt", ckpt / "model.json"}
    return sorted(f for f in found if os.path.lexists(f))


def received_file_problems(run_dir: Path) -> list[dict]:
    """Each file of :func:`received_files` that is not read (:func:`crop.io.received_problem`): anything but a
    regular file, a link that leaves the run's environment folder ``ENV``, or a file over its kind's cap
    (:data:`crop.io.RECEIVED_CAPS`) — one problem each, checked before any of them is opened."""
    root = _checkpoint_dir(run_dir).parent.parent   # ENV: the run folders and the checkpoint of its algorithms
    problems = []
    for f in received_files(run_dir):
        found = received_problem(f, root=root)
        if found:
            problems.append({"file": str(f), "problem": f"{found}; the report reads only regular files of the "
                                                        "folder within their size cap, so nothing of its run is "
                                                        "read"})
    return problems


def run_record_problems(run_dir: Path) -> list[dict]:
    """The files of a run (or replicate) folder the report cannot read: first any that is not a regular file
    of the folder within its cap (:func:`received_file_problems`), then its ``*.json`` records and its
    checkpoint's ``model.json`` that are not of the shape the report reads — one problem each
    (``{"file", "problem"}``)."""
    run_dir = Path(run_dir)
    problems = received_file_problems(run_dir)
    if problems:
        return problems
    model = _checkpoint_dir(run_dir) / "model.json"
    files = sorted(run_dir.glob("*.json"))
    for f in files + ([model] if model.is_file() else []):
        found = record_problem(f)
        if found:
            problems.append({"file": str(f), "problem": f"{found}; the report cannot read this record, so "
                                                        "nothing of its run is read (rerun the stage that wrote it)"})
    return problems


def read_table(path: str | Path, *, root: str | Path | None = None):
    """A run's CSV table (:func:`crop.io.read_csv`, within a table's cap) with its columns under their current
    names (:func:`crop.columns.current_names`): how the report and the audit read a received run's table."""
    df = read_csv(path, root=root)
    names = current_names(df.columns)
    twice = sorted(n for n, k in collections.Counter(names).items() if k > 1)   # linear in a hostile header
    if twice:   # a former name beside its current one: which column is meant is not for the report to guess
        raise ReceivedFileError(f"{path}: column(s) {', '.join(twice)} named twice (a former name beside the "
                                "current one)")
    df.columns = names
    return df


def same_table(a: str | Path, b: str | Path) -> bool:
    """Whether two CSV tables hold the same bytes once their header lines name the columns by their current names
    (:func:`crop.columns.current_names`): a re-run's table against an older folder's."""
    import hashlib

    digests = []
    for path in (a, b):
        h = hashlib.sha256()
        with open_received(path, kind="table") as f:
            head = f.readline()
            names = head.rstrip(b"\r\n")
            text = ",".join(current_names(names.decode("utf-8", "surrogateescape").split(",")))
            h.update(text.encode("utf-8", "surrogateescape") + head[len(names):])
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digests.append(h.digest())
    return digests[0] == digests[1]
