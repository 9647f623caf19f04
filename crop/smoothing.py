"""Functional smoothing of a network (Eq. (2) of the paper) — the project's one hot loop.

``SmoothedQ`` estimates f̃(s, a) = E_{Δ∼N(0,σ²I)} f(s+Δ, a) for every action from m Monte-Carlo samples,
with confidence bounds that hold *simultaneously* for all actions.  The smoothing *target* f is

* ``q``: the clipped Q-values clip(Q(s, a), V_min, V_max) (the paper's Q̃; needs the V range, App. B.1);
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
rounding does nothing to 0/1 samples).  Every call draws
fresh noise from one seeded generator that keeps advancing: noise is never reused across states (the
official CROP code drew one noise bank and reused it for every state, which makes the per-state
certificates dependent).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from crop import stats
from crop.models.s2d import space_to_depth_input
from crop.names import TARGET_NAMES

__all__ = ["SmoothedQ", "Estimate", "NonFiniteQError", "resolve_device", "BOUNDS", "TARGETS", "TARGET_RANGE"]

#: The smoothing targets (see the module docstring).
TARGETS = TARGET_NAMES
#: The fixed range of the targets bounded by construction (``q`` clips to the estimated V range instead).
TARGET_RANGE = {"probs": (0.0, 1.0), "vote": (0.0, 1.0)}


class NonFiniteQError(FloatingPointError):
    """The network produced NaN or ±inf; the state index is in the message."""


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


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
# Every function returns one-sided bounds at level alpha_each per side (see crop.stats); the mean is always
# the plain Monte-Carlo mean, so the smoothed policy's action does not depend on the bound.  ``rng`` is the
# smoother's own generator for randomised rounding (clopper_pearson), independent of the noise.
BOUNDS = {
    "hoeffding": (_hoeffding, False),
    "empirical_bernstein": (_empirical_bernstein, True),
    "betting": (_betting, True),
    "clopper_pearson": (_clopper_pearson, True),
}


@dataclass
class _Launched:
    host: torch.Tensor         # (B, 2·|A| + 1) float64: clipped sums, unclipped sums, all-finite flag
    done: object               # CUDA event recorded after the copy to ``host`` (None on the CPU)
    kept: list | None          # per state the m × |A| clipped samples, when the bound needs them
    n: int
    indices: list | None


class Submitted:
    """A call of :meth:`SmoothedQ.submit` whose device work is queued; :meth:`result` gives its estimates."""

    def __init__(self, smoother: SmoothedQ, job: _Launched, alphas: np.ndarray, order: int):
        self._smoother, self._job, self._alphas, self._order = smoother, job, alphas, order
        self._result = None

    def result(self) -> list[Estimate]:
        if self._result is None:
            sm = self._smoother
            if sm._collected != self._order - 1:
                raise RuntimeError("results of SmoothedQ.submit must be taken in the order of submission")
            sm._collected += 1  # also when collecting raises (a NaN network output): the order moves on
            self._result = sm._estimates(self._job, self._alphas)
        return self._result


class _GraphCall:
    """One CUDA graph for a whole call of n states in one block: noise σ·z drawn into the graph's own buffer,
    the state added, forward, finiteness flags, unclipped and clipped sums — the eager path's kernels in its
    order.  The smoother's generator is registered with the graph, so each replay draws what the eager
    kernels would draw at that point of the stream and advances the generator alike (the capture itself
    leaves it where it was)."""

    def __init__(self, sm: SmoothedQ, n: int, shape: tuple, pool):
        dev, m, a_n = sm.device, sm.m, sm.n_actions
        self.x = torch.zeros((n, *shape), dtype=torch.float32, device=dev)

        def body(generator):
            fmt = torch.channels_last if sm._cl(len(shape) + 1) else torch.contiguous_format
            noise = torch.empty((n * m, *shape), dtype=torch.float32, device=dev, memory_format=fmt)
            noise.normal_(0.0, sm.sigma, generator=generator)
            noise.view(n, m, *shape).add_(self.x.unsqueeze(1))
            q = sm._fwd(noise)
            if q.shape != (n * m, a_n):
                raise ValueError(f"network output shape {tuple(q.shape)} != (batch, {a_n})")
            q3 = q.view(n, m, a_n)
            finite = torch.isfinite(q3).flatten(1).all(1)
            raw = q3.sum(1, dtype=torch.float64)
            total = sm._apply_target(q3, inplace=False).sum(1, dtype=torch.float64)
            return torch.cat([total, raw, finite.to(torch.float64).unsqueeze(1)], 1)

        # Warm-up on a side stream (cuBLAS workspaces) with a scratch generator: the stream is untouched.
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            body(torch.Generator(device=dev))
        torch.cuda.current_stream(dev).wait_stream(side)
        state = sm.generator.get_state()
        self.graph = torch.cuda.CUDAGraph()
        self.graph.register_generator_state(sm.generator)
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = body(sm.generator)
        sm.generator.set_state(state)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x, non_blocking=True)
        self.graph.replay()
        # The caller queues ``out``'s copy to the host right away, on this stream, so the next replay (which
        # overwrites it) runs after that copy.
        return self.out


class SmoothedQ:
    """Monte-Carlo estimate of the locally smoothed Q-function Q̃ (Eq. (2)), in the style of Cohen et
    al.'s ``Smooth`` class.

    Parameters mirror the paper: ``sigma`` (noise std), ``m`` (samples per state), ``v_min``/``v_max``
    (clipping range, estimated beforehand from *independent* noise, Appendix B.1; [0, 1] for the targets
    ``probs`` and ``vote``), ``alpha`` (per-state miscoverage, split over the 2·|A| one-sided bounds, see
    :func:`crop.stats.per_bound_alpha`), ``target`` (what is smoothed: ``q``, ``probs`` or ``vote``, see the
    module docstring; the noise stream does not depend on it).

    Several states at once (:meth:`estimate_batch`): B states cost B·m forward samples in as few launches as
    memory allows, and every state still gets its own m fresh draws.  **Noise stream layout** (what makes a
    CPU run byte-reproducible): one call — of one state or of B — draws its B·m noise samples from the one
    generator in *state-major order* (the m samples of the batch's first state, then the second's, …),
    block by block.  On the CPU a block is ``max(chunk, NOISE_BLOCK_FLOATS // obs_size)`` samples: whole
    states when that is ≥ m (⌊block/m⌋ of them per block), otherwise consecutive pieces of one state, never
    straddling two.  Within a block the normals are drawn in one ``normal_`` call into a contiguous
    (rows, *obs_shape) buffer.  A one-state call is the case B = 1 and draws exactly what it always did, so
    the numbers of a run depend on the seed and on how the states were grouped into calls — not on
    anything else.  The normals are drawn as σ·z by the normal kernel itself (the same floats as z then ·σ).

    On CUDA (reproducible on one card and torch version, like cuDNN itself): the block is the largest that
    fits memory; convolutional networks run in channels-last (input buffer and weights, noise drawn straight
    into that layout), and a strided input convolution runs as a stride-1 one on the space-to-depth input
    (:mod:`crop.models.s2d`: the noise is drawn in the (C·s², H/s, W/s) layout, a fixed permutation of the
    pixels, so Eq. (2) is unchanged); a call small enough to be launch-bound (an MLP's) is replayed as a CUDA
    graph, which draws exactly what the eager kernels would.  :meth:`submit` queues a call and returns, so a
    caller can step environments while the card works.
    """

    # Noise is drawn for a whole block of samples at once (up to this many floats, ~16 MB): interleaving a
    # single-threaded Gaussian draw with every multi-threaded forward chunk costs more than the draw.
    NOISE_BLOCK_FLOATS = 1 << 22
    #: CUDA graphs: calls of at most this many noise floats (B·m·obs size) are replayed as one graph; the
    #: number of graphs kept (one per batch size B, least recently used dropped).
    GRAPH_MAX_FLOATS = 1 << 25
    GRAPHS = 16
    #: Space-to-depth also for the later strided convolutions (each then unshuffles its activations: one
    #: copy), not only for the input layer: on an H200 the Nature CNN's forward at m = 10,000 took 3.89 ms
    #: against 5.54 ms with the input layer alone (6.45 ms channels-last, 9.36 ms contiguous).
    S2D_INNER = True

    def __init__(self, q_net: torch.nn.Module, sigma: float, m: int, v_min: float, v_max: float,
                 alpha: float, n_actions: int, *, bound: str = "hoeffding", chunk: int = 1000,
                 seed: int = 0, device: str | torch.device | None = "cpu", target: str = "q"):
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
        if target not in TARGETS:
            raise ValueError(f"unknown smoothing target {target!r}; known: {list(TARGETS)}")
        if target in TARGET_RANGE and (float(v_min), float(v_max)) != TARGET_RANGE[target]:
            # Theorem 1 needs the range the samples lie in; for these targets it is [0, 1], not an estimate.
            raise ValueError(f"target {target!r} lies in {list(TARGET_RANGE[target])}: give v_min, v_max = "
                             f"{TARGET_RANGE[target]}, got [{v_min}, {v_max}]")
        self.target = target
        self.device = resolve_device(device)
        self.q_net = q_net.to(self.device).eval()
        self.sigma, self.m, self.alpha = float(sigma), int(m), float(alpha)
        self.v_min, self.v_max = float(v_min), float(v_max)
        self.n_actions = int(n_actions)
        self.bound = bound
        self.chunk = self._chunk = max(1, min(int(chunk), self.m))  # _chunk: the caller's, kept for a new shape
        self.alpha_each = stats.per_bound_alpha(self.alpha, self.n_actions)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        # Randomised rounding (clopper_pearson) draws from its own stream, never from the noise generator.
        self.rounding_rng = np.random.default_rng([int(seed) % 2**63, 0x524F554E44])
        self.calls = 0  # states smoothed so far (for counters and confidence accounting)
        # Channels-last for convolutional networks on CUDA only (2.7× faster forward measured on an H200; on
        # the CPU it is not faster, and normal_ into a strided buffer is much slower there).  Tests force it
        # on the CPU, where the noise is then drawn contiguous and copied, so both layouts see the same noise.
        self.channels_last = self.device.type == "cuda" and _channels_last_ok(self.q_net)
        # Space-to-depth input layer (crop.models.s2d) where the channels-last path runs: the noisy samples
        # are made in that layout, and the strided first convolution becomes a stride-1 one.
        self.space_to_depth = self.channels_last
        self._fwd, self._s2d = self.q_net, 1  # the network that runs, and its space-to-depth factor
        self._shape = None     # observation shape the buffers were made for
        self._in_shape = None  # the network input's shape for it (after space-to-depth)
        self._rows = 0         # samples per block for that shape (CUDA: what fits in memory)
        self._buf = None       # (noise, q) buffers of ≥ the largest block used so far
        # CUDA graphs for small calls (MLPs: a call is a dozen launches of a few microseconds of work each).
        self.cuda_graphs = self.device.type == "cuda"
        self._graphs, self._graph_pool = {}, None
        self._submitted = self._collected = 0  # calls submitted / whose results were taken (in order)

    def _apply_target(self, q: torch.Tensor, inplace: bool) -> torch.Tensor:
        """The target's samples from the network outputs ``q`` (rows, |A|), all in [v_min, v_max]: clipped
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
        return {"generator": self.generator.get_state(), "rounding": self.rounding_rng.bit_generator.state,
                "calls": self.calls}

    def set_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.rounding_rng.bit_generator.state = state["rounding"]
        self.calls = state["calls"]

    @torch.inference_mode()
    def _cuda_rows(self, shape) -> int:
        """On a GPU the block adapts to free memory: the largest number of samples whose noise, input and
        activations fit in half of the memory free now, measured with a small probe forward."""
        per_in = 4 * int(np.prod(shape))
        probe = min(64, self.m)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        self._fwd(self._layout(torch.zeros((probe, *shape), device=self.device)))
        per_act = max(0, torch.cuda.max_memory_allocated(self.device) - base) / probe
        free, _ = torch.cuda.mem_get_info(self.device)
        fit = int(0.5 * free / (2 * per_in + per_act + 4 * self.n_actions))
        return max(1, self._chunk, fit)

    def _layout(self, t: torch.Tensor) -> torch.Tensor:
        return t.contiguous(memory_format=torch.channels_last) if self._cl(t.dim()) else t

    def _cl(self, dim: int) -> bool:
        return self.channels_last and dim == 4

    def _set_shape(self, shape: tuple) -> None:
        """For this observation shape: the network that runs (space-to-depth input layer where it applies),
        the shape of its input, the weights' layout (a CNN on CUDA: channels-last) and the block size."""
        if self._shape != shape:
            self._fwd, self._s2d, in_shape = self.q_net, 1, shape
            if self.space_to_depth:
                made = space_to_depth_input(self.q_net, shape, inner=self.S2D_INNER)
                if made is not None:
                    self._fwd, s = made
                    self._s2d, in_shape = s, (shape[0] * s * s, shape[1] // s, shape[2] // s)
            if self._cl(len(in_shape) + 1):
                self.q_net.to(memory_format=torch.channels_last)
                self._fwd.to(memory_format=torch.channels_last)
            if self.device.type == "cuda":
                self._rows = self._cuda_rows(in_shape)
                self.chunk = self._rows  # one forward per block: the GPU wants the biggest batch
            else:
                self._rows = max(self._chunk, self.NOISE_BLOCK_FLOATS // max(int(np.prod(in_shape)), 1))
            self._shape, self._in_shape, self._buf, self._graphs = shape, in_shape, None, {}

    def _buffers(self, shape: tuple, rows_wanted: int):
        """Noise and Q buffers of at least ``rows_wanted`` samples (grown, never shrunk)."""
        if self._buf is None or len(self._buf[0]) < rows_wanted:
            # CPU: contiguous (normal_ into a strided buffer is much slower); CUDA + conv: channels-last.
            fmt = torch.channels_last if self._cl(len(shape) + 1) and self.device.type == "cuda" \
                else torch.contiguous_format
            noise = torch.empty((rows_wanted, *shape), dtype=torch.float32, device=self.device, memory_format=fmt)
            q = torch.empty((rows_wanted, self.n_actions), dtype=torch.float32, device=self.device)
            self._buf = (noise, q)
        return self._buf

    def _blocks(self, n_states: int):
        """The stream layout: (first state, states in block, first sample, samples per state) per block."""
        m, rows = self.m, self._rows
        if rows >= m:
            per = rows // m
            for s0 in range(0, n_states, per):
                yield s0, min(per, n_states - s0), 0, m
        else:
            for s in range(n_states):
                for j0 in range(0, m, rows):
                    yield s, 1, j0, min(rows, m - j0)

    def clipped_sums_batch(self, obs_batch, indices=None) -> tuple[np.ndarray, list | None]:
        """Σ_i clip(Q(obs_b + Δ_{b,i})) over m fresh noise draws for each of the B states of ``obs_batch``
        (B × |A|, float64), and per state the m × |A| samples if the bound needs them (else None).  Raises
        :class:`NonFiniteQError` naming ``indices[b]`` of the first state whose network output is NaN/inf."""
        total, _, samples = self._collect(self._launch(obs_batch, indices))
        return total, samples

    def _to_device(self, obs_batch) -> torch.Tensor:
        arr = np.asarray(obs_batch, dtype=np.float32)
        if self.device.type != "cuda":
            return torch.as_tensor(arr)
        # Pinned and asynchronous: a pageable copy would wait for every launch queued before it (and so
        # for the other half of a pipelined lockstep, see :meth:`submit`).
        return torch.from_numpy(np.ascontiguousarray(arr)).pin_memory().to(self.device, non_blocking=True)

    @torch.inference_mode()
    def _launch(self, obs_batch, indices=None) -> _Launched:
        """Queue one call's device work: noise, forward, finiteness flags and the sums of the clipped and of
        the unclipped outputs, in one (B, 2·|A| + 1) float64 tensor whose copy to the host is queued too."""
        x = self._to_device(obs_batch)
        if x.dim() < 2:
            raise ValueError(f"a batch of states needs shape (B, *obs_shape), got {tuple(x.shape)}")
        n, shape = len(x), tuple(x.shape[1:])
        if indices is not None and len(indices) != n:
            raise ValueError(f"{len(indices)} indices for {n} states")
        self._set_shape(shape)
        if self._s2d > 1:  # the states in the input layer's layout; the noise is drawn in it too
            x = torch.nn.functional.pixel_unshuffle(x, self._s2d)
        if self._cl(x.dim()):  # as the noise: adding a state of another layout is a slow strided pass
            x = x.contiguous(memory_format=torch.channels_last)
        shape = self._in_shape
        plan = list(self._blocks(n))
        needs_samples = BOUNDS[self.bound][1]
        kept = None
        graph = self._graph(n, shape, plan, needs_samples)
        if graph is not None:
            res = graph.run(x)
        else:
            res, kept = self._eager(x, shape, plan, needs_samples)
        if self.device.type == "cuda":
            host = torch.empty(res.shape, dtype=res.dtype, pin_memory=True)
            host.copy_(res, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            host, done = res, None
        return _Launched(host, done, kept, n, indices)

    def _eager(self, x, shape, plan, needs_samples):
        n, a_n = len(x), self.n_actions
        noise, qbuf = self._buffers(shape, max(k * c for _, k, _, c in plan))
        total = torch.zeros((n, a_n), dtype=torch.float64, device=self.device)
        raw = torch.zeros((n, a_n), dtype=torch.float64, device=self.device)
        finite = torch.ones(n, dtype=torch.bool, device=self.device)
        kept = [[] for _ in range(n)] if needs_samples else None
        copy_cl = self._cl(x.dim()) and self.device.type != "cuda"  # forced on the CPU (tests)
        for s0, k, _, c in plan:
            rows = k * c
            noisy = noise[:rows]
            # σ·z drawn by the normal kernel itself (the same floats as z then ·σ), then one pass adds the state.
            noisy.normal_(0.0, self.sigma, generator=self.generator)
            if copy_cl:
                noisy = noisy.contiguous(memory_format=torch.channels_last)
            noisy.view(k, c, *shape).add_(x[s0:s0 + k].unsqueeze(1))
            q = qbuf[:rows]
            for s in range(0, rows, self.chunk):
                out = self._fwd(noisy[s:s + self.chunk])
                if out.shape != (min(self.chunk, rows - s), a_n):
                    raise ValueError(f"network output shape {tuple(out.shape)} != (batch, {a_n})")
                q[s:s + self.chunk] = out
            q3 = q.view(k, c, a_n)
            # One flag per state, checked when the results are collected: no device→host sync in this loop.
            finite[s0:s0 + k] &= torch.isfinite(q3).flatten(1).all(1)
            raw[s0:s0 + k] += q3.sum(1, dtype=torch.float64)
            self._apply_target(q, inplace=True)
            total[s0:s0 + k] += q3.sum(1, dtype=torch.float64)
            if kept is not None:
                for j, part in enumerate(q3.to(torch.float64).cpu()):
                    kept[s0 + j].append(part)
        res = torch.cat([total, raw, finite.to(torch.float64).unsqueeze(1)], 1)
        return res, None if kept is None else [torch.cat(p).numpy() for p in kept]

    def _collect(self, job: _Launched) -> tuple[np.ndarray, np.ndarray, list | None]:
        """Wait for a launched call; (sums of clipped outputs, sums of unclipped outputs, samples or None)."""
        if job.done is not None:
            job.done.synchronize()
        res = job.host.numpy()
        a_n = self.n_actions
        bad = np.flatnonzero(res[:, 2 * a_n] != 1.0)
        if bad.size:
            b = int(bad[0])
            where = "" if job.indices is None or job.indices[b] is None else f" at state {job.indices[b]}"
            raise NonFiniteQError(f"the Q-network returned NaN or inf{where} (sigma={self.sigma})")
        self.calls += job.n
        return res[:, :a_n].copy(), res[:, a_n:2 * a_n].copy(), job.kept

    def _graph(self, n, shape, plan, needs_samples):
        """The CUDA graph for calls of n states, when one applies: on CUDA, the whole call one block, small
        enough that launches (not arithmetic) are its cost, and no samples to copy back.  Made on first use
        (at most :attr:`GRAPHS` kept, sharing one memory pool)."""
        if not (self.cuda_graphs and self.device.type == "cuda") or needs_samples or len(plan) != 1 \
                or plan[0][1] != n or n * self.m * int(np.prod(shape)) > self.GRAPH_MAX_FLOATS:
            return None
        key = (n, shape)
        graph = self._graphs.pop(key, None)
        if graph is None:
            if len(self._graphs) >= self.GRAPHS:
                self._graphs.pop(next(iter(self._graphs)))  # least recently used
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            graph = _GraphCall(self, n, shape, self._graph_pool)
        self._graphs[key] = graph  # most recently used last
        return graph

    def clipped_sums(self, obs, index=None) -> tuple[np.ndarray, np.ndarray | None]:
        """Σ_i clip(Q(obs + Δ_i)) over m fresh noise draws (float64), and the samples if a bound needs
        them.  Raises :class:`NonFiniteQError` naming ``index`` on NaN/inf network output."""
        total, samples = self.clipped_sums_batch(np.asarray(obs, dtype=np.float32)[None], [index])
        return total[0], None if samples is None else samples[0]

    def estimate_batch(self, obs_batch, indices=None, alpha=None) -> list[Estimate]:
        """:meth:`estimate` for B states in one go (see the class docstring for the noise layout).  ``alpha``:
        None (the smoother's), one value for all states, or one per state."""
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
        job = self._launch(obs_batch, indices)
        self._submitted += 1
        return Submitted(self, job, alphas, self._submitted)

    def _estimates(self, job: _Launched, alphas: np.ndarray) -> list[Estimate]:
        totals, raws, samples = self._collect(job)
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

    def estimate(self, obs, index=None, alpha: float | None = None) -> Estimate:
        """Means and simultaneous confidence bounds of Q̃(obs, ·): all 2·|A| one-sided bounds hold together
        with probability ≥ 1 − ``alpha`` (default: the smoother's ``alpha``; LoRe's ``alpha_mode: family``
        passes a per-state value from its schedule)."""
        if alpha is not None and not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        return self.estimate_batch(np.asarray(obs, dtype=np.float32)[None], [index], alpha)[0]


# Modules whose forward works unchanged on channels-last inputs (nn.Flatten reshapes, so the Linear layers
# see the usual NCHW order).  Anything else (CARRL's bound propagation, unknown modules) stays contiguous.
_CL_SAFE = (torch.nn.Sequential, torch.nn.Conv2d, torch.nn.ReLU, torch.nn.Flatten, torch.nn.Linear)


def _channels_last_ok(net: torch.nn.Module) -> bool:
    from crop.models import DuelingCnn

    mods = list(net.modules())
    return any(isinstance(mod, torch.nn.Conv2d) for mod in mods) and \
        all(isinstance(mod, (*_CL_SAFE, DuelingCnn)) for mod in mods)
