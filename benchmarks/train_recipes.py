"""Train every recipe end to end and print its cost and clean greedy return (not a test):

    python benchmarks/train_recipes.py                         # all nine on CartPole-v0, seed 0
    python benchmarks/train_recipes.py --env highway-fast-v0 --algos StdTrain SA-MDP-PGD RadialRL CARRL \
        --settings '{"hidden": [256, 256], "total_steps": 4000, "min_steps": 0, "eval_episodes": 20,
                     "target_return": null}'

Settings are the schema's train-block defaults, then ``--settings`` (JSON) on top — what the workflow's
``checkpoint`` rule passes for a config with that train block.  CARRL is derived from the StdTrain
network trained in the same run (as ``crop derive`` does).  Times are CPU seconds of this process at one
thread (``time.process_time``), so a busy machine does not inflate them; wall seconds are printed too.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crop.io import derive_seed  # noqa: E402
from crop.train import prepare_training, train_policy  # noqa: E402
from crop.train.dqn import TrainingFailed, greedy_returns  # noqa: E402
from crop.workflow.config import ALGORITHMS, target_return, train_defaults  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v0")
    ap.add_argument("--algos", nargs="+", default=ALGORITHMS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settings", default="{}", help="train block overrides (JSON)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    settings = {**train_defaults(), **json.loads(args.settings)}
    settings["target_return"] = target_return(args.env, settings["target_return"])   # as in a config
    rows, base = [], None
    for algo in args.algos:
        cfg, recipe, hp = prepare_training(args.env, algo, settings)
        wall, cpu = time.time(), time.process_time()
        row = {"algo": algo, "hyperparameters": hp}
        try:
            if recipe.kind == "derive":
                if base is None:
                    net, info = train_policy(args.env, "StdTrain", args.seed, settings, progress=False)
                    base = (net, info["net_spec"])
                    wall, cpu = time.time(), time.process_time()   # CARRL's own cost: derive + evaluate
                net, spec = recipe.derive(*base, hp)
                rets = greedy_returns(net, args.env, [derive_seed(args.seed, "accept-eval", i)
                                                      for i in range(settings["eval_episodes"])])
                row.update(ok=True, steps=0, mean=float(rets.mean()), std=float(rets.std()), min=float(rets.min()))
            else:
                net, info = train_policy(args.env, algo, args.seed, settings, progress=False)
                if algo == "StdTrain":
                    base = (net, info["net_spec"])
                a = info["acceptance"]
                row.update(ok=True, steps=info["steps"], mean=a["mean"], std=a["std"], min=a["min"])
        except TrainingFailed as exc:
            row.update(ok=False, error=str(exc))
        row.update(cpu_s=round(time.process_time() - cpu, 1), wall_s=round(time.time() - wall, 1))
        rows.append(row)
        status = (f"return {row['mean']:.1f} ± {row['std']:.1f} (min {row['min']:.0f}) after {row['steps']} steps"
                  if row["ok"] else f"FAILED: {row['error'][-160:]}")
        print(f"{args.env} {algo:11s} {row['cpu_s']:7.1f} s CPU {row['wall_s']:7.1f} s wall  {status}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
