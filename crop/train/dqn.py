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

Images (Atari, 4×84×84 under the ``cleanrl`` profile): the Q-network is the Nature CNN (Mnih et al., 2015)
instead of an MLP, replay stores pixels as uint8 (exact: the profile's observations are k/255), every
observation a recipe perturbs is clamped to the pixel domain [0, 1], and ``device`` (cpu | cuda | auto)
puts the networks and the update on a GPU (the replay buffer and the environment stay on the CPU).

Resumable: with ``resume`` the whole state is saved at the end of a step, periodically and on SIGTERM, and
a rerun continues from it to the same network, bit for bit on the CPU (crop/train/resume.py).
"""
from __future__ import annotations

import contextlib
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from crop.envs import env_spec, make_env, to_obs
from crop.io import derive_seed
from crop.models import build_network, non_finite
from crop.models.noisy import resample_noise
from crop.progress import pbar
from crop.smoothing.engine import resolve_device
from crop.train.defaults import DQNConfig
from crop.train.resume import Checkpointer, Progress, ResumeOptions, State, load, training_key

__all__ = ["DQNConfig", "TrainingFailed", "Batch", "TrainContext", "train_dqn", "greedy_returns"]


class TrainingFailed(RuntimeError):
    pass


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
    domain: tuple | None = None  # the valid observation box, (0, 1) for pixels: perturbed states stay inside

    def clamp(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` projected onto the observation domain (unchanged for vector observations)."""
        return x if self.domain is None else x.clamp(*self.domain)


PIXEL = np.float32(1.0 / 255.0)


def _to_pixels(x: np.ndarray) -> np.ndarray | None:
    """The uint8 k with k/255 == x exactly (as crop/envs/atari.py's ToFloat makes frames), or None."""
    k = np.rint(x * 255).clip(0, 255).astype(np.uint8)
    return k if np.array_equal(k.astype(np.float32) * PIXEL, x) else None


def is_pixel_obs(obs: np.ndarray) -> bool:
    """An image whose values are exactly k/255 (k = 0…255), as crop/envs/atari.py's ToFloat makes them."""
    obs = np.asarray(obs)
    return obs.ndim == 3 and obs.dtype == np.float32 and _to_pixels(obs) is not None


class _Replay:
    """A ring buffer; uniform sampling, or proportional prioritized sampling with importance weights.

    ``pixels``: observations are stored as uint8 (k for k/255 — exact, checked on every add) and decoded
    with the same float32 product as the environment's ToFloat, so a sampled state is bit-identical to the
    observed one.  A 4×84×84 transition then takes 2 × 28,224 B = 56 kB (s and s′; 5.6 GB for 100k
    transitions) instead of 226 kB as float32."""

    def __init__(self, size: int, obs_shape, cfg: DQNConfig, pixels: bool = False):
        self.size, self.cfg, self.n, self.pixels = size, cfg, 0, pixels
        shape = (obs_shape,) if isinstance(obs_shape, (int, np.integer)) else tuple(obs_shape)
        self.s = np.zeros((size, *shape), np.uint8 if pixels else np.float32)
        self.s2 = np.zeros_like(self.s)
        self.a = np.zeros(size, np.int64)
        self.r = np.zeros(size, np.float32)
        self.d = np.zeros(size, np.float32)
        self.prio = np.zeros(size, np.float64) if cfg.prioritized else None
        self.max_prio = 1.0

    def _encode(self, x) -> np.ndarray:
        k = _to_pixels(np.asarray(x, np.float32))
        if k is None:
            raise ValueError("pixel replay: the observation is not exactly k/255 (use float replay)")
        return k

    def decode(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32) * PIXEL if self.pixels else x

    def add(self, s, a, r, s2, d) -> None:
        i = self.n % self.size
        if self.pixels:
            s, s2 = self._encode(s), self._encode(s2)
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
        return idx, Batch(t(self.decode(self.s[idx])), t(self.a[idx]), t(self.r[idx]),
                          t(self.decode(self.s2[idx])), t(self.d[idx]), t(w))

    def update(self, idx, td_abs: np.ndarray) -> None:
        if self.prio is not None:
            prio = td_abs + 1e-6
            self.prio[idx] = prio ** self.cfg.per_alpha
            self.max_prio = max(self.max_prio, float(prio.max()))


def _device_of(net: torch.nn.Module) -> torch.device:
    p = next(iter(net.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


@torch.no_grad()
def greedy_returns(net: torch.nn.Module, env_id: str, seeds, profile: str | None = None,
                   max_steps: int | None = None) -> np.ndarray:
    """Returns of the greedy policy argmax_a Q(s, a) (no smoothing; the network in eval mode, i.e. NoisyNet's
    mean network) from the given reset seeds; an episode is cut after ``max_steps`` steps if given."""
    was_training = net.training
    net.eval()
    dev = _device_of(net)
    out = []
    try:
        for s in seeds:
            env = make_env(env_id, profile)
            obs, _ = env.reset(seed=int(s))
            total, done, t = 0.0, False, 0
            while not done:
                y = net(torch.as_tensor(to_obs(obs), device=dev).unsqueeze(0))
                # a continuous-action actor's output is its action (in the env's bounds), a Q-network's the values
                a = y[0].cpu().numpy() if getattr(net, "continuous", False) else int(y.argmax(1))
                obs, r, term, trunc, _ = env.step(a)
                total += float(r)
                t += 1
                done = term or trunc or (max_steps is not None and t >= max_steps)
            env.close()
            out.append(total)
    finally:
        net.train(was_training)
    return np.array(out)


def _summary(returns: np.ndarray, step: int) -> dict:
    return {"step": step, "mean": float(returns.mean()), "std": float(returns.std()),
            "min": float(returns.min()), "episodes": len(returns)}


def _resumed(resume: ResumeOptions, key: dict, st: State, cfg: DQNConfig, new_env, reset_seed, env):
    """(environment, progress) to continue from: the saved state where ``resume.path`` holds one of this run
    (``st`` restored in place; the environment a fresh one, reset with the current episode's seed and replayed
    through its actions), else ``env`` and a fresh start."""
    made = []

    def replay(episode: int, actions: list) -> tuple[np.ndarray, float, bool]:
        e = new_env()
        made.append(e)
        o, _ = e.reset(seed=reset_seed(episode))
        ret, early = 0.0, False
        for a in actions:
            if early:
                break
            o, r, term, trunc, _ = e.step(a)
            ret += float(r)
            early = term or trunc
        return to_obs(o), ret, early

    p = load(resume.path, key, st, cfg,
             lambda: _Replay(cfg.buffer_size, st.buf.s.shape[1:], cfg, pixels=st.buf.pixels), replay)
    if p is None:
        for e in made:
            e.close()
        return env, st.progress
    env.close()
    p.resumed_at.append(p.next_step)
    print(f"train: resumed from {resume.path} at step {p.next_step}", file=sys.stderr)
    return made[-1], p


def train_dqn(env_id: str, seed: int, cfg: DQNConfig, profile: str | None = None, progress: bool | None = None,
              recipe=None, hp: dict | None = None, resume: ResumeOptions | None = None) -> tuple[torch.nn.Module, dict]:
    """Train with ``recipe`` (default: StdTrain) and its hyper-parameters ``hp``; see the module docstring.
    ``resume``: where the training state is saved periodically and on SIGTERM, and resumed from when it
    belongs to this run (crop/train/resume.py)."""
    from crop.train.recipes import RECIPES

    recipe = recipe or RECIPES["StdTrain"]
    hp = dict(hp or {})
    started, cpu_started = time.time(), time.process_time()
    dev = resolve_device(cfg.device)
    env_spec(env_id)
    env = make_env(env_id, profile)
    # The profile's own observation shape and action set (a profile may restrict the actions).
    obs_shape, n_actions = tuple(env.observation_space.shape), int(env.action_space.n)
    net_spec = recipe.net_spec_for(obs_shape, list(cfg.hidden), n_actions, hp)
    eps_decay = (max(1, int(round(cfg.eps_decay_fraction * cfg.total_steps)))
                 if cfg.eps_decay_fraction is not None else cfg.eps_decay_steps)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=dev).manual_seed(derive_seed(seed, "recipe", recipe.name) % 2**63)
    q = build_network(net_spec).to(dev).train()     # initialised on the CPU: the same weights on any device
    target = build_network(net_spec).to(dev).train()
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr)
    noisy = recipe.exploration == "noisy"
    ctx = TrainContext(q, target, 0, hp, n_actions, gen, np.random.default_rng(derive_seed(seed, "recipe-rng")))
    accept_after = max(cfg.min_steps, recipe.schedule_end(hp))

    obs, _ = env.reset(seed=derive_seed(seed, "train-reset", 0))
    obs = to_obs(obs)
    pixels = is_pixel_obs(obs)
    if pixels:
        ctx.domain = (0.0, 1.0)   # pixels / 255: a perturbed frame must stay a valid frame
    buf = _Replay(cfg.buffer_size, obs_shape, cfg, pixels=pixels)
    run = Progress()
    saver = st = None
    if resume is not None:
        key = training_key({"env": env_id, "profile": profile, "seed": seed, "recipe": recipe.name,
                            "hyperparameters": hp, "train_config": asdict(cfg), "net_spec": net_spec,
                            "device": str(dev)})
        st = State(ctx, opt, buf, rng, run, obs, (started, cpu_started))
        env, run = _resumed(resume, key, st, cfg, lambda: make_env(env_id, profile),
                            lambda episode: derive_seed(seed, "train-reset", episode), env)
        buf, obs, saver = st.buf, st.obs, Checkpointer(resume, key)

    def greedy_action(x: np.ndarray) -> int:
        with torch.no_grad():
            return int(q(torch.as_tensor(x, device=dev).unsqueeze(0)).argmax(1))
    quick_seeds = [derive_seed(seed, "quick-eval", i) for i in range(cfg.quick_eval_episodes)]
    # Acceptance seeds are disjoint from training and quick-evaluation seeds.
    accept_seeds = [derive_seed(seed, "accept-eval", i) for i in range(cfg.eval_episodes)]
    accepted, update_cpu_s = None, 0.0
    bar = pbar(range(run.next_step, cfg.total_steps), desc=f"train {env_id} {recipe.name}", progress=progress)
    with saver.on_sigterm() if saver else contextlib.nullcontext():
        for step in bar:
            ctx.step = step
            # --- act: ε-greedy, or (NoisyNet) greedy w.r.t. a fresh sample of the noisy network
            if noisy:
                resample_noise(q, gen)
                a = greedy_action(obs)
            else:
                eps = cfg.eps_end + (cfg.eps_start - cfg.eps_end) * max(0.0, 1 - step / eps_decay)
                if rng.random() < eps:
                    a = int(rng.integers(n_actions))
                else:
                    a = greedy_action(obs)
            nxt, r, term, trunc, _ = env.step(a)
            nxt = to_obs(nxt)
            buf.add(obs, a, r, nxt, float(term))
            run.ep_ret += float(r)
            run.actions.append(a)
            obs = nxt
            if term or trunc:
                run.episodes += 1
                run.recent = (run.recent + [run.ep_ret])[-20:]
                obs, _ = env.reset(seed=derive_seed(seed, "train-reset", run.episodes))
                obs = to_obs(obs)
                run.ep_ret, run.actions = 0.0, []

            # --- learn
            if step >= cfg.learning_starts and step % cfg.train_every == 0:
                update_started = time.process_time()   # an update's own CPU time: crop calibrate's unit
                if cfg.lr_end is not None:
                    for group in opt.param_groups:
                        group["lr"] = cfg.lr_at(step)
                beta = cfg.per_beta0 + (1.0 - cfg.per_beta0) * min(1.0, step / cfg.total_steps)
                idx, batch = buf.sample(rng, cfg.batch_size, beta)
                if dev.type != "cpu":
                    batch = Batch(**{k: v.to(dev, non_blocking=True) for k, v in vars(batch).items()})
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
                buf.update(idx, (pred - y).detach().abs().cpu().numpy())
                update_cpu_s += time.process_time() - update_started
            if step % cfg.target_update == 0:
                target.load_state_dict(q.state_dict())

            # --- evaluate (greedy, eval mode)
            if cfg.target_return is not None and step >= cfg.learning_starts and step % cfg.eval_every == 0:
                quick = float(greedy_returns(q, env_id, quick_seeds, profile, cfg.eval_max_steps).mean())
                rec = {"step": step, "quick_mean": quick, **{k: round(float(v), 6) for k, v in ctx.stats.items()}}
                if quick >= cfg.target_return and step >= accept_after:
                    full = greedy_returns(q, env_id, accept_seeds, profile, cfg.eval_max_steps)
                    rec["accept_mean"] = float(full.mean())
                    if full.mean() >= cfg.target_return:
                        accepted = _summary(full, step)
                run.evals.append(rec)
                bar.set_postfix(quick=quick, recent=np.mean(run.recent) if run.recent else 0.0)
                if accepted:
                    break
            if saver:                            # the state after this step: saved when due, or on SIGTERM
                run.next_step, st.obs = step + 1, obs
                saver.after_step(step, st)
        env.close()
        bar.close()
        if cfg.target_return is None:   # no threshold: record the final policy's greedy return
            if saver:   # a kill during this evaluation resumes at it; a SIGTERM during it is noted and ignored
                run.next_step, st.obs = cfg.total_steps, obs
                saver.save_now(st)
            accepted = _summary(greedy_returns(q, env_id, accept_seeds, profile, cfg.eval_max_steps),
                                cfg.total_steps)
    bad = non_finite(q)
    if bad:   # no model.pt holds one (crop.models.save_network refuses it too)
        raise TrainingFailed(f"{env_id}/{recipe.name}: the trained network's {bad}")
    if not accepted:
        last = run.evals[-1] if run.evals else None
        raise TrainingFailed(
            f"{env_id}/{recipe.name}: the greedy policy did not reach a mean return of {cfg.target_return} "
            f"over {cfg.eval_episodes} episodes within {cfg.total_steps} steps (last evaluation: {last})")
    info = {"net_spec": net_spec, "recipe": recipe.name, "hyperparameters": hp, "train_config": asdict(cfg),
            "seed": seed, "steps": accepted["step"], "episodes": run.episodes, "acceptance": accepted,
            "accept_after_step": accept_after, "evaluations": run.evals, "device": str(dev),
            "replay_dtype": str(buf.s.dtype), "eps_decay_steps": eps_decay,
            "runtime_s": round(run.runtime_s + time.time() - started, 2),
            "cpu_s": round(run.cpu_s + time.process_time() - cpu_started, 2),
            "update_cpu_s": round(update_cpu_s, 6)}   # this process's updates (not a resumed run's earlier ones)
    if run.resumed_at:
        info["resumed_at_steps"] = run.resumed_at
    return q.cpu().eval(), info
