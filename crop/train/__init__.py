"""Training the policies CROP certifies: one Double-DQN trainer (dqn.py), nine recipes (recipes.py).

Entry points:
    ``prepare_training(env_id, algo, settings)`` — validate everything, before any work;
    ``train_policy(env_id, algo, seed, settings, profile, progress, resume)`` — train and acceptance-test,
    resumably (resume.py);
    ``dqn_config(env_id, algo, dqn, budget)`` — the DQN settings a training uses (defaults.py).
Importing the package costs no torch (the cost model and the rules read its defaults): the trainer is
:mod:`crop.train.dqn`, the recipes :mod:`crop.train.recipes`, CARRL's derived network
:func:`crop.models.carrl.derive_carrl`.

``settings`` is a config's ``train`` block: ``hidden``, ``total_steps``, ``min_steps``, ``eval_episodes``,
``target_return`` (``None``: no threshold), ``prioritized``, ``dqn`` (overrides of the per-environment
DQN defaults of defaults.py) and ``recipes`` (per-algorithm hyper-parameter overrides, ``{algo: {key: value}}``);
``recipe`` (the overrides of this algorithm alone) is accepted instead of ``recipes``.
"""
from __future__ import annotations

from dataclasses import fields

from crop.train.defaults import DQNConfig, dqn_config

__all__ = ["train_policy", "prepare_training", "DQNConfig", "dqn_config"]

_COMMON = ("hidden", "total_steps", "min_steps", "eval_episodes", "target_return", "prioritized")
_DQN_KEYS = {f.name for f in fields(DQNConfig)} - set(_COMMON)


def prepare_training(env_id: str, algo: str, settings: dict | None = None) -> tuple:
    """(DQN configuration, recipe, hyper-parameters) for ``algo`` on ``env_id``; ValueError on bad input."""
    from crop.envs import action_bounds, env_spec
    from crop.train.recipes import recipe_for

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
    from crop.train.dqn import train_dqn

    cfg, recipe, hp = prepare_training(env_id, algo, settings)
    if recipe.kind != "train":
        raise ValueError(f"{algo} is not trained: it is derived from another algorithm's checkpoint "
                         "(crop derive / crop.models.carrl.derive_carrl)")
    return train_dqn(env_id, seed, cfg, profile=profile, progress=progress, recipe=recipe, hp=hp, resume=resume)
