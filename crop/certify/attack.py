"""Empirical ℓ2 PGD attacks, to show how tight the certificates are (Appendix E: 10-step PGD at every step).

* ``run_local_attack``: against the locally smoothed policy π̃ (LoAct, LoRe).  The gradient flows through
  the smoothed Q (the mean over a batch of noisy copies of s + δ; for the targets probs and vote the mean of
  the softmax probabilities); the attacked action is π̃'s Monte-Carlo action at s + δ (of its target).
  Every step also certifies the clean state, so a flip at a step whose certified radius
  exceeds ε is counted (``flips_certified``; it must stay 0 up to Monte-Carlo error of the action).
* ``run_global_attack``: against the σ-randomized policy π′ (GRe); the gradient is the expectation over
  noise (EOT), the action is π(s + δ + Δ_t) with one fresh Δ_t.

The PGD step is normalised once and the iterate projected once onto the ε-ball (the official code
rescaled twice, which changes the budget).  Episodes for all ε run in lockstep with one batched forward;
at each step the clean states of every live run are smoothed in one :meth:`SmoothedNetwork.estimate_batch` call
and the attacked states in another (runs in (ε, episode) order; the noise layout: :mod:`crop.smoothing.engine`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from crop import columns as cols
from crop.certify.loact import certify_estimate
from crop.envs import make_env, to_obs
from crop.names import network_name
from crop.progress import pbar
from crop.schema import default_of
from crop.smoothing.engine import check_noise, resolve_device
from crop.smoothing.smoothed import NonFiniteOutputError, SmoothedNetwork

__all__ = ["LocalAttackSettings", "GlobalAttackSettings", "pgd_l2", "project_l2", "run_local_attack",
           "run_global_attack", "global_pgd"]


def pgd_l2(loss_fn, x: torch.Tensor, eps: torch.Tensor, steps: int = 10, step_scale: float = 2.5) -> torch.Tensor:
    """Maximise ``loss_fn(x + δ)`` (a per-sample loss of shape (B,)) over ‖δ_b‖₂ ≤ eps_b.

    Step size ``step_scale · ε / steps`` (Madry et al.); one normalisation and one projection per step
    (:func:`project_l2`, exact in float32: the returned δ and the perturbation x + δ − x actually applied
    both have norm ≤ ε as computed).
    """
    B = x.shape[0]
    view = (B,) + (1,) * (x.dim() - 1)
    eps = eps.to(x).reshape(view)
    alpha = step_scale * eps / max(steps, 1)
    delta = torch.zeros_like(x)
    for _ in range(steps):
        delta.requires_grad_(True)
        with torch.enable_grad():
            loss = loss_fn(x + delta).sum()
            (grad,) = torch.autograd.grad(loss, delta)
        gnorm = grad.flatten(1).norm(dim=1).clamp_min(1e-12).reshape(view)
        delta = project_l2(delta.detach() + alpha * grad / gnorm, eps, x)
    return delta.detach()


def project_l2(delta: torch.Tensor, eps: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
    """Each row δ_b scaled onto the ℓ2 ball of radius eps_b, so that its norm *as computed in its own
    precision* is ≤ eps_b (and, given ``x``, also the norm of (x + δ) − x, the perturbation the network
    actually sees).  Rows whose norms already hold are returned unchanged.

    The plain scale ε/‖δ‖ rounds: ‖δ·ε/‖δ‖‖ can exceed ε by a few ulps (in float32 up to ~4e−7 relative),
    and rounding x + δ adds more.  The scale is therefore lowered, one ulp at a time and then geometrically,
    until the computed norms hold; both are monotone in the scale, so this ends (at the latest at 0).
    """
    view = (delta.shape[0],) + (1,) * (delta.dim() - 1)
    eps = torch.as_tensor(eps, dtype=delta.dtype, device=delta.device).reshape(-1).expand(delta.shape[0]).reshape(view)

    def too_long(d):
        over = d.flatten(1).norm(dim=1).reshape(view) > eps
        if x is not None:
            over |= ((x + d) - x).flatten(1).norm(dim=1).reshape(view) > eps
        return over

    scale = torch.clamp(eps / delta.flatten(1).norm(dim=1).clamp_min(1e-12).reshape(view), max=1.0)
    out = delta * scale
    over = too_long(out)
    zero = torch.zeros_like(scale)
    k = 0
    while bool(over.any()):
        lower = torch.nextafter(scale, zero) if k < 4 else scale * (1 - 2.0 ** min(k - 24, 0))
        scale = torch.where(over, lower, scale)
        out = delta * scale
        over = too_long(out)
        k += 1
    return out


def _check(q: torch.Tensor, net, where: str) -> None:
    if not torch.isfinite(q).all():
        raise NonFiniteOutputError(f"the {network_name(net)} returned NaN or inf during the attack ({where})")


class _Runs:
    """One attacked episode per (ε, episode), in that order, all in lockstep: each run's environment (reset
    with its episode's seed: ``seeds_per_eps[k][ep]`` for the k-th ε), current observation, discounted return
    and whether it is still running."""

    def __init__(self, env_id: str, eps_grid, seeds_per_eps, profile: str | None):
        self.runs, self.envs, self.obs = [], [], []
        for e, seeds in zip(eps_grid, seeds_per_eps, strict=True):
            self.runs += [(float(e), ep) for ep in range(len(seeds))]
            for seed in seeds:
                env = make_env(env_id, profile)
                o, _ = env.reset(seed=int(seed))
                self.envs.append(env)
                self.obs.append(to_obs(o))
        self.ret = np.zeros(len(self.runs))
        self.alive = np.ones(len(self.runs), dtype=bool)

    def live(self) -> np.ndarray:
        return np.nonzero(self.alive)[0]

    def eps(self, idx, dev) -> torch.Tensor:
        return torch.tensor([self.runs[i][0] for i in idx], device=dev)

    def step(self, i: int, action: int, t: int, gamma: float, reward_fn=None) -> None:
        """Run ``i`` takes ``action`` at step ``t``; the episode's end stops it."""
        o, r, term, trunc, _ = self.envs[i].step(action)
        if reward_fn is not None:
            r = reward_fn(r)
        self.ret[i] += gamma ** t * float(r)
        self.obs[i] = to_obs(o)
        if term or trunc:
            self.alive[i] = False

    def table(self, horizon: int, **columns) -> pd.DataFrame:
        """One row per run (eps, episode, return, ``columns``, horizon); closes the environments."""
        for env in self.envs:
            env.close()
        return pd.DataFrame({cols.EPS: [r[0] for r in self.runs], cols.EPISODE: [r[1] for r in self.runs],
                             cols.RETURN: self.ret, **columns, cols.HORIZON: horizon})


@dataclass(frozen=True)
class LocalAttackSettings:
    """The local attack (against π̃): ``steps``-step ℓ2 PGD at every step of episodes of at most ``horizon``
    steps, for every ε of ``eps_grid`` from the same initial states (episode i reset with
    ``episode_seeds[i]``); the gradient averages ``m_grad`` noisy copies drawn from the stream of ``seed``;
    returns discounted by ``gamma``, each reward mapped by ``reward_fn`` (LoRe's reward modification)."""

    eps_grid: tuple
    episode_seeds: tuple
    horizon: int
    steps: int = default_of("environment.attack.pgd_steps")
    m_grad: int = default_of("environment.attack.local_m_grad")
    seed: int = 0
    gamma: float = default_of("environment.lore.gamma")
    reward_fn: Callable | None = None

    def __post_init__(self):
        _check_grid(self.eps_grid, self.steps)
        object.__setattr__(self, "eps_grid", tuple(self.eps_grid))
        object.__setattr__(self, "episode_seeds", tuple(self.episode_seeds))


@dataclass(frozen=True)
class GlobalAttackSettings:
    """The global attack (against π′): ``steps``-step ℓ2 PGD with the expectation over ``n_eot`` draws of
    N(0, σ²I) at every step of episodes of at most ``horizon`` steps, for every ε of ``eps_grid``, the k-th ε's
    episodes reset with ``seeds_per_eps[k]``; noise from the stream of ``seed`` on ``device``; returns
    discounted by ``gamma``, each reward mapped by ``reward_fn`` (GRe's reward clipping)."""

    sigma: float
    eps_grid: tuple
    seeds_per_eps: tuple
    horizon: int
    steps: int = default_of("environment.attack.pgd_steps")
    n_eot: int = default_of("environment.attack.global_n_eot")
    gamma: float = default_of("environment.gre.gamma")
    seed: int = 0
    device: object = default_of("device")
    reward_fn: Callable | None = None

    def __post_init__(self):
        _check_grid(self.eps_grid, self.steps)
        check_noise(self.sigma, self.n_eot, "n_eot")
        object.__setattr__(self, "eps_grid", tuple(self.eps_grid))
        object.__setattr__(self, "seeds_per_eps", tuple(tuple(s) for s in self.seeds_per_eps))


def _check_grid(eps_grid, steps) -> None:
    if any(not float(e) >= 0 for e in eps_grid):
        raise ValueError(f"every eps must be >= 0, got {list(eps_grid)}")
    if int(steps) < 0:
        raise ValueError(f"PGD steps must be >= 0, got {steps}")


def run_local_attack(env_id: str, smoother: SmoothedNetwork, settings: LocalAttackSettings, *,
                     profile: str | None = None,
                     progress: bool | None = None, steps_out: list | None = None) -> pd.DataFrame:
    """PGD against π̃ at every step for every ε in ``eps_grid`` and every episode (:class:`LocalAttackSettings`);
    all in lockstep.

    ``steps_out`` (a list): one row per attacked step is appended (``attack_local_steps.csv``): the run's ε,
    episode and step, the clean state's digest (:func:`crop.certify.lore.obs_digest`), its certificate (top action
    a₁ = ``clean_action``, certified, radius, L(a₁), max U(a)), the attacked action and the discounted return
    before the step — what the audit needs to bound, step by step, the chance of a flip (and of leaving LoRe's
    tree) under valid certificates, and to tell when the return so far already secures LoRe's bound."""
    dev = smoother.device
    net, target = smoother.net, getattr(smoother, "target", "q")
    horizon, steps, m_grad, gamma, reward_fn = (settings.horizon, settings.steps, settings.m_grad, settings.gamma,
                                                settings.reward_fn)
    episode_seeds = list(settings.episode_seeds)
    g = torch.Generator(device=dev)
    g.manual_seed(int(settings.seed))
    eps_grid = list(settings.eps_grid)   # every ε from the same initial states (LoRe's first): one tree per ε
    runs = _Runs(env_id, eps_grid, [episode_seeds] * len(eps_grid), profile)
    n_steps = np.zeros(len(runs.runs), dtype=int)
    flips = np.zeros(len(runs.runs), dtype=int)
    flips_cert = np.zeros(len(runs.runs), dtype=int)
    for t in pbar(range(horizon), desc=f"local PGD σ={smoother.sigma:g}", progress=progress):
        idx = runs.live()
        if idx.size == 0:
            break
        # The clean states and (below) the attacked ones: one batched smoothing call each per time step.
        clean = smoother.estimate_batch(np.stack([runs.obs[i] for i in idx]),
                                        [f"attack run {i} step {t}" for i in idx])
        certs = [certify_estimate(e, smoother.sigma, smoother.v_min, smoother.v_max) for e in clean]
        a_clean = torch.tensor([c.action for c in certs], device=dev)
        x = torch.as_tensor(np.stack([runs.obs[i] for i in idx]), device=dev)
        eps = runs.eps(idx, dev)
        noise = torch.randn((len(idx), m_grad, *x.shape[1:]), generator=g, device=dev) * smoother.sigma

        def loss(z):  # cross-entropy of the smoothed Q (unclipped, so the gradient does not vanish)
            out = net((z.unsqueeze(1) + noise).flatten(0, 1)).reshape(len(idx), m_grad, -1)
            if target != "q":  # probs and vote: the smoothed probabilities (the vote's differentiable surrogate)
                _check(out, net, f"step {t}")
                return F.nll_loss(torch.log(torch.softmax(out, -1).mean(1).clamp_min(1e-30)), a_clean,
                                  reduction="none")
            q = out.mean(1)
            _check(q, net, f"step {t}")
            return F.cross_entropy(q, a_clean, reduction="none")

        delta = pgd_l2(loss, x, eps, steps)
        adv = (x + delta).cpu().numpy()
        attacked = smoother.estimate_batch(adv, [f"attacked run {i} step {t}" for i in idx])
        for j, i in enumerate(idx):
            a = attacked[j].action
            if steps_out is not None:
                steps_out.append(_step_record(runs, i, t, a, certs[j], clean[j].upper))
            if a != certs[j].action:
                flips[i] += 1
                if certs[j].certified and certs[j].radius > runs.runs[i][0]:
                    flips_cert[i] += 1
            runs.step(i, a, t, gamma, reward_fn)
            n_steps[i] += 1
    return runs.table(horizon, **{cols.STEPS: n_steps, "flips": flips, cols.FLIPS_CERTIFIED: flips_cert})


def _step_record(runs: _Runs, i: int, t: int, action: int, cert, upper) -> dict:
    """One row of ``attack_local_steps.csv``: run ``i``'s clean state at step ``t`` (before it moves)."""
    from crop.certify.lore import obs_digest

    return {cols.EPS: runs.runs[i][0], cols.EPISODE: runs.runs[i][1], cols.STEP: t,
            cols.OBS_DIGEST: obs_digest(runs.obs[i]), cols.CLEAN_ACTION: int(cert.action), cols.ACTION: int(action),
            cols.CERTIFIED: bool(cert.certified), cols.RADIUS: float(cert.radius),
            cols.SMOOTHED_TOP_LOWER: float(cert.estimate.lower[cert.action]),
            cols.SMOOTHED_OTHERS_UPPER_MAX: float(np.max(np.delete(upper, cert.action))),
            cols.RETURN_SO_FAR: float(runs.ret[i])}


def run_global_attack(env_id: str, net: torch.nn.Module, settings: GlobalAttackSettings, *,
                      profile: str | None = None, progress: bool | None = None) -> pd.DataFrame:
    """PGD (expectation over the smoothing noise) against the σ-randomized policy π′
    (:class:`GlobalAttackSettings`).  ``seeds_per_eps``: the initial-state seeds of each ε's episodes (one list
    per ε of ``eps_grid``) — GRe's bounds are about a return from a *random* initial state, so the audit's count
    over runs needs each run's and ε's episodes drawn afresh (:func:`crop.handlers.stages.global_attack_seeds`).  A
    continuous-action actor is attacked by :func:`_run_global_attack_actor`.  ``reward_fn`` maps each step's
    reward before it is added (GRe's reward clipping, so that both returns are the same quantity)."""
    if getattr(net, "continuous", False):
        return _run_global_attack_actor(env_id, net, settings, profile=profile, progress=progress)
    dev = resolve_device(settings.device)
    net = net.to(dev).eval()
    n_eot = settings.n_eot

    def make_loss(x, noise, t):
        n = len(x)
        with torch.no_grad():
            q0 = net((x.unsqueeze(1) + noise).flatten(0, 1)).reshape(n, n_eot, -1)
            _check(q0, net, f"step {t}")
            target = q0.mean(1).argmax(1)

        def loss(z):
            q = net((z.unsqueeze(1) + noise).flatten(0, 1)).reshape(n, n_eot, -1)
            # EOT: expected cross-entropy of the single-sample policy over the noise
            return F.cross_entropy(q.flatten(0, 1), target.repeat_interleave(n_eot),
                                   reduction="none").reshape(n, n_eot).mean(1)
        return loss

    def act(z, t):
        q = net(z)
        _check(q, net, f"step {t}")
        return [int(a) for a in q.argmax(1).cpu().numpy()]

    return global_pgd(env_id, settings, make_loss, act, device=dev, profile=profile, progress=progress)


def _run_global_attack_actor(env_id: str, net, settings: GlobalAttackSettings, *, profile: str | None = None,
                             progress: bool | None = None):
    """PGD (expectation over the smoothing noise, EOT) against the σ-randomized policy π′(s) = π(s + Δ) of a
    continuous-action actor.  The loss: with a critic, −Q(s, π(s + δ + Δ)) (the agent's own objective, on the clean
    state s it is really in); without one, ‖π(s + δ + Δ) − ā‖², ā the clean action averaged over the same Δ.
    The action taken is π(s + δ + Δ_t) with one fresh Δ_t, as GRe's trajectories take it."""
    dev = resolve_device(settings.device)
    net = net.to(dev).eval()
    n_eot = settings.n_eot

    def make_loss(x, noise, t):
        n = len(x)
        with torch.no_grad():
            a0 = net.raw((x.unsqueeze(1) + noise).flatten(0, 1)).reshape(n, n_eot, -1)
            _check(a0, net, f"step {t}")
            clean = a0.mean(1, keepdim=True)
        states = x.unsqueeze(1).expand(-1, n_eot, -1).flatten(0, 1)

        def loss(z):
            a = net.raw((z.unsqueeze(1) + noise).flatten(0, 1))
            if net.has_critic:
                return -net.q(states, a).reshape(n, n_eot).mean(1)
            return (a.reshape(n, n_eot, -1) - clean).pow(2).sum(-1).mean(1)
        return loss

    def act(z, t):
        a = net(z)
        _check(a, net, f"step {t}")
        return list(a.cpu().numpy())

    return global_pgd(env_id, settings, make_loss, act, device=dev, profile=profile, progress=progress)


def global_pgd(env_id: str, settings: GlobalAttackSettings, make_loss, act, *, device, profile: str | None,
               progress: bool | None) -> pd.DataFrame:
    """The global attack's loop, whatever the action: per step the EOT noise (n_eot draws per live run),
    ``make_loss(x, noise, t)``'s per-run loss maximised by PGD, then the action ``act(x + δ + Δ_t, t)`` (one
    list entry per run) with one fresh Δ_t, played in every live run; ``device``: the resolved
    ``settings.device``."""
    sigma, horizon, steps, n_eot, gamma, reward_fn = (settings.sigma, settings.horizon, settings.steps,
                                                      settings.n_eot, settings.gamma, settings.reward_fn)
    g = torch.Generator(device=device)
    g.manual_seed(int(settings.seed))
    runs = _Runs(env_id, settings.eps_grid, settings.seeds_per_eps, profile)
    for t in pbar(range(horizon), desc=f"global PGD σ={sigma:g}", progress=progress):
        idx = runs.live()
        if idx.size == 0:
            break
        x = torch.as_tensor(np.stack([runs.obs[i] for i in idx]), device=device)
        eps = runs.eps(idx, device)
        noise = torch.randn((len(idx), n_eot, *x.shape[1:]), generator=g, device=device) * sigma
        loss = make_loss(x, noise, t)
        delta = pgd_l2(loss, x, eps, steps)
        with torch.no_grad():
            act_noise = torch.randn(x.shape, generator=g, device=device) * sigma
            actions = act(x + delta + act_noise, t)
        for j, i in enumerate(idx):
            runs.step(i, actions[j], t, gamma, reward_fn)
    return runs.table(horizon)
