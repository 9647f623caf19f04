"""What a training costs, in the units the cost model prices it by (:mod:`crop.workflow.cost`): the settings a
training of an algorithm on an environment runs with, and the work :func:`crop.train.dqn.train_dqn` does
under them (environment steps, gradient updates, their PGD, evaluation steps)."""
from __future__ import annotations

__all__ = ["EPISODE_STEPS", "training_settings", "training_work"]

#: An evaluation episode's steps where the environment's own end fixes them: CartPole-v0's 200 steps,
#: highway-fast-v0's 30 decisions, Freeway's 2 min 16 s clock (2,043 and 2,047 decisions measured under the
#: ``cleanrl`` profile, always-up and random play), Pong's game to 21 points (821, 1,766 and 2,775 decisions
#: measured, seeds 0–2, for a player that follows the ball from the RAM: 21–0 lost, 21–3 lost and 19–21 won;
#: the longest is the most contested, 40 points of about 70 decisions, and a game has at most 41, so 3,000 errs
#: long; the DQN settings' cut, 27,000, is no game's length).  Elsewhere the DQN settings' cut
#: (eval_max_steps), else the config's GRe horizon.
EPISODE_STEPS = {"CartPole-v0": 200, "highway-fast-v0": 30, "FreewayNoFrameskip-v4": 2050,
                  "PongNoFrameskip-v4": 3000}


def training_settings(env: str, algo: str, settings: dict) -> dict:
    """What the model counts of a training of ``algo`` on ``env`` under a config's ``train`` settings
    (:func:`crop.workflow.config.train_settings`): the DQN schedule (total_steps, learning_starts,
    train_every, eval_every, quick_eval_episodes, eval_episodes, eval_max_steps, target_return) and the
    recipe's PGD (pgd_steps, pgd_fraction, pgd_start; 0 steps for a recipe without PGD)."""
    from crop.schema import schema_default
    from crop.train.defaults import dqn_config, pgd_schedule, recipe_hyperparameters
    from crop.workflow.config import target_return

    dqn = dqn_config(env, algo, settings.get("dqn"))
    out = {k: getattr(dqn, k) for k in ("learning_starts", "train_every", "eval_every", "quick_eval_episodes",
                                         "eval_max_steps")}
    out["total_steps"] = settings.get("total_steps", schema_default("environment.train.total_steps"))
    out["eval_episodes"] = settings.get("eval_episodes", schema_default("environment.train.eval_episodes"))
    out["target_return"] = target_return(env, settings.get("target_return"))
    hp = recipe_hyperparameters(algo, env, (settings.get("recipes") or {}).get(algo))
    out["pgd_steps"], out["pgd_fraction"], out["pgd_start"] = pgd_schedule(algo, hp)
    return out


def _multiples(k: int, start: int, stop: int) -> int:
    """How many steps s in [start, stop) have s % k == 0."""
    start = max(start, 0)
    return max(0, -(-stop // k) - -(-start // k)) if stop > start else 0


def training_work(s: dict, episode_steps: int) -> dict:
    """A training's work in the units it is priced by (:func:`crop.train.dqn.train_dqn`, read top to bottom):
    ``env_steps`` (act, step, store), ``updates`` (one gradient update of a batch every ``train_every`` steps
    from ``learning_starts``), ``pgd_updates`` (the updates' PGD: pgd_steps × the fraction attacked, each step a
    forward and backward of that fraction, per update from the recipe's ramp start) and ``eval_steps`` (greedy
    episodes of ``episode_steps``: ``quick_eval_episodes`` every ``eval_every`` steps from ``learning_starts``
    and one acceptance evaluation of ``eval_episodes`` with a target return; without one, the final
    ``eval_episodes``).  All at ``total_steps``: a training accepted sooner costs less."""
    n = s["total_steps"]
    updates = _multiples(s["train_every"], s["learning_starts"], n)
    attacked = _multiples(s["train_every"], max(s["learning_starts"], s["pgd_start"]), n)
    quick = _multiples(s["eval_every"], s["learning_starts"], n) if s["target_return"] is not None else 0
    episodes = quick * s["quick_eval_episodes"] + s["eval_episodes"]
    return {"env_steps": n, "updates": updates, "pgd_updates": attacked * s["pgd_steps"] * s["pgd_fraction"],
            "eval_steps": episodes * episode_steps}
