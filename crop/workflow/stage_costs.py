"""Each per-run stage's cost: the work its job does, in the calibration table's units, the memory it
needs and the device it runs on.  A stage's row (:mod:`crop.workflow.stage_table`) names its functions
here; :mod:`crop.workflow.cost` adds what every job shares (start-up, headroom, caps, totals) and knows no
stage by name.

A cost function is ``(cfg, job, u) -> (seconds, note)`` and a memory function ``(cfg, job, u) -> MB``: ``cfg``
a validated config, ``job`` a :class:`crop.workflow.cost.Job` (its rule, env, algo, sigma, device and threads),
``u`` the job's :class:`crop.workflow.cost_units.Units` (``u("smooth_sample_s")``).  A device function is
``(cfg, env) -> device``: its jobs' ``--device``, a GPU asked for where it is not ``"cpu"``.  S = episodes × H states;
an episode is counted at its full horizon and LoRe's tree at its worst case for what can be known before the
run, so a prediction errs long.  No torch here (environments' facts only).
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from crop import columns as cols
from crop.workflow import layout
from crop.workflow.cost_units import CostError

__all__ = ["qrange_seconds", "loact_seconds", "gre_seconds", "gre_memory", "lore_seconds", "lore_memory",
           "lore_reads", "attack_local_seconds", "attack_global_seconds", "env_device", "cpu_device", "lore_nodes",
           "lore_transitions", "global_episodes", "MAX_PRICED_NODES", "STAGE_MEM_MB"]

#: Memory (MB) of a stage's job beside what its own memory function adds.
STAGE_MEM_MB = 1000

#: Above this many nodes a LoRe tree cannot be priced: the config needs lore.max_nodes (or a smaller horizon).
MAX_PRICED_NODES = 1e12


def env_device(cfg: dict, env: str) -> str:
    """Where an environment's networks run: its own ``device``, else the config's."""
    return cfg["environments"][env].get("device") or cfg["device"]


def cpu_device(cfg: dict, env: str) -> str:
    """The job's CPU cores whatever the device configured (GRe): its time is stepping m environments (Atari,
    highway: a millisecond and more per step and core) and, in its main process, the noise and the batched
    forward (on Atari about as long: :func:`gre_seconds`), so a GPU would idle through most of such a job while
    the stages that need it wait, and its results stay the CPU's."""
    return "cpu"


def _rollouts(block: dict, u) -> float:
    """S × (m × ``smooth_sample_s`` + ``env_step_s``): every state of clean episodes smoothed with m samples."""
    return block["episodes"] * block["horizon"] * (block["m"] * u("smooth_sample_s") + u("env_step_s"))


def qrange_seconds(cfg: dict, job, u) -> tuple[float, str]:
    """The V range (Appendix B.1): the smoothed policy's episodes, m samples per state."""
    return _rollouts(cfg["environments"][job.env]["qrange"], u), ""


def loact_seconds(cfg: dict, job, u) -> tuple[float, str]:
    """LoAct (Algorithm 1): the smoothed policy's episodes, m samples per state."""
    return _rollouts(cfg["environments"][job.env]["loact"], u), ""


def gre_seconds(cfg: dict, job, u) -> tuple[float, str]:
    """GRe (Algorithm 2): slots × ``gre_start_s`` + m × ``gre_reset_s`` spread over the job's workers, and the
    m × H trajectory steps of the lockstep loop, each a worker's ``gre_step_s`` (which the workers divide) and the
    main process's ``gre_parent_step_s`` (noise, forward, lockstep: one process, which they do not): per step
    the larger of the main process's part and the whole over the job's threads.  One process where the table says
    so (CartPole: all of it ``gre_step_s``).  A table without ``gre_start_s`` measured the making in
    ``gre_reset_s``, per trajectory, so it errs long."""
    g = cfg["environments"][job.env]["gre"]
    workers = 1 if u.env_units.get("gre_single_process") else job.threads
    start = 0.0
    if u.has("gre_start_s"):
        from crop.envs import env_spec  # gymnasium, not torch
        start = env_spec(job.env).gre_block(g["m"], g.get("batch")) * u("gre_start_s")   # one per slot
    parent = u("gre_parent_step_s") if u.has("gre_parent_step_s") else 0.0
    step = max(parent, (parent + u("gre_step_s")) / workers)
    return (start + g["m"] * u("gre_reset_s")) / workers + g["m"] * g["horizon"] * step, ""


def gre_memory(cfg: dict, job, u) -> int:
    """The environment's GRe block of m trajectories on the job's threads (EnvSpec.gre_mem_mb)."""
    from crop.envs import env_spec  # gymnasium, not torch

    g, spec = cfg["environments"][job.env]["gre"], env_spec(job.env)
    return spec.gre_mem_mb(spec.gre_block(g["m"], g["batch"]), job.threads)


def lore_nodes(horizon: int, n_actions: int, certified: float = 0.0, max_nodes: int | None = None) -> float:
    """Nodes LoRe smooths (Algorithm 3), at worst, for a tree of depth H: a node whose action is certified
    up to the search's largest ε (a fraction ``certified`` of the states) has one child, any other up to
    |A|, so the branching is b = 1 + (1 − certified)(|A| − 1) and the internal nodes Σ_{d<H} b^d (leaves at
    depth H are not smoothed).  Pruning, memoised states and terminal states only make the tree smaller.
    With ``lore.max_nodes`` the search expands at most that many."""
    b = 1.0 + (1.0 - certified) * (n_actions - 1)
    if b <= 1.0:
        n = float(horizon)
    elif horizon * math.log10(b) > 300:
        n = math.inf
    else:
        n = (b ** horizon - 1.0) / (b - 1.0)
    return float(min(n, max_nodes)) if max_nodes else n


def lore_transitions(horizon: int, n_actions: int, certified: float = 0.0, max_nodes: int | None = None) -> float:
    """Transitions LoRe makes (a child created: its parent's snapshot restored, one step, its own snapshot), at
    worst: every node of the tree but the root, b·Σ_{d<H} b^d with :func:`lore_nodes`' branching b; with
    ``lore.max_nodes`` at most max_nodes − 1 (the budget counts the root and every child created)."""
    b = 1.0 + (1.0 - certified) * (n_actions - 1)
    n = b * lore_nodes(horizon, n_actions, certified)
    return float(min(n, max_nodes - 1)) if max_nodes else n


def lore_reads(cfg: dict, job) -> Path | None:
    """The ``loact.csv`` a LoRe job's price reads (the certified fraction of its tree), or None when it reads
    none (``lore.eps_max_factor: null``)."""
    if not cfg["environments"][job.env]["lore"].get("eps_max_factor"):
        return None
    name, target = layout.split_run_algo(job.algo)
    return layout.run_dir(cfg["results"], job.env, name, job.sigma, target) / layout.RUN_FILES["loact"]


def _certified_fraction(cfg: dict, job) -> float:
    """The fraction of LoAct's states certified at LoRe's largest ε, from a finished LoAct of the same run
    when there is one (its ``loact.csv``); 0 (every action possible: the worst case) otherwise and whenever
    LoRe searches without a largest ε (``lore.eps_max_factor: null``: every action becomes possible)."""
    path = lore_reads(cfg, job)
    if path is None or not path.is_file():
        return 0.0
    eps_max = cfg["environments"][job.env]["lore"]["eps_max_factor"] * float(job.sigma)
    with open(path, newline="") as f:
        radii = [float(r[cols.RADIUS]) for r in csv.DictReader(f)]
    return sum(r >= eps_max for r in radii) / len(radii) if radii else 0.0


def _lore_tree(cfg: dict, job) -> tuple[float, float]:
    """(nodes, transitions) of a LoRe job's tree at worst (:func:`lore_nodes`, :func:`lore_transitions`)."""
    from crop.envs import env_spec  # gymnasium, not torch

    lo = cfg["environments"][job.env]["lore"]
    budget = lo.get("max_nodes") and lo["max_nodes"] * (2 if lo.get("report_double") else 1)  # it runs to twice
    tree = (lo["horizon"], env_spec(job.env).n_actions, _certified_fraction(cfg, job), budget)
    return lore_nodes(*tree), lore_transitions(*tree)


def lore_seconds(cfg: dict, job, u) -> tuple[float, str]:
    """LoRe (Algorithm 3): nodes × m × ``smooth_sample_s`` + transitions × ``lore_transition_s`` (restore a
    node's snapshot, step, snapshot the child)."""
    lo = cfg["environments"][job.env]["lore"]
    nodes, transitions = _lore_tree(cfg, job)
    if transitions > MAX_PRICED_NODES:
        from crop.envs import env_spec  # gymnasium, not torch

        raise CostError(f"lore {job.env}/{job.algo} σ={job.sigma}: a tree of up to "
                        f"{env_spec(job.env).n_actions}^{lo['horizon']} nodes cannot finish; give "
                        f"environments.{job.env}.lore.max_nodes (a budget of nodes) or a smaller lore.horizon")
    return nodes * lo["m"] * u("smooth_sample_s") + transitions * u("lore_transition_s"), f"{nodes:.0f} nodes"


def lore_memory(cfg: dict, job, u) -> int:
    """Its snapshots, one per node of the tree: twice their pickled size (``node_mb``), for Python's objects
    (a tree too large to price asks for the base; :func:`lore_seconds` refuses it)."""
    transitions = _lore_tree(cfg, job)[1]
    if transitions > MAX_PRICED_NODES:
        return STAGE_MEM_MB
    return STAGE_MEM_MB + int(2 * (transitions + 1) * u("node_mb"))


def attack_local_seconds(cfg: dict, job, u) -> tuple[float, str]:
    """The local attack: runs × H × (2m × ``smooth_sample_s`` + steps × m_grad × ``grad_sample_s`` +
    ``env_step_s``) over LoRe's horizon, LoAct's m."""
    ec = cfg["environments"][job.env]
    a = ec["attack"]
    runs = a["local_episodes"] * len(a["local_eps_factors"])
    step = 2 * ec["loact"]["m"] * u("smooth_sample_s") + a["pgd_steps"] * a["local_m_grad"] * u("grad_sample_s")
    return runs * ec["lore"]["horizon"] * (step + u("env_step_s")), ""


def global_episodes(cfg: dict, env: str) -> int:
    """``attack.global_episodes`` as a number of episodes.  Hook for a size the config leaves to the run
    (a non-integer such as ``auto``): it must resolve here the way the attack stage resolves it; until it
    can, the model refuses it rather than guess."""
    n = cfg["environments"][env]["attack"]["global_episodes"]
    if isinstance(n, bool) or not isinstance(n, int):
        raise CostError(f"environments.{env}.attack.global_episodes = {n!r}: crop plan prices a number of "
                        "episodes; give one")
    return n


def attack_global_seconds(cfg: dict, job, u) -> tuple[float, str]:
    """The global attack: runs × H × ((steps + 1) × n_eot × ``grad_sample_s`` + ``env_step_s``) over GRe's
    horizon."""
    ec = cfg["environments"][job.env]
    a = ec["attack"]
    runs = global_episodes(cfg, job.env) * len(a["global_eps_factors"])
    step = (a["pgd_steps"] + 1) * a["global_n_eot"] * u("grad_sample_s")
    return runs * ec["gre"]["horizon"] * (step + u("env_step_s")), ""
