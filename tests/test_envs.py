"""Environments: snapshots replay exactly (the TimeLimit counter included); the vectorised CartPole used
by GRe has the dynamics of the single environment."""
import numpy as np
import pytest

from crop.envs import UnknownEnvError, env_spec, make_env, make_env_pool, restore, snapshot


def _play(env, actions):
    out = []
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        out.append((obs.tobytes(), r, term, trunc))
        if term or trunc:
            break
    return out


def test_snapshot_restore_replays_cartpole_exactly():
    rng = np.random.default_rng(0)
    env = make_env("CartPole-v0")
    env.reset(seed=5)
    _play(env, [0, 1, 1, 0, 1])
    snap = snapshot(env)
    actions = list(rng.integers(0, 2, 50))
    first = _play(env, actions)
    again = _play(restore(env, snap), actions)
    assert first == again and len(first) > 5
    # the snapshot itself is not consumed: a second restore replays too
    assert _play(restore(env, snap), actions) == first


def test_snapshot_keeps_the_timelimit_counter():
    env = make_env("CartPole-v0")
    env.reset(seed=1)
    steps = 0
    # balance by a simple rule until step 195, then snapshot: truncation must come at step 200
    obs = env.reset(seed=1)[0]
    while steps < 195:
        obs, r, term, trunc, _ = env.step(int(obs[2] + 0.5 * obs[3] > 0))
        steps += 1
        assert not term, "the balancing rule failed; pick another seed"
    snap = snapshot(env)
    e2 = restore(env, snap)
    n = 0
    while True:
        obs, r, term, trunc, _ = e2.step(int(obs[2] + 0.5 * obs[3] > 0))
        n += 1
        if term or trunc:
            break
    assert trunc and n == 5


def test_vector_cartpole_pool_matches_single_env():
    pool = make_env_pool("CartPole-v0", 3)
    obs = pool.reset(seed=7)
    singles = []
    for i in range(3):
        e = make_env("CartPole-v0")
        e.reset(seed=0)
        e.unwrapped.state = np.array(pool.venv.state[:, i], dtype=np.float64)
        np.testing.assert_array_equal(obs[i], e.unwrapped.state.astype(np.float32))
        singles.append(e)
    for a in [0, 1, 1, 0, 0, 1, 1, 1]:
        o, r, term, trunc = pool.step(np.arange(3), np.full(3, a))
        for i, e in enumerate(singles):
            so, sr, st, _, _ = e.step(a)
            np.testing.assert_allclose(o[i], so, rtol=1e-6, atol=1e-7)
            assert sr == r[i] and st == term[i]


@pytest.mark.slow
def test_spec_and_unknown_env():
    s = env_spec("CartPole-v0")
    assert s.n_actions == 2 and s.return_range(200) == (0.0, 200.0) and s.nonnegative_rewards
    with pytest.raises(UnknownEnvError, match="unknown environment 'Nope-v0'"):
        env_spec("Nope-v0")


@pytest.mark.parametrize("env_id,profile,shape,n", [
    ("PongNoFrameskip-v4", "cleanrl", (4, 84, 84), 6),
    ("PongNoFrameskip-v4", "sa_dqn_pong", (1, 84, 84), 4),
    ("PongNoFrameskip-v4", "radial", (1, 80, 80), 6),
    ("FreewayNoFrameskip-v4", "sa_dqn_freeway", (1, 84, 84), 3),
    ("FreewayNoFrameskip-v4", "cleanrl", (4, 84, 84), 3),
])
@pytest.mark.slow
def test_atari_profiles_and_faithful_snapshots(env_id, profile, shape, n):
    env = make_env(env_id, profile)
    obs, _ = env.reset(seed=2)
    assert obs.shape == shape and obs.dtype == np.float32 and 0 <= obs.min() and obs.max() <= 1
    assert env.action_space.n == n
    rng = np.random.default_rng(1)
    for a in rng.integers(0, n, 40):
        env.step(int(a))
    snap = snapshot(env)
    actions = [int(a) for a in rng.integers(0, n, 60)]
    first = _play(env, actions)
    _play(env, [0] * 25)                       # wander off, then come back
    assert _play(restore(env, snap), actions) == first
    assert _play(restore(env, snap), actions) == first


def test_deepcopy_of_atari_is_not_a_snapshot():
    """The fact our snapshot exists for: deepcopy restarts the emulator."""
    import copy

    env = make_env("PongNoFrameskip-v4", "cleanrl")
    env.reset(seed=0)
    for _ in range(80):
        env.step(2)
    clone = copy.deepcopy(env)
    assert not np.array_equal(env.step(0)[0], clone.step(0)[0])


def test_sa_dqn_frames_are_transposed_like_the_original():
    """SA-DQN feeds np.swapaxes(obs, 2, 0): rows of our observation are the frame's columns."""
    env = make_env("PongNoFrameskip-v4", "sa_dqn_pong")
    obs, _ = env.reset(seed=0)
    import cv2

    frame = env.unwrapped.ale.getScreenRGB()
    g = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
    g = np.concatenate((np.zeros((210, 4), g.dtype), g, np.zeros((210, 4), g.dtype)), axis=1)[21 + 10:189 + 10]
    expected = cv2.resize(g, (84, 84), interpolation=cv2.INTER_AREA).T / 255.0
    # the observation max-pools the last two frames; the last frame alone is close, and its transpose is not
    assert np.abs(obs[0] - expected).mean() < np.abs(obs[0] - expected.T).mean()


def _roms_present():
    try:
        from ale_py import roms

        return roms.get_rom_path("pong") is not None
    except Exception:  # noqa: BLE001 — no ale-py, no ROMs: the Atari tests cannot run
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _roms_present(), reason="ale-py's Pong ROM is not installed")
@pytest.mark.parametrize("profile", ["cleanrl", "sa_dqn_pong", "radial"])
def test_atari_pool_observations_equal_the_wrapper_stack(profile):
    """GRe's Atari pool (worker processes, pixels through shared memory) gives, for the same seeds and
    actions, byte-identical observations, rewards and flags to the single wrapper stack — with envs
    stepped selectively (finished trajectories are not stepped) and as pixels for a device-side conversion."""
    import torch

    from crop.envs.atari import AtariPool

    n = 4
    pool = AtariPool("PongNoFrameskip-v4", n, workers=2, profile=profile)
    try:
        singles = [make_env("PongNoFrameskip-v4", profile) for _ in range(n)]
        ref = np.stack([e.reset(seed=7 + i)[0] for i, e in enumerate(singles)])
        obs = pool.reset(7)
        assert obs.dtype == ref.dtype == np.float32 and np.array_equal(obs, ref)
        rng = np.random.default_rng(0)
        n_act = singles[0].action_space.n
        for t in range(30):
            idx = np.sort(rng.choice(n, size=rng.integers(1, n + 1), replace=False))
            acts = rng.integers(0, n_act, len(idx))
            ob, r, te, tr = pool.step(idx, acts, pixels=t % 2 == 1)
            if t % 2 == 1:
                assert ob.dtype == pool.dtype
                # a device-side conversion (torch, as GRe would do on the GPU) is ToFloat's too
                as_torch = torch.as_tensor(ob).float().mul_(pool.scale).numpy()
                ob = pool.to_float(ob)
                assert np.array_equal(as_torch, ob)
            for j, (i, a) in enumerate(zip(idx, acts)):
                so, sr, ste, st, _ = singles[i].step(int(a))
                assert np.array_equal(ob[j], so), (profile, t, i)
                assert (sr, ste, st) == (r[j], te[j], tr[j])
        assert pool.dtype == (np.float32 if profile == "radial" else np.uint8)
    finally:
        pool.close()
