"""What a config costs before anything runs: every job of the DAG Snakemake would build, its predicted
seconds from measured unit costs, the totals, the makespan on given machines, and the SLURM wall-time and
memory each job asks for.

The unit costs (one table per device, :func:`unit_costs`) are measured by ``crop calibrate``
(:mod:`crop.workflow.calibrate`) and multiplied by each job's work.  A per-run stage's work is its row's cost
function and its memory its row's memory (:class:`crop.workflow.stage_table.StageRow`; the paper's stages:
:mod:`crop.workflow.stage_costs`); the other jobs' are here:

==============  =============================================================================================
job             seconds (every job adds the table's ``start_s``: imports, loading)
==============  =============================================================================================
checkpoint      trained: (env + evaluation steps) × ``train_step_s`` + (updates + PGD) × ``train_update_s``
                (:func:`training_work`); published, derived or your own file: ``fetch_s``
a stage         its row's cost function (qrange, loact, gre, lore, attack_local, attack_global: stage_costs)
aggregate       figures × ``figure_s``; audit: run folders × ``audit_run_s``
==============  =============================================================================================

GRe runs on CPU cores and asks for no GPU (its row's device function, :func:`stage_device`): its time is the
environments' stepping in its workers and its main process's noise and batched forward (priced apart: the
workers divide the one, not the other), so it leaves the node's GPU to the stages that need it, and several GRe
jobs share a node.

Unit costs are CPU seconds on one core (torch threads: 1).  A job asks for the threads it uses
(:func:`stage_threads`): GRe its workers, every other job one; the one-thread stage jobs of an environment and
algorithm run as one SLURM group (:func:`stage_group`), and what every allocation asks for is
:func:`requested`.  Episodes are counted at their full horizon (an episode that
ends sooner costs less), and LoRe's tree at its worst case for what can be known before the run
(:func:`~crop.workflow.stage_costs.lore_nodes`), so a prediction errs long.  No torch is imported here
(environments' facts only): ``crop plan`` on a login node and the Snakefile's resources read it.
"""
from __future__ import annotations

import functools
import heapq
import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path

from crop.workflow import layout
from crop.workflow.config import run_targets, sigma_label, smoothing_targets, train_settings
from crop.workflow.cost_units import (
    GLOBAL_UNITS,
    UNITS,
    CostError,
    Units,
    calibration_path,
    shipped_table,
    unit_costs,
)
from crop.workflow.stage_costs import MAX_PRICED_NODES, STAGE_MEM_MB, env_device, lore_nodes, lore_transitions
from crop.workflow.stage_table import STAGES
from crop.workflow.training_cost import EPISODE_STEPS, training_settings, training_work

__all__ = ["CostError", "Job", "unit_costs", "calibration_path", "jobs", "predict", "lore_nodes",
           "lore_transitions", "MAX_PRICED_NODES", "Units", "training_settings", "training_work",
           "runtime_minutes", "HEADROOM", "HEADROOM_MIN", "plan", "UNITS", "price", "job_resources", "JobResources",
           "makespan", "slurm_caps", "shipped_table", "GLOBAL_UNITS", "MAX_RUNTIME", "MAX_MEM_MB",
           "stage_device", "stage_gpus", "job_priority", "stage_threads", "stage_group", "job_kind",
           "RESUMABLE_HEADROOM", "RESUMABLE_MIN", "GROUPED_HEADROOM", "requested", "borrowed_note"]

#: A job asks SLURM for HEADROOM × its prediction + HEADROOM_MIN minutes where it must finish in one allocation
#: (a fetch, an aggregate, a stage that cannot resume): the model aims at 0.5–2× of a job's measured time
#: (docs/speed.md), so 2× covers a node half as fast as the table's, and the minutes cover the queue's file
#: system.
HEADROOM, HEADROOM_MIN = 2.0, 5
#: A resumable job (a training, a stage whose row is :attr:`~crop.workflow.stage_table.StageRow.resumable`) saves
#: its state when SLURM signals it and its retry resumes: stopped at its limit it loses the wait for the retry,
#: not its work, so it asks for RESUMABLE_HEADROOM × its prediction, and at least RESUMABLE_MIN minutes more than
#: it (the signal's lead: a job as fast as predicted is never signalled).
RESUMABLE_HEADROOM, RESUMABLE_MIN = 1.25, 5
#: A grouped job (a stage on one thread: :func:`stage_group`) runs inside its group's one allocation, which asks
#: for the sum of its members' minutes (Snakemake's group resources); a member asks for GROUPED_HEADROOM × its
#: prediction in whole minutes (rounded, at least one), so a group of tens of jobs of a minute or less asks for
#: about GROUPED_HEADROOM × their sum, and a member stopped by the limit leaves the finished ones' files for the
#: retry, which runs only the rest.
GROUPED_HEADROOM = 1.5

#: The most a job asks SLURM for where the config's ``slurm`` block gives no cap (null): a week of wall-time
#: (minutes) and 512,000 MB, the memory of the largest nodes sites commonly have.  A prediction past either
#: is a config too large for one job (``crop plan`` names it), not a request any queue would run.
MAX_RUNTIME, MAX_MEM_MB = 7 * 24 * 60, 512_000


@dataclass
class Job:
    """One job of the DAG: its rule and wildcards as Snakemake spells them, and what it will cost."""

    rule: str
    env: str | None = None
    algo: str | None = None
    sigma: str | None = None
    rep: int | None = None
    device: str = "cpu"
    threads: int = 1
    gpus: int = 0
    seconds: float = 0.0
    start_s: float = 0.0   # of ``seconds``, the start every job pays (imports, loading)
    mem_mb: int = 1000
    needs: list = field(default_factory=list)   # indices of the jobs it waits for
    note: str = ""
    borrowed: str | None = None   # the environment whose units priced it, where its own has none (Units.borrowed)

    @property
    def wildcards(self) -> dict:
        w = {"env": self.env, "algo": self.algo, "sigma": self.sigma, "rep": self.rep}
        return {k: (str(v) if v is not None else None) for k, v in w.items() if v is not None}

    @property
    def minutes(self) -> float:
        return self.seconds / 60


# ----------------------------------------------------------------------------------------------- the model

def _function(spec):
    """A row's function: itself, or the one its ``module:function`` names."""
    if callable(spec):
        return spec
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _row(rule: str):
    """The stage table's row of a per-run rule (``lore``, ``lore_replicate``), or None for another job."""
    return STAGES.get(rule.removesuffix("_replicate").replace("_", "-"))


def _checkpoint_seconds(cfg: dict, job: Job, t: dict) -> float:
    """A checkpoint's seconds: a download (``fetch_s``), or a training's work (:func:`training_work`) priced as
    (env steps + evaluation steps) × ``train_step_s`` + (updates + PGD updates) × ``train_update_s``."""
    from crop.agents.registry import checkpoint_source

    ec = cfg["environments"][job.env]
    src = checkpoint_source(job.env, job.algo, ec["source"], ec.get("files"))
    u = Units(t, job.env, job.device)
    if src["kind"] != "train":
        return u("fetch_s")
    s = training_settings(job.env, job.algo, train_settings(ec, job.algo))
    episode = min(n for n in (s["eval_max_steps"], EPISODE_STEPS.get(job.env)) if n) \
        if s["eval_max_steps"] or job.env in EPISODE_STEPS else ec["gre"]["horizon"]
    w = training_work(s, episode)
    return (w["env_steps"] + w["eval_steps"]) * u("train_step_s") + \
        (w["updates"] + w["pgd_updates"]) * u("train_update_s")


def runtime_minutes(seconds: float, cap: int | None = None, kind: str = "alone") -> int:
    """The wall-time (minutes) a job asks SLURM for, at most ``cap`` (:func:`slurm_caps`), by its ``kind``
    (:func:`job_kind`): ``alone`` :data:`HEADROOM` × its prediction + :data:`HEADROOM_MIN`; ``resumable``
    :data:`RESUMABLE_HEADROOM` × and at least :data:`RESUMABLE_MIN` more; ``grouped`` :data:`GROUPED_HEADROOM` × in
    whole minutes, at least one.  A prediction past the cap (an infinite one too) asks for the cap."""
    if cap and _over(seconds, cap):
        return cap
    if kind == "grouped":
        minutes = max(1, round(GROUPED_HEADROOM * seconds / 60))
    elif kind == "resumable":
        minutes = math.ceil(max(RESUMABLE_HEADROOM * seconds / 60, seconds / 60 + RESUMABLE_MIN))
    else:
        minutes = math.ceil(HEADROOM * seconds / 60) + HEADROOM_MIN
    return min(minutes, cap) if cap else minutes


def _over(seconds: float, cap: int) -> bool:
    """Whether :func:`runtime_minutes` of ``seconds`` without a cap exceeds ``cap`` minutes (NaN and inf do)."""
    return not HEADROOM * seconds / 60 + HEADROOM_MIN <= cap


def slurm_caps(cfg: dict) -> tuple[int, int]:
    """The most any job asks SLURM for: ``(minutes, MB)`` from the config's ``slurm.max_runtime`` and
    ``slurm.max_mem_mb``, else :data:`MAX_RUNTIME` and :data:`MAX_MEM_MB`."""
    s = cfg.get("slurm") or {}
    return s.get("max_runtime") or MAX_RUNTIME, s.get("max_mem_mb") or MAX_MEM_MB


# ----------------------------------------------------------------------------------------------- the DAG

def stage_device(cfg: dict, rule: str, env: str) -> str:
    """The ``--device`` of a stage's jobs: its row's device function's (:mod:`crop.workflow.stage_costs`)."""
    return _function(_row(rule).device)(cfg, env)


def stage_threads(cfg: dict, rule: str, env: str) -> int:
    """Threads a stage's job uses and asks for: the config's ``threads`` where its row is ``parallel`` (GRe's
    worker processes) and the environment's pool has workers, one otherwise (a stage's torch work on one core;
    on a GPU, the core that feeds it; CartPole's GRe pool in one process: crop.envs.ONE_PROCESS_POOLS)."""
    from crop.envs import ONE_PROCESS_POOLS  # gymnasium, not torch

    return cfg["threads"] if _row(rule).parallel and env not in ONE_PROCESS_POOLS else 1


def stage_group(rule: str) -> str | None:
    """The Snakemake group of a rule's jobs on a cluster, or None: every stage on one thread joins the group of
    its (environment, algorithm), so that one allocation runs all its σ's short jobs (GRe's long, parallel jobs
    stand alone).  The SLURM profile assigns these groups (``groups``), joins a group's parts
    (``group-components``) and runs its members one at a time (the local resource ``lane``); a local run, without
    the profile, runs every job on its own."""
    row = _row(rule)
    return "{env}~{algo}" if row is not None and not row.parallel else None


def job_kind(cfg: dict, job: Job) -> str:
    """How a job asks for its wall-time (:func:`runtime_minutes`): ``grouped`` (:func:`stage_group`),
    ``resumable`` (a training, a stage whose row is resumable) or ``alone``."""
    row = _row(job.rule)
    if row is not None:
        return "grouped" if stage_group(row.rule) else "resumable" if row.resumable else "alone"
    if job.rule == "checkpoint" and job.env is not None:
        from crop.agents.registry import checkpoint_source

        ec = cfg["environments"][job.env]
        if checkpoint_source(job.env, job.algo, ec["source"], ec.get("files"))["kind"] == "train":
            return "resumable"
    return "alone"


def stage_gpus(cfg: dict) -> int:
    """GPUs a certification or attack job asks for where it may use CUDA: one when any environment's networks
    run on a device other than the CPU (:func:`crop.workflow.stage_costs.env_device`), none otherwise; a
    stage's jobs ask for them where :func:`stage_device` is not the CPU."""
    return int(any(env_device(cfg, env) != "cpu" for env in cfg["environments"]))


def jobs(cfg: dict, gpus: int | None = None) -> list[Job]:
    """Every job Snakemake builds for a validated config (rules/*.smk, from the same functions): a checkpoint
    per (env, algorithm) — the certified ones and the bases others are derived from —, the per-run stages of
    the stage table (qrange only for the q target), replicates 1 … N−1 of the replicated stages, then the
    aggregate and the audit.  ``needs`` holds each job's inputs (for the makespan).  ``gpus``: GPUs a
    machine has (None: as the environments' devices ask, :func:`stage_device`; 0 runs everything on the CPU)."""
    from crop.agents.registry import checkpoint_source

    gpu_stages = 0 if gpus == 0 else stage_gpus(cfg)
    out: list[Job] = []
    ckpt: dict[tuple, int] = {}

    def add(job: Job) -> int:
        out.append(job)
        return len(out) - 1

    for env, ec in cfg["environments"].items():
        algos = list(dict.fromkeys(ec["algorithms"]))
        for algo in list(algos):
            src = checkpoint_source(env, algo, ec["source"], ec.get("files"))
            if src["kind"] == "derive" and src["base"] not in algos:
                algos.append(src["base"])
        for algo in algos:
            src = checkpoint_source(env, algo, ec["source"], ec.get("files"))
            dev = "cpu" if src["kind"] != "train" or gpus == 0 else \
                ("cpu" if ec.get("train", {}).get("dqn", {}).get("device", "cpu") == "cpu" else "cuda")
            ckpt[env, algo] = add(Job("checkpoint", env, algo, device=dev, gpus=int(dev == "cuda")))
        for algo in algos:
            src = checkpoint_source(env, algo, ec["source"], ec.get("files"))
            if src["kind"] == "derive":
                out[ckpt[env, algo]].needs.append(ckpt[env, src["base"]])
    run_jobs = []
    for env, algo, sig, target in run_targets(cfg):
        name = layout.run_algo(algo, target)
        base = ckpt[env, algo]
        stages = layout.run_stages(target, cfg["environments"][env].get("skip", ()))
        for rep in range(cfg["replicates"]):
            q = None
            for stage, row in STAGES.items():
                if rep and not row.replicate or stage not in stages:
                    continue
                gpu = gpu_stages and stage_device(cfg, row.rule, env) != "cpu"
                job = Job(row.rule + ("_replicate" if rep else ""), env, name, sig, rep or None,
                          device="cuda" if gpu else "cpu", threads=stage_threads(cfg, row.rule, env), gpus=int(gpu),
                          needs=[base])
                if row.v_range and q is not None:
                    job.needs.append(q)
                i = add(job)
                run_jobs.append(i)
                if stage == "qrange":
                    q = i
    agg = add(Job("aggregate", needs=list(run_jobs)))
    add(Job("audit", needs=[agg, *run_jobs]))
    return out


def price(cfg: dict, job: Job, table: dict) -> Job:
    """Fill in ``job``'s predicted seconds and memory from a unit-cost table (the module docstring's model):
    a stage's from its row's memory and cost function, beside the start every job pays; :class:`CostError`
    naming what to calibrate or set when it cannot."""
    u = Units(table, job.env, job.device, job.algo)
    job.borrowed = u.borrowed
    start = job.start_s = u("start_s")
    job.mem_mb = STAGE_MEM_MB
    if job.rule == "checkpoint":
        job.seconds, job.mem_mb = start + _checkpoint_seconds(cfg, job, table), 1500
    elif job.rule == "aggregate":
        figures = sum(len(layout.figure_stems(env, [sigma_label(s) for s in ec["sigmas"]],
                                              [layout.run_algo(a, x) for a in ec["algorithms"]
                                               for x in smoothing_targets(ec)]))
                      for env, ec in cfg["environments"].items())
        job.seconds, job.mem_mb = start + 2 * figures * u("figure_s"), 2000
    elif job.rule == "audit":
        job.seconds = start + len(run_targets(cfg)) * u("audit_run_s")
    else:
        row = _row(job.rule)
        job.mem_mb = row.memory if isinstance(row.memory, int) else _function(row.memory)(cfg, job, u)
        stage_s, job.note = _function(row.cost)(cfg, job, u)
        job.seconds = start + stage_s
    return job


@functools.cache
def _tables(device: str, calibration: str | None) -> tuple[dict, str]:
    return unit_costs(device, calibration)


def predict(cfg: dict, gpus: int | None = None, calibration: str | Path | None = None) -> tuple[list[Job], dict]:
    """:func:`jobs` with every job's seconds and memory filled in, and ``{device: source}`` of the unit-cost
    tables used.  Raises :class:`CostError` naming what to calibrate or set for a job it cannot price."""
    out, sources = jobs(cfg, gpus), {}
    for job in out:
        table, sources[job.device] = _tables(job.device, str(calibration) if calibration else None)
        price(cfg, job, table)
    return out, sources


def job_resources(cfg: dict, rule: str, wildcards, threads: int, gpus: int) -> dict:
    """``{"runtime": minutes, "mem_mb": MB}`` a job asks SLURM for (rules/common.smk): its prediction with
    headroom (:func:`runtime_minutes`) and its predicted memory, each at most its cap (:func:`slurm_caps`).
    A job the model cannot price asks for the wall-time cap (``crop plan`` names it); a calibration file that
    cannot be read is :class:`CostError`."""
    w = dict(wildcards.items()) if hasattr(wildcards, "items") else dict(wildcards or {})
    rep = int(w["rep"]) if "rep" in w else None
    job = Job(rule, w.get("env"), w.get("algo"), w.get("sigma"), rep, threads=threads, gpus=gpus,
              device="cuda" if gpus else "cpu")
    cap, mem_cap = slurm_caps(cfg)
    table = _tables(job.device, None)[0]
    try:
        price(cfg, job, table)
    except CostError:
        return {"runtime": cap, "mem_mb": min(job.mem_mb, mem_cap)}
    return {"runtime": runtime_minutes(job.seconds, cap, job_kind(cfg, job)), "mem_mb": min(job.mem_mb, mem_cap)}


class JobResources:
    """:func:`job_resources` of one validated config, memoised: Snakemake evaluates each resource of a job
    (``runtime``, ``mem_mb``) by its own call, and again when it schedules the job, and each call would
    price the job afresh.  The memo's key is everything a price reads: the rule, the job's wildcards, threads
    and GPUs, and for a LoRe job whose tree size comes from a finished LoAct the state of that ``loact.csv``
    (absent, or its size, modification time and inode), so a prediction made before LoAct finished is not
    served after it.  The config must not change while the memo is in use (the Snakefile's never does)."""

    def __init__(self, cfg: dict):
        self.cfg, self._memo = cfg, {}
        for device in ("cpu", "cuda"):   # a bad calibration file is refused when the workflow is parsed
            _tables(device, None)

    def __call__(self, rule: str, wildcards, threads: int, gpus: int) -> dict:
        w = dict(wildcards.items()) if hasattr(wildcards, "items") else dict(wildcards or {})
        read, row = None, _row(rule)
        if row is not None and row.reads:
            path = _function(row.reads)(self.cfg, Job(rule, w.get("env"), w.get("algo"), w.get("sigma")))
            if path is not None:
                try:
                    st = path.stat()
                    read = (st.st_size, st.st_mtime_ns, st.st_ino)
                except FileNotFoundError:
                    read = "absent"
        key = (rule, tuple(sorted(w.items())), threads, gpus, read)
        if key not in self._memo:
            self._memo[key] = job_resources(self.cfg, rule, w, threads, gpus)
        return dict(self._memo[key])


# ----------------------------------------------------------------------------------------------- the plan

def job_priority(gpus: int) -> int:
    """A job's Snakemake ``priority:`` (the rules'): a job that holds a GPU goes before every other ready job.
    On one node the GPU is the scarce resource: behind a queue of 4-thread GRe jobs that fill the cores, the
    GPU's jobs (each also needs threads) would wait and the GPU idle (paper plan: 20.4 h on one node ordered
    longest first, 16.5 h GPU jobs first)."""
    return 1 if gpus else 0


def makespan(plan_jobs: list[Job], cores: int, gpus: int, nodes: int = 1) -> float:
    """Seconds until the last job ends on ``nodes`` machines of ``cores`` cores and ``gpus`` GPUs each: list
    scheduling in the DAG's order (a job starts when its inputs exist and a node has its threads and GPU
    free; of the ready jobs, the higher :func:`job_priority` first, then the longest), as the workflow's
    scheduler would run them."""
    free = [[cores, gpus] for _ in range(nodes)]
    done_at = [math.nan] * len(plan_jobs)
    waiting = {i: set(j.needs) for i, j in enumerate(plan_jobs)}
    ready = []
    running: list = []   # (end, index, node)
    now = 0.0

    def release():
        for i in [i for i, deps in waiting.items() if not deps]:
            del waiting[i]
            heapq.heappush(ready, (-job_priority(plan_jobs[i].gpus), -plan_jobs[i].seconds, i))

    release()
    while ready or running:
        postponed = []
        while ready:
            item = heapq.heappop(ready)
            j = plan_jobs[item[-1]]
            need_c, need_g = min(j.threads, cores), min(j.gpus, gpus)
            node = next((n for n, (c, g) in enumerate(free) if c >= need_c and g >= need_g), None)
            if node is None:
                postponed.append(item)
                continue
            free[node][0] -= need_c
            free[node][1] -= need_g
            heapq.heappush(running, (now + j.seconds, item[-1], node))
        for item in postponed:
            heapq.heappush(ready, item)
        if not running:
            break
        now, i, node = heapq.heappop(running)
        j = plan_jobs[i]
        free[node][0] += min(j.threads, cores)
        free[node][1] += min(j.gpus, gpus)
        done_at[i] = now
        for deps in waiting.values():
            deps.discard(i)
        release()
    return now


def requested(cfg: dict, plan_jobs: list[Job]) -> dict:
    """What the jobs ask SLURM for, as the profile submits them: every group (:func:`stage_group`: the stage
    jobs of one environment and algorithm) one allocation of the sum of its members' minutes, its members' most
    threads and GPUs; every other job its own (:func:`runtime_minutes`).  ``{"cpu_hours": threads × minutes,
    "gpu_hours": GPUs × minutes, "allocations": how many}`` over all of them."""
    cap = slurm_caps(cfg)[0]
    allocations: dict = {}
    for i, j in enumerate(plan_jobs):
        kind = job_kind(cfg, j)
        key = (j.env, j.algo) if kind == "grouped" else i
        minutes, threads, gpus = allocations.get(key, (0, 0, 0))
        allocations[key] = (minutes + runtime_minutes(j.seconds, cap, kind), max(threads, j.threads),
                            max(gpus, j.gpus))
    return {"cpu_hours": sum(m * t for m, t, _ in allocations.values()) / 60,
            "gpu_hours": sum(m * g for m, _, g in allocations.values()) / 60, "allocations": len(allocations)}


def borrowed_note(env: str, device: str, units_of: str) -> str:
    """The line saying a price is borrowed: whose units, and what measures the environment's own."""
    return (f"{env} ({device}): units of {units_of} (no calibration of {env}; `crop calibrate --device {device} "
            f"--env {env}` measures its own)")


def plan(cfg: dict, cores: int, gpus: int, nodes: int = 1, calibration: str | Path | None = None) -> dict:
    """The plan of ``crop plan --json``: every job's rule, wildcards, device and minutes, the totals in CPU-
    and GPU-hours (a job's threads × its hours; its GPUs × its hours), what SLURM is asked for
    (:func:`requested`: ``requested_cpu_hours``, ``requested_gpu_hours``, ``allocations``) and the makespan on the
    machines; with the tables used and the jobs whose wall-time or memory the caps cut (:func:`slurm_caps`)
    beside.  A job priced with another environment's units (:func:`~crop.workflow.cost_units.lender`) is
    named in ``borrowed_units``, a key present only then."""
    out, sources = predict(cfg, gpus, calibration)
    cap, mem_cap = slurm_caps(cfg)
    asked = requested(cfg, out)
    borrowed = [{"env": env, "device": dev, "units_of": of, "note": borrowed_note(env, dev, of)}
                for env, dev, of in dict.fromkeys((j.env, j.device, j.borrowed) for j in out if j.borrowed)]
    result = {
        "jobs": [{"rule": j.rule, "env": j.env, "algo": j.algo, "sigma": j.sigma, "device": j.device,
                  "minutes": round(j.minutes, 3)} for j in out],
        "total": {"cpu_hours": round(sum(j.threads * j.seconds for j in out) / 3600, 3),
                  "gpu_hours": round(sum(j.gpus * j.seconds for j in out) / 3600, 3),
                  "requested_cpu_hours": round(asked["cpu_hours"], 3),
                  "requested_gpu_hours": round(asked["gpu_hours"], 3),
                  "allocations": asked["allocations"], "jobs": len(out)},
        "makespan_hours": round(makespan(out, cores, gpus, nodes) / 3600, 3),
        **({"borrowed_units": borrowed} if borrowed else {}),
    }
    return result, {"sources": sources, "over_cap": [j for j in out if _over(j.seconds, cap)], "cap": cap,
        "over_mem": [j for j in out if j.mem_mb > mem_cap], "mem_cap": mem_cap, "jobs": out}
