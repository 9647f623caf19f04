"""Functional smoothing of a network: the smoothed Q-function Q̃ of Eq. (2), estimated by Monte Carlo.

``SmoothedNetwork`` estimates Q̃(s, a) = E_{Δ∼N(0,σ²I)} f(s + Δ, a) for every action from m fresh noise draws, with
confidence bounds that hold *simultaneously* for all actions: the inputs of Theorem 1's radius r_t, a lower
bound on the certified perturbation ε̄ of Definition 1 (:func:`crop.certify.loact.certify_estimate`).  The
smoothing *target* f is

* ``q``: the clipped Q-values clip(Q(s, a), V_min, V_max) (Theorem 1's Q: S × A → [V_min, V_max]; needs the
  V range, App. B.1);
* ``probs``: the action probabilities softmax(z(s))_a of a policy network's logits z;
* ``vote``: the one-hot 1{a = argmax_b z(s, b)} of the network's greedy action (randomized smoothing of the
  action itself; for a Q-network or a policy network).

``probs`` and ``vote`` lie in [0, 1] by construction, so Theorem 1 holds for them with [V_min, V_max] =
[0, 1] and no V-range estimate (**adapted Theorem 1**): let f: S → [0, 1]^|A| be any measurable function and
f̃ its Gaussian smoothing.  For every a, s ↦ σ·Φ⁻¹(f̃(s, a)) is 1-Lipschitz in ℓ2 (Lemma 3 of the appendix,
Salman et al. 2019; it needs only f(·, a) ∈ [0, 1]).  So if L ≤ f̃(s, a₁) and U(a) ≥ f̃(s, a) for every
a ≠ a₁, the smoothed policy π̃(s') = argmax_a f̃(s', a) takes a₁ at every s' with ‖s' − s‖₂ <
r = min_{a≠a₁} σ/2·(Φ⁻¹(L) − Φ⁻¹(U(a))), when r > 0.  For ``vote`` with two actions and U = 1 − L this is
Cohen et al.'s radius σ·Φ⁻¹(L); with more actions it is their two-sided form against every other action.
The samples of ``vote`` are Bernoulli, so the ``clopper_pearson`` bound is exact for it (its randomised
rounding does nothing to 0/1 samples).

Every call draws fresh noise from one seeded generator that keeps advancing: noise is never reused across
states (the official CROP code drew one noise bank and reused it for every state, which makes the per-state
certificates dependent).  The noise, the forward passes and the per-state sums run in
:class:`crop.smoothing.engine.Engine`, whose docstring states the noise stream layout that makes a run reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from crop.names import TARGET_NAMES, network_name
from crop.schema import default_of
from crop.smoothing import stats
from crop.smoothing.engine import Engine, Launched, Noise, check_noise

__all__ = ["SmoothedNetwork", "SmoothingSettings", "Estimate", "NonFiniteOutputError", "BOUNDS", "TARGETS",
           "TARGET_RANGE"]

#: The smoothing targets (see the module docstring).
TARGETS = TARGET_NAMES
#: The fixed range of the targets bounded by construction (``q`` clips to the estimated V range instead).
TARGET_RANGE = {"probs": (0.0, 1.0), "vote": (0.0, 1.0)}


class NonFiniteOutputError(FloatingPointError):
    """The smoothed network — a Q-network, a policy network or an actor — produced NaN or ±inf; the message
    names it as what it is (:func:`crop.names.network_name`) and where (the state, step or trajectory)."""


@dataclass
class Estimate:
    """Smoothed means of the target (clipped Q-values, probabilities or votes) and bounds that all hold
    together with prob ≥ 1 − alpha."""

    mean: np.ndarray   # (|A|,) float64
    lower: np.ndarray  # (|A|,)
    upper: np.ndarray  # (|A|,)
    m: int
    alpha: float       # total miscoverage of the whole set of bounds for this state
    bound: str
    raw_mean: np.ndarray | None = None  # (|A|,) means of the raw network outputs: only to break exact ties

    @property
    def action(self) -> int:
        """The smoothed policy's action: argmax of the Monte-Carlo means of the target (the paper's
        inference).  An exact tie — typically every sample of the tied actions clipped to the same end of
        [V_min, V_max], or two actions with the same vote count — is broken by the means of the raw network
        outputs (unclipped Q-values or logits) instead of always taking the first action.  A tied action is
        certified only through a failed bound, inside α: its lower bound cannot exceed the other's upper bound,
        except under ``clopper_pearson``, whose random rounding of ``probs`` samples can part two equal means
        (for truly equal means only when a bound fails: probability below α); outside that, certificates do
        not depend on this rule."""
        best = np.flatnonzero(self.mean == self.mean.max())
        if len(best) == 1 or self.raw_mean is None:
            return int(best[0])
        return int(best[np.argmax(self.raw_mean[best])])


def _hoeffding(total: np.ndarray, m: int, lo: float, hi: float, alpha_each, samples=None, rng=None):
    """Also for B states at once: ``total`` (B, |A|) with ``alpha_each`` (B, 1)."""
    mean = total / m
    if not isinstance(alpha_each, np.ndarray):
        d = stats.hoeffding_margin(hi - lo, m, alpha_each)
    elif (alpha_each == alpha_each.flat[0]).all():   # one alpha for every state (all but LoRe's family mode)
        d = stats.hoeffding_margin(hi - lo, m, float(alpha_each.flat[0]))
    else:
        d = np.vectorize(lambda v: stats.hoeffding_margin(hi - lo, m, float(v)))(alpha_each)
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
# Every function returns one-sided bounds at level alpha_each per side (see crop.smoothing.stats); the mean is always
# the plain Monte-Carlo mean, so the smoothed policy's action does not depend on the bound.  ``rng`` is the
# smoother's own generator for randomised rounding (clopper_pearson), independent of the noise.
BOUNDS = {
    "hoeffding": (_hoeffding, False),
    "empirical_bernstein": (_empirical_bernstein, True),
    "betting": (_betting, True),
    "clopper_pearson": (_clopper_pearson, True),
}


@dataclass(frozen=True)
class SmoothingSettings:
    """Every setting of the smoothed Q-function, named as in the paper: ``sigma`` (noise std), ``m`` (samples
    per state), ``v_min``/``v_max`` (clipping range, estimated beforehand from *independent* noise, Appendix
    B.1; [0, 1] for the targets ``probs`` and ``vote``), ``alpha`` (per-state miscoverage, split over the 2·|A|
    one-sided bounds, see :func:`crop.smoothing.stats.per_bound_alpha`), ``bound`` (the confidence bound,
    :data:`BOUNDS`), ``target`` (what is smoothed: ``q``, ``probs`` or ``vote``, see the module docstring; the
    noise stream does not depend on it).  ``chunk``, ``seed`` and ``device`` go to the
    :class:`crop.smoothing.engine.Engine` that draws the noise (:attr:`noise`).  Checked when made: a bad value raises
    ValueError naming it."""

    sigma: float
    m: int
    v_min: float
    v_max: float
    alpha: float
    bound: str = default_of("bound")
    target: str = "q"
    chunk: int = default_of("chunk")
    seed: int = 0
    device: str | torch.device | None = default_of("device")

    def __post_init__(self):
        sigma, m, alpha, v_min, v_max = self.sigma, self.m, self.alpha, self.v_min, self.v_max
        check_noise(sigma, m)
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if not (np.isfinite(v_min) and np.isfinite(v_max) and v_max > v_min):
            raise ValueError(f"need finite v_min < v_max, got [{v_min}, {v_max}]")
        if self.bound not in BOUNDS:
            raise ValueError(f"unknown bound {self.bound!r}; known: {sorted(BOUNDS)}")
        if self.target not in TARGETS:
            raise ValueError(f"unknown smoothing target {self.target!r}; known: {list(TARGETS)}")
        if self.target in TARGET_RANGE and (float(v_min), float(v_max)) != TARGET_RANGE[self.target]:
            # Theorem 1 needs the range the samples lie in; for these targets it is [0, 1], not an estimate.
            raise ValueError(f"target {self.target!r} lies in {list(TARGET_RANGE[self.target])}: give v_min, "
                             f"v_max = {TARGET_RANGE[self.target]}, got [{v_min}, {v_max}]")
        for name, kind in (("sigma", float), ("m", int), ("alpha", float), ("v_min", float), ("v_max", float)):
            object.__setattr__(self, name, kind(getattr(self, name)))

    @property
    def noise(self) -> Noise:
        """What the engine draws: σ, m and the stream (chunk, seed, device)."""
        return Noise(self.sigma, self.m, self.chunk, self.seed, self.device)


class Submitted:
    """A call of :meth:`SmoothedNetwork.submit` whose device work is queued; :meth:`result` gives its estimates."""

    def __init__(self, smoother: SmoothedNetwork, job: Launched, alphas: np.ndarray, indices, order: int):
        self._smoother, self._job, self._alphas, self._indices = smoother, job, alphas, indices
        self._order, self._result = order, None

    def result(self) -> list[Estimate]:
        if self._result is None:
            sm = self._smoother
            if sm._collected != self._order - 1:
                raise RuntimeError("results of SmoothedNetwork.submit must be taken in the order of submission")
            sm._collected += 1  # also when collecting raises (a NaN network output): the order moves on
            self._result = sm._estimates(self._job, self._alphas, self._indices)
        return self._result


def _of_settings(name: str) -> property:
    """``settings.NAME`` read as the smoother's own attribute."""
    return property(lambda self: getattr(self.settings, name), doc=f"``settings.{name}``")


class SmoothedNetwork:
    """Monte-Carlo estimate of a smoothed network in the style of Cohen et al.'s ``Smooth`` class: the mean under
    N(0, σ²I) of a bounded function of the network's output, for each of its ``n_actions`` outputs — the
    clipped Q-values (the smoothed Q-function Q̃ of Eq. (2)), the action probabilities of a policy network, or
    the one-hot of the greedy action (a vote), as ``settings.target`` says.  The smoothed policy is
    π̃(s) = argmax_a of that mean (:attr:`Estimate.action`); Theorem 1 holds for each, its range known.

    ``settings`` (:class:`SmoothingSettings`): σ, m, the V range, α, the bound, the target and the noise
    stream; ``n_actions``: |A|, the network's outputs.

    Several states at once (:meth:`estimate_batch`): B states cost B·m forward samples in as few launches as
    memory allows, and every state still gets its own m fresh draws.  :meth:`submit` queues a call and
    returns, so a caller can step environments while the card works.
    """

    #: σ, m, α, the V range, the target and the bound: the settings' own, read from them (never copied).
    sigma, m, alpha, v_min, v_max, target, bound = map(
        _of_settings, ("sigma", "m", "alpha", "v_min", "v_max", "target", "bound"))

    def __init__(self, net: torch.nn.Module, settings: SmoothingSettings, n_actions: int):
        self.settings = settings
        self.n_actions = int(n_actions)
        self.alpha_each = stats.per_bound_alpha(self.alpha, self.n_actions)
        self.engine = Engine(net, settings.noise, self.n_actions, self._samples,
                             keep_samples=BOUNDS[settings.bound][1])
        self.device, self.net = self.engine.device, self.engine.net
        # Randomised rounding (clopper_pearson) draws from its own stream, never from the noise generator.
        self.rounding_rng = np.random.default_rng([int(settings.seed) % 2**63, 0x524F554E44])
        self.calls = 0  # states smoothed so far
        self._submitted = self._collected = 0  # calls submitted / whose results were taken (in order)

    def estimate(self, obs, index=None, alpha: float | None = None) -> Estimate:
        """Means and simultaneous confidence bounds of Q̃(obs, ·) (Algorithm 1's estimate for one state): all
        2·|A| one-sided bounds hold together with probability ≥ 1 − ``alpha`` (default: the smoother's
        ``alpha``; LoRe's ``alpha_mode: family`` passes a per-state value from its schedule).  ``index``
        names the state in the error raised when the network returns NaN or inf."""
        if alpha is not None and not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        return self.estimate_batch(np.asarray(obs, dtype=np.float32)[None], [index], alpha)[0]

    def estimate_batch(self, obs_batch, indices=None, alpha=None) -> list[Estimate]:
        """:meth:`estimate` for B states in one go (m fresh draws each).  ``alpha``: None (the smoother's),
        one value for all states, or one per state."""
        return self.submit(obs_batch, indices, alpha).result()

    def submit(self, obs_batch, indices=None, alpha=None) -> Submitted:
        """:meth:`estimate_batch` in two halves: this queues the call's device work and returns at once;
        ``.result()`` waits for it and returns the estimates.  On a GPU the caller can step environments while
        the card works (LoAct's pipelined lockstep); on the CPU the work is done here.  Results are taken in
        the order the calls were submitted (the noise was drawn in that order, and clopper_pearson's
        rounding stream is used in it)."""
        n = len(obs_batch)
        if alpha is None:
            alphas = np.full(n, self.alpha)
        else:
            alphas = np.array(np.broadcast_to(np.asarray(alpha, dtype=np.float64), (n,)))
            for v in alphas:
                if not 0 < v < 1:
                    raise ValueError(f"alpha must be in (0, 1), got {v}")
        if indices is not None and len(indices) != n:
            raise ValueError(f"{len(indices)} indices for {n} states")
        job = self.engine.launch(obs_batch)
        self._submitted += 1
        return Submitted(self, job, alphas, indices, self._submitted)

    def _estimates(self, job: Launched, alphas: np.ndarray, indices) -> list[Estimate]:
        """The collected sums as means (Eq. (2)) and simultaneous bounds (α split by the union bound)."""
        totals, raws, finite, samples = self.engine.collect(job)
        bad = np.flatnonzero(~finite)
        if bad.size:
            b = int(bad[0])
            where = "" if indices is None or indices[b] is None else f" at state {indices[b]}"
            raise NonFiniteOutputError(f"the {network_name(self.net)} returned NaN or inf{where} (sigma={self.sigma})")
        self.calls += job.n
        fn, lo, hi, m = BOUNDS[self.bound][0], self.v_min, self.v_max, self.m
        a_each = stats.per_bound_alpha(alphas, self.n_actions)
        if samples is None:   # hoeffding: the bounds of every state in one array operation
            mean, lower, upper = fn(totals, m, lo, hi, a_each[:, None])
        else:
            parts = [fn(totals[b], m, lo, hi, float(a_each[b]), samples[b], rng=self.rounding_rng)
                     for b in range(len(totals))]
            mean, lower, upper = (np.stack(p) for p in zip(*parts))
        lower, upper, raw_mean = np.clip(lower, lo, hi), np.clip(upper, lo, hi), raws / m
        return [Estimate(mean=mean[b], lower=lower[b], upper=upper[b], m=m, alpha=float(alphas[b]),
                         bound=self.bound, raw_mean=raw_mean[b]) for b in range(len(totals))]

    def _samples(self, q: torch.Tensor, inplace: bool) -> torch.Tensor:
        """The target f's samples from the network outputs ``q`` (rows, |A|), all in [v_min, v_max]: clipped
        Q-values, softmax probabilities or the one-hot of the greedy action (first index on exact ties: a
        fixed function of the state, as the theorem needs).  ``inplace``: written into ``q``."""
        if self.target == "q":
            return q.clamp_(self.v_min, self.v_max) if inplace else q.clamp(self.v_min, self.v_max)
        if self.target == "probs":
            f = torch.softmax(q, dim=-1).clamp_(0.0, 1.0)
        else:
            f = torch.zeros_like(q).scatter_(-1, q.argmax(-1, keepdim=True), 1.0)
        return q.copy_(f) if inplace else f

    def get_state(self) -> dict:
        """Everything random about the smoother's future: the noise generator, the randomised-rounding
        stream and the call counter (a resumed search restores it with :meth:`set_state`)."""
        return {"generator": self.engine.generator.get_state(), "rounding": self.rounding_rng.bit_generator.state,
                "calls": self.calls}

    def set_state(self, state: dict) -> None:
        self.engine.generator.set_state(state["generator"])
        self.rounding_rng.bit_generator.state = state["rounding"]
        self.calls = state["calls"]
