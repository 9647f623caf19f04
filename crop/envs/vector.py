"""Many copies of an environment for GRe's m trajectories: stepped selectively, optionally in processes.

GRe advances its m σ-randomized trajectories together: one batched forward per time step, then each
trajectory that is still running takes its step.  Finished trajectories are not stepped again (a crashed
highway episode costs nothing further).  For environments whose step is slow Python (highway-env ≈ 50
steps/s per core, ALE) the environments are split into contiguous shards, one per worker process; the
main process keeps the network.  Environment i is reset with seed ``seed + i`` whatever the number of
workers (CartPole's vectorised copies start from :func:`cartpole_initial_states` of seed + i), so the
returns do not depend on it.
"""
from __future__ import annotations

import multiprocessing as mp

import numpy as np

__all__ = ["EnvPool", "CartPolePool"]


def _make_envs(env_id: str, profile: str | None, n: int):
    from crop.envs import make_env

    return [make_env(env_id, profile) for _ in range(n)]


def _reset(envs, seed0: int, n: int):
    """Observations of the first ``n`` environments of ``envs``, environment k reset with seed ``seed0 + k``
    (a seeded reset restores all of a CartPole's, a highway env's or an Atari env's state: tests/test_gre.py)."""
    obs = [np.asarray(e.reset(seed=int(seed0) + k)[0], dtype=np.float32) for k, e in enumerate(envs[:max(0, n)])]
    return np.stack(obs) if obs else np.empty((0, *envs[0].observation_space.shape), np.float32)


def _step(envs, local_idx, actions):
    obs, rew, term, trunc = [], [], [], []
    for k, a in zip(local_idx, actions):
        o, r, te, tr, _ = envs[int(k)].step(a if np.ndim(a) else int(a))   # a Box action: its vector
        obs.append(np.asarray(o, dtype=np.float32))
        rew.append(float(r))
        term.append(bool(te))
        trunc.append(bool(tr))
    return np.stack(obs), np.array(rew), np.array(term), np.array(trunc)


def stop_workers(conns, procs) -> None:
    """Ask each worker process to close its environments, then wait for it (killed after 10 s); a worker
    that is already gone is skipped (EnvPool and crop.envs.atari's AtariPool)."""
    for c in conns:
        try:
            c.send(("close", None))
            c.close()
        except (BrokenPipeError, OSError):
            pass
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()


def _worker(conn, env_id, profile, n):
    import torch

    torch.set_num_threads(1)
    envs = _make_envs(env_id, profile, n)
    try:
        while True:
            cmd, arg = conn.recv()
            if cmd == "reset":
                conn.send(_reset(envs, *arg))
            elif cmd == "step":
                conn.send(_step(envs, *arg))
            elif cmd == "close":
                break
    finally:
        for e in envs:
            e.close()
        conn.close()


class EnvPool:
    """``num_envs`` environments; ``reset(seed, n)`` → the observations of the first ``n`` (all by default),
    environment k reset with seed ``seed + k``; ``step(idx, actions)`` → the results of the environments
    ``idx`` only (in that order).  Reset again, they serve the next trajectories."""

    def __init__(self, env_id: str, num_envs: int, workers: int = 1, profile: str | None = None):
        self.num_envs = num_envs
        workers = max(1, min(workers, num_envs))
        sizes = [num_envs // workers + (i < num_envs % workers) for i in range(workers)]
        self.bounds = np.cumsum([0, *sizes])
        self.conns, self.procs, self.envs = [], [], None
        if workers == 1:
            self.envs = _make_envs(env_id, profile, num_envs)
            return
        ctx = mp.get_context("spawn")  # no fork after torch/OpenMP initialisation
        for n in sizes:
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(b, env_id, profile, n), daemon=True)
            p.start()
            b.close()
            self.conns.append(a)
            self.procs.append(p)

    def reset(self, seed: int, n: int | None = None):
        n = self.num_envs if n is None else int(n)
        if self.envs is not None:
            return _reset(self.envs, seed, n)
        for i, c in enumerate(self.conns):
            c.send(("reset", (int(seed) + int(self.bounds[i]), n - int(self.bounds[i]))))
        return np.concatenate([c.recv() for c in self.conns])

    @property
    def in_processes(self) -> bool:
        """Whether the environments step in worker processes, so that a caller can work while they do."""
        return self.envs is None

    def step(self, idx, actions):
        return self.step_async(idx, actions)()

    def step_async(self, idx, actions):
        """Starts ``step(idx, actions)`` and returns the function that waits for it and returns its result (in
        one process: the step is taken now); steps started on disjoint environments may be in flight
        together, collected in the order started."""
        idx, actions = np.asarray(idx), np.asarray(actions)
        if self.envs is not None:
            out = _step(self.envs, idx, actions)
            return lambda: out
        shard = np.searchsorted(self.bounds, idx, side="right") - 1
        asked = []
        for i, c in enumerate(self.conns):
            sel = np.nonzero(shard == i)[0]
            if sel.size:
                c.send(("step", (idx[sel] - self.bounds[i], actions[sel])))
                asked.append((i, sel))

        def collect():
            out = [None] * 4
            parts = [(sel, self.conns[i].recv()) for i, sel in asked]
            for j in range(4):
                first = parts[0][1][j]
                arr = np.empty((len(idx), *first.shape[1:]), dtype=first.dtype)
                for sel, res in parts:
                    arr[sel] = res[j]
                out[j] = arr
            return tuple(out)
        return collect

    def close(self):
        if self.envs is not None:
            for e in self.envs:
                e.close()
        stop_workers(self.conns, self.procs)


#: Copies per CartPole initial-state group (see :func:`cartpole_initial_states`).
CARTPOLE_GROUP = 4096


def cartpole_initial_states(seeds) -> np.ndarray:
    """CartPole's initial states for the integer seeds ``seeds`` (n × 4, float64), drawn as CartPole's reset
    draws them (uniform on [−0.05, 0.05]⁴) but a group at a time: seed s takes row s mod G of one
    (G × 4) draw from the generator of group s // G (G = :data:`CARTPOLE_GROUP`).  So 10,000 copies cost
    three generators instead of 10,000 seeded single-environment resets (which would dominate a short GRe
    run), and copy s's start still depends on s alone — not on how many copies share a pool."""
    from crop.io import derive_seed

    seeds = np.asarray(seeds, dtype=np.int64)
    out = np.empty((len(seeds), 4), dtype=np.float64)
    groups = seeds // CARTPOLE_GROUP
    for g in np.unique(groups):
        draw = np.random.default_rng(derive_seed(int(g), "cartpole-initial-state")).uniform(
            -0.05, 0.05, size=(CARTPOLE_GROUP, 4))
        sel = groups == g
        out[sel] = draw[seeds[sel] - g * CARTPOLE_GROUP]
    return out


class CartPolePool:
    """CartPole's numpy-vectorised environment behind the same interface: every copy steps (one array
    operation is cheaper than selecting), the results of ``idx`` are returned.  Copy k starts from
    :func:`cartpole_initial_states` of seed ``seed + k`` — a function of that number alone, as in
    :class:`EnvPool` (the vector environment's own reset would draw all initial states from one seed, so
    they would change with the number of copies)."""

    def __init__(self, num_envs: int, max_episode_steps: int):
        from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

        self.venv = CartPoleVectorEnv(num_envs=num_envs, max_episode_steps=max_episode_steps)
        self.num_envs = num_envs
        self._actions = np.zeros(num_envs, dtype=np.int64)

    def reset(self, seed: int, n: int | None = None):
        """The first ``n`` copies' observations (all by default); every copy is reset (one array operation),
        the vector environment's counters and generator included, so a reused pool starts afresh."""
        self.venv.reset(seed=int(seed))  # counters and bookkeeping; the initial states are replaced below
        self.venv.state[:] = cartpole_initial_states(np.arange(self.num_envs) + int(seed)).T
        return self.venv.state.T[:self.num_envs if n is None else int(n)].astype(np.float32)

    #: One array operation in this process: nothing to overlap with (GRe then steps a block whole).
    in_processes = False

    def step(self, idx, actions):
        self._actions[:] = 0
        self._actions[idx] = actions
        obs, r, term, trunc, _ = self.venv.step(self._actions)
        return obs[idx], np.asarray(r)[idx], np.asarray(term)[idx], np.asarray(trunc)[idx]

    def step_async(self, idx, actions):
        """:meth:`step`, taken now; the function returned gives its result (the pools' common interface)."""
        out = self.step(idx, actions)
        return lambda: out

    def close(self):
        self.venv.close()
