"""Atari (ale-py, gymnasium 1.x) with the preprocessing of each checkpoint family, and faithful snapshots.

Preprocessing is a property of the *checkpoint*; each profile reproduces the wrapper chain its network
was trained with, in the gymnasium API:

``cleanrl`` (CROP's own retrains, OpenAI-baselines style)
    30 random no-ops on reset, frame skip 4 with max-pool over the last 2 RGB frames, FIRE on reset where
    the game has it, grayscale (cv2 RGB→GRAY), 84×84 (INTER_AREA), 4-frame stack (channels first), reward
    sign-clipped, pixels / 255.  Observation 4×84×84.
``sa_dqn`` (chenhongge/SA_DQN release: ``common/wrappers.py``, ``config/*.json``)
    the same skip/max-pool and FIRE, one grayscale frame, *central crop* (pad 4 columns each side, keep
    168 rows from 21 + crop_shift; Pong crop_shift = 10, Freeway 0), 84×84 INTER_AREA, the first
    ``restrict_actions`` actions (Pong: 4), no frame stack, pixels / 255, and SA-DQN's ``np.swapaxes(obs,
    2, 0)``: the network sees the frame *transposed* (1×W×H).  Observation 1×84×84.
``radial`` (tuomaso/radial_rl ``DQN/environment.py``)
    frame skip 4 with max-pool over the last *3* frames (a deque that also holds the reset frame), FIRE,
    rows 34…194 and columns 0…160, mean of the RGB channels, / 255, cv2.resize to 80×80 (twice, as the
    original does), full action set.  Observation 1×80×80.

Life loss never ends an episode here (the paper evaluates whole games; Pong and Freeway have no lives).

Snapshots: ``copy.deepcopy`` of an Atari env silently gives a fresh emulator at frame 0.  A faithful
snapshot is ``ale.cloneState(include_rng=True)`` plus the Python state of every wrapper (frame-stack queue,
max-pool buffer, …) and of the base env's RNG.
"""
from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

import cv2
import gymnasium as gym
import numpy as np

cv2.ocl.setUseOpenCL(False)

__all__ = ["ATARI_PROFILES", "make_atari", "AtariSnapshot", "atari_snapshot", "atari_restore", "is_atari",
           "AtariPool", "keep_rom_loaded"]

# profile -> settings; `*_pong`/`*_freeway` variants carry the per-game options of the published configs
ATARI_PROFILES = {
    "cleanrl": dict(kind="cleanrl"),
    "sa_dqn_pong": dict(kind="sa_dqn", crop_shift=10, restrict_actions=4),
    "sa_dqn_freeway": dict(kind="sa_dqn", crop_shift=0, restrict_actions=0),
    "radial": dict(kind="radial", crop1=34, crop2=34, dimension2=80),
}


class NoopReset(gym.Wrapper):
    """1…noop_max no-ops after reset, drawn from the env's seeded RNG (baselines' NoopResetEnv)."""

    def __init__(self, env, noop_max=30):
        super().__init__(env)
        self.noop_max = noop_max
        assert env.unwrapped.get_action_meanings()[0] == "NOOP"

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        noops = int(self.unwrapped.np_random.integers(1, self.noop_max + 1))
        for _ in range(noops):
            obs, _, term, trunc, info = self.env.step(0)
            if term or trunc:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Repeat the action ``skip`` times, sum rewards, max-pool the last ``pool`` RGB frames.

    ``pool=2`` is baselines' MaxAndSkipEnv (frames skip−2 and skip−1 of this step); ``pool=3`` with
    ``keep_reset_frame`` is RADIAL-RL's deque(maxlen=3) that persists across steps.
    """

    def __init__(self, env, skip=4, pool=2, rolling=False):
        super().__init__(env)
        self.skip, self.pool, self.rolling = skip, pool, rolling
        self.frames = deque(maxlen=pool)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.frames.clear()
        if self.rolling:
            self.frames.append(obs)
        return obs, info

    def step(self, action):
        total, term, trunc, info = 0.0, False, False, {}
        if not self.rolling:
            self.frames.clear()
        obs = None
        for i in range(self.skip):
            obs, r, term, trunc, info = self.env.step(action)
            total += float(r)
            if self.rolling or i >= self.skip - self.pool:
                self.frames.append(obs)
            if term or trunc:
                break
        if not self.frames:  # the episode ended before a pooled frame: use the last one
            self.frames.append(obs)
        return np.max(np.stack(self.frames), axis=0), total, term, trunc, info


class FireReset(gym.Wrapper):
    """Press FIRE (and then action 2) after reset, for games that wait for it."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, term, trunc, info = self.env.step(1)
        if term or trunc:
            self.env.reset(**kwargs)
        obs, _, term, trunc, info = self.env.step(2)
        if term or trunc:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class RestrictActions(gym.ActionWrapper):
    """Only the first n actions (SA-DQN's RestrictedActionEnv)."""

    def __init__(self, env, n):
        super().__init__(env)
        self.action_space = gym.spaces.Discrete(n)

    def action(self, a):
        return int(a)


class SignReward(gym.RewardWrapper):
    def reward(self, r):
        return float(np.sign(r))


class ProcessFrame(gym.ObservationWrapper):
    """RGB frame → the network's input for one profile (float32)."""

    def __init__(self, env, kind, **opts):
        super().__init__(env)
        self.kind, self.opts = kind, opts
        if kind == "cleanrl":
            shape, dtype = (1, 84, 84), np.uint8
        elif kind == "sa_dqn":
            shape, dtype = (1, 84, 84), np.uint8
        elif kind == "radial":
            shape, dtype = (1, 80, 80), np.float32
        else:
            raise ValueError(f"unknown Atari preprocessing {kind!r}")
        self.observation_space = gym.spaces.Box(0, 255 if dtype == np.uint8 else 1, shape, dtype)

    def observation(self, frame):
        if self.kind == "cleanrl":
            g = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
            return cv2.resize(g, (84, 84), interpolation=cv2.INTER_AREA)[None]
        if self.kind == "sa_dqn":
            g = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
            pad = np.zeros((g.shape[0], 4), g.dtype)
            g = np.concatenate((pad, g, pad), axis=1)            # 210 × 168
            h, w = g.shape
            off = (h - w) // 2
            shift = self.opts.get("crop_shift", 0)
            g = g[off + shift:h - off + shift]                  # 168 × 168
            g = cv2.resize(g, (84, 84), interpolation=cv2.INTER_AREA)
            return np.ascontiguousarray(g.T[None])              # SA-DQN's swapaxes(obs, 2, 0): 1 × W × H
        # radial
        c1, c2, d2 = self.opts["crop1"], self.opts["crop2"], self.opts["dimension2"]
        f = frame[c1:c2 + 160, :160].mean(2).astype(np.float32) * (1.0 / 255.0)
        f = cv2.resize(f, (80, d2))
        f = cv2.resize(f, (80, 80))
        return f.reshape(1, 80, 80)


class FrameStack(gym.Wrapper):
    """Stack the last k frames along the channel axis (channels first)."""

    def __init__(self, env, k):
        super().__init__(env)
        self.k = k
        self.frames = deque(maxlen=k)
        s = env.observation_space
        self.observation_space = gym.spaces.Box(0, 255, (k * s.shape[0], *s.shape[1:]), s.dtype)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.k):
            self.frames.append(obs)
        return np.concatenate(self.frames, 0), info

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        self.frames.append(obs)
        return np.concatenate(self.frames, 0), r, term, trunc, info


class ToFloat(gym.ObservationWrapper):
    """Pixels / 255 as float32 — the space in which noise is added."""

    def __init__(self, env, scale):
        super().__init__(env)
        self.scale = scale
        self.observation_space = gym.spaces.Box(0.0, 1.0, env.observation_space.shape, np.float32)

    def observation(self, obs):
        return np.asarray(obs, dtype=np.float32) * self.scale


def make_atari(env_id: str, profile: str) -> gym.Env:
    """``env_id`` (``<Game>NoFrameskip-v4`` or ``ALE/<Game>-v5``) with the wrapper chain of ``profile``.  A v5
    id is made with frameskip=1 (MaxAndSkip skips 4, as SB3's AtariWrapper on v5 with ``frameskip=1``) and the
    sticky-action probability of the profile (``cleanrl``: 0.25, v5's default; ``cleanrl:sticky=P``: P); the
    sticky actions draw from the emulator's own seeded generator, which snapshots include."""
    import ale_py

    from crop.envs import sticky_probability

    gym.register_envs(ale_py)
    sticky = sticky_probability(env_id, profile)
    base = profile.split(":", 1)[0] if sticky is not None else profile
    if base not in ATARI_PROFILES:
        raise ValueError(f"{env_id}: unknown Atari profile {profile!r}; known: {sorted(ATARI_PROFILES)}")
    opts = dict(ATARI_PROFILES[base])
    kind = opts.pop("kind")
    kwargs = {} if sticky is None else {"frameskip": 1, "repeat_action_probability": sticky}
    env = gym.make(env_id, disable_env_checker=True, **kwargs)  # NoFrameskip-v4: frameskip 1, no sticky actions
    env = NoopReset(env, 30)
    env = MaxAndSkip(env, 4, pool=3 if kind == "radial" else 2, rolling=kind == "radial")
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    if opts.get("restrict_actions"):
        env = RestrictActions(env, opts["restrict_actions"])
    env = SignReward(env)
    env = ProcessFrame(env, kind, **opts)
    if kind == "cleanrl":
        env = FrameStack(env, 4)
    return ToFloat(env, 1.0 if kind == "radial" else 1.0 / 255.0)


def is_atari(env: gym.Env) -> bool:
    return hasattr(env.unwrapped, "ale")


@dataclass
class AtariSnapshot:
    ale_state: object
    rng_state: dict
    layers: list  # per wrapper (outermost first): its attributes except the wrapped env


_SKIP = {"env", "_action_space", "_observation_space", "_metadata", "_cached_spec"}


def atari_snapshot(env: gym.Env) -> AtariSnapshot:
    layers, e = [], env
    while isinstance(e, gym.Wrapper):
        layers.append({k: copy.deepcopy(v) for k, v in vars(e).items() if k not in _SKIP})
        e = e.env
    return AtariSnapshot(e.ale.cloneState(include_rng=True), copy.deepcopy(e.np_random.bit_generator.state),
                         layers)


def atari_restore(env: gym.Env, snap: AtariSnapshot) -> gym.Env:
    """Put ``env`` (built with the same profile) back into the snapshot's state; returns ``env``."""
    e, i = env, 0
    while isinstance(e, gym.Wrapper):
        for k, v in snap.layers[i].items():
            setattr(e, k, copy.deepcopy(v))
        e, i = e.env, i + 1
    if i != len(snap.layers):
        raise ValueError("snapshot taken from a different wrapper chain")
    e.ale.restoreState(snap.ale_state)
    e.np_random.bit_generator.state = copy.deepcopy(snap.rng_state)
    return env


# ---------------------------------------------------------------------------------------------------------
# GRe's m Atari copies: worker processes, observations through shared memory.


def _pixels(env: gym.Env):
    """(the env below ToFloat, ToFloat's scale): its observations are the stored pixels (uint8 for cleanrl
    and sa_dqn, float32 for radial); ToFloat's own expression turns them into the network's input."""
    if not isinstance(env, ToFloat):
        raise TypeError("an Atari env from make_atari ends with ToFloat")
    return env.env, env.scale


#: Games whose seeded resets :func:`keep_rom_loaded` makes without reloading the ROM (checked byte for byte, state
#: and trajectories, in tests/test_gre.py); any other game's seeded reset reloads its ROM.
ROM_KEPT_GAMES = ("pong", "freeway")


def keep_rom_loaded(env: gym.Env) -> gym.Env:
    """``env`` (new from :func:`make_atari`) whose seeded resets restore the emulator's state as its ROM left it
    instead of loading the ROM again, for GRe's reused environments.  ale-py's ``reset(seed=…)`` reloads the
    ROM only to reseed (0.15–0.2 s, most of a trajectory's start); the state it gives does not depend on the
    seed: Stella's own generator has a fixed seed (``system_random_seed``), and the seed reaches an episode
    only through the gymnasium env's ``np_random`` (NoopReset's no-ops), which ``seed_game`` still reseeds,
    and the ALE's generator, which only sticky actions (and a few games, e.g. Adventure) draw from.  So this
    applies only without sticky actions (``NoFrameskip-v4``) and to :data:`ROM_KEPT_GAMES`; any other env is
    returned unchanged and reloads its ROM.  The restored state leaves the ALE's generator where it is: with
    no sticky actions its draws never change an action."""
    base = env.unwrapped
    if getattr(base, "_game", None) not in ROM_KEPT_GAMES or base.ale.getFloat("repeat_action_probability") != 0:
        return env
    loaded = base.ale.cloneState()   # as the ROM's loading left it: make_atari resets nothing
    base.load_game = lambda: base.ale.restoreState(loaded)
    return env


@dataclass(frozen=True)
class _SharedArrays:
    """The arrays an :class:`AtariPool` shares with its workers: the observations (as pixels), rewards and
    (terminated, truncated) flags of all ``n`` envs, one shared-memory block each (``names``)."""

    names: tuple[str, str, str]
    n: int
    shape: tuple[int, ...]
    dtype: np.dtype

    def views(self, shms) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(observations, rewards, done) over the blocks ``shms`` (opened on ``names``, in that order)."""
        return (np.ndarray((self.n, *self.shape), self.dtype, buffer=shms[0].buf),
                np.ndarray((self.n,), np.float64, buffer=shms[1].buf),
                np.ndarray((self.n, 2), np.bool_, buffer=shms[2].buf))


def _pool_worker(conn, env_id, profile, shard: tuple[int, int], arrays: _SharedArrays):
    """Runs the envs ``shard`` = [lo, hi) of a pool: answers ``reset``/``step`` on ``conn`` by writing into the
    shared ``arrays``."""
    from multiprocessing import shared_memory

    from crop.envs import make_env

    lo, hi = shard
    cv2.setNumThreads(1)  # one process per core already
    envs = [_pixels(keep_rom_loaded(make_env(env_id, profile)))[0] for _ in range(hi - lo)]
    shms = [shared_memory.SharedMemory(name=name) for name in arrays.names]
    obs, rew, done = arrays.views(shms)
    try:
        while True:
            cmd, arg = conn.recv()
            if cmd == "reset":   # the first arg[1] environments of the pool
                for k, e in enumerate(envs[:max(0, arg[1] - lo)]):
                    obs[lo + k] = e.reset(seed=int(arg[0]) + lo + k)[0]
            elif cmd == "step":
                for i, a in zip(*arg):
                    o, r, te, tr, _ = envs[i - lo].step(int(a))
                    obs[i], rew[i], done[i] = o, float(r), (bool(te), bool(tr))
            elif cmd == "close":
                break
            conn.send(None)
    finally:
        for e in envs:
            e.close()
        del obs, rew, done
        for s in shms:
            s.close()
        conn.close()


class AtariPool:
    """``num_envs`` copies of an Atari env (the wrapper stack of ``profile``, so the observations are those
    of :func:`make_atari`, byte for byte) in ``workers`` processes, behind the interface of
    :class:`crop.envs.vector.EnvPool`: ``reset(seed, n)`` → the observations of the first ``n`` envs (all by
    default; env i seeded ``seed + i``), ``step(idx, actions)`` → (obs, reward, terminated, truncated) of the
    envs ``idx`` only, in that order.  The envs are made once and reset again for each block of GRe's
    trajectories, without reloading the ROM where :func:`keep_rom_loaded` allows it.

    What differs from ``EnvPool`` is the transport: the workers write each observation *as pixels* (uint8
    frames for cleanrl and sa_dqn, 4× smaller than float32) into one shared-memory array, and the pipes
    carry only the actions and a done signal — no pickling of observations.  ``step(..., pixels=True)``
    returns the stored pixels instead of floats, for a caller that converts on its own device
    (``x = pixels.float() * pool.scale`` on the GPU: a quarter of the host→device bytes); the conversion is
    ToFloat's own expression, so both give identical network inputs.
    """

    def __init__(self, env_id: str, num_envs: int, workers: int = 1, profile: str | None = None):
        import multiprocessing as mp
        from multiprocessing import shared_memory

        from crop.envs import make_env

        probe, self.scale = _pixels(make_env(env_id, profile))
        space = probe.observation_space
        probe.close()
        self.shape, self.dtype = tuple(space.shape), np.dtype(space.dtype)
        self.num_envs = int(num_envs)
        workers = max(1, min(int(workers), self.num_envs))
        sizes = [self.num_envs // workers + (i < self.num_envs % workers) for i in range(workers)]
        self.bounds = np.cumsum([0, *sizes])
        nbytes = [self.num_envs * int(np.prod(self.shape)) * self.dtype.itemsize, 8 * self.num_envs,
                  2 * self.num_envs]
        self._shms = [shared_memory.SharedMemory(create=True, size=max(1, b)) for b in nbytes]
        arrays = _SharedArrays(tuple(s.name for s in self._shms), self.num_envs, self.shape, self.dtype)
        self.pixels, self._rew, self._done = arrays.views(self._shms)
        ctx = mp.get_context("spawn")  # no fork after torch/OpenMP initialisation
        self.conns, self.procs = [], []
        for i in range(workers):
            a, b = ctx.Pipe()
            lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
            p = ctx.Process(target=_pool_worker, daemon=True,
                            args=(b, env_id, profile, (lo, hi), arrays))
            p.start()
            b.close()
            self.conns.append(a)
            self.procs.append(p)

    def to_float(self, pixels: np.ndarray) -> np.ndarray:
        """ToFloat's expression: the network's input from stored pixels."""
        return np.asarray(pixels, dtype=np.float32) * self.scale

    def _wait(self, conns):
        for c in conns:
            c.recv()

    def reset(self, seed: int, n: int | None = None, pixels: bool = False):
        n = self.num_envs if n is None else int(n)
        for c in self.conns:
            c.send(("reset", (int(seed), n)))
        self._wait(self.conns)
        return self.pixels[:n].copy() if pixels else self.to_float(self.pixels[:n])

    #: The envs step in worker processes: a caller can work while they do (:meth:`step_async`).
    in_processes = True

    def step(self, idx, actions, pixels: bool = False):
        return self.step_async(idx, actions, pixels)()

    def step_async(self, idx, actions, pixels: bool = False):
        """Starts ``step(idx, actions, pixels)`` and returns the function that waits for it and returns its
        result; steps started on disjoint envs may be in flight together, collected in the order started."""
        idx, actions = np.asarray(idx, dtype=np.int64), np.asarray(actions)
        shard = np.searchsorted(self.bounds, idx, side="right") - 1
        asked = []
        for i, c in enumerate(self.conns):
            sel = shard == i
            if sel.any():
                c.send(("step", (idx[sel], actions[sel])))
                asked.append(c)

        def collect():
            self._wait(asked)
            obs = self.pixels[idx]
            done = self._done[idx]
            rew, term, trunc = self._rew[idx].copy(), done[:, 0].copy(), done[:, 1].copy()
            return (obs if pixels else self.to_float(obs)), rew, term, trunc
        return collect

    def close(self):
        from crop.envs.vector import stop_workers

        stop_workers(self.conns, self.procs)
        self.conns, self.procs = [], []
        self.pixels = self._rew = self._done = None
        for s in self._shms:
            s.close()
            s.unlink()
        self._shms = []

    def __del__(self):
        if getattr(self, "_shms", None):
            self.close()
