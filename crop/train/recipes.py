"""The nine methods of the paper (Appendix E) as small variants of one Double-DQN trainer (crop/train/dqn.py).

Each recipe changes the *data* of a sampled batch (``perturb``) or the *loss* (``loss``), or, for CARRL,
nothing in training at all (a test-time policy derived from StdTrain's network).  Hyper-parameters have
per-environment defaults in crop/train/defaults.py (``HYPERPARAMETERS``); a config's
``train.recipes.<algo>`` block overrides them key by key, and every value used is recorded in model.json.

Threat models.  CROP certifies ℓ2 perturbations of the observation, so the methods that attack with a
norm of our choosing (AdvTrain, GradDQN, CARRL) use ℓ2 with ε = 0.1 on CartPole and 0.05 on highway
(the paper's CARRL values).  SA-MDP and RadialRL are defined by their authors on ℓ∞ boxes (ε = 1/255 on
Atari pixels in [0, 1]); we keep ℓ∞ with ε in state units: 0.02 on CartPole (10 % of the pole-angle
range; with 0.05 RadialRL's worst-case loss diverged on seed 1) and 0.005 on highway (with 0.02 the
4,000-step budget gave clean returns of 12 (SA-MDP-PGD) and 8 (RadialRL) against 15 and 12; one seed,
20 episodes).  An ℓ∞ box of radius ε contains the ℓ2 ball of radius ε, so these are trained for at least
that ℓ2 ε.
Atari (pixels in [0, 1], 4×84×84 under the ``cleanrl`` profile): the network is the Nature CNN; GaussAug's σ
is the paper's 0.005; AdvTrain and GradDQN use ℓ2 ε = 0.05, inside the paper's Atari smoothing range
σ ∈ [0.001, 0.1] (an ℓ2 ball of radius 0.05 over 28,224 pixels can still move single pixels by 0.05);
SA-MDP and RadialRL use their authors' ℓ∞ ε = 1/255 (SA-DQN's κ = 0.005, c = 1).  Schedules start after
learning_starts (80k) and end by a third of the paper config's 1.5M steps.  Every perturbed frame is
clamped to [0, 1] (``ctx.clamp``), and the bounds of SA-MDP-CVX and RadialRL are over the box ∩ [0, 1].
NoisyNet (noisy MLP layers only) and CARRL (an MLP base) are refused on images.
Every schedule is linear in environment steps; a recipe is accepted only once its ε is at full value.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from crop.certify.attack import pgd_l2
from crop.models.bounds_ibp import CrownSettings, crown_bounds, ibp_bounds, margin_spec, parse_norm
from crop.train.defaults import recipe_hyperparameters

__all__ = ["Recipe", "RECIPES", "recipe_for", "pgd"]


# ----------------------------------------------------------------------------------------- helpers

def ramp(step: int, start: int, length: int) -> float:
    """0 before ``start``, then linear to 1 over ``length`` steps."""
    if step < start:
        return 0.0
    return 1.0 if length <= 0 else min(1.0, (step - start) / length)


def pgd_linf(loss_fn, x: torch.Tensor, eps: float, steps: int, gen: torch.Generator | None = None,
             random_start: bool = True) -> torch.Tensor:
    """Maximise ``loss_fn(x + δ)`` (per-sample, shape (B,)) over ‖δ‖∞ ≤ eps: sign steps of 2.5·ε/steps
    from a uniform random start in the box (as SA-DQN's PGD)."""
    alpha = 2.5 * eps / max(steps, 1)
    delta = ((torch.rand(x.shape, generator=gen, device=x.device) * 2 - 1) * eps if random_start
             else torch.zeros_like(x))
    for _ in range(steps):
        delta.requires_grad_(True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(loss_fn(x + delta).sum(), delta)
        delta = (delta.detach() + alpha * grad.sign()).clamp(-eps, eps)
    return delta.detach()


def pgd(loss_fn, x: torch.Tensor, eps: float, norm, steps: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """PGD perturbation δ maximising ``loss_fn`` within the ε-ball of ``norm`` (ℓ∞ or ℓ2)."""
    if parse_norm(norm) == math.inf:
        return pgd_linf(loss_fn, x, eps, steps, gen)
    return pgd_l2(loss_fn, x, torch.full((x.shape[0],), float(eps)), steps)  # crop.certify.attack's ℓ2 PGD


def action_margin(q_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """max_{a ≠ label} Q(a) − Q(label), per sample (> 0 ⇔ the greedy action has changed)."""
    own = q_values.gather(1, labels[:, None]).squeeze(1)
    others = q_values.masked_fill(F.one_hot(labels, q_values.shape[1]).bool(), float("-inf"))
    return others.max(1).values - own


def _weighted_mean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (w * x).mean()


# ----------------------------------------------------------------------------------------- recipes

class Recipe:
    """StdTrain: Double DQN (van Hasselt et al., 2016), the base of every variant."""

    name = "StdTrain"
    kind = "train"                # "train", or "derive" (CARRL: built from another algorithm's checkpoint)
    exploration = "epsilon"       # or "noisy" (NoisyNet: parameter noise instead of ε-greedy)
    images = True                 # trains on image observations (a CNN)

    # -- hyper-parameters
    def hyperparameters(self, env_id: str, overrides: dict | None = None) -> dict:
        """Its hyper-parameters on ``env_id`` (crop/train/defaults.py, then ``overrides``), checked."""
        hp = recipe_hyperparameters(self.name, env_id, overrides)
        self.validate(hp)
        return hp

    def validate(self, hp: dict) -> None:
        for k in ("eps", "sigma", "kappa", "hinge_c"):
            if k in hp and not (isinstance(hp[k], (int, float)) and math.isfinite(hp[k]) and hp[k] >= 0):
                raise ValueError(f"{self.name}: {k} must be a finite number >= 0, got {hp[k]!r}")
        for k in ("steps", "candidates"):
            if k in hp and not (isinstance(hp[k], int) and hp[k] >= 1):
                raise ValueError(f"{self.name}: {k} must be an integer >= 1, got {hp[k]!r}")
        for k in ("ramp_start", "ramp_steps"):
            if k in hp and not (isinstance(hp[k], int) and hp[k] >= 0):
                raise ValueError(f"{self.name}: {k} must be an integer >= 0, got {hp[k]!r}")
        if "fraction" in hp and not (isinstance(hp["fraction"], (int, float)) and 0 <= hp["fraction"] <= 1):
            raise ValueError(f"{self.name}: fraction must be in [0, 1], got {hp['fraction']!r}")
        if "kappa_end" in hp and not 0 <= hp["kappa_end"] <= 1:
            raise ValueError(f"{self.name}: kappa_end must be in [0, 1], got {hp['kappa_end']!r}")
        if "norm" in hp:
            parse_norm(hp["norm"])

    def net_spec(self, n_in: int, hidden: list, n_out: int, hp: dict) -> dict:
        return {"arch": "mlp", "in": n_in, "hidden": list(hidden), "out": n_out}

    def net_spec_for(self, obs_shape: tuple, hidden: list, n_out: int, hp: dict) -> dict:
        """Images (c×n×n): the Nature CNN of Mnih et al. (2015) (``hidden`` does not apply); vectors:
        ``net_spec`` on the flattened observation."""
        if len(obs_shape) == 3:
            if not self.images:
                raise ValueError(f"{self.name} has no image (CNN) variant")
            c, h, w = obs_shape
            if h != w:
                raise ValueError(f"the Nature CNN needs square frames, got {obs_shape}")
            return {"arch": "nature_cnn", "in_channels": int(c), "in_size": int(h), "out": int(n_out)}
        return self.net_spec(int(math.prod(obs_shape)), hidden, n_out, hp)

    def schedule_end(self, hp: dict) -> int:
        """The step at which the recipe's robustness schedule reaches full strength (acceptance waits)."""
        return int(hp.get("ramp_start", 0) + hp.get("ramp_steps", 0)) if "eps" in hp else 0

    def eps_now(self, ctx) -> float:
        return float(ctx.hp["eps"]) * ramp(ctx.step, ctx.hp["ramp_start"], ctx.hp["ramp_steps"])

    # -- the two hooks
    def perturb(self, ctx, batch):
        """Data variant: the observations the TD loss is computed on (default: unchanged)."""
        return batch

    def loss(self, ctx, batch, q_all: torch.Tensor, y: torch.Tensor, td: torch.Tensor) -> torch.Tensor:
        """Loss variant: ``td`` is the per-sample Huber TD loss of Q(s, a) against the Double-DQN target y."""
        return _weighted_mean(td, batch.w)


class GaussAug(Recipe):
    """GaussAug (Behzadan & Munir, 2017; Kos & Song, 2017): i.i.d. N(0, σ²) noise on every training
    observation (s and s′ of every sampled transition, fresh at every update), σ = 0.005 as the paper
    (Appendix E: "the best testing performance under attacks"), in observation units on every environment.
    (With σ = 0.05 on CartPole, seed 0 never passed the acceptance test within 100,000 steps.)"""

    name = "GaussAug"

    def perturb(self, ctx, batch):
        sigma = float(ctx.hp["sigma"])
        def noise(x):
            return ctx.clamp(x + sigma * torch.randn(x.shape, generator=ctx.gen, device=x.device))
        return replace(batch, s=noise(batch.s), s2=noise(batch.s2))


class AdvTrain(Recipe):
    """AdvTrain (Behzadan & Munir, 2017): a ``fraction`` (50 %) of each sampled batch's observations s is
    replaced by a ``steps``-step (5) PGD perturbation within the ℓ2 ε-ball that maximises the cross-entropy
    of Q(ŝ, ·) (as logits) against the greedy action at s — the attack crop/certify/attack.py runs on the
    certified policies.  ε ramps from 0 over ``ramp_steps`` after ``ramp_start``."""

    name = "AdvTrain"

    def perturb(self, ctx, batch):
        eps = self.eps_now(ctx)
        B = batch.s.shape[0]
        k = int(round(float(ctx.hp["fraction"]) * B))
        if eps == 0 or k == 0:
            ctx.stats["adv_eps"] = 0.0
            return batch
        idx = torch.as_tensor(ctx.rng.choice(B, size=k, replace=False), device=batch.s.device)
        s = batch.s[idx]
        with torch.no_grad():
            greedy = ctx.q(s).argmax(1)
        delta = pgd(lambda z: F.cross_entropy(ctx.q(ctx.clamp(z)), greedy, reduction="none"), s, eps,
                    ctx.hp["norm"], int(ctx.hp["steps"]), ctx.gen)
        s_new = batch.s.clone()
        s_new[idx] = ctx.clamp(s + delta)   # clamping to the domain only shortens δ: still in the ball
        ctx.stats["adv_eps"] = eps
        return replace(batch, s=s_new)


class GradDQN(Recipe):
    """GradDQN (Pattanaik et al., 2018): the gradient-based adversary of their Algorithm 2.  The direction
    g = ∇_s log softmax(Q(s, ·))[a_w] (towards the worst action a_w = argmin_a Q(s, a)), normalised in ℓ2;
    ``candidates`` (10) points s + ε·u_i·g with u_i ~ Beta(1, 1) (= Uniform(0, 1)); the adversarial state is
    the candidate whose greedy action has the lowest Q(s, ·) at the true state, if it is lower than the
    greedy action's (else s stays).  Training uses the adversarial states in place of s for a
    ``fraction`` (all) of each batch.  ℓ2, ε ramped like AdvTrain."""

    name = "GradDQN"

    def validate(self, hp):
        super().validate(hp)
        if parse_norm(hp["norm"]) != 2.0:
            raise ValueError("GradDQN: only the ℓ2 norm is implemented (norm: 2)")

    @staticmethod
    def adversarial_states(q, s: torch.Tensor, eps: float, candidates: int, gen, clamp=None) -> torch.Tensor:
        with torch.no_grad():
            q_clean = q(s)
        worst = q_clean.argmin(1)
        x = s.clone().requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(F.log_softmax(q(x), 1).gather(1, worst[:, None]).sum(), x)
        view = (-1,) + (1,) * (s.dim() - 1)                                 # (per-sample norms of any shape)
        g = g / g.flatten(1).norm(dim=1).clamp_min(1e-12).reshape(view)
        u = torch.rand((candidates, s.shape[0]) + (1,) * (s.dim() - 1), generator=gen, device=s.device)
        cand = s.unsqueeze(0) + eps * u * g.unsqueeze(0)                    # (n, B, *obs): Beta(1, 1) steps
        if clamp is not None:
            cand = clamp(cand)
        with torch.no_grad():
            acts = q(cand.flatten(0, 1)).argmax(1).reshape(candidates, -1)  # the agent's action at each
            val = q_clean.gather(1, acts.T).T                               # Q(s, that action), (n, B)
            best_val, best = val.min(0)
            own = q_clean.gather(1, q_clean.argmax(1, keepdim=True)).squeeze(1)
            chosen = cand[best, torch.arange(s.shape[0])]
            return torch.where((best_val < own).reshape(view), chosen, s)

    def perturb(self, ctx, batch):
        eps = self.eps_now(ctx)
        B = batch.s.shape[0]
        k = int(round(float(ctx.hp["fraction"]) * B))
        if eps == 0 or k == 0:
            return batch
        idx = (torch.as_tensor(ctx.rng.choice(B, size=k, replace=False), device=batch.s.device) if k < B
               else torch.arange(B, device=batch.s.device))
        s_new = batch.s.clone()
        s_new[idx] = self.adversarial_states(ctx.q, batch.s[idx], eps, int(ctx.hp["candidates"]), ctx.gen,
                                             ctx.clamp)
        ctx.stats["adv_changed"] = float((s_new != batch.s).flatten(1).any(1).float().mean())
        return replace(batch, s=s_new)


class _SAMDP(Recipe):
    """SA-DQN (Zhang et al., 2020): TD loss + κ · mean_i max{ max_{ŝ ∈ B(s_i)} max_{a ≠ a*} Q(ŝ, a) −
    Q(ŝ, a*), −c }, a* = argmax_a Q(s_i, a) (the hinge stops pushing once every other action is ≥ c below
    a* everywhere in the ball).  ℓ∞ ball; ε ramps linearly from 0 after ``ramp_start`` over
    ``ramp_steps`` (SA-DQN: start after 25 % of training, κ = 0.005, c = 1, PGD 5 steps with random start;
    our κ and c are in CartPole's/highway's Q scale)."""

    def inner_max(self, ctx, s, labels, eps) -> torch.Tensor:
        raise NotImplementedError

    def regulariser(self, ctx, s, labels, eps) -> torch.Tensor:
        """Per-sample hinge max{inner max, −c} + c: ≥ 0, and 0 once every other action is at least c
        below a* in the whole ball (the + c does not change the gradient)."""
        c = float(ctx.hp["hinge_c"])
        return torch.clamp(self.inner_max(ctx, s, labels, eps), min=-c) + c

    def loss(self, ctx, batch, q_all, y, td):
        td_loss = _weighted_mean(td, batch.w)
        eps = self.eps_now(ctx)
        if eps == 0:
            return td_loss
        reg = self.regulariser(ctx, batch.s, q_all.argmax(1).detach(), eps)
        ctx.stats.update(sa_eps=eps, sa_reg=reg.detach().mean().item())
        return td_loss + float(ctx.hp["kappa"]) * _weighted_mean(reg, batch.w)


class SAMDP_PGD(_SAMDP):
    __doc__ = _SAMDP.__doc__ + "\n    Inner maximisation by PGD (``steps`` = 5) on the action margin."
    name = "SA-MDP-PGD"

    def inner_max(self, ctx, s, labels, eps):
        delta = pgd(lambda z: action_margin(ctx.q(ctx.clamp(z)), labels), s, eps, ctx.hp["norm"],
                    int(ctx.hp["steps"]), ctx.gen)
        return action_margin(ctx.q(ctx.clamp(s + delta)), labels)   # a lower bound of the true inner max


class SAMDP_CVX(_SAMDP):
    __doc__ = _SAMDP.__doc__ + """
    Inner maximisation by convex relaxation: a sound *upper* bound of max_{a≠a*} Q(ŝ, a) − Q(ŝ, a*) from
    CROWN-IBP with the margin specification (crop/models/bounds_ibp.py), mixed with the IBP bound as
    β·CROWN-IBP + (1 − β)·IBP, β going 1 → 0 along the ε schedule (SA-DQN's convex_start/final_beta)."""
    name = "SA-MDP-CVX"

    def inner_max(self, ctx, s, labels, eps):
        C = margin_spec(labels, ctx.n_actions, s.dtype)
        norm = ctx.hp["norm"]
        beta = 1.0 - ramp(ctx.step, ctx.hp["ramp_start"], ctx.hp["ramp_steps"])
        ub = 0.0
        if beta > 0:   # (each bound computed only when its weight is non-zero)
            ub = ub + beta * crown_bounds(ctx.q, s, eps, norm, C=C, domain=ctx.domain, settings=CrownSettings(
                intermediate="ibp", intersect_ibp=False, lower=False))[1]
        if beta < 1:
            ub = ub + (1 - beta) * ibp_bounds(ctx.q, s, eps, norm, C=C, domain=ctx.domain)[1]
        return ub.max(1).values


class RadialRL(Recipe):
    """RADIAL-DQN (Oikarinen et al., 2021): loss = κ·TD + (1 − κ)·worst-case loss, where the worst-case
    loss sums over actions the Huber loss of the bound farther from the target: for the taken action the
    target is y, for the others Q(s, a); bounds of Q over the ℓ∞ ε-box by IBP.  ε ramps linearly from 0
    (from step 0) to ``eps`` over ``ramp_steps`` and κ from 1 to ``kappa_end`` (0.5) with it.  (The
    reference uses min(d², |d|); we use the same Huber loss as the TD term.)"""

    name = "RadialRL"

    def worst_case_loss(self, ctx, batch, q_all, y, eps) -> torch.Tensor:
        """Per-sample worst-case loss; ≥ the TD loss of the taken action, since lb ≤ Q(s, a) ≤ ub."""
        lb, ub = ibp_bounds(ctx.q, batch.s, eps, ctx.hp["norm"], domain=ctx.domain)
        onehot = F.one_hot(batch.a, q_all.shape[1]).to(q_all.dtype)
        target = onehot * y.unsqueeze(1) + (1 - onehot) * q_all
        diff = torch.maximum((ub - target).abs(), (lb - target).abs())
        return F.smooth_l1_loss(diff, torch.zeros_like(diff), reduction="none").sum(1)

    def loss(self, ctx, batch, q_all, y, td):
        frac = ramp(ctx.step, ctx.hp["ramp_start"], ctx.hp["ramp_steps"])
        eps, kappa = float(ctx.hp["eps"]) * frac, 1.0 - frac * (1.0 - float(ctx.hp["kappa_end"]))
        td_loss = _weighted_mean(td, batch.w)
        if eps == 0:
            return td_loss
        wc = self.worst_case_loss(ctx, batch, q_all, y, eps)
        ctx.stats.update(radial_eps=eps, radial_wc=wc.detach().mean().item())
        return kappa * td_loss + (1 - kappa) * _weighted_mean(wc, batch.w)


class NoisyNet(Recipe):
    """NoisyNet-DQN (Fortunato et al., 2018): every linear layer a factorised Gaussian noisy layer with
    σ0 = 0.5; noise is resampled at every environment step (exploration, no ε-greedy) and for every
    update (online and target networks independently).  Evaluation and certification use the mean
    network μ (crop/models/noisy.py): a fixed function, as smoothing requires."""

    name = "NoisyNet"
    exploration = "noisy"
    images = False                # noisy linear layers only (crop/models/noisy.py)

    def validate(self, hp):
        super().validate(hp)
        if not (isinstance(hp["sigma0"], (int, float)) and hp["sigma0"] >= 0):
            raise ValueError(f"NoisyNet: sigma0 must be >= 0, got {hp['sigma0']!r}")

    def net_spec(self, n_in, hidden, n_out, hp):
        return {"arch": "noisy_mlp", "in": n_in, "hidden": list(hidden), "out": n_out,
                "sigma0": float(hp["sigma0"])}


class CARRL(Recipe):
    """CARRL (Everett et al., 2021): no training — StdTrain's network, acting on the largest CROWN lower
    bound of Q(x′, a) over ‖x′ − x‖₂ ≤ ε (ε = 0.1 on CartPole, 0.05 on highway, as in the paper).
    Built by ``crop derive`` from the base algorithm's checkpoint (crop/models/carrl.py)."""

    name = "CARRL"
    kind = "derive"
    images = False                # CROWN bounds of an MLP base (crop/models/carrl.py)

    def validate(self, hp):
        super().validate(hp)
        if hp["method"] not in ("crown", "crown-ibp", "ibp"):
            raise ValueError(f"CARRL: method must be crown, crown-ibp or ibp, got {hp['method']!r}")

    def schedule_end(self, hp):
        return 0

    def derive(self, base_net, base_spec: dict, hp: dict):
        from crop.models.carrl import derive_carrl

        return derive_carrl(base_net, base_spec, hp["eps"], hp["norm"], hp["method"])


RECIPES: dict[str, Recipe] = {r.name: r for r in (Recipe(), GaussAug(), AdvTrain(), SAMDP_PGD(), SAMDP_CVX(),
                                                  RadialRL(), CARRL(), NoisyNet(), GradDQN())}


def recipe_for(algo: str) -> Recipe:
    try:
        return RECIPES[algo]
    except KeyError:
        raise ValueError(f"no training recipe for algorithm {algo!r}; known: {sorted(RECIPES)}") from None
