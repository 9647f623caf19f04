"""Estimation of V_min, V_max (Appendix B.1, "Estimation of the Algorithm Parameters V_min, V_max").

Roll the smoothed policy for a few episodes and record the smallest and largest network output over all
noisy samples.  Soundness does not depend on the estimate (the certifiers clip to it), only on it being
fixed *before* the certification noise is drawn — this stage uses its own noise stream and its own
initial states.
"""
from __future__ import annotations

import numpy as np
import torch
from crop.progress import pbar

from crop.envs import make_env, to_obs
from crop.smoothing import NonFiniteQError, resolve_device

__all__ = ["estimate_qrange", "load_qrange"]


@torch.inference_mode()
def estimate_qrange(env_id: str, q_net: torch.nn.Module, sigma: float, m: int, episodes: int, horizon: int,
                    episode_seeds, seed: int, chunk: int = 1000, device="cpu", profile: str | None = None,
                    progress: bool | None = None) -> dict:
    dev = resolve_device(device)
    q_net = q_net.to(dev).eval()
    g = torch.Generator(device=dev)
    g.manual_seed(int(seed))
    v_min, v_max = np.inf, -np.inf
    states = 0
    returns = []
    bar = pbar(total=episodes * horizon, desc=f"qrange σ={sigma:g}", progress=progress)
    for ep in range(episodes):
        env = make_env(env_id, profile)
        obs, _ = env.reset(seed=int(episode_seeds[ep]))
        ret, t = 0.0, 0
        for t in range(horizon):
            x = torch.as_tensor(to_obs(obs), device=dev)
            total = None
            for start in range(0, m, chunk):
                c = min(chunk, m - start)
                noisy = torch.randn((c, *x.shape), generator=g, device=dev).mul_(sigma).add_(x)
                q = q_net(noisy)
                if not torch.isfinite(q).all():
                    raise NonFiniteQError(f"the Q-network returned NaN or inf at episode {ep} step {t}")
                v_min = min(v_min, float(q.min()))
                v_max = max(v_max, float(q.max()))
                s = q.sum(0, dtype=torch.float64)
                total = s if total is None else total + s
            states += 1
            obs, reward, terminated, truncated, _ = env.step(int(torch.argmax(total)))
            ret += float(reward)
            bar.update(1)
            if terminated or truncated:
                break
        bar.update(horizon - (t + 1))
        returns.append(ret)
        env.close()
    bar.close()
    if not v_max > v_min:
        raise ValueError(f"degenerate Q range [{v_min}, {v_max}]: the network output is constant")
    return {"v_min": v_min, "v_max": v_max, "states": states, "samples_per_state": m,
            "episodes": episodes, "returns": returns}


def load_qrange(path, env: str, algo: str, sigma: float) -> tuple[float, float]:
    """``(v_min, v_max)`` of a qrange.json, verified to be for ``env``/``algo``/``sigma`` and a proper range;
    raises :class:`crop.io.InputError` (bad input, before any work)."""
    import math

    from crop.io import InputError, read_json

    q = read_json(path)
    if q.get("env") != env or q.get("algo") != algo or not math.isclose(q.get("sigma", -1), sigma):
        raise InputError(f"{path}: Q range was estimated for {q.get('env')}/{q.get('algo')}/σ={q.get('sigma')}, "
                         f"not {env}/{algo}/σ={sigma}")
    v_min, v_max = q.get("v_min"), q.get("v_max")
    if not (isinstance(v_min, (int, float)) and isinstance(v_max, (int, float)) and v_max > v_min):
        raise InputError(f"{path}: invalid Q range [{v_min}, {v_max}]")
    return float(v_min), float(v_max)
