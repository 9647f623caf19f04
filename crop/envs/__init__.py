"""Environments: one factory, preprocessing profiles, faithful snapshots, and vectorised rollouts.

Nothing outside this package knows how an observation is made; every other layer sees a float32 array of
the shape the Q-network takes, to which Gaussian noise is added (the paper smooths in that space).
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

__all__ = ["EnvSpec", "ENV_SPECS", "env_spec", "make_env", "make_vec_env", "make_env_pool", "snapshot", "restore",
           "to_obs", "UnknownEnvError"]


class UnknownEnvError(KeyError):
    def __str__(self):  # KeyError quotes its message; keep it readable
        return str(self.args[0])


@dataclass(frozen=True)
class EnvSpec:
    """What the certifiers need to know about an environment.

    ``reward_range`` is the per-step reward range from the game's specification; with the horizon H and
    γ it gives J_min, J_max of Lemma 2 / Theorem 2 (Appendix B.2: "default values in the game
    specifications").
    """

    env_id: str
    paper_name: str          # figure prefix as in the paper's files, e.g. "CartPole"
    clean_name: str          # prefix of the benign-return figure, e.g. "Cartpole"
    n_actions: int
    obs_shape: tuple
    reward_range: tuple
    profile: str             # default preprocessing profile
    game_return_range: tuple | None = None  # whole-game score range from the game's rules, if any
    lore_reward: str | None = None  # LoRe-only reward modification (Appendix E), named in the output
    solved_return: float | None = None  # acceptance threshold of a locally trained policy, if any
    # Resources of the workflow's jobs (rules/common.smk asks these; measured on one CPU core).
    train_steps_per_s: float = 50.0  # conservative training rate (measured: CartPole ≈ 1,000, highway ≈ 40,
    #                                  Pong StdTrain ≈ 63 steps/s)
    gre_mb_per_copy: float = 0.0     # memory of one environment copy in GRe's pool (measured)
    gre_batch: int | None = 1000     # GRe trajectories stepped together by default (None: all m)

    def lore_reward_fn(self):
        """The LoRe-only reward modification: negative rewards count as 0, which enables pruning."""
        if self.lore_reward == "max(r, 0)":
            return lambda r: max(float(r), 0.0)
        return None

    @property
    def nonnegative_rewards(self) -> bool:
        """LoRe may prune only when no step can lower the return (Appendix B.3)."""
        return self.reward_range[0] >= 0

    def train_minutes(self, total_steps: int) -> int:
        """Minutes a training job may take (SLURM): 2× ``total_steps`` at ``train_steps_per_s``, plus 30."""
        return 30 + int(total_steps / self.train_steps_per_s / 60 * 2)

    def replay_mb(self, buffer_size: int) -> int:
        """Memory of an image policy's replay buffer (MB): s and s′ as uint8 (crop/train/dqn.py _Replay:
        100k Atari transitions × 56 kB = 5.6 GB), with 20 % headroom; 0 for vector observations."""
        if len(self.obs_shape) != 3:
            return 0
        return int(buffer_size * 2 * math.prod(self.obs_shape) / 1e6 * 1.2)

    def gre_block(self, m: int, batch: int | None = None) -> int:
        """GRe's block of trajectories stepped together: ``batch`` (config gre.batch), else the default."""
        if batch is not None:
            return min(batch, m)
        return m if self.gre_batch is None else min(m, self.gre_batch)

    def gre_mem_mb(self, block: int, threads: int) -> int:
        """Memory of a GRe job (MB): the process (measured ≤ 350 MB), about 100 MB per worker process and one
        block of environment copies, with 2× headroom (about 6 GB for an Atari block of 1,000)."""
        return int(2 * (350 + 100 * threads + self.gre_mb_per_copy * block))

    def return_range(self, horizon: int, gamma: float = 1.0) -> tuple[float, float]:
        """[J_min, J_max] for returns over ``horizon`` steps with discount ``gamma``."""
        if gamma == 1.0:
            w = float(horizon)
        else:
            w = (1.0 - gamma ** horizon) / (1.0 - gamma)
        lo, hi = self.reward_range
        j_min, j_max = min(0.0, lo * w), max(0.0, hi * w)
        if self.game_return_range is not None and gamma == 1.0:
            j_min, j_max = max(j_min, self.game_return_range[0]), min(j_max, self.game_return_range[1])
        return (j_min, j_max)


ENV_SPECS: dict[str, EnvSpec] = {
    # CartPole steps all m trajectories in numpy arrays: no copies to hold, one block.
    "CartPole-v0": EnvSpec("CartPole-v0", "CartPole", "Cartpole", 2, (4,), (0.0, 1.0), "vector",
                           solved_return=195.0, train_steps_per_s=500.0, gre_batch=None),
    "highway-fast-v0": EnvSpec("highway-fast-v0", "highway-fast", "highway-fast", 5, (25,), (0.0, 1.0),
                               "flat25", train_steps_per_s=20.0, gre_mb_per_copy=0.45),
    # Atari: 6 actions in the full minimal set of Pong (3 for Freeway); a checkpoint's own action count
    # (its network's output size) takes precedence.  Pong's game ends at 21 points.
    "PongNoFrameskip-v4": EnvSpec("PongNoFrameskip-v4", "Pong", "Pong", 6, (4, 84, 84), (-1.0, 1.0),
                                  "cleanrl", game_return_range=(-21.0, 21.0), lore_reward="max(r, 0)",
                                  gre_mb_per_copy=2.6),
    # Freeway's ALE rewards are never negative; the paper's "losing scores 0" modification is kept for
    # uniformity and named in the output.
    "FreewayNoFrameskip-v4": EnvSpec("FreewayNoFrameskip-v4", "Freeway", "Freeway", 3, (4, 84, 84),
                                     (0.0, 1.0), "cleanrl", lore_reward="max(r, 0)", gre_mb_per_copy=2.6),
}


def env_spec(env_id: str) -> EnvSpec:
    try:
        return ENV_SPECS[env_id]
    except KeyError:
        raise UnknownEnvError(f"unknown environment {env_id!r}; known: {sorted(ENV_SPECS)}") from None


class _Flatten(gym.ObservationWrapper):
    """Kinematics 5×5 → the 25-vector (row-major), as CROP's MLP's ``reshape(-1, 25)``.  A plain class
    (gymnasium's FlattenObservation holds a lambda) so snapshots can be pickled for resumable searches."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (int(np.prod(env.observation_space.shape)),),
                                                np.float32)

    def observation(self, obs):
        return np.asarray(obs, dtype=np.float32).reshape(-1)


PROFILES = {
    "CartPole-v0": ["vector"],
    "highway-fast-v0": ["flat25"],
    "PongNoFrameskip-v4": ["cleanrl", "sa_dqn_pong", "radial"],
    "FreewayNoFrameskip-v4": ["cleanrl", "sa_dqn_freeway", "radial"],
}


def _check_profile(env_id: str, profile: str) -> None:
    known = PROFILES.get(env_id, [])
    if profile not in known:
        raise ValueError(f"{env_id}: unknown preprocessing profile {profile!r}; known: {known}")


def make_env(env_id: str, profile: str | None = None) -> gym.Env:
    """A single environment with the preprocessing of ``profile`` (the checkpoint's, or the default)."""
    spec = env_spec(env_id)
    profile = profile or spec.profile
    _check_profile(env_id, profile)
    if env_id == "CartPole-v0":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CartPole-v0 is out of date": the paper uses v0
            return gym.make("CartPole-v0")
    if env_id == "highway-fast-v0":
        import highway_env  # noqa: F401  (registers the ids)

        # Default configuration (Kinematics 5×5: presence, x, y, vx, vy of the 5 nearest vehicles,
        # normalised; 5 meta-actions; 30 steps), flattened to the 25-vector CROP's MLPs take.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = gym.make("highway-fast-v0")
        return _Flatten(env)
    if env_id.endswith("NoFrameskip-v4"):
        from crop.envs.atari import make_atari

        return make_atari(env_id, profile)
    raise UnknownEnvError(f"unknown environment {env_id!r}")


def make_vec_env(env_id: str, num_envs: int, profile: str | None = None):
    """gymnasium's numpy-vectorised CartPole (``CartPoleVectorEnv``): the dynamics of the single
    environment, one array operation per step for all copies."""
    if env_id != "CartPole-v0":
        raise UnknownEnvError(f"no native vector environment for {env_id!r}; use make_env_pool")
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    return CartPoleVectorEnv(num_envs=num_envs, max_episode_steps=gym.spec(env_id).max_episode_steps)


def make_env_pool(env_id: str, num_envs: int, profile: str | None = None, workers: int = 1):
    """``num_envs`` copies for GRe's m trajectories, stepped selectively (:mod:`crop.envs.vector`): CartPole
    vectorised in numpy; Atari in :class:`crop.envs.atari.AtariPool` (the profile's wrapper stack in
    ``workers`` processes, observations as pixels through shared memory: the same observations as
    ``EnvPool``'s, without pickling them); the others (highway) as independent copies in ``EnvPool``."""
    from crop.envs.vector import CartPolePool, EnvPool

    spec = env_spec(env_id)
    profile = profile or spec.profile
    _check_profile(env_id, profile)
    if env_id == "CartPole-v0":
        return CartPolePool(num_envs, gym.spec(env_id).max_episode_steps)
    if env_id.endswith("NoFrameskip-v4"):
        from crop.envs.atari import AtariPool

        return AtariPool(env_id, num_envs, workers, profile)
    return EnvPool(env_id, num_envs, workers, profile)


def to_obs(obs) -> np.ndarray:
    """The network's input as float32 (noise is added in this space)."""
    return np.asarray(obs, dtype=np.float32)


def snapshot(env: gym.Env):
    """A faithful copy of ``env``'s whole state, wrappers included.

    CartPole and highway: ``copy.deepcopy`` of the *wrapped* env (the TimeLimit counter lives in the
    wrapper).  Atari: the emulator's own state plus every wrapper's state (deepcopy would silently give a
    fresh emulator at frame 0) — see :mod:`crop.envs.atari`.
    """
    from crop.envs.atari import atari_snapshot, is_atari

    return atari_snapshot(env) if is_atari(env) else copy.deepcopy(env)


def restore(env: gym.Env | None, snap) -> gym.Env:
    """An environment in the state ``snap`` was taken in; ``snap`` stays untouched for reuse.

    For Atari ``env`` (an instance with the same wrapper chain) is put into that state and returned; for
    the others a new copy of the snapshot is returned and ``env`` is ignored.
    """
    from crop.envs.atari import AtariSnapshot, atari_restore

    if isinstance(snap, AtariSnapshot):
        if env is None:
            raise ValueError("restoring an Atari snapshot needs the environment instance")
        return atari_restore(env, snap)
    return copy.deepcopy(snap)
