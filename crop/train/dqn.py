"""One Double-DQN trainer (van Hasselt et al., 2016) — StdTrain in the paper's terms (Appendix E).

Read it top to bottom like a CleanRL script: ε-greedy collection, a uniform replay buffer, the Double-DQN
target (online network picks a′, target network scores it), Huber loss, periodic hard target updates.
Time-limit truncation is not a terminal state (bootstrapping continues through it).  Training stops as
soon as the greedy policy passes the acceptance test (mean return over ``eval_episodes`` episodes ≥
``target_return``); otherwise it fails loudly rather than hand a weak policy to the certifiers.
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from crop.progress import pbar

from crop.envs import env_spec, make_env, to_obs
from crop.io import derive_seed
from crop.models import build_q_network

__all__ = ["DQNConfig", "TrainingFailed", "train_dqn", "greedy_returns"]


class TrainingFailed(RuntimeError):
    pass


@dataclass
class DQNConfig:
    hidden: list = field(default_factory=lambda: [128, 128])
    total_steps: int = 100000
    min_steps: int = 0           # no acceptance before this many steps (a trained, not a lucky, Q)
    learning_starts: int = 1000
    buffer_size: int = 50000
    batch_size: int = 64
    lr: float = 1e-3
    gamma: float = 0.99
    target_update: int = 500
    train_every: int = 2
    eps_start: float = 1.0
    eps_end: float = 0.02
    eps_decay_steps: int = 10000
    eval_every: int = 1000
    eval_episodes: int = 100
    quick_eval_episodes: int = 10
    target_return: float = 195.0
    max_grad_norm: float = 10.0


@torch.no_grad()
def greedy_returns(net: torch.nn.Module, env_id: str, seeds, profile: str | None = None) -> np.ndarray:
    """Returns of the greedy policy argmax_a Q(s, a) (no smoothing) from the given reset seeds."""
    out = []
    for s in seeds:
        env = make_env(env_id, profile)
        obs, _ = env.reset(seed=int(s))
        total, done = 0.0, False
        while not done:
            a = int(net(torch.as_tensor(to_obs(obs)).unsqueeze(0)).argmax(1))
            obs, r, term, trunc, _ = env.step(a)
            total += float(r)
            done = term or trunc
        env.close()
        out.append(total)
    return np.array(out)


def train_dqn(env_id: str, seed: int, cfg: DQNConfig, profile: str | None = None,
              progress: bool | None = None) -> tuple[torch.nn.Module, dict]:
    started = time.time()
    spec = env_spec(env_id)
    net_spec = {"arch": "mlp", "in": int(np.prod(spec.obs_shape)), "hidden": list(cfg.hidden), "out": spec.n_actions}
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    q = build_q_network(net_spec)
    target = build_q_network(net_spec)
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr)

    obs_dim = net_spec["in"]
    buf_s = np.zeros((cfg.buffer_size, obs_dim), np.float32)
    buf_s2 = np.zeros_like(buf_s)
    buf_a = np.zeros(cfg.buffer_size, np.int64)
    buf_r = np.zeros(cfg.buffer_size, np.float32)
    buf_d = np.zeros(cfg.buffer_size, np.float32)
    n_stored = 0

    env = make_env(env_id, profile)
    obs, _ = env.reset(seed=derive_seed(seed, "train-reset", 0))
    obs = to_obs(obs)
    episodes, ep_ret, recent = 0, 0.0, []
    evals = []
    quick_seeds = [derive_seed(seed, "quick-eval", i) for i in range(cfg.quick_eval_episodes)]
    # Acceptance seeds are disjoint from training and quick-evaluation seeds.
    accept_seeds = [derive_seed(seed, "accept-eval", i) for i in range(cfg.eval_episodes)]
    accepted = None
    bar = pbar(range(cfg.total_steps), desc=f"train {env_id}", progress=progress)
    for step in bar:
        eps = cfg.eps_end + (cfg.eps_start - cfg.eps_end) * max(0.0, 1 - step / cfg.eps_decay_steps)
        if rng.random() < eps:
            a = int(rng.integers(spec.n_actions))
        else:
            with torch.no_grad():
                a = int(q(torch.as_tensor(obs).unsqueeze(0)).argmax(1))
        nxt, r, term, trunc, _ = env.step(a)
        nxt = to_obs(nxt)
        i = n_stored % cfg.buffer_size
        buf_s[i], buf_a[i], buf_r[i], buf_s2[i], buf_d[i] = obs, a, r, nxt, float(term)
        n_stored += 1
        ep_ret += float(r)
        obs = nxt
        if term or trunc:
            episodes += 1
            recent = (recent + [ep_ret])[-20:]
            obs, _ = env.reset(seed=derive_seed(seed, "train-reset", episodes))
            obs = to_obs(obs)
            ep_ret = 0.0

        if step >= cfg.learning_starts and step % cfg.train_every == 0:
            idx = rng.integers(min(n_stored, cfg.buffer_size), size=cfg.batch_size)
            s, a_b = torch.as_tensor(buf_s[idx]), torch.as_tensor(buf_a[idx])
            r_b, s2, d = torch.as_tensor(buf_r[idx]), torch.as_tensor(buf_s2[idx]), torch.as_tensor(buf_d[idx])
            with torch.no_grad():
                a2 = q(s2).argmax(1, keepdim=True)                     # Double DQN: online picks
                y = r_b + cfg.gamma * (1 - d) * target(s2).gather(1, a2).squeeze(1)  # target scores
            pred = q(s).gather(1, a_b.unsqueeze(1)).squeeze(1)
            loss = F.smooth_l1_loss(pred, y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(q.parameters(), cfg.max_grad_norm)
            opt.step()
        if step % cfg.target_update == 0:
            target.load_state_dict(q.state_dict())

        if step >= cfg.learning_starts and step % cfg.eval_every == 0:
            quick = float(greedy_returns(q, env_id, quick_seeds, profile).mean())
            rec = {"step": step, "quick_mean": quick}
            if quick >= cfg.target_return and step >= cfg.min_steps:
                full = greedy_returns(q, env_id, accept_seeds, profile)
                rec["accept_mean"] = float(full.mean())
                if full.mean() >= cfg.target_return:
                    accepted = {"step": step, "mean": float(full.mean()), "std": float(full.std()),
                                "min": float(full.min()), "episodes": len(full)}
            evals.append(rec)
            bar.set_postfix(quick=quick, recent=np.mean(recent) if recent else 0.0)
            if accepted:
                break
    env.close()
    bar.close()
    if not accepted:
        last = evals[-1] if evals else None
        raise TrainingFailed(
            f"{env_id}: the greedy policy did not reach a mean return of {cfg.target_return} over "
            f"{cfg.eval_episodes} episodes within {cfg.total_steps} steps (last evaluation: {last})")
    info = {"net_spec": net_spec, "train_config": asdict(cfg), "seed": seed, "steps": accepted["step"],
            "episodes": episodes, "acceptance": accepted, "evaluations": evals,
            "runtime_s": round(time.time() - started, 2)}
    return q.eval(), info
