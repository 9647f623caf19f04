"""Training the policies CROP certifies: one Double-DQN trainer (dqn.py), nine recipes (recipes.py).

Entry points:
    ``prepare_training(env_id, algo, settings)`` — validate everything, before any work;
    ``train_policy(env_id, algo, seed, settings, profile, progress, resume)`` — train and acceptance-test,
    resumably (resume.py);
    ``derive_carrl(base_net, base_spec, eps, norm)`` — CARRL's network from StdTrain's.

``settings`` is a config's ``train`` block: ``hidden``, ``total_steps``, ``min_steps``, ``eval_episodes``,
``target_return`` (``None``: no threshold), ``prioritized``, ``dqn`` (overrides of the per-environment
DQN defaults below) and ``recipes`` (per-algorithm hyper-parameter overrides, ``{algo: {key: value}}``);
``recipe`` (the overrides of this algorithm alone) is accepted instead of ``recipes``.
"""
from __future__ import annotations

from dataclasses import fields

from crop.models.carrl import derive_carrl
from crop.train.dqn import DQNConfig, TrainingFailed, greedy_returns, train_dqn
from crop.train.recipes import RECIPES, Recipe, recipe_for

__all__ = ["train_policy", "prepare_training", "derive_carrl", "RECIPES", "Recipe", "DQNConfig",
           "TrainingFailed", "greedy_returns", "ENV_DQN_DEFAULTS", "dqn_config"]

# Per-environment DQN settings (CartPole: DQNConfig's own defaults); a recipe may adjust them per
# environment (Recipe.dqn_defaults), a config's train.dqn block overrides both.  highway-fast-v0 follows the
# highway-env documentation's DQN example (γ = 0.8, small buffer, frequent target updates), since an
# episode is at most 30 decisions and its simulated steps are slow.
ENV_DQN_DEFAULTS: dict[str, dict] = {
    "CartPole-v0": {},
    "highway-fast-v0": {"learning_starts": 200, "buffer_size": 15000, "batch_size": 32, "lr": 5e-4,
                        "gamma": 0.8, "target_update": 50, "train_every": 1, "eps_decay_steps": 2000,
                        "eps_end": 0.05, "eval_every": 500},
    # CleanRL's dqn_atari.py (lr 1e-4, 80k steps before learning, an update every 4 steps, target every
    # 1000, batch 32, ε 1 → 0.01 over 10 % of the steps, γ 0.99) with the paper config's 100k buffer.
    # Rewards are sign-clipped by the environment factory for every Atari profile (SignReward in
    # crop/envs/atari.py, as CleanRL's ClipRewardEnv) — a no-op for Pong (±1) and Freeway (0/1), so training
    # and certification see the same rewards.  Evaluation episodes are cut at 27,000 decisions (108k
    # frames, the usual ALE cap).  Prioritized replay stays on (the paper's StdTrain; CleanRL: uniform).
    **{env: {"lr": 1e-4, "buffer_size": 100_000, "learning_starts": 80_000, "train_every": 4,
             "target_update": 1000, "batch_size": 32, "eps_start": 1.0, "eps_end": 0.01,
             "eps_decay_fraction": 0.1, "gamma": 0.99, "eval_every": 50_000, "quick_eval_episodes": 3,
             "eval_max_steps": 27_000}
       for env in ("PongNoFrameskip-v4", "FreewayNoFrameskip-v4")},
}

_COMMON = ("hidden", "total_steps", "min_steps", "eval_episodes", "target_return", "prioritized")
_DQN_KEYS = {f.name for f in fields(DQNConfig)} - set(_COMMON)


def dqn_config(env_id: str, algo: str, dqn: dict | None = None, budget: dict | None = None) -> DQNConfig:
    """The DQN settings ``algo`` trains with on ``env_id``: :class:`DQNConfig`'s defaults, the environment's
    (:data:`ENV_DQN_DEFAULTS`), the recipe's (``Recipe.dqn_defaults``), then a config's ``train.dqn`` overrides
    ``dqn`` and its training budget ``budget`` (unchecked: :func:`prepare_training` checks them)."""
    dqn = dqn or {}
    merged = {**ENV_DQN_DEFAULTS.get(env_id, {}), **recipe_for(algo).dqn_defaults.get(env_id, {}), **dqn,
              **(budget or {})}
    if "eps_decay_steps" in dqn and "eps_decay_fraction" not in dqn:
        merged["eps_decay_fraction"] = None   # an explicit step count beats a default fraction
    return DQNConfig(**merged)


def prepare_training(env_id: str, algo: str, settings: dict | None = None) -> tuple[DQNConfig, Recipe, dict]:
    """(DQN configuration, recipe, hyper-parameters) for ``algo`` on ``env_id``; ValueError on bad input."""
    from crop.envs import action_bounds, env_spec

    if action_bounds(env_id) is not None:   # a Q-network needs one output per action: a finite set of them
        raise ValueError(f"{env_id} has continuous (Box) actions; crop trains and derives Q-networks (Double DQN) "
                         "over Discrete actions only: import your own continuous agent (crop import, "
                         "docs/own-policy.md)")
    images = len(env_spec(env_id).obs_shape) == 3
    recipe = recipe_for(algo)
    if images and not recipe.images:
        raise ValueError(f"{algo} has no image (CNN) variant, so it cannot be trained on {env_id}; "
                         "use the published checkpoints (crop/agents/registry.yaml)")
    settings = dict(settings or {})
    if "recipe" in settings and "recipes" in settings:
        raise ValueError("give either 'recipe' (this algorithm's overrides) or 'recipes', not both")
    overrides = settings.pop("recipe", None)
    per_algo = settings.pop("recipes", None) or {}
    if overrides is None:
        overrides = per_algo.get(algo, {})
    dqn = settings.pop("dqn", None) or {}
    unknown = sorted(set(settings) - set(_COMMON))
    if unknown:
        raise ValueError(f"unknown training setting(s) {unknown}; known: {sorted(_COMMON + ('dqn', 'recipes'))}")
    bad = sorted(set(dqn) - _DQN_KEYS)
    if bad:
        raise ValueError(f"unknown dqn setting(s) {bad}; known: {sorted(_DQN_KEYS)}")
    hp = recipe.hyperparameters(env_id, overrides)
    if recipe.kind != "train":
        return DQNConfig(), recipe, hp
    cfg = dqn_config(env_id, algo, dqn, {k: v for k, v in settings.items() if v is not None or k == "target_return"})
    if cfg.total_steps < 1 or cfg.eval_episodes < 1 or cfg.min_steps < 0 or not cfg.hidden:
        raise ValueError(f"invalid training budget: {cfg}")
    if cfg.device not in ("cpu", "cuda", "auto") and not str(cfg.device).startswith("cuda:"):
        raise ValueError(f"device must be cpu, cuda or auto, got {cfg.device!r}")
    if str(cfg.device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {cfg.device!r} asked for, but no CUDA device is available (use auto)")
    if cfg.eps_decay_fraction is not None and not 0 < cfg.eps_decay_fraction <= 1:
        raise ValueError(f"eps_decay_fraction must be in (0, 1], got {cfg.eps_decay_fraction!r}")
    if cfg.eval_max_steps is not None and cfg.eval_max_steps < 1:
        raise ValueError(f"eval_max_steps must be >= 1, got {cfg.eval_max_steps!r}")
    return cfg, recipe, hp


def train_policy(env_id: str, algo: str, seed: int, settings: dict | None = None, profile: str | None = None,
                 progress: bool | None = None, resume=None):
    """Train ``algo`` on ``env_id`` from ``seed``; returns (network in eval mode, info).  ``resume``
    (:class:`crop.train.resume.ResumeOptions`): where the training state is saved and resumed from.

    ``info`` holds ``net_spec``, ``acceptance`` (the clean greedy return: mean/std/min/episodes/step),
    ``steps``, ``recipe``, ``hyperparameters``, ``train_config``, the evaluations and the runtime.
    Raises ValueError (bad input, before any work) or TrainingFailed (acceptance test not passed).
    """
    cfg, recipe, hp = prepare_training(env_id, algo, settings)
    if recipe.kind != "train":
        raise ValueError(f"{algo} is not trained: it is derived from another algorithm's checkpoint "
                         "(crop derive / crop.train.derive_carrl)")
    return train_dqn(env_id, seed, cfg, profile=profile, progress=progress, recipe=recipe, hp=hp, resume=resume)
