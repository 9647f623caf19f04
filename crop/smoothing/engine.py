"""The device side of Eq. (2)'s Monte-Carlo estimate: noise, forward passes and per-state sums.

:class:`Engine` draws the m samples Δ ∼ N(0, σ²I) of each state, runs the network on s + Δ, turns the outputs
into the smoothing target's samples (a function :class:`~crop.smoothing.smoothed.SmoothedNetwork` gives) and returns per
state the sums of those samples and the sums of the raw outputs (to break exact ties; they also tell whether
every output was finite, see :meth:`Engine.collect`).  What the sums mean — bounds, radii — is
:mod:`crop.smoothing.smoothed`'s and :mod:`crop.certify.loact`'s.

**Noise stream layout** (what makes a CPU run byte-reproducible): one call — of one state or of B — draws
its B·m noise samples from the one generator in *state-major order* (the m samples of the batch's first
state, then the second's, …), block by block.  On the CPU a block is ``max(chunk, NOISE_BLOCK_FLOATS //
obs_size)`` samples: whole states when that is ≥ m (⌊block/m⌋ of them per block), otherwise consecutive
pieces of one state, never straddling two.  Within a block the normals are drawn in one ``normal_`` call
into a contiguous (rows, *obs_shape) buffer, as σ·z by the normal kernel itself (the same floats as z then
·σ).  A one-state call is the case B = 1, so the numbers of a run depend on the seed and on how the states
were grouped into calls — not on anything else.

On CUDA (reproducible on one card and torch version, like cuDNN itself): the block is the largest that fits
memory; convolutional networks run in channels-last (input buffer and weights, noise drawn straight into
that layout), and a strided input convolution runs as a stride-1 one on the space-to-depth input
(:mod:`crop.models.s2d`: the noise is drawn in the (C·s², H/s, W/s) layout, a fixed permutation of the
pixels, so Eq. (2) is unchanged); a call small enough to be launch-bound (an MLP's) is replayed as a CUDA
graph, which draws exactly what the eager kernels would.  :meth:`Engine.launch` queues a call and returns,
so a caller can step environments while the card works; :meth:`Engine.collect` waits for it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from crop.models.s2d import space_to_depth_input
from crop.schema import default_of

__all__ = ["Engine", "Launched", "Noise", "block_plan", "resolve_device", "check_noise"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def block_plan(n_states: int, m: int, rows: int):
    """The stream layout of one call: (first state, states in block, first sample, samples per state) per
    block of at most ``rows`` samples — ⌊rows/m⌋ whole states per block when rows ≥ m, else consecutive
    pieces of one state."""
    if rows >= m:
        per = rows // m
        for s0 in range(0, n_states, per):
            yield s0, min(per, n_states - s0), 0, m
    else:
        for s in range(n_states):
            for j0 in range(0, m, rows):
                yield s, 1, j0, min(rows, m - j0)


def check_noise(sigma, m, samples: str = "m") -> tuple[float, int]:
    """The check every smoothing setting makes of its noise N(0, σ²I) and its sample count ``m`` (named
    ``samples`` in the message): σ > 0 and m ≥ 1, else ValueError naming the field.  Returns them as float, int."""
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if int(m) < 1:
        raise ValueError(f"{samples} must be >= 1, got {m}")
    return float(sigma), int(m)


@dataclass(frozen=True)
class Noise:
    """The noise Eq. (2) averages over: ``m`` samples Δ ∼ N(0, σ²I) per state from one generator seeded with
    ``seed`` on ``device``; ``chunk``: samples per forward on the CPU."""

    sigma: float
    m: int
    chunk: int = default_of("chunk")
    seed: int = 0
    device: str | torch.device | None = default_of("device")

    def __post_init__(self):
        sigma, m = check_noise(self.sigma, self.m)
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "m", m)


@dataclass
class Launched:
    """A call whose device work is queued."""

    host: torch.Tensor         # (B, 2·|A|) float64: target sums, raw-output sums
    done: object               # CUDA event recorded after the copy to ``host`` (None on the CPU)
    kept: list | None          # per state the m × |A| target samples, when the engine keeps them
    n: int


class _GraphCall:
    """One CUDA graph for a whole call of n states in one block: noise σ·z drawn into the graph's own buffer,
    the state added, forward, raw and target sums — the eager path's kernels in its
    order.  The engine's generator is registered with the graph, so each replay draws what the eager kernels
    would draw at that point of the stream and advances the generator alike (the capture itself leaves it
    where it was)."""

    def __init__(self, eng: Engine, n: int, shape: tuple, pool):
        dev, m, a_n = eng.device, eng.m, eng.n_actions
        self.x = torch.zeros((n, *shape), dtype=torch.float32, device=dev)

        def body(generator):
            fmt = torch.channels_last if eng._cl(len(shape) + 1) else torch.contiguous_format
            noise = torch.empty((n * m, *shape), dtype=torch.float32, device=dev, memory_format=fmt)
            noise.normal_(0.0, eng.sigma, generator=generator)
            noise.view(n, m, *shape).add_(self.x.unsqueeze(1))
            q = eng._fwd(noise)
            if q.shape != (n * m, a_n):
                raise ValueError(f"network output shape {tuple(q.shape)} != (batch, {a_n})")
            q3 = q.view(n, m, a_n)
            raw = q3.sum(1, dtype=torch.float64)
            total = eng.target(q3, inplace=False).sum(1, dtype=torch.float64)
            return torch.cat([total, raw], 1)

        # Warm-up on a side stream (cuBLAS workspaces) with a scratch generator: the stream is untouched.
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            body(torch.Generator(device=dev))
        torch.cuda.current_stream(dev).wait_stream(side)
        state = eng.generator.get_state()
        self.graph = torch.cuda.CUDAGraph()
        self.graph.register_generator_state(eng.generator)
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = body(eng.generator)
        eng.generator.set_state(state)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x, non_blocking=True)
        self.graph.replay()
        # The caller queues ``out``'s copy to the host right away, on this stream, so the next replay (which
        # overwrites it) runs after that copy.
        return self.out


class Engine:
    """Noise, forward and sums for m samples per state (see the module docstring for the stream layout).

    ``net`` maps a batch of states to |A| outputs; ``noise``: σ, m, chunk, seed and device (:class:`Noise`);
    ``target(q, inplace)`` turns outputs (rows, |A|) into the target's samples (written into ``q`` when
    ``inplace``); ``keep_samples``: also return every state's m × |A| target samples (for the bounds that need
    them).
    """

    #: Noise is drawn for a whole block of samples at once (up to this many floats, ~16 MB): interleaving a
    #: single-threaded Gaussian draw with every multi-threaded forward chunk costs more than the draw.
    NOISE_BLOCK_FLOATS = 1 << 22
    #: CUDA graphs: calls of at most this many noise floats (B·m·obs size) are replayed as one graph; the
    #: number of graphs kept (one per batch size B, least recently used dropped).
    GRAPH_MAX_FLOATS = 1 << 25
    GRAPHS = 16
    #: Space-to-depth also for the later strided convolutions (each then unshuffles its activations: one
    #: copy), not only for the input layer: the stride-1 convolutions that result outrun the strided ones by
    #: more than the copies cost.
    S2D_INNER = True

    #: σ and m: the noise's own, read from it (never copied).
    sigma = property(lambda self: self.noise.sigma, doc="``noise.sigma``")
    m = property(lambda self: self.noise.m, doc="``noise.m``")

    def __init__(self, net: torch.nn.Module, noise: Noise, n_actions: int, target, *, keep_samples: bool = False):
        self.noise = noise
        self.device = resolve_device(noise.device)
        self.net = net.to(self.device).eval()
        self.n_actions = int(n_actions)
        self.target, self.keep_samples = target, bool(keep_samples)
        self.chunk = self._chunk = max(1, min(int(noise.chunk), self.m))  # _chunk: the caller's, kept for a new shape
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(noise.seed))
        # Channels-last for convolutional networks on CUDA only: the GPU's convolution kernels are fastest in
        # it, while on the CPU normal_ into a strided buffer is slow.  Tests force it on the CPU, where the
        # noise is then drawn contiguous and copied, so both layouts see the same noise.
        self.channels_last = self.device.type == "cuda" and _channels_last_ok(self.net)
        # Space-to-depth input layer (crop.models.s2d) where the channels-last path runs: the noisy samples
        # are made in that layout, and the strided first convolution becomes a stride-1 one.
        self.space_to_depth = self.channels_last
        self._fwd, self._s2d = self.net, 1  # the network that runs, and its space-to-depth factor
        self._shape = None     # observation shape the buffers were made for
        self._in_shape = None  # the network input's shape for it (after space-to-depth)
        self._rows = 0         # samples per block for that shape (CUDA: what fits in memory)
        self._buf = None       # (noise, q, q in float64) buffers of ≥ the largest block used so far
        # CUDA graphs for small calls (an MLP's call is a dozen launches of tiny kernels).
        self.cuda_graphs = self.device.type == "cuda"
        self._graphs, self._graph_pool = {}, None

    @torch.inference_mode()
    def launch(self, obs_batch) -> Launched:
        """Queue one call's device work for the B states of ``obs_batch``: noise, forward and the sums of the
        target's and of the raw outputs, in one (B, 2·|A|) float64 tensor whose copy to the host is queued
        too."""
        x = self._to_device(obs_batch)
        if x.dim() < 2:
            raise ValueError(f"a batch of states needs shape (B, *obs_shape), got {tuple(x.shape)}")
        n, shape = len(x), tuple(x.shape[1:])
        self._set_shape(shape)
        if self._s2d > 1:  # the states in the input layer's layout; the noise is drawn in it too
            x = torch.nn.functional.pixel_unshuffle(x, self._s2d)
        if self._cl(x.dim()):  # as the noise: adding a state of another layout is a slow strided pass
            x = x.contiguous(memory_format=torch.channels_last)
        shape = self._in_shape
        plan = list(block_plan(n, self.m, self._rows))
        kept = None
        graph = self._graph(n, shape, plan)
        if graph is not None:
            res = graph.run(x)
        else:
            res, kept = self._eager(x, shape, plan)
        if self.device.type == "cuda":
            host = torch.empty(res.shape, dtype=res.dtype, pin_memory=True)
            host.copy_(res, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            host, done = res, None
        return Launched(host, done, kept, n)

    def collect(self, job: Launched) -> tuple[np.ndarray, np.ndarray, np.ndarray, list | None]:
        """Wait for a launched call: per state the sums of the target's samples and of the raw outputs
        (B × |A|, float64), whether all its outputs were finite (B,), and its samples (None unless kept).

        Finiteness is read off the raw sums: a float64 sum of float32 outputs is finite exactly when every
        output is (NaN and ±inf propagate through additions, and m·3.4e38 stays far below float64's 1.8e308),
        so no pass over the samples is needed for it."""
        if job.done is not None:
            job.done.synchronize()
        res = job.host.numpy()
        a_n = self.n_actions
        total, raw = res[:, :a_n].copy(), res[:, a_n:].copy()
        return total, raw, np.isfinite(raw).all(1), job.kept

    # ---- layout and block plan ----------------------------------------------------------------------------

    def _to_device(self, obs_batch) -> torch.Tensor:
        arr = np.asarray(obs_batch, dtype=np.float32)
        if self.device.type != "cuda":
            return torch.as_tensor(arr)
        # Pinned and asynchronous: a pageable copy would wait for every launch queued before it (and so
        # for the other half of a pipelined lockstep, see crop.certify.loact).
        return torch.from_numpy(np.ascontiguousarray(arr)).pin_memory().to(self.device, non_blocking=True)

    def _cl(self, dim: int) -> bool:
        return self.channels_last and dim == 4

    def _layout(self, t: torch.Tensor) -> torch.Tensor:
        return t.contiguous(memory_format=torch.channels_last) if self._cl(t.dim()) else t

    def _set_shape(self, shape: tuple) -> None:
        """For this observation shape: the network that runs (space-to-depth input layer where it applies),
        the shape of its input, the weights' layout (a CNN on CUDA: channels-last) and the block size."""
        if self._shape != shape:
            self._fwd, self._s2d, in_shape = self.net, 1, shape
            if self.space_to_depth:
                made = space_to_depth_input(self.net, shape, inner=self.S2D_INNER)
                if made is not None:
                    self._fwd, s = made
                    self._s2d, in_shape = s, (shape[0] * s * s, shape[1] // s, shape[2] // s)
            if self._cl(len(in_shape) + 1):
                self.net.to(memory_format=torch.channels_last)
                self._fwd.to(memory_format=torch.channels_last)
            if self.device.type == "cuda":
                self._rows = self._cuda_rows(in_shape)
                self.chunk = self._rows  # one forward per block: the GPU wants the biggest batch
            else:
                self._rows = max(self._chunk, self.NOISE_BLOCK_FLOATS // max(int(np.prod(in_shape)), 1))
            self._shape, self._in_shape, self._buf, self._graphs = shape, in_shape, None, {}

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

    # ---- the two ways a call runs -------------------------------------------------------------------------

    def _buffers(self, shape: tuple, rows_wanted: int):
        """Noise and output buffers of at least ``rows_wanted`` samples (grown, never shrunk).  Kept across
        calls, so that a call allocates nothing of the block's size besides the network's own activations: a
        large temporary freed at the top of the C heap is handed back to the kernel (glibc's trim), and the
        next forward then pays a page fault per 4 KiB of fresh memory — on the CPU that cost more than
        everything else the step adds to the forward."""
        if self._buf is None or len(self._buf[0]) < rows_wanted:
            # CPU: contiguous (normal_ into a strided buffer is slow there); CUDA + conv: channels-last.
            fmt = torch.channels_last if self._cl(len(shape) + 1) and self.device.type == "cuda" \
                else torch.contiguous_format
            noise = torch.empty((rows_wanted, *shape), dtype=torch.float32, device=self.device, memory_format=fmt)
            q = torch.empty((rows_wanted, self.n_actions), dtype=torch.float32, device=self.device)
            q64 = torch.empty((rows_wanted, self.n_actions), dtype=torch.float64, device=self.device)
            self._buf = (noise, q, q64)
        return self._buf

    def _eager(self, x, shape, plan):
        n, a_n = len(x), self.n_actions
        noise, qbuf, q64buf = self._buffers(shape, max(k * c for _, k, _, c in plan))
        total = torch.zeros((n, a_n), dtype=torch.float64, device=self.device)
        raw = torch.zeros((n, a_n), dtype=torch.float64, device=self.device)
        kept = [[] for _ in range(n)] if self.keep_samples else None
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
                del out  # freed before the next forward allocates (see _buffers)
            q3, q64 = q.view(k, c, a_n), q64buf[:rows].view(k, c, a_n)
            # The sums in float64: what q3.sum(1, dtype=torch.float64) computes (it converts, then reduces),
            # converted into the kept buffer instead of a temporary.  Non-finite outputs show in the raw sums,
            # checked when the results are collected (no device→host sync here).
            raw[s0:s0 + k] += q64.copy_(q3).sum(1)
            self.target(q, inplace=True)
            total[s0:s0 + k] += q64.copy_(q3).sum(1)
            if kept is not None:
                for j, part in enumerate(q64.to("cpu", copy=True)):
                    kept[s0 + j].append(part)
        res = torch.cat([total, raw], 1)
        return res, None if kept is None else [torch.cat(p).numpy() for p in kept]

    def _graph(self, n, shape, plan):
        """The CUDA graph for calls of n states, when one applies: on CUDA, the whole call one block, small
        enough that launches (not arithmetic) are its cost, and no samples to copy back.  Made on first use
        (at most :attr:`GRAPHS` kept, sharing one memory pool)."""
        if not (self.cuda_graphs and self.device.type == "cuda") or self.keep_samples or len(plan) != 1 \
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


# Modules whose forward works unchanged on channels-last inputs (nn.Flatten reshapes, so the Linear layers
# see the usual NCHW order).  Anything else (CARRL's bound propagation, unknown modules) stays contiguous.
_CL_SAFE = (torch.nn.Sequential, torch.nn.Conv2d, torch.nn.ReLU, torch.nn.Flatten, torch.nn.Linear)


def _channels_last_ok(net: torch.nn.Module) -> bool:
    from crop.models import DuelingCnn

    mods = list(net.modules())
    return any(isinstance(mod, torch.nn.Conv2d) for mod in mods) and \
        all(isinstance(mod, (*_CL_SAFE, DuelingCnn)) for mod in mods)
