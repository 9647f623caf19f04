"""The workflow config `crop certify` writes: one environment, one policy file under one label, the σ to
certify and the stage sizes of a budget (docs/own-policy.md, "In one command").

``quick`` is sized to finish a CartPole, Acrobot or Pendulum agent in a few CPU-minutes while every stage
still runs and the audit has checks to make: LoAct and GRe over the environment's whole episode (its
``max_episode_steps``, at most :data:`QUICK_MAX_HORIZON` steps; 50 for an image environment) with m in the
thousands and hundreds, LoRe to depth 3, the attacks with few PGD steps and ``global_episodes: auto`` (the
fewest episodes that let each GRe percentile check fail on its own, as config.yaml).  ``paper`` takes the
paper's sizes (Appendix E) from configs/paper.yaml: the environment's own block where the paper has it, else
CartPole's, the protocol of the paper's vector environment.

Every path in the config is absolute (the policy file, ``results``), so the config re-runs the same DAG from
any working directory: ``snakemake -s WORKFLOW/Snakefile --cores N --configfile DIR/config.yaml`` (WORKFLOW:
:func:`crop.workflow.workflow_root`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from crop.workflow import workflow_root

#: The stages' sizes per budget; ``paper`` is read from configs/paper.yaml (:func:`budget_sizes`).
QUICK = {
    "train": {"eval_episodes": 3},
    "qrange": {"m": 1000, "episodes": 1, "horizon": 50},
    "loact": {"m": 1000, "episodes": 2, "horizon": 50},
    "gre": {"m": 500, "horizon": 50, "eps_factors": [0.0, 0.05, 0.1, 0.2]},
    "lore": {"m": 1000, "horizon": 3},
    "attack": {"pgd_steps": 5, "local_episodes": 1, "local_m_grad": 16, "local_eps_factors": [0.0, 1.0],
               "global_episodes": "auto", "global_n_eot": 4, "global_eps_factors": [0.0, 0.05, 0.1, 0.2]},
}
QUICK_SIGMAS = [0.05, 0.1]
#: The quick budget certifies a vector environment's whole episode up to this many steps (its
#: ``max_episode_steps``): a classic-control agent's run then stays within a few CPU-minutes.
QUICK_MAX_HORIZON = 500
BUDGETS = ("quick", "paper")
#: The smoothing targets --target offers (the config's ``target``); auto is the default.
TARGETS = ("auto", "q", "probs", "vote")
#: The confidence bound of a discrete agent's smoothed outputs (the config's ``bound``): Clopper–Pearson, exact
#: for the vote's 0/1 samples (there it is never looser than Hoeffding, the workflow's default, whose margin
#: bounds the same binomial tail), so ``auto`` can weigh the vote at Cohen et al.'s own bound.
CERTIFY_BOUND = "clopper_pearson"

#: The file that marks a folder as made by `crop certify`: the agent (its sha256), environment and label the
#: folder's results are of.  Only such a folder, an empty one or a new one is written into without --force.
MARKER = "crop-certify.json"
#: What makes two certifications the same agent's: a rerun with these equal writes into the same folder.
SAME = ("env", "algo", "sha256")

#: Reward facts of the Gymnasium environments crop certifies without a ``--reward-range`` (their
#: specifications): the per-step range and, where an episode's length is capped, the whole game's range.
REWARDS = {
    "CartPole-v1": {"range": [0.0, 1.0], "return_range": [0.0, 500.0]},      # +1 per step, at most 500
    "Acrobot-v1": {"range": [-1.0, 0.0], "return_range": [-500.0, 0.0]},     # -1 per step until the goal
    "MountainCar-v0": {"range": [-1.0, 0.0], "return_range": [-200.0, 0.0]},
    "Pendulum-v1": {"range": [-16.2736045, 0.0]},                          # -(π² + 0.1·8² + 0.001·2²)
    "MountainCarContinuous-v0": {"range": [-0.1, 100.0]},                  # -0.1·a², +100 at the flag
}

#: What a Box-action environment runs (LoAct per dimension, GRe, the global attack; docs/own-policy.md).
_BOX_STAGES = ("train", "loact", "gre", "attack")
_LOCAL_ATTACK = ("local_episodes", "local_m_grad", "local_eps_factors")


def certify_args(p, algo_type, sigma_type, count_type) -> None:
    """`crop certify`'s options, checked by the command line's own types (crop.workflow.cli: a label as the
    config's, σ > 0, a count ≥ 1); --env is checked with the file, in one line."""
    p.add_argument("policy", help="your agent's file: a Stable-Baselines3 .zip (DQN, PPO, A2C, SAC, TD3, DDPG), a "
                                  "CleanRL checkpoint or a PyTorch state dict; its kind is read from the file")
    p.add_argument("--env", required=True, help="the Gymnasium id to certify it on, with Discrete or Box actions "
                                                "(its observation and action spaces must be the agent's)")
    p.add_argument("--algo", type=algo_type, default="Mine",
                   help="the label it gets in the tables, figures and folders")
    p.add_argument("--sigma", type=sigma_type, nargs="+",
                   help=f"the σ to certify (default: quick {QUICK_SIGMAS}, paper: the paper's for the environment)")
    p.add_argument("--out", default="certify",
                   help="the folder of config.yaml, results/, report.html and Snakemake's .snakemake/: a new or "
                        "empty folder, or one crop certify made for the same agent, environment and label (then a "
                        "rerun resumes or finds nothing to do)")
    p.add_argument("--force", action="store_true",
                   help="write into --out even if it holds other files (config.yaml and report.html are replaced, "
                        "results/ is shared)")
    p.add_argument("--cores", type=count_type, default=2, help="cores Snakemake may use")
    p.add_argument("--budget", choices=BUDGETS, default="quick",
                   help="quick: a few CPU-minutes for a classic-control agent; paper: the paper's sizes")
    p.add_argument("--horizon", type=count_type,
                   help="the steps of an episode the V range, LoAct and GRe (and so the global attack) cover "
                        f"(default: quick: the environment's max_episode_steps up to {QUICK_MAX_HORIZON}, "
                        f"{QUICK['gre']['horizon']} for "
                        "an image environment; paper: the paper's)")
    p.add_argument("--episodes", type=count_type, help="LoAct's episodes (default: the budget's)")
    p.add_argument("--m", type=count_type,
                   help="every stage's noise samples per state (the V range, LoAct, LoRe) and GRe's sampled paths "
                        "(default: the budget's)")
    p.add_argument("--target", choices=TARGETS,
                   help="what LoAct, LoRe and the local attack smooth (discrete actions): auto (the default) lets "
                        "a pilot pick, per σ and before any certification noise is drawn, the target with the "
                        "largest predicted radius (q or vote for a Q-network, probs or vote for a policy network); "
                        "q, probs or vote fixes it")
    p.add_argument("--skip", action="append", metavar="STAGE",
                   help="a stage not to run (repeat it, or a comma list): lore (LoRe; skipped with a line saying "
                        "why where it cannot run, as on a Box2D environment), attack-local (the local PGD attack); "
                        "the report and the audit then show only the stages that ran")
    p.add_argument("--reward-range", type=float, nargs=2, metavar=("LOW", "HIGH"),
                   help="the per-step reward range (GRe and LoRe need it; known for "
                        f"{', '.join(REWARDS)} and the paper's environments)")


def _paper_block(env: str) -> tuple[dict, list[float]]:
    """configs/paper.yaml's block of ``env``, else its CartPole-v0 block (the vector protocol)."""
    import yaml

    envs = yaml.safe_load((workflow_root() / "configs" / "paper.yaml").read_text())["environments"]
    return envs.get(env, envs["CartPole-v0"]), envs.get(env, envs["CartPole-v0"])["sigmas"]


def episode_steps(env: str) -> int | None:
    """The length Gymnasium caps an episode of ``env`` at (its ``max_episode_steps``), None where it has none
    or is not a vector environment (an image's every step is a CNN forward per noise sample: the quick budget
    keeps its short horizon there)."""
    import gymnasium as gym

    from crop.envs import env_family

    if ":" in env or (env_family(env) != "vector" and env != "CartPole-v0"):   # a module:Id imports nothing here
        return None
    try:
        steps = gym.spec(env).max_episode_steps
    except Exception:   # not registered under that name in Gymnasium's own registry
        return None
    return int(steps) if steps else None


def quick_horizon(env: str) -> tuple[int, str]:
    """The quick budget's horizon of ``env`` and why: the whole episode (``max_episode_steps``) up to
    :data:`QUICK_MAX_HORIZON`, else QUICK's 50 steps."""
    steps = episode_steps(env)
    if steps is None:
        return QUICK["gre"]["horizon"], f"{env} declares no episode length crop sizes by"
    if steps > QUICK_MAX_HORIZON:
        return QUICK_MAX_HORIZON, f"{env}'s episode of {steps} steps, capped by the quick budget"
    return steps, f"{env}'s whole episode"


def budget_sizes(budget: str, env: str, horizon: int | None = None, episodes: int | None = None,
                 m: int | None = None) -> tuple[dict, list[float]]:
    """``({stage: settings}, default σ)`` of ``budget`` for ``env``; ``horizon`` (the V range's, LoAct's and
    GRe's), ``episodes`` (LoAct's) and ``m`` (every stage's noise samples or paths) replace the budget's."""
    if budget == "quick":
        sizes, sigmas = {k: dict(v) for k, v in QUICK.items()}, list(QUICK_SIGMAS)
        horizon = horizon or quick_horizon(env)[0]
    else:
        block, sigmas = _paper_block(env)
        sizes = {k: dict(block[k]) for k in QUICK if k in block and k != "train"}
    for stage in ("qrange", "loact", "gre"):
        if horizon and stage in sizes:
            sizes[stage]["horizon"] = int(horizon)
    if episodes and "loact" in sizes:
        sizes["loact"]["episodes"] = int(episodes)
    for stage in ("qrange", "loact", "gre", "lore"):
        if m and stage in sizes:
            sizes[stage]["m"] = int(m)
    return sizes, list(sigmas)


def certify_config(env: str, agent: tuple[str, Path], out: Path, sizes: dict, sigmas: list[float],
                   rewards: dict | None, box: bool, target: str | None = None) -> dict:
    """The workflow config of one policy file (``agent``: its label and absolute path) certified on ``env``
    with the smoothing ``target`` (none: the network's default) and :data:`CERTIFY_BOUND`, results in
    ``out``/results; a Box-action environment gets its stages only (no V range, LoRe or local attack), no
    target and no bound (its LoAct's are exact order statistics)."""
    label, policy = agent
    ec = {"source": "file", "files": {label: {"path": str(policy)}}, "algorithms": [label],
          "sigmas": [float(s) for s in sigmas]}
    if target and not box:
        ec["target"] = target
    if rewards:
        ec["rewards"] = dict(rewards)
    for stage, settings in sizes.items():
        if box and stage not in _BOX_STAGES:
            continue
        ec[stage] = {k: v for k, v in settings.items() if not (box and k in _LOCAL_ATTACK)}
    return {"results": str(out / "results"), "seed": 0, **({} if box else {"bound": CERTIFY_BOUND}),
            "environments": {env: ec}}


def policy_sha256(path: Path) -> str:
    """The sha256 of the policy file: the agent's identity in the folder's :data:`MARKER`."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def out_problem(out: Path, identity: dict, force: bool) -> str | None:
    """Why ``out`` may not receive this certification (one line naming the folder and --force), or None: it
    must not exist, be empty, or hold the :data:`MARKER` of the same ``identity`` (env, label, the policy
    file's sha256); with ``force`` any folder will do.  A file, or a path under a file, is never a folder."""
    first = next((p for p in (out, *out.parents) if p.exists() or p.is_symlink()), None)
    if first is not None and not first.is_dir():
        return f"--out {out}: {'is a file' if first == out else f'{first} is a file'}, not a folder; name a folder"
    if first != out or force:
        return None
    try:
        held = sorted(p.name for p in out.iterdir())
    except OSError as exc:
        return f"--out {out}: cannot read the folder ({exc.strerror})"
    if not held:
        return None
    try:
        made = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        made = None
    if isinstance(made, dict) and all(made.get(k) == identity[k] for k in SAME):
        return None
    what = ("crop certify made it for another agent, environment or label" if isinstance(made, dict)
            else f"it holds {', '.join(held[:3])}{' …' if len(held) > 3 else ''}, not made by crop certify")
    return (f"--out {out}: {what}; name a new or empty folder, or give --force to write into it anyway "
            "(config.yaml and report.html replaced, results/ shared)")


def identity(env: str, label: str, policy: Path) -> dict:
    """What :data:`MARKER` records: the environment, the label and the policy file (path and sha256)."""
    return {"env": env, "algo": label, "policy": str(policy), "sha256": policy_sha256(policy)}
