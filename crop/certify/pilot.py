"""``target: auto`` — one smoothing target per run (env, algo, σ), chosen by a pilot before any certification
noise is drawn.

The pilot predicts, for each target the network supports (a Q-network: ``q``, ``vote``; a policy network:
``probs``, ``vote``; :mod:`crop.smoothing.smoothed`), the mean certified radius LoAct would find, and
:func:`choose_target` takes the largest.  Per pilot state s (a fixed, evenly spaced subset of the states the
qrange stage visited) one set of ``m`` noisy forwards f(s + Δ_i) gives every candidate's samples at once
(clip(Q, V_min, V_max) with the V range just estimated, softmax, one-hot of the argmax).  The *predicted*
radius plugs the pilot's samples into the bound the certification will use at the certification's sizes —
m_cert samples (the pilot's repeated: same mean, same spread), the per-state α of LoAct
(:func:`crop.smoothing.stats.loact_state_alpha`) — then Theorem 1's radius through LoAct's own
:func:`crop.certify.loact.certify_estimate`.  So the prediction does not shrink with the pilot's smaller m.

Why the choice keeps every certificate valid (docs/statistics.md, "target: auto"): the chosen target T is a
function of the network, qrange's states and qrange's noise only.  The pilot takes a generator and never a
smoother: it continues the qrange stage's stream (after its V-range draws) and cannot see the certification's,
which is drawn later from the certification stage's own seed.  For each fixed t, Theorem 1's guarantee holds
over the certification noise; hence P(wrong) = Σ_t P(T = t) P(wrong | T = t) ≤ α.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from crop.certify.loact import certify_estimate
from crop.names import TARGET_NAMES
from crop.smoothing.engine import check_noise
from crop.smoothing.smoothed import BOUNDS, TARGET_RANGE, Estimate, NonFiniteOutputError
from crop.smoothing.stats import per_bound_alpha

__all__ = ["PilotSettings", "CANDIDATES", "pilot_states", "run_pilot", "choose_target", "MAX_PILOT_STATES"]

#: The targets ``auto`` chooses among, per network kind (model.json ``network``), in the tie-breaking order.
CANDIDATES = {"q": ("q", "vote"), "policy": ("probs", "vote")}

#: At most this many of the qrange stage's states are pilot states (evenly spaced over the visit order).
MAX_PILOT_STATES = 32


@dataclass(frozen=True)
class PilotSettings:
    """The pilot: ``m`` noise samples N(0, σ²I) per pilot state, candidates ``targets``; ``v_range`` the clip
    of ``q`` (the qrange stage fills it in once estimated); the certification it predicts: ``cert_m`` samples per state,
    per-state miscoverage ``cert_alpha`` and its ``bound`` (:data:`crop.smoothing.smoothed.BOUNDS`); ``chunk``
    rows per forward."""

    sigma: float
    m: int
    targets: tuple
    cert_m: int
    cert_alpha: float
    bound: str
    v_range: tuple | None = None
    chunk: int = 1000

    def __post_init__(self):
        check_noise(self.sigma, self.m)
        check_noise(self.sigma, self.cert_m, "cert_m")
        if not self.targets or any(t not in TARGET_NAMES for t in self.targets):
            raise ValueError(f"targets must be among {list(TARGET_NAMES)}, got {list(self.targets)}")
        if not 0 < self.cert_alpha < 1:
            raise ValueError(f"cert_alpha must be in (0, 1), got {self.cert_alpha}")
        if self.bound not in BOUNDS:
            raise ValueError(f"unknown bound {self.bound!r}; known: {sorted(BOUNDS)}")
        object.__setattr__(self, "targets", tuple(self.targets))


def pilot_states(n_visited: int, k: int = MAX_PILOT_STATES) -> list[int]:
    """Indices of at most ``k`` of ``n_visited`` states, evenly spaced (first and last included)."""
    if n_visited < 1:
        raise ValueError("the pilot needs at least one visited state")
    return sorted({int(i) for i in np.linspace(0, n_visited - 1, min(k, n_visited)).round()})


def _target_samples(out: torch.Tensor, target: str, v_range) -> torch.Tensor:
    """The target's samples from raw outputs (rows, |A|), as :class:`crop.smoothing.smoothed.SmoothedNetwork`
    makes them (first index on exact argmax ties)."""
    if target == "q":
        return out.clamp(*v_range)
    if target == "probs":
        return torch.softmax(out, dim=-1).clamp_(0.0, 1.0)
    return torch.zeros_like(out).scatter_(-1, out.argmax(-1, keepdim=True), 1.0)


def _predicted(samples: np.ndarray, raw_mean: np.ndarray, target: str, s: PilotSettings, rng) -> tuple[float, bool]:
    """Theorem 1's radius the certification would find if its m_cert samples looked like the pilot's."""
    lo, hi = TARGET_RANGE.get(target, s.v_range)
    fn, needs_samples = BOUNDS[s.bound]
    tiled = np.resize(samples, (s.cert_m, samples.shape[1]))   # the pilot's samples repeated to m_cert rows
    a_each = float(per_bound_alpha(s.cert_alpha, samples.shape[1]))
    mean, lower, upper = fn(tiled.sum(0), s.cert_m, lo, hi, a_each, tiled if needs_samples else None, rng=rng)
    est = Estimate(mean=mean, lower=np.clip(lower, lo, hi), upper=np.clip(upper, lo, hi), m=s.cert_m,
                   alpha=s.cert_alpha, bound=s.bound, raw_mean=raw_mean)
    cert = certify_estimate(est, s.sigma, lo, hi)
    return cert.radius, cert.certified


@torch.inference_mode()
def run_pilot(net: torch.nn.Module, states: np.ndarray, generator: torch.Generator, settings: PilotSettings) -> dict:
    """Each candidate's predicted LoAct radius on ``states`` (B, *obs_shape), noise from ``generator``.

    ``generator`` must be the qrange stage's own (a ``torch.Generator``, continuing its stream): the pilot
    takes no smoother, so the certification's noise cannot reach it.  Noise stream layout: state after state,
    ``m`` samples each, in pieces of ≤ ``chunk`` rows, one ``torch.randn`` call per piece."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"the pilot draws from the qrange stage's torch.Generator, not a {type(generator).__name__}")
    s = settings
    if "q" in s.targets and (s.v_range is None or not s.v_range[1] > s.v_range[0]):
        raise ValueError(f"the q target needs a V range v_min < v_max, got {s.v_range}")
    dev = generator.device
    x = torch.as_tensor(np.asarray(states, dtype=np.float32), device=dev)
    rng = np.random.default_rng(0x50494C4F54)  # clopper_pearson's rounding in the prediction only
    radii = {t: [] for t in s.targets}
    certified = {t: [] for t in s.targets}
    for b in range(len(x)):
        parts = []
        for r0 in range(0, s.m, s.chunk):
            rows = min(s.chunk, s.m - r0)
            noisy = torch.randn((rows, *x.shape[1:]), generator=generator, device=dev).mul_(s.sigma).add_(x[b])
            parts.append(net(noisy))
        out = torch.cat(parts)
        if not torch.isfinite(out).all():
            raise NonFiniteOutputError(f"the network returned NaN or inf at pilot state {b}")
        raw_mean = out.double().mean(0).cpu().numpy()
        for t in s.targets:
            r, c = _predicted(_target_samples(out, t, s.v_range).double().cpu().numpy(), raw_mean, t, s, rng)
            radii[t].append(r)
            certified[t].append(c)
    per = {t: {"mean_predicted_radius": float(np.mean(radii[t])),
               "certified_fraction": float(np.mean(certified[t]))} for t in s.targets}
    return {"chosen": choose_target({t: v["mean_predicted_radius"] for t, v in per.items()}),
            "candidates": list(s.targets), "predicted": per, "pilot_states": int(len(x)), "pilot_m": int(s.m),
            "cert_m": int(s.cert_m), "cert_alpha": float(s.cert_alpha), "bound": s.bound}


def choose_target(mean_radius: dict) -> str:
    """The target with the largest mean predicted radius; ties go to the first in :data:`TARGET_NAMES`
    (q, probs, vote)."""
    if not mean_radius:
        raise ValueError("no candidate targets")
    order = sorted(mean_radius, key=lambda t: (-mean_radius[t], TARGET_NAMES.index(t)))
    return order[0]
