"""The cost model's unit costs (:mod:`crop.workflow.cost`): what each unit measures, the range a calibrated value
may lie in, and the check of a calibration file — ``crop calibrate``'s, one given to ``crop plan
--calibration``, or a table shipped in crop/workflow/costs/ — against them.

A table is read by ``crop plan`` and by the workflow's resources (rules/common.smk) and multiplied into
every job's prediction and SLURM request, so a value no machine measures (a start of 1e300 s, a snapshot
of a terabyte, a string) would become a plan of 300-digit hours, an overflow, or a job asking SLURM for
petabytes.  Every table is therefore checked key by key when it is read, and a bad one is refused in one
line naming the key, before anything is priced.  No torch here: a login node reads it.
"""
from __future__ import annotations

import json
import math
import os
from importlib import resources
from pathlib import Path

__all__ = ["CostError", "Units", "UNIT_TABLE", "UNITS", "OPTIONAL_UNITS", "ALGO_UNITS", "GLOBAL_UNITS", "DEVICES",
           "check_tables", "check_table", "calibration_path", "shipped_table", "unit_costs", "LENDERS", "lender"]


class CostError(ValueError):
    """A config or calibration the model cannot price; the message names what to calibrate or set."""


#: Every unit: (per environment, lowest, highest plausible value, what it measures).  Seconds on one core
#: (torch threads: 1), but ``node_mb`` (megabytes).  The lowest values leave room for hardware far faster
#: than the shipped tables' (a GPU smooths a CartPole state's sample in 45 ns); the highest are beyond any
#: job the workflow can finish, so a value outside is a broken or hostile file, never a slow machine.
UNIT_TABLE = {
    "smooth_sample_s": (True, 1e-10, 1.0, "one noisy state through the network when smoothing, per sample"),
    "grad_sample_s": (True, 1e-10, 1.0, "a PGD gradient through the network, per sample"),
    "grad_call_s": (True, 1e-10, 60.0, "a PGD gradient call's fixed cost, whatever its batch"),
    "env_step_s": (True, 1e-9, 60.0, "one environment step"),
    "gre_step_s": (True, 1e-9, 60.0, "one step of a GRe trajectory on one worker"),
    "gre_parent_step_s": (True, 1e-9, 60.0, "GRe's main process per trajectory step: noise, forward, lockstep"),
    "gre_reset_s": (True, 1e-9, 600.0, "a GRe trajectory's environment reset (and made, without gre_start_s)"),
    "gre_start_s": (True, 1e-9, 600.0, "a GRe slot's environment made, its worker started and closed"),
    "lore_transition_s": (True, 1e-9, 600.0, "a LoRe child created: restore, step, snapshot"),
    "node_mb": (True, 1e-6, 65536.0, "one LoRe node's snapshot, pickled"),
    "train_step_s": (True, 1e-8, 600.0, "one training environment step: act greedily, step, store"),
    "train_update_s": (True, 1e-8, 600.0, "one training gradient update of a batch"),
    "start_s": (False, 1e-3, 3600.0, "a job's fixed start: imports, loading"),
    "fetch_s": (False, 1e-3, 86400.0, "a download with its evaluation"),
    "figure_s": (False, 1e-6, 3600.0, "one figure file"),
    "audit_run_s": (False, 1e-6, 3600.0, "one run folder audited"),
}
#: Per-environment unit costs the model needs (in ``envs.<id>``), and the global ones.
#: ``gre_start_s`` may be absent: a table measured before GRe reused its slots counts the making of an
#: environment in ``gre_reset_s``, per trajectory, which errs long; so may ``gre_parent_step_s`` (a pool in one
#: process, CARTPOLE's, or a table that measured the main process's part inside ``gre_step_s``); so may
#: ``grad_call_s`` (a table that measured ``grad_sample_s`` at 32 samples a call holds the call's cost in it).
OPTIONAL_UNITS = ("gre_start_s", "gre_parent_step_s", "grad_call_s")
#: The units an algorithm's own network changes (``envs.<id>.algos.<algo>``: crop.workflow.calibrate.algo_costs).
ALGO_UNITS = ("smooth_sample_s", "grad_sample_s", "grad_call_s", "gre_step_s", "gre_parent_step_s")
UNITS = tuple(name for name, row in UNIT_TABLE.items() if row[0] and name not in OPTIONAL_UNITS)
GLOBAL_UNITS = tuple(name for name, row in UNIT_TABLE.items() if not row[0])

#: The devices a calibration file holds a table for.
DEVICES = ("cpu", "cuda")
#: A table's provenance beside its units: what measured it, when, on which machine.
_TEXT = ("device", "source", "measured", "note")


def _number(value, key: str, where: str) -> None:
    """``value`` a finite number within its unit's range; CostError naming ``key`` otherwise."""
    _, lo, hi, meaning = UNIT_TABLE[key.rsplit(".", 1)[-1]]
    what = "MB" if key.endswith("_mb") else "s"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CostError(f"{where}: {key} = {value!r:.40} is not a number ({what}: {meaning})")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise CostError(f"{where}: {key} = {value:g} is outside [{lo:g}, {hi:g}] {what} ({meaning})")


def _env(units, device: str, env, where: str) -> None:
    key = f"{device}.envs.{env}"
    again = f"run `crop calibrate --device {device} --env {env}` again"
    if not isinstance(units, dict):
        raise CostError(f"{where}: {key} is {type(units).__name__}, not a table of unit costs; {again}")
    if "lore_node_s" in units and "lore_transition_s" not in units:
        raise CostError(f"{where}: the calibration of {env} on {device} predates lore_transition_s (it has "
                        f"lore_node_s, which the model no longer uses): {again}")
    for name in units:
        if name in OPTIONAL_UNITS:
            _number(units[name], f"{key}.{name}", where)
        elif name == "algos":
            _algos(units[name], f"{key}.algos", where)
        elif name not in UNITS and name != "gre_single_process":
            raise CostError(f"{where}: {key}.{name} is not a unit cost (known: {', '.join(UNITS)}); {again}")
    for name in UNITS:
        if name not in units:
            raise CostError(f"{where}: no unit cost {name} of {env} on {device} ({key}.{name}): {again}")
        _number(units[name], f"{key}.{name}", where)
    if not isinstance(units.get("gre_single_process", False), bool):
        raise CostError(f"{where}: {key}.gre_single_process = {units['gre_single_process']!r:.40} is not true or "
                        "false")


def _algos(algos, key: str, where: str) -> None:
    """``envs.<id>.algos``: per algorithm, a table of some of :data:`ALGO_UNITS`."""
    if not isinstance(algos, dict):
        raise CostError(f"{where}: {key} is {type(algos).__name__}, not a table of unit costs per algorithm")
    for algo, units in algos.items():
        if not isinstance(units, dict):
            raise CostError(f"{where}: {key}.{algo} is {type(units).__name__}, not a table of unit costs")
        for name, value in units.items():
            if name not in ALGO_UNITS:
                raise CostError(f"{where}: {key}.{algo}.{name} is not a unit an algorithm's network changes "
                                f"(known: {', '.join(ALGO_UNITS)})")
            _number(value, f"{key}.{algo}.{name}", where)


def check_table(table, device: str, where: str) -> None:
    """One device's table checked key by key: provenance text, the machine's record (plain values), every
    global unit and ``envs`` (a table of unit costs per environment id), each unit a finite number within
    :data:`UNIT_TABLE`'s range.  Raises :class:`CostError` in one line naming the first bad key."""
    again = f"run `crop calibrate --device {device}` again"
    if not isinstance(table, dict):
        raise CostError(f"{where}: {device} is {type(table).__name__}, not a table of unit costs; {again}")
    for key, value in table.items():
        if key in _TEXT:
            if not isinstance(value, str) or (key == "device" and value != device):
                raise CostError(f"{where}: {device}.{key} = {value!r:.40} is not "
                                f"{repr(device) if key == 'device' else 'text'}")
        elif key == "machine":
            if not isinstance(value, dict) or not all(isinstance(k, str) and (v is None or isinstance(v, (str, int)))
                                                      for k, v in value.items()):
                raise CostError(f"{where}: {device}.machine is not a record of the machine (cpu, cores, gpu)")
        elif key not in GLOBAL_UNITS and key != "envs":
            raise CostError(f"{where}: {device}.{key} is not a key of a calibration (units: "
                            f"{', '.join(GLOBAL_UNITS)}, envs; provenance: {', '.join(_TEXT)}, machine)")
    for name in GLOBAL_UNITS:
        if name not in table:
            raise CostError(f"{where}: no unit cost {name} on {device} ({device}.{name}): {again}")
        _number(table[name], f"{device}.{name}", where)
    envs = table.get("envs")
    if not isinstance(envs, dict):
        raise CostError(f"{where}: {device}.envs is {'missing' if envs is None else type(envs).__name__}, not a "
                        f"table of unit costs per environment; {again}")
    for env, units in envs.items():
        _env(units, device, env, where)


def check_tables(tables, where: str) -> None:
    """A calibration file's content: a JSON object of one table per device (:data:`DEVICES`), each checked by
    :func:`check_table`.  Raises :class:`CostError` in one line naming the first bad key."""
    if not isinstance(tables, dict) or not tables:
        what = "an empty object" if isinstance(tables, dict) else f"a JSON {type(tables).__name__}"
        raise CostError(f"{where}: not a calibration file ({what}; one holds a table of unit costs per device: "
                        f"{' or '.join(DEVICES)}, as `crop calibrate` writes it)")
    for device in tables:
        if device not in DEVICES:
            raise CostError(f"{where}: not a calibration file ({device!r:.40} is not a device: "
                            f"{' or '.join(DEVICES)})")
    for device, table in tables.items():
        check_table(table, device, where)


# ------------------------------------------------------------------------------------------- reading a table

def calibration_path() -> Path:
    """``$XDG_CACHE_HOME/crop/calibration.json`` (default ``~/.cache/crop/``): what ``crop calibrate`` wrote."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "crop" / "calibration.json"


def shipped_table(device: str) -> dict:
    """The table shipped with the package for ``device``, checked as any calibration is
    (:func:`check_table`): an edited copy must not price a plan any other way."""
    text = resources.files("crop.workflow").joinpath(f"costs/{device}.json").read_text()
    table = json.loads(text)
    check_table(table, device, f"calibration crop/workflow/costs/{device}.json (shipped)")
    return table


#: A calibration file is a few kB; anything far larger is not one, and is not read into memory.
MAX_CALIBRATION_BYTES = 1_000_000


def unit_costs(device: str, calibration: str | Path | None = None) -> tuple[dict, str]:
    """The unit-cost table for ``device`` (cpu or cuda) and where it came from: the calibration file
    (``calibration``, else this machine's: :func:`calibration_path`) when it holds one for the device, else
    the table shipped with the package.  The file is checked as a whole before any of it is used
    (:func:`check_tables`); a ``calibration`` given that is not a file is refused, never replaced by the
    shipped table."""
    path = Path(calibration) if calibration else calibration_path()
    where = f"calibration {path}"
    if calibration and not path.exists():
        raise CostError(f"{where}: no such file (`crop calibrate --out FILE` writes one)")
    if path.exists():
        try:
            if not path.is_file() or path.stat().st_size > MAX_CALIBRATION_BYTES:
                raise ValueError(f"not a regular file of at most {MAX_CALIBRATION_BYTES:,} bytes")
            tables = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as exc:
            why = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise CostError(f"{where}: not a calibration file ({why}); rerun `crop calibrate --device {device}`") \
                from None
        check_tables(tables, where)
        if device in tables:
            t = tables[device]
            return t, f"{path} (crop calibrate --device {device}, {t.get('measured', '?')}, {t.get('machine', {})})"
    t = shipped_table(device)
    return t, f"the shipped {device} table (crop/workflow/costs/{device}.json: {t['source']}, {t['measured']})"


#: Whose units price an environment the table has none of, by its family (crop.envs.env_family): the first of
#: these the table holds.  A borrowed price is a guess (``crop plan`` says so); ``crop calibrate --env ID``
#: measures the environment's own.  The paper's four environments never borrow: their units are shipped.
LENDERS = {"atari": ("PongNoFrameskip-v4", "FreewayNoFrameskip-v4"), "highway": ("highway-fast-v0",),
           "vector": ("CartPole-v0",)}


def lender(table: dict, env: str | None) -> str | None:
    """The environment whose units price ``env``: ``env`` itself where the table holds it (or for a global
    job, env None), else the first of its family's :data:`LENDERS` the table holds, else ``env`` (whose
    missing units :class:`Units` names)."""
    envs = table.get("envs", {})
    if env is None or env in envs:
        return env
    from crop.envs import UnknownEnvError, env_family  # gymnasium, not torch

    try:
        family = env_family(env)
    except UnknownEnvError:
        return env
    return next((e for e in LENDERS.get(family, ()) if e in envs), env)


class Units:
    """The unit costs one job is priced from: a table (:func:`unit_costs`) read for the job's environment and
    device, or of the environment it borrows them from (:func:`lender`: ``borrowed``).  ``u(name)`` is a unit; a
    missing one (in a checked table: an environment it has no units for) is an error naming the calibration
    that gives it, never a silent 0."""

    def __init__(self, table: dict, env: str | None, device: str, algo: str | None = None):
        self.table, self.env, self.device = table, env, device
        self.units_of = lender(table, env)
        self.algo = algo.split("@", 1)[0] if algo else None   # a run folder's ALGO@TARGET: its algorithm

    @property
    def env_units(self) -> dict:
        """The environment's own entries of the table (a unit it may leave out, ``gre_single_process``)."""
        return self.table.get("envs", {}).get(self.units_of, {})

    @property
    def borrowed(self) -> str | None:
        """The environment whose units price this one's job where it has none of its own, else None."""
        return self.units_of if self.units_of != self.env else None

    def has(self, name: str) -> bool:
        """Whether the table gives ``name`` for this job (an optional unit may be absent)."""
        return name in self.env_units or name in self.algo_units

    @property
    def algo_units(self) -> dict:
        """The units the job's algorithm's own network changes (CARRL, NoisyNet), else none."""
        return (self.env_units.get("algos") or {}).get(self.algo) or {}

    def __call__(self, name: str) -> float:
        glob = name in GLOBAL_UNITS
        value = self.table.get(name) if glob else self.algo_units.get(name, self.env_units.get(name))
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0 \
                or not math.isfinite(value):
            what = name + ("" if glob else f" of {self.env}")
            raise CostError(f"no unit cost {what} on {self.device}: run `crop calibrate --device {self.device}"
                            f"{'' if glob else f' --env {self.env}'}` on a machine like the one that runs it")
        return float(value)
