"""``target: auto`` against the best fixed target, per run of ``config.yaml``: LoAct's mean radius with
``q`` and with ``vote``, the target the pilot chose, auto/best with a bootstrap interval over episodes, and
the pilot's time beside LoAct's.

    nice -n 5 python benchmarks/target_auto.py RESULTS [--episodes 10] [--envs CartPole-v0 highway-fast-v0]
        [--algos StdTrain ...] [--out target_auto.csv]

RESULTS holds trained checkpoints as the workflow lays them out (RESULTS/ENV/ALGO/checkpoint/model.pt and
model.json); they are only read.  Every run (env, algo, σ) of config.yaml whose checkpoint exists is measured
with config.yaml's settings (qrange: m 1,000 over 3 episodes; LoAct: m 10,000, horizon 200 for CartPole and 30
for highway, α 0.05, hoeffding, alpha_mode state) and the workflow's seeds (stage seeds and initial states as
``crop qrange`` / ``crop loact`` derive them: the numbers are the workflow's).

Per run one row: ``q`` and ``vote`` (LoAct's mean radius, uncertified steps counted as 0), ``auto`` (the pilot's
choice), ``auto/best`` with a 95 % percentile-bootstrap interval (episodes resampled, the same episodes for
both targets: they share initial states), ``pilot_s``, ``loact_s`` (LoAct of the chosen target) and their
ratio.  Goals: auto/best ≥ 0.9 per run, pilot ≤ 10 % of LoAct.  Rows are appended to ``--out`` as they finish
(a run already there is skipped), then the table is printed as markdown.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

import crop.certify.qrange as qrange_module
from crop.certify.loact import LoActSettings, run_loact
from crop.certify.pilot import CANDIDATES, PilotSettings
from crop.certify.qrange import QRangeSettings, estimate_qrange
from crop.io import derive_seed
from crop.models import load_checkpoint, n_actions
from crop.smoothing.smoothed import TARGET_RANGE, SmoothedNetwork, SmoothingSettings
from crop.smoothing.stats import loact_state_alpha

ROOT = Path(__file__).resolve().parents[1]


def _seeds(seed, env, n, kind):
    return [derive_seed(seed, env, kind, i) % (2**31) for i in range(n)]


def _stage_seed(seed, env, algo, sigma, stage):
    return derive_seed(seed, env, algo, repr(float(sigma)), stage)


def _timed_pilot(record):
    """crop.certify.qrange's run_pilot, its wall time added to ``record``."""
    inner = qrange_module.run_pilot

    def run(*a, **kw):
        t0 = time.perf_counter()
        out = inner(*a, **kw)
        record["pilot_s"] = time.perf_counter() - t0
        return out

    return run


def measure(results: Path, env: str, algo: str, sigma: float, cfg: dict, episodes: int) -> dict:
    ec = cfg["environments"][env]
    seed, alpha, bound, mode = cfg["seed"], cfg["alpha"], cfg["bound"], cfg["alpha_mode"]
    qr, la = ec["qrange"], ec["loact"]
    net, meta = load_checkpoint(results / env / algo / "checkpoint" / "model.pt", env, algo)
    profile = meta.get("profile")
    alpha_state = loact_state_alpha(alpha, mode, la["horizon"])
    pilot = PilotSettings(sigma, qr["m"], CANDIDATES[meta.get("network", "q")], la["m"], alpha_state, bound,
                          chunk=cfg["chunk"])
    record = {}
    qrange_module.run_pilot = _timed_pilot(record)
    settings = QRangeSettings(sigma, qr["m"], qr["episodes"], qr["horizon"],
                              _seeds(seed, env, qr["episodes"], "qrange-episode"),
                              seed=_stage_seed(seed, env, algo, sigma, "qrange"), chunk=cfg["chunk"])
    res = estimate_qrange(env, net, settings, profile=profile, progress=False, pilot=pilot)
    choice = res["target_choice"]
    per_episode, seconds = {}, {}
    for target in pilot.targets:
        v_min, v_max = TARGET_RANGE.get(target, (res["v_min"], res["v_max"]))
        sm = SmoothedNetwork(net, SmoothingSettings(sigma, la["m"], v_min, v_max, alpha_state, bound=bound,
                                                    target=target, chunk=cfg["chunk"],
                                                    seed=_stage_seed(seed, env, algo, sigma, "loact")),
                             n_actions(meta["net_spec"]))
        t0 = time.perf_counter()
        steps, _ = run_loact(env, sm, LoActSettings(episodes, la["horizon"], _seeds(seed, env, episodes, "episode")),
                             profile=profile, progress=False)
        seconds[target] = time.perf_counter() - t0
        per_episode[target] = steps.groupby("episode")["radius"].agg(["sum", "count"])
    means = {t: float(g["sum"].sum() / g["count"].sum()) for t, g in per_episode.items()}
    best = max(means, key=means.get)
    auto = choice["chosen"]
    rng = np.random.default_rng(0)
    n = len(per_episode[best])
    ratios = []
    for _ in range(2000):
        idx = rng.integers(0, n, n)
        a, b = per_episode[auto].iloc[idx], per_episode[best].iloc[idx]
        ratios.append((a["sum"].sum() / a["count"].sum()) / max(b["sum"].sum() / b["count"].sum(), 1e-300))
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    row = {"env": env, "algo": algo, "sigma": sigma, "episodes": episodes,
           **{f"radius_{t}": means[t] for t in means},
           **{f"predicted_{t}": v["mean_predicted_radius"] for t, v in choice["predicted"].items()},
           "auto": auto, "best": best, "auto_over_best": means[auto] / means[best] if means[best] > 0 else 1.0,
           "ci_low": float(lo) if means[best] > 0 else 1.0, "ci_high": float(hi) if means[best] > 0 else 1.0,
           "pilot_s": record["pilot_s"], "loact_s": seconds[auto],
           "pilot_over_loact": record["pilot_s"] / seconds[auto]}
    return row


def table(df: pd.DataFrame) -> str:
    lines = ["| env | algo | σ | q | vote | auto chose | auto/best [95 % CI] | pilot s | LoAct s | pilot/LoAct |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
    for r in df.itertuples():
        lines.append(f"| {r.env} | {r.algo} | {r.sigma:g} | {r.radius_q:.4g} | {r.radius_vote:.4g} | {r.auto} | "
                     f"{r.auto_over_best:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] | {r.pilot_s:.2f} | {r.loact_s:.1f} | "
                     f"{r.pilot_over_loact:.1%} |")
    met = (df["auto_over_best"] >= 0.9).mean()
    lines.append(f"\nauto ≥ 0.9 × best in {met:.0%} of {len(df)} runs; auto = best in "
                 f"{(df['auto'] == df['best']).mean():.0%}; pilot/LoAct at most {df['pilot_over_loact'].max():.1%}")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="folder of trained checkpoints (RESULTS/ENV/ALGO/checkpoint)")
    p.add_argument("--config", type=Path, default=ROOT / "config.yaml")
    p.add_argument("--envs", nargs="+")
    p.add_argument("--algos", nargs="+", help="only these algorithms (default: the config's)")
    p.add_argument("--episodes", type=int, help="LoAct's episodes (default: the config's)")
    p.add_argument("--out", type=Path, default=Path("target_auto.csv"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = yaml.safe_load(a.config.read_text())
    done = pd.read_csv(a.out) if a.out.exists() else pd.DataFrame(columns=["env", "algo", "sigma"])
    missing = []
    for env, ec in cfg["environments"].items():
        if a.envs and env not in a.envs:
            continue
        for algo in ec["algorithms"]:
            if a.algos and algo not in a.algos:
                continue
            if not (a.results / env / algo / "checkpoint" / "model.pt").exists():
                missing.append(f"{env}/{algo}")
                continue
            for sigma in ec["sigmas"]:
                if ((done["env"] == env) & (done["algo"] == algo) & (done["sigma"] == sigma)).any():
                    continue
                row = measure(a.results, env, algo, float(sigma), cfg, a.episodes or ec["loact"]["episodes"])
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
                done = pd.concat([done, pd.DataFrame([row])], ignore_index=True)
                done.to_csv(a.out, index=False)
    if missing:
        print("no checkpoint (not measured): " + ", ".join(missing))
    print(table(done))


if __name__ == "__main__":
    main()
