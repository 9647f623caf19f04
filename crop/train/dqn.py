"""One Double-DQN trainer (van Hasselt et al., 2016) — StdTrain in the paper's terms (Appendix E) — with
two hooks through which every other training method is a small variant (crop/train/recipes.py):

* ``recipe.perturb(ctx, batch)`` changes the *data* of a sampled batch (GaussAug, AdvTrain, GradDQN);
* ``recipe.loss(ctx, batch, q_all, y, td)`` changes the *loss* (SA-MDP regularisers, RadialRL's
  worst-case loss); the default is the mean Huber TD loss.

Read it top to bottom like a CleanRL script: ε-greedy collection (or NoisyNet's parameter noise), a replay
buffer (proportional prioritized replay — Schaul et al., 2016 — as the paper's StdTrain; uniform with
``prioritized=False``), the Double-DQN target (online network picks a′, target network scores it), Huber
loss, periodic hard target updates.  Time-limit truncation is not a terminal state (bootstrapping
continues through it).

Acceptance: training stops as soon as the greedy policy (argmax of the network in eval mode) reaches a
mean return ≥ ``target_return`` over ``eval_episodes`` episodes, but never before ``min_steps`` nor before
the recipe's robustness schedule is complete (a robust recipe is accepted at its full ε); it fails loudly
otherwise rather than hand a weak policy to the certifiers.  With ``target_return=None`` there is no
threshold: it trains ``total_steps`` steps and records the final greedy return.
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from crop.envs import env_spec, make_env, to_obs
from crop.io import derive_seed
from crop.models import build_q_network
from crop.models.noisy import resample_noise
from crop.progress import pbar

__all__ = ["DQNConfig", "TrainingFailed", "Batch", "TrainContext", "train_dqn", "greedy_returns"]


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
    lr_end: float | None = None  # linear decay of the learning rate to lr_end over lr_decay_steps (None: constant)
    lr_decay_steps: int = 0
    gamma: float = 0.99
    target_update: int = 500
    train_every: int = 2
    eps_start: float = 1.0
    eps_end: float = 0.02
    eps_decay_steps: int = 10000
    eval_every: int = 1000
    eval_episodes: int = 100
    quick_eval_episodes: int = 10
    target_return: float | None = 195.0
    max_grad_norm: float = 10.0
    prioritized: bool = True     # proportional prioritized replay (α, β annealed to 1 over total_steps)
    per_alpha: float = 0.6
    per_beta0: float = 0.4


@dataclass
class Batch:
    s: torch.Tensor
    a: torch.Tensor
    r: torch.Tensor
    s2: torch.Tensor
    d: torch.Tensor
    w: torch.Tensor              # importance weights (all 1 without prioritized replay)


@dataclass
class TrainContext:
    """What a recipe's hooks may use: the networks, the step, its hyper-parameters and seeded generators."""
    q: torch.nn.Module
    target: torch.nn.Module
    step: int
    hp: dict
    n_actions: int
    gen: torch.Generator         # torch noise (GaussAug, PGD random starts, NoisyNet)
    rng: np.random.Generator     # numpy choices (which frames AdvTrain perturbs)
    stats: dict = field(default_factory=dict)


class _Replay:
    """A ring buffer; uniform sampling, or proportional prioritized sampling with importance weights."""

    def __init__(self, size: int, obs_dim: int, cfg: DQNConfig):
        self.size, self.cfg, self.n = size, cfg, 0
        self.s = np.zeros((size, obs_dim), np.float32)
        self.s2 = np.zeros_like(self.s)
        self.a = np.zeros(size, np.int64)
        self.r = np.zeros(size, np.float32)
        self.d = np.zeros(size, np.float32)
        self.prio = np.zeros(size, np.float64) if cfg.prioritized else None
        self.max_prio = 1.0

    def add(self, s, a, r, s2, d) -> None:
        i = self.n % self.size
        self.s[i], self.a[i], self.r[i], self.s2[i], self.d[i] = s, a, r, s2, d
        if self.prio is not None:
            self.prio[i] = self.max_prio ** self.cfg.per_alpha
        self.n += 1

    def sample(self, rng: np.random.Generator, k: int, beta: float):
        n = min(self.n, self.size)
        if self.prio is None:
            idx = rng.integers(n, size=k)
            w = np.ones(k, np.float32)
        else:
            p = self.prio[:n]                     # stored as priority^α
            cdf = np.cumsum(p)
            idx = np.minimum(np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right"), n - 1)
            prob = p[idx] / cdf[-1]
            w = (n * prob) ** (-beta)
            w = (w / w.max()).astype(np.float32)
        t = torch.as_tensor
        return idx, Batch(t(self.s[idx]), t(self.a[idx]), t(self.r[idx]), t(self.s2[idx]), t(self.d[idx]), t(w))

    def update(self, idx, td_abs: np.ndarray) -> None:
        if self.prio is not None:
            prio = td_abs + 1e-6
            self.prio[idx] = prio ** self.cfg.per_alpha
            self.max_prio = max(self.max_prio, float(prio.max()))


@torch.no_grad()
def greedy_returns(net: torch.nn.Module, env_id: str, seeds, profile: str | None = None) -> np.ndarray:
    """Returns of the greedy policy argmax_a Q(s, a) (no smoothing; the network in eval mode, i.e. NoisyNet's
    mean network) from the given reset seeds."""
    was_training = net.training
    net.eval()
    out = []
    try:
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
    finally:
        net.train(was_training)
    return np.array(out)


def _summary(returns: np.ndarray, step: int) -> dict:
    return {"step": step, "mean": float(returns.mean()), "std": float(returns.std()),
            "min": float(returns.min()), "episodes": len(returns)}


def train_dqn(env_id: str, seed: int, cfg: DQNConfig, profile: str | None = None,
              progress: bool | None = None, recipe=None, hp: dict | None = None) -> tuple[torch.nn.Module, dict]:
    """Train with ``recipe`` (default: StdTrain) and its hyper-parameters ``hp``; see the module docstring."""
    from crop.train.recipes import RECIPES

    recipe = recipe or RECIPES["StdTrain"]
    hp = dict(hp or {})
    started, cpu_started = time.time(), time.process_time()
    spec = env_spec(env_id)
    net_spec = recipe.net_spec(int(np.prod(spec.obs_shape)), list(cfg.hidden), spec.n_actions, hp)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(derive_seed(seed, "recipe", recipe.name) % 2**63)
    q = build_q_network(net_spec).train()
    target = build_q_network(net_spec).train()
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr)
    noisy = recipe.exploration == "noisy"
    ctx = TrainContext(q, target, 0, hp, spec.n_actions, gen, np.random.default_rng(derive_seed(seed, "recipe-rng")))
    accept_after = max(cfg.min_steps, recipe.schedule_end(hp))

    buf = _Replay(cfg.buffer_size, net_spec["in"], cfg)
    env = make_env(env_id, profile)
    obs, _ = env.reset(seed=derive_seed(seed, "train-reset", 0))
    obs = to_obs(obs)
    episodes, ep_ret, recent = 0, 0.0, []
    evals, stats_log = [], []
    quick_seeds = [derive_seed(seed, "quick-eval", i) for i in range(cfg.quick_eval_episodes)]
    # Acceptance seeds are disjoint from training and quick-evaluation seeds.
    accept_seeds = [derive_seed(seed, "accept-eval", i) for i in range(cfg.eval_episodes)]
    accepted = None
    bar = pbar(range(cfg.total_steps), desc=f"train {env_id} {recipe.name}", progress=progress)
    for step in bar:
        ctx.step = step
        # --- act: ε-greedy, or (NoisyNet) greedy w.r.t. a fresh sample of the noisy network
        if noisy:
            resample_noise(q, gen)
            with torch.no_grad():
                a = int(q(torch.as_tensor(obs).unsqueeze(0)).argmax(1))
        else:
            eps = cfg.eps_end + (cfg.eps_start - cfg.eps_end) * max(0.0, 1 - step / cfg.eps_decay_steps)
            if rng.random() < eps:
                a = int(rng.integers(spec.n_actions))
            else:
                with torch.no_grad():
                    a = int(q(torch.as_tensor(obs).unsqueeze(0)).argmax(1))
        nxt, r, term, trunc, _ = env.step(a)
        nxt = to_obs(nxt)
        buf.add(obs, a, r, nxt, float(term))
        ep_ret += float(r)
        obs = nxt
        if term or trunc:
            episodes += 1
            recent = (recent + [ep_ret])[-20:]
            obs, _ = env.reset(seed=derive_seed(seed, "train-reset", episodes))
            obs = to_obs(obs)
            ep_ret = 0.0

        # --- learn
        if step >= cfg.learning_starts and step % cfg.train_every == 0:
            if cfg.lr_end is not None:
                frac = min(1.0, step / cfg.lr_decay_steps) if cfg.lr_decay_steps > 0 else 1.0
                for group in opt.param_groups:
                    group["lr"] = cfg.lr + (cfg.lr_end - cfg.lr) * frac
            beta = cfg.per_beta0 + (1.0 - cfg.per_beta0) * min(1.0, step / cfg.total_steps)
            idx, batch = buf.sample(rng, cfg.batch_size, beta)
            if noisy:
                resample_noise(q, gen)
                resample_noise(target, gen)
            batch = recipe.perturb(ctx, batch)                                 # data variant
            with torch.no_grad():
                a2 = q(batch.s2).argmax(1, keepdim=True)                       # Double DQN: online picks
                y = batch.r + cfg.gamma * (1 - batch.d) * target(batch.s2).gather(1, a2).squeeze(1)
            q_all = q(batch.s)
            pred = q_all.gather(1, batch.a.unsqueeze(1)).squeeze(1)
            td = F.smooth_l1_loss(pred, y, reduction="none")
            loss = recipe.loss(ctx, batch, q_all, y, td)                       # loss variant
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(q.parameters(), cfg.max_grad_norm)
            opt.step()
            buf.update(idx, (pred - y).detach().abs().numpy())
        if step % cfg.target_update == 0:
            target.load_state_dict(q.state_dict())

        # --- evaluate (greedy, eval mode)
        if cfg.target_return is not None and step >= cfg.learning_starts and step % cfg.eval_every == 0:
            quick = float(greedy_returns(q, env_id, quick_seeds, profile).mean())
            rec = {"step": step, "quick_mean": quick, **{k: round(float(v), 6) for k, v in ctx.stats.items()}}
            if quick >= cfg.target_return and step >= accept_after:
                full = greedy_returns(q, env_id, accept_seeds, profile)
                rec["accept_mean"] = float(full.mean())
                if full.mean() >= cfg.target_return:
                    accepted = _summary(full, step)
            evals.append(rec)
            bar.set_postfix(quick=quick, recent=np.mean(recent) if recent else 0.0)
            if accepted:
                break
    env.close()
    bar.close()
    if cfg.target_return is None:   # no threshold: record the final policy's greedy return
        accepted = _summary(greedy_returns(q, env_id, accept_seeds, profile), cfg.total_steps)
    if not accepted:
        last = evals[-1] if evals else None
        raise TrainingFailed(
            f"{env_id}/{recipe.name}: the greedy policy did not reach a mean return of {cfg.target_return} "
            f"over {cfg.eval_episodes} episodes within {cfg.total_steps} steps (last evaluation: {last})")
    info = {"net_spec": net_spec, "recipe": recipe.name, "hyperparameters": hp, "train_config": asdict(cfg),
            "seed": seed, "steps": accepted["step"], "episodes": episodes, "acceptance": accepted,
            "accept_after_step": accept_after, "evaluations": evals,
            "runtime_s": round(time.time() - started, 2),
            "cpu_s": round(time.process_time() - cpu_started, 2)}
    return q.eval(), info
