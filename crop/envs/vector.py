"""Many copies of an environment stepped in lockstep, spread over worker processes.

GRe advances its m σ-randomized trajectories together: one batched forward per time step, then every
environment steps.  For environments whose step is slow Python (highway-env ≈ 50 steps/s per core, ALE),
the environments are split into contiguous shards, one per worker process; the main process keeps the
network.  The result is identical to stepping the same environments in one process (each environment is
seeded by its own index), only faster on several cores.
"""
from __future__ import annotations

import multiprocessing as mp

import gymnasium as gym
import numpy as np

__all__ = ["ShardedVectorEnv"]


def _make_sync(env_id: str, profile: str | None, n: int):
    from crop.envs import make_env

    return gym.vector.SyncVectorEnv([lambda: make_env(env_id, profile) for _ in range(n)],
                                    autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def _worker(conn, env_id, profile, n):
    import torch

    torch.set_num_threads(1)
    venv = _make_sync(env_id, profile, n)
    try:
        while True:
            cmd, arg = conn.recv()
            if cmd == "reset":
                obs, _ = venv.reset(seed=arg)
                conn.send(obs)
            elif cmd == "step":
                obs, r, term, trunc, _ = venv.step(arg)
                conn.send((obs, r, term, trunc))
            elif cmd == "close":
                break
    finally:
        venv.close()
        conn.close()


class ShardedVectorEnv:
    """``num_envs`` environments in ``workers`` processes; the vector-env subset of the API GRe uses
    (``reset(seed)``, ``step(actions)``, ``close()``; next-step autoreset like gymnasium's vector envs)."""

    def __init__(self, env_id: str, num_envs: int, workers: int, profile: str | None = None):
        self.num_envs = num_envs
        workers = max(1, min(workers, num_envs))
        sizes = [num_envs // workers + (i < num_envs % workers) for i in range(workers)]
        self.bounds = np.cumsum([0, *sizes])
        ctx = mp.get_context("spawn")  # no fork after torch/OpenMP initialisation
        self.conns, self.procs = [], []
        for n in sizes:
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(b, env_id, profile, n), daemon=True)
            p.start()
            b.close()
            self.conns.append(a)
            self.procs.append(p)

    def reset(self, seed: int | None = None):
        for i, c in enumerate(self.conns):
            # Environment k is seeded seed + k, as in a single SyncVectorEnv(seed=seed).
            c.send(("reset", None if seed is None else int(seed) + int(self.bounds[i])))
        return np.concatenate([c.recv() for c in self.conns]), {}

    def step(self, actions):
        actions = np.asarray(actions)
        for i, c in enumerate(self.conns):
            c.send(("step", actions[self.bounds[i]:self.bounds[i + 1]]))
        parts = [c.recv() for c in self.conns]
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]), {})

    def close(self):
        for c in self.conns:
            try:
                c.send(("close", None))
                c.close()
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
