"""Bounded LoRe on Atari: best-first vs depth-first at the same node budget.

Runs ``crop lore`` (the stage itself) on each given checkpoint directory ``ROOT/ENV/ALGO/checkpoint/model.pt``
with ``--max-nodes``, ``--report-double`` and both orders, and prints per job: truncated?, the bound at the
smallest ε (0), J_min (the lowest return the search can count: min(0, r_min·H) with r_min as LoRe counts
rewards), the nodes explored of those known, the bound at twice the budget and the time.  The goal: a truncated
bound above J_min at the smallest ε in at least half of the jobs.

    nice -n 5 python benchmarks/lore_budget.py ROOT [--max-nodes 500] [--m 128] [--horizon 200] [--sigma 0.01]
                                                   [--target vote] [--budget-s 1500]
                                                   [--qrange-m 1000] [--qrange-horizon H]

With ``--target q`` each network's V range comes from a ``crop qrange`` run first (3 episodes).

Jobs run one after another until ``--budget-s`` seconds have passed (a job started runs to its end).

``--toy``: instead, a small synthetic tree where the order matters (a 1-D walk with signed rewards, r_min = −1,
H = 5, γ = 0.9, every action inseparable at ε = 0: a full ternary tree), one certificate per observation shared
by every run, the bound at ε = 0 of both orders at a range of budgets and the smallest budget reaching the exact
bound.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd

from crop.certify.lore import lore_bound_at
from crop.envs import env_spec
from crop.io import meta_name

ORDERS = ("best-first", "depth-first")


def run_job(checkpoint: Path, env: str, algo: str, order: str, a: argparse.Namespace, out: Path) -> dict:
    """One ``crop lore`` job; its meta and wall time."""
    csv = out / f"{env}-{algo}-{order}.csv"
    cmd = [sys.executable, "-m", "crop", "lore", "--env", env, "--algo", algo, "--sigma", str(a.sigma),
           "--checkpoint", str(checkpoint), "--target", a.target, "--m", str(a.m), "--horizon", str(a.horizon),
           "--max-nodes", str(a.max_nodes), "--order", order, "--report-double", "--out", str(csv),
           "--no-progress"]
    if a.target == "q":   # Q-values are clipped to the V range: the qrange stage's, once per network
        qrange = out / f"{env}-{algo}-qrange.json"
        if not qrange.exists():
            _run([sys.executable, "-m", "crop", "qrange", "--env", env, "--algo", algo, "--sigma", str(a.sigma),
                  "--checkpoint", str(checkpoint), "--m", str(a.qrange_m), "--episodes", "3", "--horizon",
                  str(a.qrange_horizon or a.horizon), "--out", str(qrange), "--no-progress"])
        cmd += ["--qrange", str(qrange)]
    started = time.time()
    done = _run(cmd)
    meta = json.loads(Path(meta_name(str(csv))).read_text())
    return {"meta": meta, "seconds": time.time() - started, "line": done.stdout.strip().splitlines()[-1]}


def _run(cmd: list) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return done


class _Walk(gym.Env):
    """A 1-D walk: actions left/stay/right by 0.35, reward 1 − |pos| (negative past ±1, which ends it)."""

    observation_space = gym.spaces.Box(-5, 5, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        self.pos, self.t = 0.1, 0
        return np.array([self.pos, 0.0], np.float32), {}

    def step(self, a):
        self.pos, self.t = round(self.pos + (int(a) - 1) * 0.35, 6), self.t + 1
        return np.array([self.pos, self.t / 10], np.float32), 1.0 - abs(self.pos), abs(self.pos) > 1, False, {}


def toy() -> None:
    """The synthetic comparison (``--toy``)."""
    import torch

    from crop.certify.lore import LoReSettings, Problem, Search, run_lore
    from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings

    class Fixed(SmoothedNetwork):   # one estimate per observation, shared by every run
        cache: dict = {}

        def estimate_batch(self, obs_batch, indices=None, alpha=None):
            out = []
            for o in obs_batch:
                if o.tobytes() not in self.cache:
                    self.cache[o.tobytes()] = super().estimate_batch(o[None], alpha=None)[0]
                out.append(self.cache[o.tobytes()])
            return out

    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    with torch.no_grad():
        for prm in net.parameters():
            prm.mul_(0.3)
    sm = Fixed(net, SmoothingSettings(0.3, 200, -6.0, 6.0, 0.05, seed=0), 3)

    def bound(order, budget):
        search = Search(prune=False, max_nodes=budget, reward_min=None if budget is None else -1.0, order=order)
        r = run_lore("walk", sm, LoReSettings(Problem(5, 0, 0.9), search), make=_Walk, progress=False)
        return float(r.table["lower_bound"].iloc[0]), r.info

    exact, info = bound("depth-first", None)
    j_min = -sum(0.9 ** k for k in range(5))
    print(f"toy walk: {info['nodes']} nodes, exact bound at ε=0 {exact:.4g}, J_min {j_min:.4g}")
    first = {}
    for budget in (10, 30, 60, 100, 150, 200, 250, 300, 350):
        row = {o: bound(o, budget)[0] for o in ORDERS}
        print(f"  budget {budget:4d}: " + ", ".join(f"{o} {b:8.4g}" for o, b in row.items()))
    for o in ORDERS:
        first[o] = next((b for b in range(1, info["nodes"] + 1) if bound(o, b)[0] >= exact), None)
    print("smallest budget reaching the exact bound: " + ", ".join(f"{o} {b}" for o, b in first.items()) +
          f" (ratio {first['depth-first'] / first['best-first']:.2f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, nargs="?")
    p.add_argument("--toy", action="store_true")
    p.add_argument("--max-nodes", type=int, default=500)
    p.add_argument("--m", type=int, default=128)
    p.add_argument("--horizon", type=int, default=200)
    p.add_argument("--sigma", type=float, default=0.01)
    p.add_argument("--target", default="vote")
    p.add_argument("--qrange-m", type=int, default=1000, help="the V range's samples per state (target q)")
    p.add_argument("--qrange-horizon", type=int, help="the V range's episode length (target q; default: --horizon)")
    p.add_argument("--budget-s", type=float, default=1500.0)
    a = p.parse_args()
    if a.toy or a.root is None:
        return toy()
    jobs = sorted(a.root.glob("*/*/checkpoint/model.pt"))
    started, rows = time.time(), []
    print(f"max_nodes {a.max_nodes} (and twice it), m {a.m}, H {a.horizon}, σ {a.sigma}, target {a.target}")
    print(f"{'job':36s} {'order':11s} trunc  bound@0  J_min  ε_k       bound@ε_k  explored@ε_k  bound@ε_k,2N  time")
    with tempfile.TemporaryDirectory() as tmp:
        for i, ckpt in enumerate(jobs):
            if time.time() - started > a.budget_s:
                print(f"time budget spent: {len(jobs) - i} jobs not run")
                break
            env, algo = ckpt.parts[-4], ckpt.parts[-3]
            for order in ORDERS:
                r = run_job(ckpt, env, algo, order, a, Path(tmp))
                s = r["meta"]["search"]
                table = pd.read_csv(Path(tmp) / f"{env}-{algo}-{order}.csv")
                bound0 = float(table["lower_bound"].iloc[0])
                eps_k = s["exact_below_eps"]
                at_k = lore_bound_at(table, eps_k) if eps_k is not None else math.nan
                j_min = _j_min(env, a.horizon)
                d = s["double_budget"]
                rows.append((env, order, s["truncated"], bound0, j_min))
                double = pd.DataFrame(d["pairs"], columns=["eps", "lower_bound"])
                at_k2 = lore_bound_at(double, eps_k) if eps_k is not None else math.nan
                job = f"{env.removesuffix('NoFrameskip-v4')}/{algo}"
                print(f"{job:36s} {order:11s} {str(s['truncated']):5s} {bound0:8.3g} {j_min:6.3g} "
                      f"{eps_k if eps_k is not None else math.nan:<9.3g} {at_k:8.3g}  "
                      f"{s['explored_nodes']:6d}/{s['known_nodes']:<7d} {at_k2:8.3g}  {r['seconds']:5.0f}s", flush=True)
    for order in ORDERS:
        mine = [r for r in rows if r[1] == order]
        truncated = [r for r in mine if r[2]]
        above = [r for r in truncated if r[3] > r[4]]
        print(f"{order}: {len(truncated)} of {len(mine)} jobs truncated; {len(above)} of them with a bound above "
              f"J_min at ε = 0 (goal: at least half)")


def _j_min(env: str, horizon: int) -> float:
    """The lowest return LoRe can count over ``horizon`` steps (γ = 1): min(0, r_min·H), r_min as it counts
    rewards (Pong and Freeway: max(r, 0), so 0)."""
    spec = env_spec(env)
    fn = spec.lore_reward_fn()
    low = spec.reward_range[0] if fn is None else fn(spec.reward_range[0])
    return min(0.0, low * horizon)


if __name__ == "__main__":
    main()
