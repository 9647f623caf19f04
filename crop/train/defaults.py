"""The trainer's defaults, as data: the DQN settings (:class:`DQNConfig`, per environment, per recipe) and each
recipe's hyper-parameters (per environment).  Stated here once, without torch, for everyone who reads them: the
trainer (crop/train/dqn.py, recipes.py), the cost model (crop/workflow/cost.py prices a training by its steps,
updates and PGD) and the rules (a checkpoint job's memory and GPU) -- the last two must not import torch.

A config's ``train.dqn`` overrides the DQN settings and ``train.recipes.<algo>`` a recipe's hyper-parameters,
key by key (crop/schemas/config.schema.yaml); every value used is recorded in model.json.
"""
from __future__ import annotations

from dataclasses import dataclass

from crop.schema import default_of

__all__ = ["DQNConfig", "ENV_DQN_DEFAULTS", "RECIPE_DQN_DEFAULTS", "HYPERPARAMETERS", "dqn_config",
           "recipe_hyperparameters", "pgd_schedule", "CHECKPOINT_EVERY", "EVAL_EPISODES_ALONE"]

#: Seconds between two saves of the training state: a save of CartPole's state takes milliseconds, an Atari
#: replay buffer of 100k transitions is 5.6 GB (seconds on a local disk, more on a network file system).
CHECKPOINT_EVERY = 600.0
#: Episodes of the clean greedy return of `crop fetch` / `crop import` run by hand (few: a highway episode
#: steps slowly); the workflow uses the config's train.eval_episodes.
EVAL_EPISODES_ALONE = 10


@dataclass
class DQNConfig:
    """One Double-DQN run's settings.  The training budget shared by every environment (hidden, total_steps,
    min_steps, eval_episodes, target_return, prioritized) defaults to the schema's ``train`` block; the rest is
    the DQN table the schema's ``train.dqn`` overrides: these defaults, then the environment's
    (:data:`ENV_DQN_DEFAULTS`), then the recipe's (:data:`RECIPE_DQN_DEFAULTS`), merged by :func:`dqn_config`."""

    hidden: list = default_of("environment.train.hidden")
    total_steps: int = default_of("environment.train.total_steps")
    min_steps: int = default_of("environment.train.min_steps")  # no acceptance before (a trained, not a lucky, Q)
    learning_starts: int = 1000
    buffer_size: int = 50000
    batch_size: int = 64
    lr: float = 1e-3
    lr_end: float | None = None  # linear decay of the learning rate to lr_end over lr_decay_steps (None: constant)
    lr_decay_steps: int = 0
    gamma: float = 0.99
    target_update: int = 500
    train_every: int = 2
    eps_start: float = 1.0
    eps_end: float = 0.02
    eps_decay_steps: int = 10000
    eval_every: int = 1000
    eval_episodes: int = default_of("environment.train.eval_episodes")
    quick_eval_episodes: int = 10
    # None: no acceptance threshold (train total_steps); a config's null, the environment's own threshold, is
    # resolved before it gets here (crop.workflow.config.target_return)
    target_return: float | None = default_of("environment.train.target_return")
    max_grad_norm: float = 10.0
    # proportional prioritized replay (α, β annealed to 1 over total_steps)
    prioritized: bool = default_of("environment.train.prioritized")
    per_alpha: float = 0.6
    per_beta0: float = 0.4
    eps_decay_fraction: float | None = None  # ε decays over this fraction of total_steps (replaces eps_decay_steps)
    eval_max_steps: int | None = None  # greedy evaluation episodes cut after this many steps (None: the env's own end)
    device: str = "cpu"          # cpu | cuda | auto (cuda if available); CPU runs are bit-for-bit reproducible

    def lr_at(self, step: int) -> float:
        """The learning rate of the update at ``step``: ``lr``, decayed linearly to ``lr_end`` over
        ``lr_decay_steps`` where ``lr_end`` is set."""
        if self.lr_end is None:
            return self.lr
        frac = min(1.0, step / self.lr_decay_steps) if self.lr_decay_steps > 0 else 1.0
        return self.lr + (self.lr_end - self.lr) * frac

    def last_update(self, stop: int) -> int | None:
        """The last step before ``stop`` with a gradient update (one every ``train_every`` steps from
        ``learning_starts``), or None."""
        last = (stop - 1) // self.train_every * self.train_every
        return last if stop > 0 and last >= self.learning_starts else None

    def updates(self, stop: int) -> int:
        """How many gradient updates the steps before ``stop`` make."""
        last = self.last_update(stop)
        if last is None:
            return 0
        first = -(-self.learning_starts // self.train_every) * self.train_every
        return (last - first) // self.train_every + 1


_ATARI = ("PongNoFrameskip-v4", "FreewayNoFrameskip-v4")


def _atari(**settings) -> dict:
    return {env: dict(settings) for env in _ATARI}


# Per-environment DQN settings (CartPole: DQNConfig's own defaults).  highway-fast-v0 follows the
# highway-env documentation's DQN example (γ = 0.8, small buffer, frequent target updates), since an
# episode is at most 30 decisions and its simulated steps are slow.
# Atari: CleanRL's dqn_atari.py (lr 1e-4, 80k steps before learning, an update every 4 steps, target every
# 1000, batch 32, ε 1 → 0.01 over 10 % of the steps, γ 0.99) with the paper config's 100k buffer.
# Rewards are sign-clipped by the environment factory for every Atari profile (SignReward in
# crop/envs/atari.py, as CleanRL's ClipRewardEnv) -- a no-op for Pong (±1) and Freeway (0/1), so training
# and certification see the same rewards.  Evaluation episodes are cut at 27,000 decisions (108k
# frames, the usual ALE cap).  Prioritized replay stays on (the paper's StdTrain; CleanRL: uniform).
ENV_DQN_DEFAULTS: dict[str, dict] = {
    "CartPole-v0": {},
    "highway-fast-v0": {"learning_starts": 200, "buffer_size": 15000, "batch_size": 32, "lr": 5e-4,
                        "gamma": 0.8, "target_update": 50, "train_every": 1, "eps_decay_steps": 2000,
                        "eps_end": 0.05, "eval_every": 500},
    **_atari(lr=1e-4, buffer_size=100_000, learning_starts=80_000, train_every=4, target_update=1000,
             batch_size=32, eps_start=1.0, eps_end=0.01, eps_decay_fraction=0.1, gamma=0.99, eval_every=50_000,
             quick_eval_episodes=3, eval_max_steps=27_000),
}

# The DQN settings a recipe needs on an environment, on top of ENV_DQN_DEFAULTS.  Measured on CartPole
# (seed 0): with a target update every 500 steps the greedy policies of GradDQN and NoisyNet sat on a plateau
# at ~100 return (the cart running off the track) from min_steps until 58,000 and 61,000 steps; every 100
# steps they pass at 20,000 and 25,000.  (With 100 for every recipe, RadialRL (then at ε = 0.05) diverged
# and GaussAug needed 65,000 steps: a per-recipe setting.)
RECIPE_DQN_DEFAULTS: dict[str, dict] = {
    "GradDQN": {"CartPole-v0": {"target_update": 100}},
    "NoisyNet": {"CartPole-v0": {"target_update": 100}},
}

_SAMDP = ({"eps": 0.02, "norm": "inf", "kappa": 0.1, "hinge_c": 0.1, "ramp_start": 5000, "ramp_steps": 10000},
          {"highway-fast-v0": {"eps": 0.005, "ramp_start": 500, "ramp_steps": 1500},
           **_atari(eps=1 / 255, kappa=0.005, hinge_c=1.0, ramp_start=100_000, ramp_steps=400_000)})

#: Each recipe's hyper-parameters: (its defaults, per environment on top of them).  What they mean and why
#: these values: the recipe's class in crop/train/recipes.py and its module docstring (threat models).
HYPERPARAMETERS: dict[str, tuple[dict, dict]] = {
    "StdTrain": ({}, {}),
    "GaussAug": ({"sigma": 0.005}, {}),
    "AdvTrain": ({"eps": 0.1, "norm": 2, "steps": 5, "fraction": 0.5, "ramp_start": 2000, "ramp_steps": 8000},
                 {"highway-fast-v0": {"eps": 0.05, "ramp_start": 200, "ramp_steps": 1000},
                  **_atari(eps=0.05, ramp_start=100_000, ramp_steps=400_000)}),
    "GradDQN": ({"eps": 0.1, "norm": 2, "candidates": 10, "fraction": 1.0, "ramp_start": 2000, "ramp_steps": 8000},
                {"highway-fast-v0": {"eps": 0.05, "ramp_start": 200, "ramp_steps": 1000},
                 **_atari(eps=0.05, ramp_start=100_000, ramp_steps=400_000)}),
    "SA-MDP-PGD": ({**_SAMDP[0], "steps": 5}, _SAMDP[1]),
    "SA-MDP-CVX": _SAMDP,
    "RadialRL": ({"eps": 0.02, "norm": "inf", "kappa_end": 0.5, "ramp_start": 0, "ramp_steps": 20000},
                 {"highway-fast-v0": {"eps": 0.005, "ramp_steps": 2000},
                  **_atari(eps=1 / 255, ramp_start=100_000, ramp_steps=400_000)}),
    "NoisyNet": ({"sigma0": 0.5}, {}),
    "CARRL": ({"eps": 0.1, "norm": 2, "method": "crown"}, {"highway-fast-v0": {"eps": 0.05}}),
}


def dqn_config(env_id: str, algo: str, dqn: dict | None = None, budget: dict | None = None) -> DQNConfig:
    """The DQN settings ``algo`` trains with on ``env_id``: :class:`DQNConfig`'s defaults, the environment's
    (:data:`ENV_DQN_DEFAULTS`), the recipe's (:data:`RECIPE_DQN_DEFAULTS`), then a config's ``train.dqn``
    overrides ``dqn`` and its training budget ``budget`` (unchecked: :func:`crop.train.prepare_training`
    checks them)."""
    dqn = dqn or {}
    merged = {**ENV_DQN_DEFAULTS.get(env_id, {}), **RECIPE_DQN_DEFAULTS.get(algo, {}).get(env_id, {}), **dqn,
              **(budget or {})}
    if "eps_decay_steps" in dqn and "eps_decay_fraction" not in dqn:
        merged["eps_decay_fraction"] = None   # an explicit step count beats a default fraction
    return DQNConfig(**merged)


def recipe_hyperparameters(algo: str, env_id: str, overrides: dict | None = None) -> dict:
    """``algo``'s hyper-parameters on ``env_id``: its defaults, the environment's, then ``overrides`` (a config's
    ``train.recipes.<algo>``); ValueError naming an unknown algorithm or key (the values are checked by the
    recipe, :meth:`crop.train.recipes.Recipe.validate`)."""
    if algo not in HYPERPARAMETERS:
        raise ValueError(f"no training recipe for algorithm {algo!r}; known: {sorted(HYPERPARAMETERS)}")
    defaults, per_env = HYPERPARAMETERS[algo]
    hp = {**defaults, **per_env.get(env_id, {})}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(hp))
    if unknown:
        raise ValueError(f"{algo}: unknown hyper-parameter(s) {unknown}; known: {sorted(hp)}")
    return {**hp, **overrides}


def pgd_schedule(algo: str, hp: dict) -> tuple[int, float, int]:
    """(PGD steps per attacked sample, fraction of each batch attacked, the step PGD starts at) of a recipe that
    runs PGD in every update once its ε ramp starts: AdvTrain attacks its ``fraction``, SA-MDP-PGD's inner
    maximum every sample (crop/train/recipes.py); (0, 0.0, 0) for the others."""
    if algo == "AdvTrain":
        return int(hp["steps"]), float(hp["fraction"]), int(hp["ramp_start"])
    if algo == "SA-MDP-PGD":
        return int(hp["steps"]), 1.0, int(hp["ramp_start"])
    return 0, 0.0, 0
