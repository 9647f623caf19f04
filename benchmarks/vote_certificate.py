"""crop's LoAct mean radius against an independent Cohen-style vote certificate on the same agent.

    nice -n 10 python benchmarks/vote_certificate.py AGENT --env Acrobot-v1 --certify DIR [--sigma 0.05 0.1]
        [--alpha 0.05] [--m 1000] [--n0 100] [--episodes 2] [--horizon 500] [--seed 0]

AGENT is any file ``crop certify`` reads (an SB3 or CleanRL .zip, a state dict); DIR is the ``--out`` folder
of a finished ``crop certify AGENT --env ENV`` run, whose LoAct results (``loact.csv`` of each σ, whatever
target ``auto`` chose) are only read.  The vote certificate is Cohen, Rosenblum & Kolter (ICML 2019)'s
CERTIFY, written here without crop's smoothing code: per state, the top action of ``n0`` noisy forwards
argmax f(s + δ), δ ~ N(0, σ²I); then ``m`` fresh forwards, k of them voting for it; the one-sided
Clopper–Pearson lower bound p̲ = Beta⁻¹(α; k, m − k + 1); radius σ·Φ⁻¹(p̲) where p̲ > 1/2, else abstain
(radius 0).  The smoothed policy plays the top action over ``episodes`` episodes of at most ``horizon`` steps
(reset seeds ``seed``, ``seed + 1``, …), and the mean radius counts every step (abstentions as 0), as crop's.

Prints per σ: crop's target, certified fraction and mean radius, the vote certificate's, and the ratio
crop ÷ vote (at least 0.8 expected on the Acrobot A2C at σ 0.1, same α).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import torch
from scipy.special import betaincinv, ndtri


def _votes(net, x: torch.Tensor, sigma: float, n: int, n_actions: int, gen: torch.Generator) -> np.ndarray:
    """How many of ``n`` noisy forwards f(x + δ) take each action."""
    noisy = x + sigma * torch.randn((n, *x.shape), generator=gen)
    return torch.bincount(net(noisy).argmax(-1), minlength=n_actions).numpy()


@torch.inference_mode()
def vote_certificate(net, env_id: str, sigma: float, alpha: float, m: int, n0: int, episodes: int,
                     horizon: int, seed: int) -> tuple[float, float]:
    """(certified fraction, mean radius) of Cohen's CERTIFY along the smoothed vote policy's own episodes."""
    gen = torch.Generator().manual_seed(seed)
    radii = []
    for ep in range(episodes):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed + ep)
        for _ in range(horizon):
            x = torch.as_tensor(np.asarray(obs, np.float32))
            top = int(_votes(net, x, sigma, n0, env.action_space.n, gen).argmax())   # selection draws
            k = int(_votes(net, x, sigma, m, env.action_space.n, gen)[top])           # estimation draws
            p_lower = betaincinv(k, m - k + 1, alpha) if k > 0 else 0.0
            radii.append(sigma * float(ndtri(p_lower)) if p_lower > 0.5 else 0.0)
            obs, _, terminated, truncated, _ = env.step(top)
            if terminated or truncated:
                break
        env.close()
    r = np.array(radii)
    return float(np.mean(r > 0)), float(r.mean())


def crop_loact(certify_dir: Path, env_id: str, sigma: float) -> tuple[str, float, float]:
    """(target, certified fraction, mean radius) of crop certify's LoAct at ``sigma`` in ``certify_dir``."""
    runs = sorted((certify_dir / "results" / env_id).glob(f"*@*/sigma-{sigma:g}/loact.csv"))
    if not runs:
        raise SystemExit(f"{certify_dir}: no results/{env_id}/*@*/sigma-{sigma:g}/loact.csv (run crop certify first)")
    steps = pd.read_csv(runs[0])
    target = runs[0].parent.parent.name.split("@")[1]
    if target == "auto":
        target = json.loads((runs[0].parent / "qrange.json").read_text())["target_choice"]["chosen"]
    return target, float(steps["certified"].mean()), float(steps["radius"].mean())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("agent", type=Path)
    p.add_argument("--env", required=True)
    p.add_argument("--certify", type=Path, required=True, help="crop certify's --out folder for this agent")
    p.add_argument("--sigma", type=float, nargs="+", default=[0.05, 0.1])
    p.add_argument("--alpha", type=float, default=0.05, help="the certificate's α (crop certify's: 0.05)")
    p.add_argument("--m", type=int, default=1000)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--horizon", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from crop.agents.importing import import_policy

    torch.set_num_threads(1)
    net, _ = import_policy(a.agent, "mlp")
    print(f"{a.agent.name} on {a.env}: α {a.alpha}, vote certificate m {a.m} (n0 {a.n0}), "
          f"{a.episodes} episodes of at most {a.horizon} steps")
    print("   sigma  crop target  crop certified  crop radius  vote certified  vote radius  crop/vote  vote s")
    for sigma in a.sigma:
        target, c_frac, c_rad = crop_loact(a.certify, a.env, sigma)
        t0 = time.perf_counter()
        v_frac, v_rad = vote_certificate(net, a.env, sigma, a.alpha, a.m, a.n0, a.episodes, a.horizon, a.seed)
        ratio = c_rad / v_rad if v_rad > 0 else float("nan")
        print(f"{sigma:8g}  {target:>11}  {c_frac:14.1%}  {c_rad:11.4f}  {v_frac:14.1%}  {v_rad:11.4f}  "
              f"{ratio:9.3f}  {time.perf_counter() - t0:6.1f}")


if __name__ == "__main__":
    main()
