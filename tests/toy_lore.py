"""LoRe (Algorithm 3) on a toy whose answer is known: a deterministic 1-D walk (:class:`ToyWalk`), a smoother
that estimates each distinct state once (:class:`CachedSmoother`) and the brute-force enumeration of every
action sequence the radii allow (:func:`brute_force`), with LoRe's settings built by name."""
import copy
import math

import gymnasium as gym
import numpy as np

from crop.certify.loact import certify_estimate
from crop.certify.lore import LoReSettings, Problem, Search, run_lore
from crop.smoothing.smoothed import SmoothedNetwork


def lore_settings(horizon, env_seed, run_key=None, **options):
    """LoRe's settings of a test, from the fields of :class:`Problem` and :class:`Search` by name."""
    problem = {k: options.pop(k) for k in list(options) if k in Problem.__dataclass_fields__}
    return LoReSettings(Problem(horizon, env_seed, **problem), Search(**options), run_key)


def lore(env_id, sm, horizon, env_seed, *, make=None, progress=False, **options):
    """:func:`run_lore` of a test's settings: its bound table and record."""
    result = run_lore(env_id, sm, lore_settings(horizon, env_seed, **options), make=make, progress=progress)
    return result.table, result.info


class ToyWalk(gym.Env):
    """Deterministic 1-D walk: 3 actions move left/stay/right; reward depends on position (may be negative
    when ``signed``); stepping outside [-1, 1] terminates (with that step's reward)."""

    def __init__(self, signed=False, repeat_states=False):
        self.signed, self.repeat = signed, repeat_states
        self.observation_space = gym.spaces.Box(-5, 5, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(3)

    def _obs(self):
        t = 0.0 if self.repeat else self.t / 10
        return np.array([self.pos, t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0.1, 0
        return self._obs(), {}

    def step(self, a):
        self.pos = round(self.pos + (int(a) - 1) * 0.35, 6)
        self.t += 1
        r = 1.0 - abs(self.pos)
        if not self.signed:
            r = max(r, 0.0)
        return self._obs(), r, abs(self.pos) > 1.0, False, {}


class CachedSmoother(SmoothedNetwork):
    """One estimate per distinct observation, shared by LoRe and the brute force."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.cache = {}
        self.alphas = []  # the per-state α of every fresh estimate, in order

    def estimate_batch(self, obs_batch, indices=None, alpha=None):
        obs_batch = np.asarray(obs_batch, np.float32)
        keys = [o.tobytes() for o in obs_batch]
        alphas = np.broadcast_to(np.asarray(self.alpha if alpha is None else alpha, np.float64), (len(keys),))
        new = [b for b, k in enumerate(keys) if k not in self.cache and k not in keys[:b]]
        if new:
            for b, est in zip(new, super().estimate_batch(obs_batch[new], alpha=alphas[new])):
                self.cache[keys[b]] = est
                self.alphas.append(est.alpha)
        return [self.cache[k] for k in keys]


def brute_force(make, sm, horizon, eps, gamma=1.0, seed=0):
    """min return over every action sequence in which each action a taken at state s has r_s(a) ≤ ε
    (plain depth-first enumeration of the allowed sequences, no pruning, no priority queue)."""
    certs = {}

    def cert(obs):
        k = np.asarray(obs, np.float32).tobytes()
        if k not in certs:
            certs[k] = certify_estimate(sm.estimate(obs), sm.sigma, sm.v_min, sm.v_max)
        return certs[k]

    def rec(env, obs, t):
        if t == horizon:
            return 0.0
        c = cert(obs)
        best = math.inf
        for a in range(len(c.radii)):
            if c.radii[a] > eps:
                continue
            e = copy.deepcopy(env)
            o, r, term, trunc, _ = e.step(a)
            rest = 0.0 if (term or trunc) else rec(e, o, t + 1)
            best = min(best, gamma ** t * r + rest)
        return best

    env = make()
    obs, _ = env.reset(seed=seed)
    return rec(env, obs, 0)
