"""crop's highway-fast-v0 (crop/envs/highway.py) steps exactly as stock highway-env: the same observation bytes,
rewards, terminated/truncated and info, over seeds, random and fixed actions, crashes and episode ends."""
import copy
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest

from crop.certify.gre import GReSettings, sample_randomized_returns
from crop.envs import _Flatten, highway, make_env


def stock_env():
    import highway_env  # noqa: F401  (registers the ids)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _Flatten(gym.make("highway-fast-v0"))


def _reset_info(info):
    """Reset info without 'action': highway-env fills it with a draw of the (unseeded) action space."""
    return {k: v for k, v in info.items() if k != "action"}


def assert_same_transitions(seeds, steps):
    """Stock and crop's env side by side; returns (crashes, episode ends) seen, so a caller can check the
    comparison covered them."""
    crashes = ends = 0
    for seed in seeds:
        stock, fast = stock_env(), make_env("highway-fast-v0")
        assert isinstance(fast.unwrapped, highway.FastHighwayEnvFast)
        o1, i1 = stock.reset(seed=seed)
        o2, i2 = fast.reset(seed=seed)
        assert o1.tobytes() == o2.tobytes() and _reset_info(i1) == _reset_info(i2)
        rng = np.random.default_rng(seed)
        for t in range(steps):
            a = int(rng.integers(5)) if seed % 2 else (3, 1, 4)[t % 3]  # random, or faster/idle/slower
            s1, s2 = stock.step(a), fast.step(a)
            assert s1[0].dtype == s2[0].dtype == np.float32
            assert s1[0].tobytes() == s2[0].tobytes(), (seed, t)
            assert s1[1:] == s2[1:], (seed, t)
            if s1[2] or s1[3]:
                crashes += bool(s1[4]["crashed"])
                ends += 1
                o1, i1 = stock.reset(seed=seed + 1000 + t)
                o2, i2 = fast.reset(seed=seed + 1000 + t)
                assert o1.tobytes() == o2.tobytes() and _reset_info(i1) == _reset_info(i2)
    return crashes, ends


def test_same_transitions_as_stock_highway_env():
    crashes, ends = assert_same_transitions(range(3), 30)
    assert ends >= 1


@pytest.mark.slow
def test_same_transitions_as_stock_highway_env_over_many_seeds():
    crashes, ends = assert_same_transitions(range(20), 120)
    assert crashes >= 5 and ends > crashes  # crashes and time-limit ends were both compared


def test_the_fast_classes_are_in_place_and_survive_snapshots():
    env = make_env("highway-fast-v0")
    env.reset(seed=3)
    base = env.unwrapped
    assert type(base.road) is highway.FastRoad
    assert type(base.observation_type) is highway.FastKinematicObservation
    snap = pickle.loads(pickle.dumps(copy.deepcopy(env)))  # LoRe's snapshots, and resumable searches' pickles
    for a in (3, 0, 2, 1):
        s1, s2 = env.step(a), snap.step(a)
        assert s1[0].tobytes() == s2[0].tobytes() and s1[1:] == s2[1:]
    assert type(snap.unwrapped.road) is highway.FastRoad


def test_other_scenes_keep_the_stock_classes():
    import highway_env  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = highway.speed_up(gym.make("merge-v0"))
    assert type(env.unwrapped).__name__ == "MergeEnv"


def test_gre_returns_are_those_of_stock_highway_env(mlp_factory, monkeypatch):
    net = mlp_factory(n_in=25, n_out=5, hidden=(16,), seed=4)
    settings = GReSettings(0.5, 4, 8, 1.0, seed=2, env_seed=5)
    fast = sample_randomized_returns("highway-fast-v0", net, settings, progress=False)
    monkeypatch.setattr(highway, "_FAST", {})  # speed_up leaves the stock classes
    assert type(make_env("highway-fast-v0").unwrapped).__name__ == "HighwayEnvFast"
    stock = sample_randomized_returns("highway-fast-v0", net, settings, progress=False)
    assert fast.tobytes() == stock.tobytes()
