"""GRe (Algorithm 2): lockstep rollouts equal one-at-a-time rollouts; bounds follow Theorems 2–3."""
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from crop.certify.gre import GReSettings, TrajectoryNoise, gre_bounds, sample_randomized_returns
from crop.envs import make_env
from crop.envs.vector import CARTPOLE_GROUP, cartpole_initial_states
from crop.smoothing import stats


def test_lockstep_returns_equal_single_trajectories(mlp_factory):
    net = mlp_factory(n_in=4, n_out=2, hidden=(16,), seed=5, scale=2.0)
    m, H = 12, 60
    # σ so small that the randomized policy is the greedy one: every trajectory is then deterministic
    R = sample_randomized_returns("CartPole-v0", net, GReSettings(1e-9, m, H, 1.0, seed=0, env_seed=11), progress=False)
    expected = []
    for i in range(m):
        e = make_env("CartPole-v0")
        e.reset(seed=0)
        # trajectory i starts from CartPole's initial state for seed env_seed + i
        e.unwrapped.state = cartpole_initial_states([11 + i])[0]
        obs = np.asarray(e.unwrapped.state, dtype=np.float32)
        J = 0.0
        for _ in range(H):
            a = int(net(torch.as_tensor(obs).unsqueeze(0)).argmax(1))
            obs, r, term, trunc, _ = e.step(a)
            J += r
            if term or trunc:
                break
        expected.append(J)
    np.testing.assert_array_equal(R, expected)
    assert len(set(expected)) > 1, "trajectories of different lengths make the test bite"


@pytest.mark.slow
def test_cartpole_initial_states_per_seed_and_reset_distribution():
    """A seed's start does not depend on the other seeds asked for (also across a group's edge), and the
    starts have CartPole's reset distribution: uniform on [-0.05, 0.05]^4 (Kolmogorov-Smirnov per coordinate)."""
    from scipy import stats as st

    seeds = np.arange(CARTPOLE_GROUP - 50, CARTPOLE_GROUP + 50)
    whole = cartpole_initial_states(seeds)
    np.testing.assert_array_equal(whole[::7], cartpole_initial_states(seeds[::7]))
    np.testing.assert_array_equal(whole[60:61], cartpole_initial_states([seeds[60]]))
    many = cartpole_initial_states(np.arange(20000))
    assert np.abs(many).max() <= 0.05
    for c in range(4):
        assert st.kstest(many[:, c], st.uniform(loc=-0.05, scale=0.1).cdf).pvalue > 1e-3
    assert len(np.unique(many[:, 0])) == len(many), "no two seeds share a start"


def test_bounds_by_definition():
    rng = np.random.default_rng(0)
    returns = rng.integers(0, 201, 1000).astype(float)
    t = gre_bounds(returns, sigma=0.1, horizon=200, alpha=0.05, eps_grid=[0.0, 0.001, 0.05],
                   percentiles=[0.5, 0.1], j_min=0.0, j_max=200.0)
    for _, r in t.iterrows():
        formula = stats.expectation_bound(returns.mean(), 0, 200, 1000, 0.05, 0.1, r["eps"], 200)
        assert r["expectation_bound_raw"] == pytest.approx(formula)
        # below J_min Theorem 2 says no more than J_min: the bound reported is clipped to it, as the CDF bound is
        assert r["expectation_bound"] == pytest.approx(max(formula, 0.0)) and r["expectation_bound"] >= 0.0
        assert r["cdf_expectation_bound"] == pytest.approx(
            stats.cdf_expectation_bound(returns, 0, 200, 0.05, 0.1, r["eps"], 200))
        assert 0.0 <= r["cdf_expectation_bound"] <= 200.0  # never looser than trivially J_min
        k = stats.percentile_order_index(1000, stats.percentile_p_prime(r["p"], r["eps"], 200, 0.1), 0.05)
        if k is None:
            assert not r["percentile_certified"] and math.isnan(r["percentile_bound"])
        else:
            assert r["percentile_certified"] and r["percentile_bound"] == np.sort(returns)[k - 1]
    # at ε = 0.05, √200·0.05/0.1 ≈ 7: p′ ≈ 0, no order statistic qualifies; Theorem 2's bound lies below J_min
    assert (t[t["eps"] == 0.05]["expectation_bound_raw"] < 0.0).all()
    assert (t[t["eps"] == 0.05]["expectation_bound"] == 0.0).all()
    assert not t[(t["eps"] == 0.05)]["percentile_certified"].any()
    # at ε = 0 the CDF bound is never below Theorem 2's; with ε it falls, but far more slowly
    e0 = t[t["eps"] == 0.0].iloc[0]
    assert e0["cdf_expectation_bound"] >= e0["expectation_bound"]
    e1 = t[t["eps"] == 0.001].iloc[0]
    assert e1["cdf_expectation_bound"] > e1["expectation_bound"]


def test_returns_outside_the_declared_range_are_refused():
    with pytest.raises(ValueError, match="J_min, J_max"):
        gre_bounds(np.array([0.0, 250.0]), sigma=0.1, horizon=200, alpha=0.05, eps_grid=[0.0],
                   percentiles=[0.5], j_min=0.0, j_max=200.0)


@pytest.mark.slow
def test_sharded_environments_give_the_same_returns(mlp_factory):
    """Spreading GRe's environments over worker processes changes nothing but the speed."""
    net = mlp_factory(n_in=25, n_out=5, hidden=(16,), seed=2)
    a = sample_randomized_returns("highway-fast-v0", net, GReSettings(0.1, 6, 4, 1.0, seed=1, env_seed=9),
                                  progress=False)
    b = sample_randomized_returns("highway-fast-v0", net, GReSettings(0.1, 6, 4, 1.0, seed=1, env_seed=9, workers=2),
                                  progress=False)
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_blocks_of_trajectories_change_nothing_on_the_env_pool(mlp_factory):
    """Stepping the trajectories in blocks (bounded memory) changes nothing: each keeps its environment
    seed and its own noise (σ large enough for the noise to decide actions)."""
    net = mlp_factory(n_in=25, n_out=5, hidden=(16,), seed=3)
    a = sample_randomized_returns("highway-fast-v0", net, GReSettings(0.5, 5, 4, 1.0, seed=1, env_seed=7),
                                  progress=False)
    b = sample_randomized_returns("highway-fast-v0", net, GReSettings(0.5, 5, 4, 1.0, seed=1, env_seed=7, batch=2),
                                  progress=False)
    np.testing.assert_array_equal(a, b)


def test_cartpole_returns_depend_neither_on_the_blocks_nor_on_m(mlp_factory):
    """Trajectory i: environment seed env_seed + i and its own noise stream, whatever the block size, the
    forward chunk or the number of trajectories m (the first m returns of a larger run are the same)."""
    net = mlp_factory(n_in=4, n_out=2, hidden=(16,), seed=5, scale=2.0)
    m, H = 23, 80

    def run(**kw):
        kw = {"m": m, **kw}
        return sample_randomized_returns("CartPole-v0", net, GReSettings(0.3, kw.pop("m"), H, 1.0, seed=3, env_seed=11,
                                                                         **kw), progress=False)

    ref = run()
    assert len(set(ref)) > 3, "the noise and the initial states must matter for the test to bite"
    for kw in ({"batch": 7}, {"batch": 1}, {"chunk": 5}, {"batch": 10, "chunk": 3}):
        np.testing.assert_array_equal(run(**kw), ref, err_msg=str(kw))
    np.testing.assert_array_equal(run(m=9), ref[:9])
    np.testing.assert_array_equal(run(m=40, batch=13)[:m], ref)
    # the noise decides: another noise seed changes returns, the same initial states kept
    other = sample_randomized_returns("CartPole-v0", net, GReSettings(0.3, m, H, 1.0, seed=4, env_seed=11),
                                      progress=False)
    assert (other != ref).any()


def test_trajectory_noise_is_per_trajectory_and_standard_normal():
    """Row i at step t is the same for any block layout and whichever trajectories have finished; the rows
    are standard normal and differ between trajectories and steps."""
    shape, n, T = (3,), 9000, 3
    whole = TrajectoryNoise(seed=5, b0=0, n=n, shape=shape, device="cpu")
    assert 1 < whole.group < n, "several groups for the test to bite"
    full = [whole.step(np.arange(n)) for _ in range(T)]
    for b0, size in ((0, 1), (4000, 2000), (n - 5, 5), (whole.group - 3, 7)):
        part = TrajectoryNoise(seed=5, b0=b0, n=size, shape=shape, device="cpu")
        for t in range(T):
            # finished trajectories draw nothing more (here a whole group finishes after step 0)
            alive = np.arange(size)[size // 2:][:: max(t, 1)] if t else np.arange(size)
            got = part.step(alive)
            assert torch.equal(got, full[t][b0 + alive]), (b0, size, t)
    z = torch.stack(full).reshape(-1).double()
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert not torch.equal(full[0][0], full[1][0]) and not torch.equal(full[0][0], full[0][1])


@pytest.mark.slow
def test_gre_on_pong_gives_the_same_returns_through_the_atari_pool(monkeypatch):
    """GRe's Atari copies run in AtariPool (pixels through shared memory): for the same seeds its trajectories
    are EnvPool's, observation for observation and return for return (Pong, cleanrl profile), also when the
    pixels are converted on the network's device (the CUDA path, forced on the CPU)."""
    import crop.certify.gre
    from crop.envs import make_env_pool
    from crop.envs.atari import AtariPool
    from crop.envs.vector import EnvPool
    from crop.models import build_network

    torch.manual_seed(0)
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "out": 6}).eval()
    seen = {}

    def recording(kind):
        def make(env_id, num_envs, profile=None, workers=1):
            pool = make_env_pool(env_id, num_envs, profile, workers) if kind == "atari" else \
                EnvPool(env_id, num_envs, workers, profile)
            assert isinstance(pool, AtariPool if kind == "atari" else EnvPool)
            return _log_steps(pool, seen.setdefault(kind, {}))
        return make

    monkeypatch.setattr(crop.certify.gre, "HALF_MIN", 1)   # AtariPool's 3 trajectories as halves of 1 and 2
    returns = {}
    for kind, workers in (("env", 1), ("atari", 2)):
        monkeypatch.setattr(crop.certify.gre, "make_env_pool", recording(kind))
        returns[kind] = sample_randomized_returns("PongNoFrameskip-v4", net, GReSettings(0.05, 3, 120, 1.0, seed=4,
                                                                                         env_seed=9, workers=workers),
                                                  progress=False)
    # the GPU path (pixels moved to the device, converted there), run on the CPU
    monkeypatch.setattr(crop.certify.gre, "make_env_pool", make_env_pool)
    monkeypatch.setattr(crop.certify.gre, "PIXELS_ON", ("cuda", "cpu"))
    returns["pixels"] = sample_randomized_returns("PongNoFrameskip-v4", net, GReSettings(0.05, 3, 120, 1.0, seed=4,
                                                                                         env_seed=9, workers=2),
                                                  progress=False)
    np.testing.assert_array_equal(returns["atari"], returns["env"])
    np.testing.assert_array_equal(returns["pixels"], returns["env"])
    assert [len(seen["env"][i]) for i in range(3)] == [120] * 3 and seen["atari"] == seen["env"]
    assert any(r for steps in seen["env"].values() for _, r in steps), "a point must be scored for the returns to bite"


# ------------------------------------------------------------------ reused environments: one per slot of the pool

def _trace(env, seed: int, steps: int) -> list:
    """Observation bytes, rewards and ends of an episode from ``env.reset(seed=seed)``, random actions of a
    generator seeded the same; for an Atari env also, after the reset, the emulator's serialized state, every
    wrapper's state and the gymnasium RNG's (a reset that left any of them behind differs here even before a
    step), and the ALE's own generator where sticky actions draw from it."""
    import pickle

    from crop.envs.atari import atari_snapshot, is_atari

    obs, _ = env.reset(seed=seed)
    out = [np.asarray(obs).tobytes()]
    if is_atari(env):
        ale, snap = env.unwrapped.ale, atari_snapshot(env)
        out.append(pickle.dumps((ale.cloneState(include_rng=ale.getFloat("repeat_action_probability") > 0),
                                 snap.rng_state, snap.layers)))
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        obs, r, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        out.append((np.asarray(obs).tobytes(), float(r), bool(term), bool(trunc)))
        if term or trunc:
            break
    return out


def _reused(env_id, profile):
    """An environment as GRe's pool holds it (Atari: :func:`crop.envs.atari.keep_rom_loaded`)."""
    from crop.envs.atari import is_atari, keep_rom_loaded

    env = make_env(env_id, profile)
    return keep_rom_loaded(env) if is_atari(env) else env


@pytest.mark.parametrize("env_id,profile", [("highway-fast-v0", "flat25"), ("PongNoFrameskip-v4", "cleanrl"),
                                            ("PongNoFrameskip-v4", "sa_dqn_pong"), ("PongNoFrameskip-v4", "radial"),
                                            ("FreewayNoFrameskip-v4", "cleanrl"), ("ALE/Pong-v5", "cleanrl")])
def test_a_reused_environment_starts_as_a_new_one(env_id, profile):
    """Reset with a seed after an episode of another seed, an environment of GRe's pool replays what a new one
    reset with that seed does: observations, rewards and ends, and on Atari the emulator's serialized state,
    every wrapper's state (frame stacks, max-pool buffers) and the gymnasium RNG (NoopReset's no-ops).  ALE v5's
    sticky actions draw from the ALE's generator, so there the ROM is reloaded (keep_rom_loaded refuses)."""
    steps = 6 if env_id.startswith("highway") else 40
    env = _reused(env_id, profile)
    try:
        _trace(env, 101, steps)   # an episode of another seed first, left where it ended
        for seed in (5, 6):
            fresh = make_env(env_id, profile)
            try:
                assert _trace(env, seed, steps) == _trace(fresh, seed, steps), (env_id, profile, seed)
            finally:
                fresh.close()
        sticky = env_id.startswith("ALE/")
        assert ("load_game" in vars(env.unwrapped)) == (not sticky and not env_id.startswith("highway"))
    finally:
        env.close()


def test_a_kept_rom_that_is_not_restored_is_caught():
    """The comparison above bites: a reused Pong whose seeded reset neither reloads the ROM nor restores its
    loaded state (the emulator carries on from the last episode) differs from a new one; restored, it does not."""
    env = _reused("PongNoFrameskip-v4", "cleanrl")
    fresh = make_env("PongNoFrameskip-v4", "cleanrl")
    try:
        _trace(env, 101, 40)
        expected = _trace(fresh, 5, 40)
        restore = env.unwrapped.load_game
        env.unwrapped.load_game = lambda: None
        assert _trace(env, 5, 40) != expected
        env.unwrapped.load_game = restore
        assert _trace(env, 5, 40) == expected
    finally:
        env.close()
        fresh.close()


def _log_steps(pool, log: dict):
    """``pool`` whose steps append what each environment returns to ``log[its index]`` (observation bytes,
    reward), whether GRe steps all its live trajectories at once or in halves in flight together
    (``step_async``, through which the pools' ``step`` goes)."""
    def record(idx, out):
        for k, i in enumerate(np.asarray(idx).tolist()):
            log.setdefault(i, []).append((np.asarray(out[0][k], np.float32).tobytes(), float(out[1][k])))
        return out

    if hasattr(pool, "step_async"):
        start = pool.step_async

        def logged_async(idx, actions, **k):
            collect = start(idx, actions, **k)
            return lambda: record(idx, collect())
        pool.step_async = logged_async
    else:
        step = pool.step
        pool.step = lambda idx, actions, **k: record(idx, step(idx, actions, **k))
    return pool


def _recorded(pool, log: dict):
    """``pool`` whose resets append their observations' bytes to ``log["reset"]`` and whose steps log what each
    environment returns (:func:`_log_steps`)."""
    reset = pool.reset

    def logged_reset(*a, **k):
        obs = reset(*a, **k)
        log.setdefault("reset", []).append(np.asarray(obs, np.float32).tobytes())
        return obs

    pool.reset = logged_reset
    return _log_steps(pool, log)


def _fresh_per_block(env_id, net, settings, profile, log):
    """GRe's returns with a new pool for every block, each environment made for its trajectory and reset once
    (Atari: in the main process, each seeded reset loading the ROM; its returns are AtariPool's, tested above)."""
    import crop.certify.gre
    from crop.envs import make_env_pool
    from crop.envs.vector import EnvPool

    out = []
    for b0 in range(0, settings.m, settings.batch):
        n = min(settings.batch, settings.m - b0)
        pool = _recorded(make_env_pool(env_id, n, profile) if env_id == "CartPole-v0" else
                         EnvPool(env_id, n, 1, profile), log)
        try:
            out.append(crop.certify.gre._lockstep(pool, net, torch.device("cpu"), settings, b0, n, False))
        finally:
            pool.close()
    return np.concatenate(out)


def _reuse_case(env_id):
    from crop.models import build_network

    torch.manual_seed(0)
    if env_id == "CartPole-v0":
        return build_network({"arch": "mlp", "in": 4, "hidden": [16], "out": 2}), 80, 0.3, "vector"
    if env_id == "highway-fast-v0":
        return build_network({"arch": "mlp", "in": 25, "hidden": [16], "out": 5}), 8, 0.5, "flat25"
    out = 6 if env_id.startswith("Pong") else 3
    return build_network({"arch": "nature_cnn", "in_channels": 4, "out": out}), 60, 0.05, "cleanrl"


@pytest.mark.parametrize("env_id", ["CartPole-v0", "highway-fast-v0", "PongNoFrameskip-v4", "FreewayNoFrameskip-v4"])
def test_reused_slots_give_the_returns_of_new_environments(env_id, monkeypatch):
    """GRe makes one pool of `batch` environments and resets it for each block: m = 5 trajectories in blocks of
    2 (the last block uses one slot; two workers, so one worker resets none) give, byte for byte, the returns,
    and step by step the observations and rewards, of a new pool for every block."""
    import crop.certify.gre

    monkeypatch.setattr(crop.certify.gre, "HALF_MIN", 1)   # blocks of 2 run as halves where the pool has workers
    net, horizon, sigma, profile = _reuse_case(env_id)
    settings = GReSettings(sigma, 5, horizon, 1.0, seed=2, env_seed=30, batch=2, workers=2)
    made, log, expected_log = [], {}, {}
    make = crop.certify.gre.make_env_pool
    monkeypatch.setattr(crop.certify.gre, "make_env_pool",
                        lambda *a, **k: made.append(a) or _recorded(make(*a, **k), log))
    reused = sample_randomized_returns(env_id, net.eval(), settings, profile=profile, progress=False)
    assert [a[1] for a in made] == [2], "one pool of two slots for the three blocks"
    np.testing.assert_array_equal(reused, _fresh_per_block(env_id, net, settings, profile, expected_log))
    assert log == expected_log and len(log["reset"]) == 3
    if env_id == "CartPole-v0":
        assert len(set(reused)) > 2, "trajectories that end at different times"


def test_halves_in_flight_give_the_returns_of_one_lockstep(mlp_factory, monkeypatch):
    """With the environments in worker processes a block runs as two halves, one stepping while the other's
    noise and forward are computed: byte for byte the returns of the whole block stepped at once in one process
    (CartPole's noise group of 4,096 trajectories straddles the halves, so each half's stream is checked)."""
    import crop.certify.gre
    from crop.envs.vector import EnvPool

    monkeypatch.setattr(crop.certify.gre, "HALF_MIN", 3)
    net = mlp_factory(4, 2, (64,), 1).eval()
    settings = GReSettings(0.5, 6, 60, 0.99, seed=3, env_seed=11, batch=6, workers=2)
    out, in_flight = {}, []
    for workers in (1, 2, "another seed"):
        pool = EnvPool("CartPole-v0", 6, 1 if workers == "another seed" else workers)
        if workers == 2:
            start, flying = pool.step_async, []

            def counted(idx, actions, start=start, flying=flying):
                flying.append(len(idx))
                in_flight.append(list(flying))
                collect = start(idx, actions)

                def done():
                    flying.pop(0)
                    return collect()
                return done
            pool.step_async = counted
        try:
            run = replace(settings, seed=4) if workers == "another seed" else settings
            out[workers] = crop.certify.gre._lockstep(pool, net, torch.device("cpu"), run, 0, 6, False)
        finally:
            pool.close()
    np.testing.assert_array_equal(out[2], out[1])
    assert (out["another seed"] != out[1]).all(), "every trajectory's return depends on its noise"
    assert [3, 3] in in_flight, "both halves in flight together"
