"""ale-py's native ``AtariVectorEnv`` against the ``cleanrl`` profile's wrapper stack (crop/envs/atari.py),
observation by observation over a seeded episode (seed 0, random actions from a seeded generator).

    python benchmarks/atari_vector_env_check.py [--steps 300]

First the profile as it is (no-ops, FIRE reset, max-pool); then with no-ops and FIRE off on both sides, with
and without max-pooling, to show which part of the preprocessing differs (docs/speed.md).
"""
from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np


def compare(game: str, gid: str, steps: int, *, profile: bool, maxpool: bool = True) -> str:
    import ale_py
    from ale_py.vector_env import AtariVectorEnv

    from crop.envs import make_env
    from crop.envs.atari import FrameStack, MaxAndSkip, ProcessFrame, SignReward, _pixels

    gym.register_envs(ale_py)
    if profile:
        v = AtariVectorEnv(game=game, num_envs=1, num_threads=1, batch_size=1)
        e = _pixels(make_env(gid, "cleanrl"))[0]
    else:
        v = AtariVectorEnv(game=game, num_envs=1, num_threads=1, batch_size=1, noop_max=0, use_fire_reset=False,
                           maxpool=maxpool)
        e = gym.make(gid, disable_env_checker=True)
        e = FrameStack(ProcessFrame(SignReward(MaxAndSkip(e, 4, pool=2 if maxpool else 1)), "cleanrl"), 4)
    ov, _ = v.reset(seed=0)
    oe, _ = e.reset(seed=0)
    at_reset = int((ov[0] != oe).sum())
    rng = np.random.default_rng(0)
    stacks = newest = 0
    worst = 0
    for _ in range(steps):
        a = int(rng.integers(e.action_space.n))
        ov, *_ = v.step(np.array([a]))
        oe, *_ = e.step(a)
        stacks += np.array_equal(ov[0], oe)
        newest += np.array_equal(ov[0][-1], oe[-1])
        worst = max(worst, int(np.abs(ov[0][-1].astype(int) - oe[-1]).max()))
    v.close()
    e.close()
    return (f"{gid} {'profile' if profile else f'no-ops and FIRE off, maxpool={maxpool}'}: pixels differing at "
            f"reset {at_reset} of {oe.size}; stacks equal {stacks} / {steps}, newest frames equal {newest} / "
            f"{steps} (largest difference {worst} levels)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    for game, gid in (("pong", "PongNoFrameskip-v4"), ("freeway", "FreewayNoFrameskip-v4")):
        print(compare(game, gid, a.steps, profile=True), flush=True)
        for maxpool in (True, False):
            print(compare(game, gid, a.steps, profile=False, maxpool=maxpool), flush=True)


if __name__ == "__main__":
    main()
