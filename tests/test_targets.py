"""Smoothing targets bounded in [0, 1]: ``probs`` (softmax of a policy network's logits) and
``vote`` (one-hot of the greedy action).  The adapted Theorem 1 is tested as the Q target is: the bounds
cover at rate ≥ 1 − α, the certified radius never exceeds what a brute-force search over perturbations finds,
ties are never certified, and LoRe and GRe on a policy network pass the same checks as on a Q-network."""
import numpy as np
import pytest
import torch
from scipy import stats as st

from crop.certify.gre import GReSettings, TrajectoryNoise, sample_randomized_returns
from crop.certify.loact import certify_estimate, certify_state
from crop.smoothing.smoothed import BOUNDS, TARGETS, SmoothedNetwork, SmoothingSettings

from networks import Affine as Linear2  # logits z(x) = W x + b: smoothed values known in closed form

TARGETS01 = ("probs", "vote")


def smoother(net, target, sigma=0.5, m=1000, alpha=0.05, n=3, **kw):
    return SmoothedNetwork(net, SmoothingSettings(sigma, m, 0.0, 1.0, alpha, target=target, **kw), n)


@pytest.mark.parametrize("target", TARGETS01)
def test_samples_lie_in_zero_one_and_sum_to_one(mlp_factory, target):
    net = mlp_factory(n_in=4, n_out=3, seed=2, scale=4.0)
    sm = smoother(net, target, m=777, bound="empirical_bernstein")
    total, _, _, samples = sm.engine.collect(sm.engine.launch(np.full((1, 4), 0.3, np.float32)))
    total, samples = total[0], samples[0]
    assert samples.shape == (777, 3) and samples.min() >= 0.0 and samples.max() <= 1.0
    np.testing.assert_allclose(samples.sum(1), 1.0, atol=1e-6)
    if target == "vote":  # a vote is one action per sample: the counts add up to m exactly
        assert set(np.unique(samples)) <= {0.0, 1.0} and total.sum() == 777


@pytest.mark.slow
def test_vote_counts_the_greedy_action_at_the_noisy_states():
    """The vote of a half-space network is Bernoulli(Φ(d/σ)), d the signed distance to the boundary."""
    net = Linear2([[1.0, 0.0], [-1.0, 0.0]], [0.0, 0.0])   # action 0 iff x₁ > 0
    for x1 in (-0.3, 0.1, 0.6):
        est = smoother(net, "vote", sigma=0.5, m=20000, n=2, seed=1).estimate(np.array([x1, 2.0], np.float32))
        p = st.norm.cdf(x1 / 0.5)
        assert abs(est.mean[0] - p) < 5 * np.sqrt(p * (1 - p) / 20000)
        assert est.mean[0] + est.mean[1] == 1.0


def test_targets_draw_the_same_noise_and_q_is_unchanged(mlp_factory):
    """The target changes what is averaged, not the noise: the raw means (of the network outputs) are equal
    for every target, and the default target is q."""
    net = mlp_factory(n_in=4, n_out=3, seed=5)
    x = np.full(4, 0.1, np.float32)
    q = SmoothedNetwork(net, SmoothingSettings(0.4, 500, 0.0, 1.0, 0.05, seed=3), 3).estimate(x)
    for t in TARGETS:
        e = SmoothedNetwork(net, SmoothingSettings(0.4, 500, 0.0, 1.0, 0.05, seed=3, target=t), 3).estimate(x)
        np.testing.assert_array_equal(e.raw_mean, q.raw_mean)
    assert SmoothedNetwork(net, SmoothingSettings(0.4, 500, 0.0, 1.0, 0.05), 3).target == "q"


@pytest.mark.parametrize("bad,match", [(dict(target="logits"), "unknown smoothing target"),
                                       (dict(target="probs", v_max=2.0), "lies in"),
                                       (dict(target="vote", v_min=-1.0), "lies in")])
def test_bad_targets_and_ranges_are_refused(mlp_factory, bad, match):
    kw = dict(sigma=0.1, m=10, v_min=0.0, v_max=1.0, alpha=0.05)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        SmoothedNetwork(mlp_factory(), SmoothingSettings(**kw), n_actions=2)


# ------------------------------------------------------------------------------------------------- coverage

def _truth(net, x, target, sigma, n=2_000_000, seed=99):
    """f̃(x, ·) from a large independent sample (standard error ≤ 4e-4)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        z = net(torch.as_tensor(x) + sigma * torch.randn(n, len(x), generator=g))
        f = torch.softmax(z, 1) if target == "probs" else torch.nn.functional.one_hot(z.argmax(1), z.shape[1])
        return f.double().mean(0).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS01)
@pytest.mark.parametrize("bound", sorted(BOUNDS))
def test_bounds_cover_at_rate_1_minus_alpha(target, bound):
    """All 2·|A| bounds of a state hold together in ≥ 1 − α of 300 fresh estimates (α = 0.2, so a
    miscoverage above α is visible); the plain mean used as both bounds must fail the same check (it can
    fail)."""
    th = np.array([0.0, 2.1, 4.2])  # three logits z_a = 3·(cos θ_a, sin θ_a)·x: every action has mass near 0
    net = Linear2(3 * np.stack([np.cos(th), np.sin(th)], 1), [0.0, 0.0, 0.0])
    x, sigma, alpha, reps = np.array([0.2, -0.1], np.float32), 0.5, 0.2, 300
    truth = _truth(net, x, target, sigma)
    assert truth.min() > 0.05, "every action must have some mass for the test to bite"
    sm = smoother(net, target, sigma=sigma, m=200, alpha=alpha, bound=bound, seed=7)
    ests = [sm.estimate(x) for _ in range(reps)]
    # 1e-3: the truth's own Monte-Carlo error
    held = [np.all(e.lower <= truth + 1e-3) and np.all(e.upper >= truth - 1e-3) for e in ests]
    k = reps - sum(held)
    assert st.binom.sf(k - 1, reps, alpha) > 1e-3, f"{k}/{reps} misses at alpha={alpha}"
    plain = [np.all(e.mean <= truth + 1e-3) and np.all(e.mean >= truth - 1e-3) for e in ests]
    assert reps - sum(plain) > 2 * alpha * reps, "the plain mean as a bound must be caught"


# ------------------------------------------------------------------------------------ radius vs brute force

def _judge(net, target, sigma, n=10_000, seed=11):
    """f̃ at many states from one noise bank (common random numbers): the brute force's oracle."""
    bank = sigma * torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))

    def f(points):
        with torch.no_grad():
            z = net((torch.as_tensor(np.asarray(points, np.float32)).unsqueeze(1) + bank).flatten(0, 1))
            v = torch.softmax(z, 1) if target == "probs" else \
                torch.nn.functional.one_hot(z.argmax(1), z.shape[1]).float()
            return v.reshape(len(points), n, -1).double().mean(1).numpy()
    return f, n


def _brute_force_distance(f, n, s, action, r_max, rings=16, angles=36):
    """The smallest ‖δ‖ on a polar grid (≤ r_max, ring by ring outwards) at which another action's smoothed
    value exceeds the top action's beyond the oracle's Monte-Carlo error (inf: none found)."""
    th = np.linspace(0, 2 * np.pi, angles, endpoint=False)
    for r in np.linspace(r_max / rings, r_max, rings):
        v = f(s + r * np.stack([np.cos(th), np.sin(th)], 1))
        if np.any(np.delete(v, action, axis=1).max(1) - v[:, action] > 4 * np.sqrt(0.5 / n)):
            return float(r)
    return np.inf


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS01)
def test_radius_never_beyond_a_brute_force_search_on_a_small_network(mlp_factory, target):
    """On random 2-D → 3 networks: for every certified state, a dense polar grid search finds no
    perturbation within the radius that changes the smoothed action (the first ring where it changes is
    beyond the radius), and the search does find changes somewhere (the test can fail)."""
    sigma, found, certified = 0.5, 0, 0
    for net_seed in range(2):
        net = mlp_factory(n_in=2, n_out=3, hidden=(16, 16), seed=net_seed, scale=2.0)
        f, n = _judge(net, target, sigma)
        sm = smoother(net, target, sigma=sigma, m=10000, bound="clopper_pearson" if target == "vote" else
                      "hoeffding", seed=net_seed)
        for s in np.random.default_rng(net_seed).normal(size=(5, 2)).astype(np.float32):
            c = certify_state(sm, s)
            if not c.certified:
                continue
            certified += 1
            d = _brute_force_distance(f, n, s, c.action, r_max=2.5)
            assert d > c.radius, f"{target}: the smoothed action changes at ‖δ‖ = {d} < radius {c.radius}"
            found += np.isfinite(d)
    assert certified >= 4 and found >= 2, (certified, found)


@pytest.mark.parametrize("bound", sorted(BOUNDS))
def test_vote_radius_is_below_and_near_the_distance_to_a_half_space(bound):
    """Two actions split by the line x₁ = 0: the smoothed vote's decision boundary is that line, so the
    radius must lie below |x₁| (sound) and, with m = 10,000, not far below it (the theorem is nearly
    tight here)."""
    net = Linear2([[1.0, 0.0], [-1.0, 0.0]], [0.0, 0.0])
    for x1 in (0.2, 0.5, 0.9):
        c = certify_state(smoother(net, "vote", m=10000, n=2, bound=bound, seed=3), np.array([x1, 0.3], np.float32))
        assert c.certified and c.action == 0
        assert (0.75 if bound != "betting" else 0.6) * x1 < c.radius < x1, (bound, x1, c.radius)


@pytest.mark.parametrize("target", TARGETS01)
def test_probs_and_vote_share_the_boundary_of_a_symmetric_network(target):
    """Softmax of two linear logits: p̃₀ > ½ iff x₁ > 0 (the sigmoid is odd about ½ and the noise symmetric),
    so both targets' radii stay below the distance |x₁|."""
    net = Linear2([[2.0, 0.0], [-2.0, 0.0]], [0.0, 0.0])
    for x1 in (0.3, 0.8):
        c = certify_state(smoother(net, target, m=10000, n=2, seed=5), np.array([x1, -0.4], np.float32))
        assert c.certified and c.radius < x1


# -------------------------------------------------------------------------------------------------- ties

@pytest.mark.parametrize("bound", sorted(BOUNDS))
def test_ties_are_never_certified(bound):
    """probs: two actions with identical logits tie exactly at every sample; vote: a state on the boundary
    with m = 10 ties 5 to 5 in about a quarter of the estimates.  No tied state is certified."""
    same = Linear2([[1.0, 0.5], [1.0, 0.5], [-1.0, 0.0]], [0.0, 0.0, -1.0])
    for seed in range(5):
        c = certify_state(smoother(same, "probs", m=200, bound=bound, seed=seed), np.array([0.3, 0.1], np.float32))
        assert c.estimate.mean[0] == c.estimate.mean[1] and not c.certified and c.radius == 0.0
    net, ties = Linear2([[1.0, 0.0], [-1.0, 0.0]], [0.0, 0.0]), 0
    for seed in range(40):
        c = certify_state(smoother(net, "vote", m=10, n=2, bound=bound, seed=seed), np.zeros(2, np.float32))
        if c.estimate.mean[0] == c.estimate.mean[1]:
            ties += 1
            assert not c.certified and c.radius == 0.0
    assert ties >= 3


# ------------------------------------------------------------------------- LoRe and GRe on a policy network

@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS01)
@pytest.mark.parametrize("signed,prune", [(False, True), (True, False)])
def test_lore_on_a_policy_network_equals_brute_force(mlp_factory, target, signed, prune):
    """LoRe's bound over the smoothed probabilities or votes equals the brute-force enumeration of every
    action sequence the radii allow, at every ε (tests/test_lore.py's check of the Q target)."""
    from crop.certify.lore import lore_bound_at, run_lore

    from toy_lore import CachedSmoother, ToyWalk, brute_force, lore_settings

    horizon = 6
    net = mlp_factory(n_in=2, n_out=3, hidden=(16,), seed=3, scale=3.0)
    sm = CachedSmoother(net, SmoothingSettings(0.3, 2000, 0.0, 1.0, 0.05, seed=0, target=target), 3)
    make = lambda: ToyWalk(signed=signed)  # noqa: E731
    table = run_lore("toy", sm, lore_settings(horizon, 0, prune=prune), make=make, progress=False).table
    radii = sorted({float(r) for e in sm.cache.values() for r in certify_estimate(e, sm.sigma, 0.0, 1.0).radii})
    assert len(radii) > 3, "the test network should produce several distinct radii"
    for eps in sorted({0.0, *radii, *[r + 1e-9 for r in radii], *[max(r - 1e-9, 0) for r in radii], 10.0}):
        assert lore_bound_at(table, eps) == pytest.approx(brute_force(make, sm, horizon, eps)), eps


def test_gre_on_a_policy_network_acts_by_the_greedy_action_at_the_noisy_state(mlp_factory):
    """GRe's σ-randomized policy of a policy network: trajectory i at step t takes argmax of the logits at
    s_t + σ·Δ_{i,t}, Δ from its own noise stream (TrajectoryNoise) — replayed one trajectory at a time."""
    from crop.envs import make_env
    from crop.envs.vector import cartpole_initial_states

    torch.manual_seed(0)
    actor = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2)).eval()
    with torch.no_grad():
        actor[2].weight.mul_(20.0)
    m, H, sigma = 6, 40, 0.3
    R = sample_randomized_returns("CartPole-v0", actor, GReSettings(sigma, m, H, 1.0, seed=4, env_seed=11),
                                  progress=False)
    expected = []
    for i in range(m):
        noise = TrajectoryNoise(4, i, 1, (4,), torch.device("cpu"))
        e = make_env("CartPole-v0")
        e.reset(seed=0)
        e.unwrapped.state = cartpole_initial_states([11 + i])[0]
        obs, J = np.asarray(e.unwrapped.state, dtype=np.float32), 0.0
        for _ in range(H):
            x = noise.step(np.array([0])).mul_(sigma).add_(torch.as_tensor(obs))
            obs, r, term, trunc, _ = e.step(int(torch.softmax(actor(x), 1).argmax(1)))
            J += r
            if term or trunc:
                break
        expected.append(J)
    np.testing.assert_array_equal(R, expected)
    assert len(set(expected)) > 1


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS01)
def test_local_attack_on_a_policy_network_never_flips_a_certified_step(target):
    """PGD on the smoothed probabilities against π̃ of a Tanh actor: no attacked step whose certified radius
    exceeds ε changes the smoothed action, and at a large ε the attack does change actions (it bites)."""
    from crop.certify.attack import LocalAttackSettings, run_local_attack

    torch.manual_seed(2)
    actor = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2)).eval()
    with torch.no_grad():
        actor[2].weight.mul_(30.0)
    sm = smoother(actor, target, sigma=0.1, m=1000, n=2, seed=1)
    table = run_local_attack("CartPole-v0", sm, LocalAttackSettings([0.0, 0.02, 0.5], [5, 6], 12, steps=5, m_grad=64,
                                                                    seed=3), progress=False)
    assert (table["flips_certified"] == 0).all()
    assert table.loc[table["eps"] == 0.5, "flips"].sum() > 0
