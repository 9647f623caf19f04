"""LoAct with its episodes in lockstep: one batched smoothing call per time step, the same
distribution as episode-by-episode LoAct, deterministic for a seed."""
import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as sps

from crop.certify.loact import LoActSettings, run_loact
from crop.smoothing.smoothed import SmoothedNetwork, SmoothingSettings

SIGMA, M = 0.01, 1000
# Q = (−θ, 1 + θ): affine, so the smoothed Q is Q itself (no clipping inside [-5, 5]) and each sample's
# std is σ‖w_a‖; the margin 1 + 2θ ≥ 0.58 (|θ| ≤ 0.21 in CartPole) keeps both runs on the same actions, so
# they visit the same states and their means can be compared state by state.
W = np.array([[0, 0, -1, 0], [0, 0, 1, 0]], np.float32)
B = np.array([0, 1], np.float32)


class _Affine(torch.nn.Module):
    def forward(self, x):
        return x @ torch.as_tensor(W).T + torch.as_tensor(B)


def _run(seed, lockstep, episodes=16, horizon=60, pipeline=False):
    sm = SmoothedNetwork(_Affine(), SmoothingSettings(SIGMA, M, -5, 5, 0.05, seed=seed), 2)
    calls = []
    submit = sm.submit
    sm.submit = lambda obs, **kw: calls.append(len(obs)) or submit(obs, **kw)
    steps, eps = run_loact("CartPole-v0", sm, LoActSettings(episodes, horizon, list(range(100, 100 + episodes)),
                                                            lockstep=lockstep, pipeline=pipeline), progress=False)
    return steps, eps, calls


def _q_right(steps):
    """Q̃(s, push right) of every step, from the top and runner-up means (two actions)."""
    right = steps["action"].to_numpy() == 1
    return np.where(right, steps["smoothed_top"].to_numpy(), steps["smoothed_runner_up"].to_numpy())


@pytest.mark.slow
def test_lockstep_smooths_every_live_episode_in_one_call_and_is_deterministic():
    steps, eps, calls = _run(1, True)
    assert len(calls) == eps["steps"].max() and sum(calls) == len(steps) == eps["steps"].sum()
    assert calls[0] == 16 and calls[-1] < 16  # episodes end at different steps
    again, eps2, _ = _run(1, True)
    pd.testing.assert_frame_equal(steps, again)
    pd.testing.assert_frame_equal(eps, eps2)
    other, _, _ = _run(2, True)
    assert not np.array_equal(steps["smoothed_top"].to_numpy(), other["smoothed_top"].to_numpy())


def test_pipelined_halves_alternate_and_are_deterministic():
    """The GPU's pipelined lockstep, forced on the CPU: two halves of 8 episodes whose calls alternate, every
    step of every episode smoothed once, the same run for the same seed."""
    steps, eps, calls = _run(1, True, pipeline=True)
    assert calls[:2] == [8, 8] and sum(calls) == len(steps) == eps["steps"].sum()
    assert set(steps.groupby(["episode", "step"]).size()) == {1}
    again, eps2, calls2 = _run(1, True, pipeline=True)
    pd.testing.assert_frame_equal(steps, again)
    assert calls == calls2


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", [False, True])
def test_lockstep_equals_episode_by_episode_in_distribution(pipeline):
    """Same episode seeds: while the two runs take the same actions they visit the same states, and their
    smoothed means are independent estimates of the same Q̃: (difference)/(√2·SE) is N(0, 1)."""
    lock, _, _ = _run(3, True, pipeline=pipeline)
    seq, _, calls = _run(4, False)
    assert set(calls) == {1}
    z, agreed, total = [], 0, 0
    for ep in range(16):
        a, b = lock[lock.episode == ep], seq[seq.episode == ep]
        n = min(len(a), len(b))
        total += max(len(a), len(b))
        differ = np.nonzero(a["action"].to_numpy()[:n] != b["action"].to_numpy()[:n])[0]
        k = differ[0] + 1 if differ.size else n   # the states agree up to and including the first split
        agreed += k
        se = SIGMA * np.linalg.norm(W[1]) / np.sqrt(M)
        z.append((_q_right(a)[:k] - _q_right(b)[:k]) / (np.sqrt(2) * se))
    z = np.concatenate(z)
    assert agreed == total, (agreed, total)
    assert abs(z.mean()) < 4 / np.sqrt(z.size) and 0.7 < z.var() < 1.4, (z.mean(), z.var())
    assert sps.kstest(z, "norm").pvalue > 1e-3
    # the certificates agree in distribution too: the same share of certified steps, within noise
    assert abs(lock["certified"].mean() - seq["certified"].mean()) < 0.1
