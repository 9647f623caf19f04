"""The training cost model against real trainings: a calibration measured here (crop.workflow.calibrate.train_costs)
predicts two short CartPole trainings (StdTrain; AdvTrain with PGD from the first update), and the measured time
is printed beside the prediction.  The model aims at 0.5–2× (docs/hpc.md); this is a measurement, not a test.

    python benchmarks/training_cost_check.py [--steps 600]
"""
from __future__ import annotations

import argparse
import copy
import time


def main(argv=None) -> None:
    import torch

    from crop.train import prepare_training
    from crop.train.dqn import train_dqn
    from crop.workflow import cost
    from crop.workflow.calibrate import train_costs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600, help="each training's environment steps")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    units = train_costs("CartPole-v0", "cpu")
    for algo, recipe in (("StdTrain", {}), ("AdvTrain", {"ramp_start": 0, "ramp_steps": 1})):
        settings = {"total_steps": args.steps, "eval_episodes": 1, "target_return": None,
                    "dqn": {"learning_starts": 100}, "recipes": {algo: recipe}}
        dqn, rec, hp = prepare_training("CartPole-v0", algo, copy.deepcopy(settings))
        t = time.perf_counter()
        train_dqn("CartPole-v0", 0, dqn, recipe=rec, hp=hp, progress=False)
        measured = time.perf_counter() - t
        w = cost.training_work(cost.training_settings("CartPole-v0", algo, settings), 200)
        predicted = ((w["env_steps"] + w["eval_steps"]) * units["train_step_s"]
                     + (w["updates"] + w["pgd_updates"]) * units["train_update_s"])
        print(f"CartPole-v0 {algo}, {args.steps} steps: measured {measured:.2f} s, predicted {predicted:.2f} s: "
              f"{measured / predicted:.2f}x")


if __name__ == "__main__":
    main()
