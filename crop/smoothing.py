"""Functional smoothing of a Q-network (Eq. (2) of the paper) — the project's one hot loop.

``SmoothedQ`` estimates Q̃(s, a) = E_{Δ∼N(0,σ²I)} clip(Q(s+Δ, a), V_min, V_max) for every action from m
Monte-Carlo samples, with confidence bounds that hold *simultaneously* for all actions.  Every call draws
fresh noise from one seeded generator that keeps advancing: noise is never reused across states (the
official CROP code drew one noise bank and reused it for every state, which makes the per-state
certificates dependent).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from crop import stats

__all__ = ["SmoothedQ", "Estimate", "NonFiniteQError", "resolve_device", "BOUNDS"]


class NonFiniteQError(FloatingPointError):
    """The network produced NaN or ±inf; the state index is in the message."""


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@dataclass
class Estimate:
    """Smoothed means of the clipped Q-values and bounds that all hold together with prob ≥ 1 − alpha."""

    mean: np.ndarray   # (|A|,) float64
    lower: np.ndarray  # (|A|,)
    upper: np.ndarray  # (|A|,)
    m: int
    alpha: float       # total miscoverage of the whole set of bounds for this state
    bound: str

    @property
    def action(self) -> int:
        """The smoothed policy's action: argmax of the Monte-Carlo means (the paper's inference)."""
        return int(np.argmax(self.mean))


def _hoeffding(total: np.ndarray, m: int, lo: float, hi: float, alpha_each: float, samples=None, rng=None):
    mean = total / m
    d = stats.hoeffding_margin(hi - lo, m, alpha_each)
    return mean, np.clip(mean - d, lo, hi), np.clip(mean + d, lo, hi)


def _empirical_bernstein(total, m, lo, hi, alpha_each, samples, rng=None):
    return (total / m, *stats.empirical_bernstein_bounds(samples, lo, hi, alpha_each))


def _betting(total, m, lo, hi, alpha_each, samples, rng=None):
    return (total / m, *stats.betting_bounds(samples, lo, hi, alpha_each))


def _clopper_pearson(total, m, lo, hi, alpha_each, samples, rng=None):
    if rng is None:
        raise ValueError("the clopper_pearson bound needs its own seeded generator for the random rounding")
    return (total / m, *stats.clopper_pearson_bounds(samples, lo, hi, alpha_each, rng))


# name -> (function(total, m, lo, hi, alpha_each, samples, rng) -> (mean, lower, upper), needs_samples).
# Every function returns one-sided bounds at level alpha_each per side (see crop.stats); the mean is always
# the plain Monte-Carlo mean, so the smoothed policy's action does not depend on the bound.  ``rng`` is the
# smoother's own generator for randomised rounding (clopper_pearson), independent of the noise.
BOUNDS = {
    "hoeffding": (_hoeffding, False),
    "empirical_bernstein": (_empirical_bernstein, True),
    "betting": (_betting, True),
    "clopper_pearson": (_clopper_pearson, True),
}


class SmoothedQ:
    """Monte-Carlo estimate of the locally smoothed Q-function Q̃ (Eq. (2)), in the style of Cohen et
    al.'s ``Smooth`` class.

    Parameters mirror the paper: ``sigma`` (noise std), ``m`` (samples per state), ``v_min``/``v_max``
    (clipping range, estimated beforehand from *independent* noise, Appendix B.1), ``alpha`` (per-state
    miscoverage, split over the 2·|A| one-sided bounds, see :func:`crop.stats.per_bound_alpha`).
    """

    def __init__(self, q_net: torch.nn.Module, sigma: float, m: int, v_min: float, v_max: float,
                 alpha: float, n_actions: int, *, bound: str = "hoeffding", chunk: int = 1000,
                 seed: int = 0, device: str | torch.device | None = "cpu"):
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        if m < 1:
            raise ValueError(f"m must be >= 1, got {m}")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if not (np.isfinite(v_min) and np.isfinite(v_max) and v_max > v_min):
            raise ValueError(f"need finite v_min < v_max, got [{v_min}, {v_max}]")
        if bound not in BOUNDS:
            raise ValueError(f"unknown bound {bound!r}; known: {sorted(BOUNDS)}")
        self.device = resolve_device(device)
        self.q_net = q_net.to(self.device).eval()
        self.sigma, self.m, self.alpha = float(sigma), int(m), float(alpha)
        self.v_min, self.v_max = float(v_min), float(v_max)
        self.n_actions = int(n_actions)
        self.bound = bound
        self.chunk = max(1, min(int(chunk), self.m))
        self.alpha_each = stats.per_bound_alpha(self.alpha, self.n_actions)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        # Randomised rounding (clopper_pearson) draws from its own stream, never from the noise generator.
        self.rounding_rng = np.random.default_rng([int(seed) % 2**63, 0x524F554E44])
        self.calls = 0  # states smoothed so far (for counters and confidence accounting)
        self._buf = None

    def get_state(self) -> dict:
        """Everything random about the smoother's future: the noise generator, the randomised-rounding
        stream and the call counter (a resumed search restores it with :meth:`set_state`)."""
        return {"generator": self.generator.get_state(), "rounding": self.rounding_rng.bit_generator.state,
                "calls": self.calls}

    def set_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.rounding_rng.bit_generator.state = state["rounding"]
        self.calls = state["calls"]

    # Noise is drawn for a whole block of samples at once (up to this many floats, ~16 MB): interleaving a
    # single-threaded Gaussian draw with every multi-threaded forward chunk costs more than the draw.
    NOISE_BLOCK_FLOATS = 1 << 22

    @torch.inference_mode()
    def _cuda_chunk(self, shape) -> int:
        """On a GPU the batch adapts to free memory: the largest chunk (≤ m) whose noise, input and
        activations fit in half of the memory free now, measured with a small probe forward."""
        per_in = 4 * int(np.prod(shape))
        probe = min(64, self.m)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        self.q_net(torch.zeros((probe, *shape), device=self.device))
        per_act = max(0, torch.cuda.max_memory_allocated(self.device) - base) / probe
        free, _ = torch.cuda.mem_get_info(self.device)
        fit = int(0.5 * free / (2 * per_in + per_act + 4 * self.n_actions))
        return max(1, min(self.m, max(self.chunk, fit)))

    def _buffers(self, shape):
        if self._buf is None or self._buf[0].shape[1:] != shape:
            per = int(np.prod(shape))
            if self.device.type == "cuda":
                self.chunk = self._cuda_chunk(shape)
                block = self.chunk
            else:
                block = min(self.m, max(self.chunk, self.NOISE_BLOCK_FLOATS // max(per, 1)))
            # Contiguous (never channels_last): normal_ into a strided buffer is much slower.
            noise = torch.empty((block, *shape), dtype=torch.float32, device=self.device)
            q = torch.empty((block, self.n_actions), dtype=torch.float32, device=self.device)
            self._buf = (noise, q)
        return self._buf

    @torch.inference_mode()
    def clipped_sums(self, obs, index=None) -> tuple[np.ndarray, np.ndarray | None]:
        """Σ_i clip(Q(obs + Δ_i)) over m fresh noise draws (float64), and the samples if a bound needs
        them.  Raises :class:`NonFiniteQError` naming ``index`` on NaN/inf network output."""
        x = torch.as_tensor(np.asarray(obs, dtype=np.float32), device=self.device)
        noise, qbuf = self._buffers(tuple(x.shape))
        needs_samples = BOUNDS[self.bound][1]
        total = torch.zeros(self.n_actions, dtype=torch.float64, device=self.device)
        kept = [] if needs_samples else None
        done = 0
        while done < self.m:
            b = min(len(noise), self.m - done)
            noisy = noise[:b]
            torch.randn(noisy.shape, generator=self.generator, out=noisy)
            noisy.mul_(self.sigma).add_(x)
            q = qbuf[:b]
            for s in range(0, b, self.chunk):
                out = self.q_net(noisy[s:s + self.chunk])
                if out.shape != (min(self.chunk, b - s), self.n_actions):
                    raise ValueError(f"network output shape {tuple(out.shape)} != (batch, {self.n_actions})")
                q[s:s + self.chunk] = out
            if not torch.isfinite(q).all():
                where = "" if index is None else f" at state {index}"
                raise NonFiniteQError(f"the Q-network returned NaN or inf{where} (sigma={self.sigma})")
            q.clamp_(self.v_min, self.v_max)
            total += q.sum(0, dtype=torch.float64)
            if kept is not None:
                kept.append(q.to(torch.float64).cpu())
            done += b
        self.calls += 1
        samples = torch.cat(kept).numpy() if kept is not None else None
        return total.cpu().numpy(), samples

    def estimate(self, obs, index=None, alpha: float | None = None) -> Estimate:
        """Means and simultaneous confidence bounds of Q̃(obs, ·): all 2·|A| one-sided bounds hold together
        with probability ≥ 1 − ``alpha`` (default: the smoother's ``alpha``; LoRe's ``alpha_mode: family``
        passes a per-state value from its schedule)."""
        if alpha is None:
            alpha, alpha_each = self.alpha, self.alpha_each
        else:
            if not 0 < alpha < 1:
                raise ValueError(f"alpha must be in (0, 1), got {alpha}")
            alpha_each = stats.per_bound_alpha(alpha, self.n_actions)
        total, samples = self.clipped_sums(obs, index)
        fn = BOUNDS[self.bound][0]
        mean, lower, upper = fn(total, self.m, self.v_min, self.v_max, alpha_each, samples, rng=self.rounding_rng)
        lower = np.clip(lower, self.v_min, self.v_max)
        upper = np.clip(upper, self.v_min, self.v_max)
        return Estimate(mean=mean, lower=lower, upper=upper, m=self.m, alpha=float(alpha), bound=self.bound)
