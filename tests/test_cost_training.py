"""The training cost model (crop.workflow.cost.training_work, _checkpoint_seconds) counts what
crop.train.dqn.train_dqn does: environment steps, gradient updates every ``train_every`` steps from
``learning_starts``, the recipe's PGD on the attacked fraction of each batch from its ramp start, and the
greedy evaluations (quick ones every ``eval_every`` steps, the acceptance or final one)."""
import copy
import subprocess
import sys

import pytest

from crop.workflow import cost
from crop.workflow.config import load_config, train_settings

ENVS = ("CartPole-v0", "highway-fast-v0", "PongNoFrameskip-v4", "FreewayNoFrameskip-v4")


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("algo", ["StdTrain", "AdvTrain", "SA-MDP-PGD", "GaussAug"])
def test_the_model_counts_the_trainers_settings(env, algo):
    from crop.train import prepare_training
    from crop.train.recipes import recipe_for

    if env in ENVS[2:] and not recipe_for(algo).images:
        pytest.skip(f"{algo} has no image variant")
    settings = {"total_steps": 12345, "eval_episodes": 7, "dqn": {"train_every": 3}, "recipes": {algo: {}}}
    dqn, recipe, hp = prepare_training(env, algo, copy.deepcopy(settings))
    s = cost.training_settings(env, algo, settings)
    for key in ("learning_starts", "train_every", "eval_every", "quick_eval_episodes", "eval_max_steps",
                "total_steps", "eval_episodes"):
        assert s[key] == getattr(dqn, key), key
    assert s["train_every"] == 3
    runs_pgd = algo in ("AdvTrain", "SA-MDP-PGD")
    assert s["pgd_steps"] == (hp["steps"] if runs_pgd else 0)
    assert s["pgd_fraction"] == (hp.get("fraction", 1.0) if runs_pgd else 0.0)
    assert s["pgd_start"] == (hp["ramp_start"] if runs_pgd else 0)


def test_cartpole_stdtrain_and_advtrain_by_hand():
    """10,000 steps, CartPole's defaults: an update every 2 steps from step 1,000 (4,500); AdvTrain attacks
    half of each batch with 5 PGD steps from step 2,000 (4,000 updates × 2.5); a quick evaluation of 10
    episodes every 1,000 steps from 1,000 (9 of them) and the acceptance evaluation of 100, 200 steps each."""
    for algo, pgd in (("StdTrain", 0.0), ("AdvTrain", 4000 * 5 * 0.5)):
        s = cost.training_settings("CartPole-v0", algo, {"total_steps": 10_000, "eval_episodes": 100})
        assert cost.training_work(s, 200) == {"env_steps": 10_000, "updates": 4500, "pgd_updates": pgd,
                                              "eval_steps": (9 * 10 + 100) * 200}
    s = cost.training_settings("highway-fast-v0", "StdTrain", {"total_steps": 1000, "eval_episodes": 5})
    assert s["target_return"] is None    # no threshold: no quick evaluations, the final one only
    assert cost.training_work(s, 30) == {"env_steps": 1000, "updates": 800, "pgd_updates": 0.0, "eval_steps": 150}


def _seconds(train: dict, algo: str = "AdvTrain") -> float:
    cfg = load_config("configs/paper.yaml")
    ec = cfg["environments"]["CartPole-v0"]
    ec["train"] = train
    return cost._checkpoint_seconds(cfg, cost.Job("checkpoint", "CartPole-v0", algo), cost.shipped_table("cpu"))


def test_seconds_rise_by_the_counted_units():
    """More PGD steps, more evaluation episodes and fewer environment steps per update each add exactly their
    counted work at the table's unit costs."""
    u = cost.shipped_table("cpu")["envs"]["CartPole-v0"]
    step, update = u["train_step_s"], u["train_update_s"]
    base = {"total_steps": 10_000, "eval_episodes": 100}
    t0 = _seconds(base)
    assert _seconds({**base, "recipes": {"AdvTrain": {"steps": 7}}}) - t0 == pytest.approx(4000 * 2 * 0.5 * update)
    assert _seconds({**base, "eval_episodes": 150}) - t0 == pytest.approx(50 * 200 * step)
    # an update every step instead of every 2: 4,500 more updates, 4,000 of them attacked (5 × half a batch)
    assert _seconds({**base, "dqn": {"train_every": 1}}) - t0 == pytest.approx((4500 + 4000 * 2.5) * update)
    assert _seconds(base) - _seconds(base, "StdTrain") == pytest.approx(4000 * 2.5 * update)


def test_paper_config_prices_every_training_by_its_work():
    cfg = load_config("configs/paper.yaml")
    for env, ec in cfg["environments"].items():
        if ec["source"] != "train":
            continue
        s = cost.training_settings(env, "AdvTrain", train_settings(ec, "AdvTrain"))
        assert s["total_steps"] == ec["train"]["total_steps"]


def test_the_trainers_defaults_cost_no_torch():
    """The cost model and the rules (a checkpoint job's memory and GPU) read the trainer's defaults from
    crop/train/defaults.py: the table the trainer itself reads, without importing torch."""
    code = ("import sys; from crop.train import dqn_config; from crop.workflow import cost; "
            "assert dqn_config('PongNoFrameskip-v4', 'SA-MDP-PGD').buffer_size == 100_000; "
            "assert cost.training_settings('PongNoFrameskip-v4', 'SA-MDP-PGD', {})['pgd_steps'] == 5; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
