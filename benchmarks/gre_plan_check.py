"""GRe's price against its run: one small GRe job per environment (a random network of the environment's
architecture, GRe's workflow path with ``--workers`` processes, crop.workflow.calibrate.gre_phases), measured
against what the cost model predicts for the same job (crop.workflow.stage_costs.gre_seconds, from the unit costs
of crop plan: this machine's calibration file, else the shipped table).

The model counts every trajectory at its full horizon; a random network's CartPole episodes end sooner, so the
prediction is made for the trajectory steps the run took (counted).  Printed per environment: the lockstep loop's
CPU seconds (main process and workers) against its prediction (every step's main-process and worker parts), and
the job's wall seconds against the predicted wall seconds; the goal is 0.7-1.3 on a quiet machine (a busy one
stretches the wall-clock, not the CPU seconds; a job this small also pays its workers' start, which a paper-size
job spreads over minutes).

    python benchmarks/gre_plan_check.py [--env ID ...] [--workers 2] [--calibration FILE]
"""
from __future__ import annotations

import argparse
import os

import torch

from crop.envs import make_env, to_obs
from crop.models import build_network
from crop.workflow.calibrate import PAPER_ENVS, _net_spec, gre_phases
from crop.workflow.cost import Job, unit_costs
from crop.workflow.cost_units import Units
from crop.workflow.stage_costs import gre_seconds

#: (m, H) per environment: a few seconds to a minute of work on two cores.
SIZES = {"CartPole-v0": (10000, 200), "highway-fast-v0": (48, 30), "PongNoFrameskip-v4": (128, 100),
         "FreewayNoFrameskip-v4": (128, 100)}


def check(env: str, workers: int, table: dict) -> tuple[float, float]:
    m, horizon = SIZES[env]
    e = make_env(env)
    obs = to_obs(e.reset(seed=0)[0])
    net = build_network(_net_spec(env, int(e.action_space.n), obs.shape)).eval()
    e.close()
    ph = gre_phases(env, net, m, horizon, workers=workers)
    u = Units(table, env, "cpu")
    job = Job("gre", env, "StdTrain", "0.01", threads=workers)
    cfg = {"environments": {env: {"gre": {"m": m, "horizon": horizon, "batch": None}}}}
    full = gre_seconds(cfg, job, u)[0]
    taken = ph["steps"] / (m * horizon)   # the fraction of the full horizon's steps taken
    cfg_taken = {"environments": {env: {"gre": {"m": m, "horizon": horizon * taken, "batch": None}}}}
    predicted = gre_seconds(cfg_taken, job, u)[0]
    single = u.env_units.get("gre_single_process")
    parent = u("gre_parent_step_s") if u.has("gre_parent_step_s") else 0.0
    steps = ph["steps"]
    loop_predicted = steps * (parent + u("gre_step_s"))
    loop = float(ph["loop"][1] + ph["loop"][2])   # the lockstep loop's CPU seconds: main process and workers
    wall = float(ph["total"][0])
    print(f"{env:<24} m={m:<6} H={horizon:<4} workers={1 if single else workers}: {steps:>9,} steps "
          f"({taken:.0%} of the horizon's); loop CPU {loop:7.2f} s against {loop_predicted:7.2f} s predicted: "
          f"{loop / loop_predicted:.2f}x; wall {wall:7.2f} s against {predicted:7.2f} s predicted (full horizon "
          f"{full:.2f} s; the workers' own start, an interpreter's imports each, is not priced): "
          f"{wall / predicted:.2f}x")
    return wall / predicted, loop / loop_predicted


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", nargs="+", default=list(PAPER_ENVS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--calibration", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    table, source = unit_costs("cpu", args.calibration)
    print(f"unit costs: {source}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    ratios = [check(env, args.workers, table) for env in args.env]
    print(f"load average {os.getloadavg()[0]:.2f} at the end; measured / predicted, wall: "
          f"{', '.join(f'{w:.2f}' for w, _ in ratios)}; the loop's CPU: {', '.join(f'{c:.2f}' for _, c in ratios)} "
          "(goal 0.7-1.3)")
    return 0 if all(0.7 <= c <= 1.3 for _, c in ratios) else 1


if __name__ == "__main__":
    raise SystemExit(main())
