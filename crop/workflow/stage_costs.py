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
           "lore_reads", "attack_local_seconds", "attack_global_seconds", "grad_call", "env_device", "cpu_device",
           "lore_nodes",
           "lore_transitions", "global_episodes", "MAX_PRICED_NODES", "STAGE_MEM_MB", "rollout_memory",
           "attack_local_memory", "attack_global_memory", "EPISODE_S", "EPISODE_MB", "ROW_MB"]

#: Memory (MB) of a stage's job beside what its own memory function adds.
STAGE_MEM_MB = 1000

#: Above this many nodes a LoRe tree cannot be priced: the config needs lore.max_nodes (or a smaller horizon).
MAX_PRICED_NODES = 1e12

#: An episode of the smoothed policy's rollouts (the V range, LoAct) beside its steps: making and resetting its
#: environment, its row of the per-episode table and its 81 certified-ratio rows, and, since the episodes run
#: side by side (lockstep), its environment alive until the last ends.  Measured on CartPole-v0 (2,000 and
#: 8,000 episodes of 5 steps, m = 100, crop/certify/loact.py with its tables written, one core of the
#: development machine): 3.4 ms and 31 kB an episode; taken as 4 ms and 50 kB (an environment's own copy,
#: ``gre_mb_per_copy``, and making it, ``gre_start_s``, are added where the table has them).
EPISODE_S, EPISODE_MB = 4e-3, 0.05
#: A step's row of a stage's table (about 10 numbers as a dict, its DataFrame row and CSV line): 2 kB.
ROW_MB = 0.002
#: The smoothing engine's noise block on the CPU (crop.smoothing.engine.Engine.NOISE_BLOCK_FLOATS): m samples
#: of a call's states cost memory up to this many floats (float32 noise, its outputs beside).
NOISE_BLOCK_FLOATS = 1 << 22
#: Pending nodes LoRe smooths in one call (crop.certify.lore.Search.batch's default, which the stage keeps).
LORE_BATCH = 64


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
    """S × (m × ``smooth_sample_s`` + ``env_step_s``) + episodes × (:data:`EPISODE_S` + ``gre_start_s`` +
    ``gre_reset_s``): every state of clean episodes smoothed with m samples, and each episode's environment
    made, reset and tabled."""
    episode = EPISODE_S + u.env_units.get("gre_start_s", 0.0) + u("gre_reset_s")
    return block["episodes"] * (block["horizon"] * (block["m"] * u("smooth_sample_s") + u("env_step_s")) + episode)


def _noise_mb(cfg: dict, env: str, m: int, states: int) -> float:
    """MB of one smoothing call of ``states`` states at m samples each: its noise and outputs, at most the
    engine's block (:data:`NOISE_BLOCK_FLOATS`, or ``chunk`` samples when larger)."""
    from crop.envs import env_spec  # gymnasium, not torch

    size = math.prod(env_spec(env).obs_shape)
    rows = min(m * states, max(int(cfg.get("chunk") or 1), NOISE_BLOCK_FLOATS // size))
    return 8 * rows * size / 1e6


def rollout_memory(cfg: dict, job, u) -> int:
    """The V range's and LoAct's memory (MB): episodes × (:data:`EPISODE_MB` + one environment copy, all alive
    side by side) + episodes × H step rows (:data:`ROW_MB`) + one smoothing call of every episode's state at m
    samples (:func:`_noise_mb`), beside :data:`STAGE_MEM_MB`."""
    from crop.envs import env_spec  # gymnasium, not torch

    b = cfg["environments"][job.env][job.rule.removesuffix("_replicate")]
    episodes = b["episodes"] * (EPISODE_MB + env_spec(job.env).gre_mb_per_copy)
    rows = b["episodes"] * b["horizon"] * ROW_MB
    return int(STAGE_MEM_MB + episodes + rows + _noise_mb(cfg, job.env, b["m"], b["episodes"]))


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
    """The environment's GRe block of m trajectories (``gre.batch`` of them at a time) on the job's threads
    (EnvSpec.gre_mem_mb); its horizon costs no memory (a trajectory steps in place and keeps its return only)."""
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
    """Its snapshots, one per node of the tree (max_nodes, horizon): twice their pickled size (``node_mb``), for
    Python's objects, and a smoothing call of a batch of pending nodes at m samples (a tree too large to price
    asks for the base; :func:`lore_seconds` refuses it)."""
    transitions = _lore_tree(cfg, job)[1]
    if transitions > MAX_PRICED_NODES:
        return STAGE_MEM_MB
    lo = cfg["environments"][job.env]["lore"]
    return STAGE_MEM_MB + int(2 * (transitions + 1) * u("node_mb") + _noise_mb(cfg, job.env, lo["m"], LORE_BATCH))


def attack_local_seconds(cfg: dict, job, u) -> tuple[float, str]:
    """The local attack, its runs in lockstep over LoRe's horizon: H × (2 × runs × m × ``smooth_sample_s`` +
    steps × :func:`grad_call`(runs × m_grad) + runs × ``env_step_s``), at LoAct's m."""
    ec = cfg["environments"][job.env]
    a = ec["attack"]
    runs = a["local_episodes"] * len(a["local_eps_factors"])
    step = 2 * runs * ec["loact"]["m"] * u("smooth_sample_s") + a["pgd_steps"] * grad_call(u, runs * a["local_m_grad"])
    return ec["lore"]["horizon"] * (step + runs * u("env_step_s")), ""


def grad_call(u, samples: int) -> float:
    """One PGD gradient call over ``samples`` noisy states: ``grad_call_s`` (0 in a table that holds it in
    ``grad_sample_s``) + samples × ``grad_sample_s``."""
    return (u("grad_call_s") if u.has("grad_call_s") else 0.0) + samples * u("grad_sample_s")


def attack_local_memory(cfg: dict, job, u) -> int:
    """The local attack's memory (MB): a row per step of its runs (episodes × ε factors × LoRe's H,
    :data:`ROW_MB`) and a smoothing call of one state at LoAct's m, beside :data:`STAGE_MEM_MB`."""
    ec = cfg["environments"][job.env]
    a = ec["attack"]
    rows = a["local_episodes"] * len(a["local_eps_factors"]) * ec["lore"]["horizon"]
    return int(STAGE_MEM_MB + rows * ROW_MB + _noise_mb(cfg, job.env, ec["loact"]["m"], 1))


def attack_global_memory(cfg: dict, job, u) -> int:
    """The global attack's memory (MB): a row per step of its runs (episodes × ε factors × GRe's H,
    :data:`ROW_MB`), beside :data:`STAGE_MEM_MB`."""
    ec = cfg["environments"][job.env]
    a = ec["attack"]
    return int(STAGE_MEM_MB + global_episodes(cfg, job.env) * len(a["global_eps_factors"]) * ec["gre"]["horizon"]
               * ROW_MB)


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
    """The global attack, its runs in lockstep over GRe's horizon: H × ((steps + 1) × :func:`grad_call`(runs ×
    n_eot) + runs × ``env_step_s``)."""
    ec = cfg["environments"][job.env]
    a = ec["attack"]
    runs = global_episodes(cfg, job.env) * len(a["global_eps_factors"])
    step = (a["pgd_steps"] + 1) * grad_call(u, runs * a["global_n_eot"])
    return ec["gre"]["horizon"] * (step + runs * u("env_step_s")), ""
