"""Continuous-action agents: SB3 SAC / TD3 / PPO zips (made here as SB3 writes them) import as actors whose
actions are SB3's deterministic ones in the environment's bounds; GRe and the global attack run on them; the
percentile (median) certificate of crop.certify.percentile covers brute force at rate >= 1 - alpha; what crop cannot
certify of them is refused in one line."""
import io
import json
import math
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch
from scipy.stats import binom, norm
from torch import nn

from crop.__main__ import main
from crop.agents.importing import PolicyImportError, check_policy_file, import_policy
from crop.io import meta_name
from crop.workflow.layout import FRAMES_FILE, RUN_FILES
from crop.workflow.stage_table import STAGES

from networks import box_space, mlp, sb3_sac, sb3_zip
from paths import REPO

OBS = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
#: Pendulum-v1's smallest reward, −(θ² + 0.1 θ̇² + 0.001 u²) at |θ| = π, |θ̇| = 8, |u| = 2, rounded outwards to
#: the 7 decimals the docs give (a range that is too narrow by a rounding would make GRe's bound unsound).
PENDULUM_MIN = -math.ceil((math.pi ** 2 + 0.1 * 8 ** 2 + 0.001 * 2 ** 2) * 1e7) / 1e7


def _td3(path):
    mu = mlp([3, 16, 16, 1], 4, last=nn.Tanh)
    q0 = mlp([4, 16, 16, 1], 5)
    state = {**{f"actor.mu.{k}": v for k, v in mu.state_dict().items()},
             **{f"actor_target.mu.{k}": v for k, v in mu.state_dict().items()},
             **{f"critic.qf0.{k}": v for k, v in q0.state_dict().items()},
             **{f"critic.qf1.{k}": v for k, v in mlp([4, 16, 16, 1], 6).state_dict().items()}}
    return sb3_zip(path, state, {"action_space": box_space([-2.0], [2.0])}), (lambda x: 2.0 * mu(x)), \
        (lambda x: q0(torch.cat([x, mu(x)], 1))[:, 0])


def _ppo(path, space=None, kwargs=None):
    pi = nn.Sequential(*mlp([3, 16, 16], 7, nn.Tanh), nn.Tanh())
    action_net = nn.Linear(16, 1)
    vf = mlp([3, 16, 16], 8, nn.Tanh)
    state = {"log_std": torch.zeros(1), **{f"mlp_extractor.policy_net.{k}": v for k, v in pi.state_dict().items()},
             **{f"mlp_extractor.value_net.{k}": v for k, v in vf.state_dict().items()},
             **{f"action_net.{k}": v for k, v in action_net.state_dict().items()},
             "value_net.weight": torch.zeros(1, 16), "value_net.bias": torch.zeros(1)}
    data = {"action_space": space or box_space([-2.0], [2.0]), "policy_kwargs": kwargs or {}}
    return sb3_zip(path, state, data), (lambda x: torch.clamp(action_net(pi(x)), -2, 2))


def test_sb3_sac_td3_ppo_import_as_actors_with_their_squashing_and_bounds(tmp_path):
    """SAC: tanh then the rescaling to [low, high]; TD3: its Tanh rescaled; PPO: the mean clipped to the
    bounds; the critics the attack uses (SAC: min of two; TD3: the first); the bounds recorded in the spec."""
    src, action, q = sb3_sac(tmp_path / "sac.zip")
    net, info = check_policy_file(src, "mlp", "auto", None, "Pendulum-v1", "vector")
    assert info["network"] == "actor" and info["net_spec"]["squash"] == "tanh"
    assert info["net_spec"]["low"] == [-2.0] and info["net_spec"]["high"] == [2.0]
    assert info["net_spec"]["critic"]["count"] == 2
    with torch.no_grad():
        assert torch.allclose(net(OBS), action(OBS), atol=1e-6)
        assert torch.allclose(net.q(OBS, net.raw(OBS)), q(OBS), atol=1e-6)
    src, action, q = _td3(tmp_path / "td3.zip")
    net, info = check_policy_file(src, "mlp", "auto", None, "Pendulum-v1", "vector")
    assert info["net_spec"]["critic"]["count"] == 1
    with torch.no_grad():
        assert torch.allclose(net(OBS), action(OBS), atol=1e-6)
        assert torch.allclose(net.q(OBS, net.raw(OBS)), q(OBS), atol=1e-6)
    # PPO: the mean, clipped to the bounds (a larger action_net makes some of the 64 outputs leave [-2, 2])
    src, action = _ppo(tmp_path / "ppo.zip")
    with torch.no_grad():
        assert torch.allclose(import_policy(src, "mlp")[0](OBS), action(OBS), atol=1e-6)
    state = torch.load(io.BytesIO(zipfile.ZipFile(src).read("policy.pth")), weights_only=True)
    state["action_net.weight"] *= 40
    src = sb3_zip(tmp_path / "ppo_big.zip", state, {"action_space": box_space([-2.0], [2.0])})
    net, info = import_policy(src, "mlp")
    assert info["net_spec"]["squash"] == "clip" and info["net_spec"]["activation"] == "tanh"
    out = net(OBS).detach()
    assert out.min() == -2.0 or out.max() == 2.0
    assert bool(((out >= -2) & (out <= 2)).all())


class _CleanRLActor(nn.Module):
    """td3_continuous_action.py's Actor (sac_continuous_action.py's alike with fc_mean, fc_logstd)."""

    def __init__(self, head="fc_mu", low=-2.0, high=2.0):
        super().__init__()
        torch.manual_seed(9)
        self.fc1, self.fc2 = nn.Linear(3, 32), nn.Linear(32, 32)
        setattr(self, head, nn.Linear(32, 1))
        if head == "fc_mean":
            self.fc_logstd = nn.Linear(32, 1)
        self.head = head
        self.register_buffer("action_scale", torch.tensor([(high - low) / 2]))
        self.register_buffer("action_bias", torch.tensor([(high + low) / 2]))

    def forward(self, x):
        x = torch.relu(self.fc2(torch.relu(self.fc1(x))))
        return torch.tanh(getattr(self, self.head)(x)) * self.action_scale + self.action_bias


def _sac_layout(path, latent_sizes, n_critics, module="stable_baselines3.sac.policies"):
    """An SB3 SAC zip with net_arch ``latent_sizes`` (possibly []) and ``n_critics`` critics, its actions and its
    actor loss's value min_k Q_k(s, tanh(μ(s)))."""
    latent = nn.Sequential(*mlp([3, *latent_sizes], 1), nn.ReLU()) if latent_sizes else nn.Identity()
    mu = nn.Linear(latent_sizes[-1] if latent_sizes else 3, 1)
    qs = [mlp([4, 16, 1], 20 + k) for k in range(n_critics)]
    state = {**{f"actor.latent_pi.{k}": v for k, v in latent.state_dict().items()},
             **{f"actor.mu.{k}": v for k, v in mu.state_dict().items()},
             **{f"actor.log_std.{k}": v for k, v in nn.Linear(mu.in_features, 1).state_dict().items()},
             **{f"critic.qf{j}.{k}": v for j, q in enumerate(qs) for k, v in q.state_dict().items()}}
    data = {"action_space": box_space([-2.0], [2.0]), "policy_kwargs": {"net_arch": latent_sizes,
                                                                     "n_critics": n_critics},
            "policy_class": {":type:": "<class 'abc.ABCMeta'>", "__module__": module}}

    def q(x):
        a = torch.tanh(mu(latent(x)))
        return torch.stack([c(torch.cat([x, a], 1))[:, 0] for c in qs]).min(0).values

    return sb3_zip(path, state, data), (lambda x: 2.0 * torch.tanh(mu(latent(x)))), q


def test_sb3_sac_keeps_all_its_critics_and_imports_without_hidden_layers(tmp_path):
    """SAC's actor loss is the minimum over all n_critics critics (3 here); a SAC with net_arch [] (no
    latent_pi) is SAC, not TD3; a file whose declared policy class contradicts its layout is refused."""
    for sizes, n in [([16, 16], 3), ([], 2)]:
        src, action, q = _sac_layout(tmp_path / f"sac{n}.zip", sizes, n)
        net, info = check_policy_file(src, "mlp", "auto", None, "Pendulum-v1", "vector")
        assert info["net_spec"]["algorithm"] == "SAC" and info["net_spec"]["critic"]["count"] == n
        assert info["net_spec"]["hidden"] == sizes
        with torch.no_grad():
            assert torch.allclose(net(OBS), action(OBS), atol=1e-6)
            assert torch.allclose(net.q(OBS, net.raw(OBS)), q(OBS), atol=1e-5)
    odd = _sac_layout(tmp_path / "odd.zip", [16], 2, module="stable_baselines3.td3.policies")[0]
    _one_line(lambda: import_policy(odd, "mlp"), "declares a TD3 policy")


def _cleanrl_q(seed):
    torch.manual_seed(seed)
    q = nn.Module()
    q.fc1, q.fc2, q.fc3 = nn.Linear(4, 32), nn.Linear(32, 32), nn.Linear(32, 1)
    return q, (lambda x, a: q.fc3(torch.relu(q.fc2(torch.relu(q.fc1(torch.cat([x, a], 1)))))))


def test_cleanrl_td3_and_sac_import_with_their_buffers_bounds_and_env_scale_critics(tmp_path):
    actor = _CleanRLActor().eval()
    (q1, f1), (q2, _) = _cleanrl_q(10), _cleanrl_q(11)
    torch.save((actor.state_dict(), q1.state_dict(), q2.state_dict()), tmp_path / "td3.cleanrl_model")
    net, info = check_policy_file(tmp_path / "td3.cleanrl_model", "mlp", "auto", None, "Pendulum-v1", "vector")
    assert info["network"] == "actor" and info["format"] == "cleanrl" and info["net_spec"]["critic"]["count"] == 1
    assert info["net_spec"]["low"] == [-2.0] and info["net_spec"]["high"] == [2.0]
    with torch.no_grad():
        assert torch.allclose(net(OBS), actor(OBS), atol=1e-6)
        assert torch.allclose(net.q(OBS, net.raw(OBS)), f1(OBS, actor(OBS))[:, 0], atol=1e-5)
    sac = _CleanRLActor("fc_mean").eval()
    torch.save(sac.state_dict(), tmp_path / "sac.pt")
    net, info = import_policy(tmp_path / "sac.pt", "mlp")
    assert "critic" not in info["net_spec"]
    with torch.no_grad():
        assert torch.allclose(net(OBS), sac(OBS), atol=1e-6)
    wide = _CleanRLActor(low=-1.0, high=3.0)
    torch.save(wide.state_dict(), tmp_path / "wide.pt")
    _one_line(lambda: check_policy_file(tmp_path / "wide.pt", "mlp", "auto", None, "Pendulum-v1", "vector"),
              "disagree with Pendulum-v1's")
    ppo = {"actor_mean.0.weight": torch.zeros(8, 3), "actor_mean.0.bias": torch.zeros(8),
           "actor_logstd": torch.zeros(1, 1)}
    torch.save(ppo, tmp_path / "ppo.cleanrl_model")
    _one_line(lambda: import_policy(tmp_path / "ppo.cleanrl_model", "mlp"), "NormalizeObservation")


def test_an_over_limit_or_unknown_format_continuous_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """The format and the size limit are checked before any byte is read, for a CleanRL file as for any."""
    import crop.models

    actor = _CleanRLActor().eval()
    torch.save(actor.state_dict(), tmp_path / "td3.cleanrl_model")
    size = (tmp_path / "td3.cleanrl_model").stat().st_size

    def no_read(*a, **k):
        raise AssertionError("the file was read")
    monkeypatch.setattr(crop.models, "load_tensors", no_read)
    monkeypatch.setattr("pathlib.Path.read_bytes", no_read)
    for fmt in ("auto", "cleanrl", "torch"):
        _one_line(lambda: import_policy(tmp_path / "td3.cleanrl_model", "mlp", fmt, max_bytes=size - 1),
                  "over the limit")
    _one_line(lambda: import_policy(tmp_path / "td3.cleanrl_model", "mlp", "bogus"), "unknown format 'bogus'")
    _one_line(lambda: import_policy(sb3_sac(tmp_path / "s.zip")[0], "mlp", "bogus"), "unknown format 'bogus'")


def test_a_deeply_nested_data_member_is_one_line(tmp_path):
    """A ``data`` member nested deeper than the JSON parser's recursion limit is refused in one line, for a
    continuous agent (SAC) and for a discrete actor-critic (whose activation data would tell)."""
    def nested(path):
        with zipfile.ZipFile(path) as zf:
            members = {n: zf.read(n) for n in zf.namelist()}
        members["data"] = b"[" * 200000
        with zipfile.ZipFile(path, "w") as zf:
            for n, b in members.items():
                zf.writestr(n, b)
        return path

    _one_line(lambda: import_policy(nested(sb3_sac(tmp_path / "s.zip")[0]), "mlp"), "not SB3's JSON")
    ppo = _ppo(tmp_path / "p.zip")[0]
    with zipfile.ZipFile(ppo) as zf:
        state = torch.load(io.BytesIO(zf.read("policy.pth")), weights_only=True)
    del state["log_std"]     # a Categorical policy's actor-critic: read as a discrete policy
    _one_line(lambda: import_policy(nested(sb3_zip(tmp_path / "d.zip", state, {})), "mlp"), "not SB3's JSON")


def _one_line(fn, needle):
    with pytest.raises(PolicyImportError) as e:
        fn()
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


def test_continuous_files_crop_cannot_tell_are_refused_in_one_line(tmp_path):
    """No data member (bounds unknown), a Dict action space, bounds that disagree with the env's, a
    continuous agent on a Discrete env, an actor's size another env's."""
    check = lambda p, env="Pendulum-v1": check_policy_file(p, "mlp", "auto", None, env, "vector")  # noqa: E731
    _one_line(lambda: check(sb3_sac(tmp_path / "a.zip", with_data=False)[0]), "cannot be told")
    bad = _ppo(tmp_path / "b.zip", space={":type:": "<class 'gymnasium.spaces.dict.Dict'>"})[0]
    _one_line(lambda: check(bad), "not a Box")
    _one_line(lambda: check(sb3_sac(tmp_path / "c.zip", low=(-1.0,), high=(1.0,))[0]), "disagree with Pendulum-v1's")
    _one_line(lambda: check(sb3_sac(tmp_path / "d.zip")[0], "CartPole-v1"), "Discrete action space")
    _one_line(lambda: check(sb3_sac(tmp_path / "e.zip", data_extra={"use_sde": True})[0]), "gSDE")
    _one_line(lambda: import_policy(sb3_sac(tmp_path / "f.zip")[0], {"arch": "mlp", "hidden": [8]}),
              "read from the file")


class _MultiBinaryEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.MultiBinary(3)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, a):
        return np.zeros(2, np.float32), 0.0, True, False, {}


def test_an_action_space_crop_cannot_certify_is_one_line():
    from crop.envs import UnknownEnvError, make_env

    gym.register("CropTestMultiBinary-v0", entry_point=_MultiBinaryEnv)
    with pytest.raises(UnknownEnvError) as e:
        make_env("CropTestMultiBinary-v0")
    assert "neither Discrete(n) from 0 nor a Box" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("argv,needle", [
    (["loact", "--target", "q", "--out", "x.csv"], "has no Q-values"),
    (["loact", "--target", "vote", "--out", "x.csv"], "greedy-action votes"),
    (["qrange", "--out", "x.json"], "V range"),
    (["attack-local", "--out", "x.csv"], "local attack"),
    (["lore", "--reward-range", "-16.3", "0", "--out", "x.csv"], "LoRe"),
    (["loact", "--bound", "betting", "--out", "x.csv"], "--bound betting: a continuous-action agent's LoAct"),
])
def test_discrete_stages_on_a_continuous_agent_are_one_line(imported, tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit):
        main([argv[0], "--env", "Pendulum-v1", "--algo", "SAC", "--sigma", "0.1", "--checkpoint", str(imported),
              *[str(tmp_path / a) if a.startswith("x.") else a for a in argv[1:]]])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not list(tmp_path.iterdir())


def _scaled(src, dst, factor):
    """A copy of the SB3 zip ``src`` with every weight multiplied by ``factor``."""
    with zipfile.ZipFile(src) as zf:
        data, state = zf.read("data"), torch.load(io.BytesIO(zf.read("policy.pth")))
    return sb3_zip(dst, {k: v * factor for k, v in state.items()}, json.loads(data))


def test_an_import_whose_greedy_return_is_not_finite_is_refused_and_writes_nothing(tmp_path, capsys):
    """Weights of 1e30 are finite, so the file's checks pass, but the actor's outputs overflow to NaN: the
    import refuses it in one line naming the actor and its weights, before model.pt or model.json exist."""
    big = _scaled(sb3_sac(tmp_path / "sac.zip")[0], tmp_path / "big.zip", 1e30)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["import", "--env", "Pendulum-v1", "--algo", "SAC", "--file", str(big), "--eval-episodes", "2",
              "--out", str(out / "model.pt")])
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("crop import")]
    assert exc.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"crop import: error: {big}: the imported actor's greedy return is nan over 2 episodes: "
                             "its outputs are not finite (weights of magnitude up to ")
    assert "e+29)" in err[0] or "e+30)" in err[0]
    assert not (out / "model.pt").exists() and not (out / "model.json").exists()


def test_an_actor_that_returns_nan_is_called_an_actor(imported):
    """The stages name the network as what it is: an actor's NaN is the actor's (GRe, the global attack), a
    policy network's the policy network's, a Q-network's the Q-network's."""
    from crop.certify.attack import GlobalAttackSettings, run_global_attack
    from crop.certify.gre import GReSettings, sample_randomized_returns
    from crop.models import load_checkpoint
    from crop.smoothing.smoothed import NonFiniteOutputError, SmoothedNetwork, SmoothingSettings

    net, _ = load_checkpoint(imported, "Pendulum-v1", "SAC")
    with torch.no_grad():
        for p in net.actor.parameters():
            p.fill_(math.nan)
    with pytest.raises(NonFiniteOutputError, match=r"^the actor returned NaN or inf at step 0"):
        sample_randomized_returns("Pendulum-v1", net, GReSettings(0.1, 4, 5, 1.0, seed=1, env_seed=2))
    with pytest.raises(NonFiniteOutputError, match=r"^the actor returned NaN or inf during the attack"):
        run_global_attack("Pendulum-v1", net, GlobalAttackSettings(0.1, [0.2], [[5]], 5, steps=2, n_eot=2))
    policy = mlp([3, 4, 2], 0)
    policy.network_kind = "policy"
    with torch.no_grad():
        policy[0].weight.fill_(math.nan)
    sm = SmoothedNetwork(policy, SmoothingSettings(0.1, 8, 0.0, 1.0, 0.05, target="probs"), 2)
    with pytest.raises(NonFiniteOutputError, match=r"^the policy network returned NaN or inf at state 3"):
        sm.estimate(np.zeros(3, np.float32), index=3)
    from crop.names import network_name

    assert network_name(mlp([3, 2], 0)) == "Q-network"


def test_gre_and_global_attack_run_on_a_continuous_agent(imported):
    from crop.certify.attack import GlobalAttackSettings, pgd_l2, run_global_attack
    from crop.certify.gre import GReSettings, sample_randomized_returns
    from crop.models import load_checkpoint

    net, _ = load_checkpoint(imported, "Pendulum-v1", "SAC")
    a = sample_randomized_returns("Pendulum-v1", net, GReSettings(0.1, 6, 30, 1.0, seed=1, env_seed=2))
    b = sample_randomized_returns("Pendulum-v1", net, GReSettings(0.1, 6, 30, 1.0, seed=1, env_seed=2, batch=4))
    again = sample_randomized_returns("Pendulum-v1", net, GReSettings(0.1, 6, 30, 1.0, seed=1, env_seed=2))
    # the same noise whatever the block: equal up to the float rounding of a batched forward (actions are floats)
    assert np.array_equal(a, again) and np.allclose(a, b, rtol=1e-6, atol=0)
    assert (a <= 0).all() and (a >= PENDULUM_MIN * 30).all()
    table = run_global_attack("Pendulum-v1", net, GlobalAttackSettings(0.1, [0.0, 0.2], [[5, 6], [5, 6]], 20, steps=5,
                                                                       n_eot=8))
    assert len(table) == 4 and np.isfinite(table["return"]).all()
    # the attack's objective: PGD lowers the critic's value of the action taken under the perturbation
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(4))
    loss = lambda z: -net.q(x, net.raw(z))  # noqa: E731
    delta = pgd_l2(loss, x, torch.full((16,), 0.3), steps=10)
    with torch.no_grad():
        assert (loss(x + delta) >= loss(x) - 1e-6).all() and (loss(x + delta) > loss(x) + 1e-4).any()


def test_order_indices_are_the_exact_binomial_ones():
    from crop.certify.percentile import order_indices

    m, alpha = 200, 0.01
    for f in (0.0, 0.3, 1.0):
        k, k2 = order_indices(m, 0.5, f, alpha)
        p_lo, p_hi = norm.cdf(-f), norm.cdf(f)
        ok_lo = [j for j in range(1, m + 1) if binom.cdf(j - 1, m, p_lo) <= alpha]
        ok_hi = [j for j in range(1, m + 1) if binom.sf(j - 1, m, p_hi) <= alpha]
        assert k == max(ok_lo) and k2 == min(ok_hi)


def test_the_schema_states_the_default_action_tolerance_the_certifier_uses():
    """loact.action_tolerance's null means percentile.DEFAULT_TOLERANCE of each range: the schema's text (which
    --action-tolerance's help shows) says that number, and no other percentage."""
    import re

    from crop.certify.percentile import DEFAULT_TOLERANCE
    from crop.schema import schema_node

    text = schema_node("environment.loact")["properties"]["action_tolerance"]["description"]
    assert re.findall(r"(\d+(?:\.\d+)?) %", text) == [f"{100 * DEFAULT_TOLERANCE:g}"], text


def test_the_played_action_is_the_empirical_h_p_the_intervals_certify():
    """π̃ plays sup{y : F_m(y) ≤ p} of the m samples' empirical CDF (the sup definition of h_p the certificate
    is for), per dimension, for m·p whole or not."""
    from crop.certify.percentile import smoothed_action

    rng = np.random.default_rng(0)
    for m, p in [(200, 0.5), (201, 0.5), (100, 0.25), (10, 0.9), (7, 0.99), (1, 0.5)]:
        x = rng.standard_normal((m, 3))
        brute = [min(y for y in x[:, k] if np.mean(x[:, k] <= y) > p) for k in range(3)]
        np.testing.assert_array_equal(smoothed_action(x, p), brute)


def test_each_one_sided_percentile_bound_misses_at_most_alpha_each():
    """Every one-sided bound of every ε of the grid, on its own, misses at rate <= α_each (the union bound adds
    them up, so each must hold at its own level).  A 1-D toy actor f(s) = s + 0.3 tanh(s), increasing and never
    saturating, so h_q(s) = f(s + σΦ⁻¹(q)) for every q: the lower end must be <= h_p̲(s) = h_p(s − ε) and the
    upper >= h_p̄(s) = h_p(s + ε) (Theorem 1's ends for a monotone f).  20,000 repetitions at m = 100 (one
    vectorised call: the repetitions are the columns) resolve the miss rate to ±0.0015, so an order statistic
    one index too far inward (miss rates 0.053–0.092 here, against 0.032–0.044 of the right ones) fails."""
    from crop.certify.percentile import EPS_FACTORS, action_intervals

    f = lambda s: s + 0.3 * np.tanh(s)  # noqa: E731
    sigma, p, m, alpha_each, reps = 0.5, 0.5, 100, 0.05, 20000
    rng = np.random.default_rng(0)
    s = rng.uniform(-1, 1, reps)
    lower, upper = action_intervals(f(s + sigma * rng.standard_normal((m, reps))), np.full(reps, -1e9),
                                    np.full(reps, 1e9), EPS_FACTORS, p, alpha_each)
    z = norm.ppf(p)
    slack = 4 * np.sqrt(alpha_each * (1 - alpha_each) / reps)
    for g, e in enumerate(EPS_FACTORS):
        miss_lo = np.mean(lower[:, g] > f(s + sigma * (z - e)))
        miss_hi = np.mean(upper[:, g] < f(s + sigma * (z + e)))
        assert miss_lo <= alpha_each + slack and miss_hi <= alpha_each + slack, (e, miss_lo, miss_hi)
    # and the intervals are not vacuous: at ε = 0 they are narrow in most repetitions
    assert np.median(upper[:, 0] - lower[:, 0]) < 0.5


class _DriftEnv(gym.Env):
    """A 1-D state drawn afresh each step from the env's own generator (whatever the action), two action
    dimensions; every instance keeps the observations it gave, in order."""
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    made: list = []

    def __init__(self):
        self.seen = []
        _DriftEnv.made.append(self)

    def _obs(self):
        self.seen.append(self.np_random.uniform(-1, 1, 1).astype(np.float32))
        return self.seen[-1]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, a):
        return self._obs(), 0.0, False, False, {}


@pytest.mark.slow
def test_loact_of_a_two_dimensional_actor_covers_the_true_median_action_at_its_states():
    """run_loact_continuous on a toy env with a linear actor of d = 2 (one dimension increasing, one
    decreasing, never clipped), so the true median action h_0.5(s) is f(s) itself: at the states the episodes
    visit, the ε = 0 interval of both dimensions holds it at rate >= 1 − 2d·α_each (the four one-sided bounds
    at ε = 0 of the 2·d·G the union bound counts), and each bound is at α_state / (2·2·7)."""
    from crop.certify.percentile import EPS_FACTORS, PercentileSettings, run_loact_continuous
    from crop.models.actor import ContinuousActor

    gym.register("CropTestDrift-v0", entry_point=_DriftEnv, max_episode_steps=1000)
    net = ContinuousActor({"arch": "actor", "in": 1, "hidden": [], "out": 2, "squash": "clip", "low": [-10, -10],
                           "high": [10, 10]})
    with torch.no_grad():
        net.actor[0].weight.copy_(torch.tensor([[1.0], [-2.0]]))
        net.actor[0].bias.copy_(torch.tensor([0.0, 0.5]))
    alpha_state, episodes, horizon = 0.35, 20, 100
    _DriftEnv.made.clear()
    settings = PercentileSettings(0.5, 100, episodes, horizon, range(episodes), alpha_state=alpha_state, seed=0)
    table, _, info = run_loact_continuous("CropTestDrift-v0", net, settings, progress=False)
    assert info["per_bound_alpha"] == alpha_state / (2 * 2 * len(EPS_FACTORS))
    obs = np.stack([np.concatenate(e.seen[:horizon]) for e in _DriftEnv.made])          # (episode, step)
    truth = np.stack([obs, -2 * obs + 0.5], -1)                                           # (episode, step, dim)
    t = table.sort_values(["episode", "step", "dim"])
    held = ((t["lower_e0"].to_numpy() <= truth.ravel()) & (truth.ravel() <= t["upper_e0"].to_numpy()))
    missed = (~held.reshape(episodes * horizon, 2)).any(1).sum()
    level = 2 * 2 * info["per_bound_alpha"]
    assert missed <= binom.ppf(0.999, episodes * horizon, level), (missed, level)
    assert np.median(t["upper_e0"] - t["lower_e0"]) < 1.0     # and not vacuous


def test_crop_loact_on_a_continuous_agent_writes_one_row_per_step_and_dimension(imported, tmp_path):
    import pandas as pd

    f = {k: tmp_path / RUN_FILES[k] for k in ("loact", "loact_episodes", "certified_ratio")}
    main(["loact", "--env", "Pendulum-v1", "--algo", "SAC", "--sigma", "0.1", "--checkpoint", str(imported),
          "--m", "200", "--episodes", "2", "--horizon", "5", "--action-tolerance", "0.5", "--out", str(f["loact"]),
          "--out-episodes", str(f["loact_episodes"]), "--out-ratio", str(f["certified_ratio"])])
    table = pd.read_csv(f["loact"])
    assert len(table) == 2 * 5 and set(table["dim"]) == {0}
    assert len(pd.read_csv(f["loact_episodes"])) == 2
    assert (tmp_path / meta_name(RUN_FILES["certified_ratio"])).is_file()
    meta = json.loads((tmp_path / meta_name(RUN_FILES["loact"])).read_text())
    assert "exact binomial order statistics" in json.dumps(meta) and "hoeffding" not in json.dumps(meta)


def test_crop_loact_clips_the_benign_rewards_it_is_told_to(imported, tmp_path):
    """Pendulum's rewards reach −16.3: with --clip-rewards to [−0.5, 0] every step's recorded reward is the
    clipped one (some were below), and each benign return is the sum of its episode's clipped rewards."""
    import pandas as pd

    f = {k: tmp_path / RUN_FILES[k] for k in ("loact", "loact_episodes", "certified_ratio")}
    args = ["loact", "--env", "Pendulum-v1", "--algo", "SAC", "--sigma", "0.1", "--checkpoint", str(imported),
            "--m", "50", "--episodes", "2", "--horizon", "20", "--out", str(f["loact"]), "--out-episodes",
            str(f["loact_episodes"]), "--out-ratio", str(f["certified_ratio"])]
    main(args)
    raw = pd.read_csv(f["loact"])
    assert (raw["reward"] < -0.5).any()   # the clip below has something to do
    main([*args, "--reward-range", "-0.5", "0", "--clip-rewards"])
    table, episodes = pd.read_csv(f["loact"]), pd.read_csv(f["loact_episodes"])
    np.testing.assert_array_equal(table["reward"], np.clip(raw["reward"], -0.5, 0.0))
    per_episode = table.groupby("episode")["reward"].sum()
    np.testing.assert_allclose(episodes.set_index("episode")["return"].sort_index(), per_episode, rtol=0, atol=1e-9)


# ------------------------------------------------------------------------- the real agents (tests/data/continuous)

DATA = __import__("pathlib").Path(__file__).parent / "data" / "continuous"
REAL = [("sac_pendulum", "Pendulum-v1", [PENDULUM_MIN, 0.0]),
        ("ppo_mountaincar", "MountainCarContinuous-v0", [-0.1, 100.0])]


def test_pendulum_reward_range_is_the_documented_one_and_holds_every_reward():
    """The docs' range is the formula's, rounded outwards; the environment's own rewards at the extremes and at
    random states stay within it."""
    docs = REPO / "docs"
    for name in ("statistics.md", "own-policy.md"):
        assert f"{PENDULUM_MIN:.7f}".lstrip("-") in (docs / name).read_text()
    assert PENDULUM_MIN < -(math.pi ** 2 + 6.4 + 0.004)
    env = gym.make("Pendulum-v1").unwrapped
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for th, thdot, u in [(np.pi, 8.0, 2.0), (-np.pi, -8.0, -2.0), *rng.uniform([-4, -8, -2], [4, 8, 2], (200, 3))]:
        env.state = np.array([th, thdot])
        r = env.step(np.array([u], dtype=np.float32))[1]
        assert PENDULUM_MIN <= r <= 0.0


@pytest.mark.parametrize("name,env,_", REAL, ids=[r[0] for r in REAL])
def test_real_sb3_agents_act_as_sb3_predicts(name, env, _):
    """The trained zips import with SB3's own deterministic actions (and SAC's critic values), recorded by
    make_agents.py with SB3 installed; here SB3 is not needed."""
    ref = np.load(DATA / "reference.npz")
    net, info = check_policy_file(DATA / f"{name}.zip", "mlp", "auto", None, env, "vector")
    obs = torch.as_tensor(ref[f"{name}_obs"])
    with torch.no_grad():
        np.testing.assert_allclose(net(obs).numpy(), ref[f"{name}_action"], rtol=0, atol=1e-5)
        if f"{name}_q" in ref:
            np.testing.assert_allclose(net.q(obs, net.raw(obs)).numpy(), ref[f"{name}_q"], rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name,env,rewards", REAL, ids=[r[0] for r in REAL])
def test_real_sb3_agents_certified_end_to_end(name, env, rewards, tmp_path):
    """import → GRe → global attack → LoAct (percentile) on the trained agents, by the CLI as the docs run it
    (docs/own-policy.md, "Continuous-action agents"): every output written with its provenance, GRe's
    bounds below the mean randomized return, the intervals holding the action played."""
    import pandas as pd

    ck, common = tmp_path / "model.pt", ["--env", env, "--algo", "Mine", "--no-progress"]
    main(["import", *common, "--file", str(DATA / f"{name}.zip"), "--eval-episodes", "2", "--out", str(ck)])
    stage = [*common, "--sigma", "0.05", "--checkpoint", str(ck)]
    written = ("gre", "gre_returns", "attack_global", "loact", "loact_episodes", "certified_ratio")
    f = {k: str(tmp_path / RUN_FILES[k]) for k in written}
    main(["gre", *stage, "--m", "200", "--horizon", "100", "--reward-range", *map(str, rewards),
          "--out", f["gre"], "--out-returns", f["gre_returns"]])
    main(["attack-global", *stage, "--episodes", "2", "--horizon", "50", "--eps-factors", "0", "1",
          "--out", f["attack_global"]])
    main(["loact", *stage, "--m", "500", "--episodes", "2", "--horizon", "50", "--out", f["loact"],
          "--out-episodes", f["loact_episodes"], "--out-ratio", f["certified_ratio"]])
    gre = pd.read_csv(f["gre"])
    returns = pd.read_csv(f["gre_returns"])["return"]
    assert gre["eps"].is_monotonic_increasing and len(returns) == 200
    assert len(pd.read_csv(f["attack_global"])) == 4
    assert len(pd.read_csv(f["loact"])) == 2 * 50
    for k in written:   # a JSON result carries its provenance inside; every CSV has its .meta.json
        assert (tmp_path / meta_name(RUN_FILES[k])).is_file()


def test_clipped_rewards_are_what_gre_and_the_attack_certify(imported, tmp_path, capsys):
    """Pendulum's rewards reach −16.3: with a declared range of [−1, 0] GRe stops in one line; with
    --clip-rewards the returns are those of the clipped rewards (each step ≥ −1), the metadata say so, and a
    clip range wider than the rewards changes nothing (the same bytes)."""
    import pandas as pd

    from crop.certify.gre import GReSettings, sample_randomized_returns
    from crop.models import load_checkpoint

    base = ["--env", "Pendulum-v1", "--algo", "SAC", "--sigma", "0.1", "--checkpoint", str(imported), "--no-progress"]
    gre = ["gre", *base, "--m", "20", "--horizon", "30", "--reward-range", "-1", "0",
           "--out", str(tmp_path / RUN_FILES["gre"]), "--out-returns", str(tmp_path / RUN_FILES["gre_returns"])]
    with pytest.raises(SystemExit):
        main(gre)
    assert "leave [J_min, J_max]" in capsys.readouterr().err
    main([*gre, "--clip-rewards"])
    returns = pd.read_csv(tmp_path / RUN_FILES["gre_returns"])["return"]
    assert (returns >= -30).all() and (returns < 0).all()
    assert "clipped" in json.loads((tmp_path / meta_name(RUN_FILES["gre"])).read_text())["reward_clip_note"]
    main(["attack-global", *base, "--episodes", "1", "--horizon", "30", "--eps-factors", "0", "--reward-range", "-1",
          "0", "--clip-rewards", "--out", str(tmp_path / RUN_FILES["attack_global"])])
    assert (pd.read_csv(tmp_path / RUN_FILES["attack_global"])["return"] >= -30).all()
    net, _ = load_checkpoint(imported, "Pendulum-v1", "SAC")
    plain = sample_randomized_returns("Pendulum-v1", net, GReSettings(0.1, 4, 20, 1.0, seed=3, env_seed=4))
    wide = sample_randomized_returns("Pendulum-v1", net, GReSettings(0.1, 4, 20, 1.0, seed=3, env_seed=4,
                                                                     reward_clip=(-100, 0)))
    assert np.array_equal(plain, wide)


def test_mujoco_environments_are_box_environments_gre_runs_on_with_clipped_rewards():
    """The optional `mujoco` extra: HalfCheetah-v5 (6 action dimensions in [−1, 1], unbounded rewards) takes an
    actor of its sizes; GRe's returns with --clip-rewards' range stay in [J_min, J_max]."""
    pytest.importorskip("mujoco")
    from crop.certify.gre import GReSettings, sample_randomized_returns
    from crop.envs import action_bounds, env_shapes
    from crop.models import fit_problem
    from crop.models.actor import ContinuousActor

    assert env_shapes("HalfCheetah-v5") == (6, (17,))
    assert action_bounds("HalfCheetah-v5") == ((-1.0,) * 6, (1.0,) * 6)
    spec = {"arch": "actor", "in": 17, "hidden": [16], "out": 6, "activation": "relu", "squash": "tanh",
            "low": [-1.0] * 6, "high": [1.0] * 6}
    assert fit_problem(spec, "HalfCheetah-v5") is None
    assert "disagree" in fit_problem({**spec, "high": [2.0] * 6}, "HalfCheetah-v5")
    torch.manual_seed(0)
    settings = GReSettings(0.1, 4, 20, 1.0, seed=0, env_seed=0, reward_clip=(-0.05, 0.05))
    returns = sample_randomized_returns("HalfCheetah-v5", ContinuousActor(spec).eval(), settings)
    assert (np.abs(returns) <= 20 * 0.05 + 1e-12).all()


def test_actions_stay_within_asymmetric_bounds_at_the_ends_of_tanh():
    """float32 rounding of low + (raw + 1)/2 · (high − low) can exceed high (or fall below low) by one ulp for
    asymmetric bounds; every action the actor gives lies in [low, high] all the same."""
    from crop.models.actor import ContinuousActor

    g = torch.Generator().manual_seed(0)
    bounds = [([-2.8487583], [0.58279073])] + [((-3 * torch.rand(4, generator=g)).tolist(),
                                                (3 * torch.rand(4, generator=g) + 1e-3).tolist()) for _ in range(200)]
    for low, high in bounds:
        d = len(low)
        actor = ContinuousActor({"arch": "actor", "in": 2, "hidden": [], "out": d, "squash": "tanh", "low": low,
                                 "high": high})
        raw = torch.cat([torch.ones(1, d), -torch.ones(1, d), 2 * torch.rand(64, d, generator=g) - 1])
        out = actor.to_env(raw)
        assert ((out >= actor.low) & (out <= actor.high)).all(), (low, high)


def test_a_workflow_config_clips_rewards_of_a_box_environment_only_and_needs_its_range():
    """A discrete environment's LoRe and local attack never clip: a config clipping its rewards is refused in
    one line; a Box environment (no LoRe) may clip, to a declared rewards.range only."""
    from crop.workflow.config import ConfigError, validate_config

    ec = {"source": "file", "files": {"Mine": {"path": "a.pt"}}, "algorithms": ["Mine"], "sigmas": [0.1],
          "rewards": {"range": [-1.0, 0.0]}}
    validate_config({"environments": {"Acrobot-v1": ec}})
    with pytest.raises(ConfigError) as e:
        validate_config({"environments": {"Acrobot-v1": {**ec, "rewards": {"range": [-1.0, 0.0], "clip": True}}}})
    assert "environments.Acrobot-v1.rewards.clip: a discrete-action environment's LoRe" in str(e.value)
    assert "\n" not in str(e.value)
    box = {**ec, "rewards": {"range": [-16.3, 0.0], "clip": True}}
    assert validate_config({"environments": {"Pendulum-v1": box}})["environments"]["Pendulum-v1"]["rewards"]["clip"]
    with pytest.raises(ConfigError) as e:   # the range it clips to is the config's: none, no clip
        validate_config({"environments": {"Pendulum-v1": {**ec, "rewards": {"clip": True}}}})
    assert "environments.Pendulum-v1.rewards.clip: clips every reward to rewards.range" in str(e.value)
    with pytest.raises(ConfigError) as e:   # the game's return range does not bound the clipped return
        validate_config({"environments": {"Pendulum-v1": {**ec, "rewards": {**box["rewards"],
                                                                            "return_range": [-100.0, 0.0]}}}})
    assert "environments.Pendulum-v1.rewards.return_range: bounds the game's own return" in str(e.value)


def test_report_captions_name_the_clip_exactly_on_the_figures_of_returns():
    """The report's figure captions (report/{family}.rst, rendered as Snakemake's report does) of a run with
    clipped rewards: those of the figures of returns or return bounds (LoAct's benign return, GRe against the
    global attack, all bounds) say the rewards are clipped; those of radii and certified ratios (stepwise,
    certified ratio, periodic, large σ), of LoRe and the local attack (adasearch, never clipped) and the legend
    do not."""
    import jinja2

    from crop.report.captions import caption_settings
    from crop.workflow.config import validate_config
    from crop.workflow.layout import FIGURE_FAMILIES

    ec = {"source": "file", "files": {"Mine": {"path": "a.pt"}}, "algorithms": ["Mine"], "sigmas": [0.1]}
    returns = {"loact_clean", "global_mean", "global_median", "all_bounds"}
    for rewards, note in (({"range": [-16.3, 0.0], "clip": True}, "rewards clipped to [-16.3, 0]"),
                          ({"range": [-16.3, 0.0]}, None)):
        cfg = validate_config({"environments": {"Pendulum-v1": {**ec, "rewards": rewards}}})
        params = {"settings": caption_settings(cfg), "alpha": cfg["alpha"]}
        for family in FIGURE_FAMILIES:
            text = jinja2.Template((REPO / "report" / f"{family}.rst").read_text()).render(
                snakemake={"params": params})
            assert "Pendulum-v1" in text or family == "legend", family
            assert ("rewards clipped" in text) == (note is not None and family in returns), (family, text)
            if note and family in returns:
                assert f"returns and bounds of {note} (rewards.clip)" in text, (family, text)
        assert ("rewards clipped" in str(params["settings"])) == (note is not None)


# ---------------------------------------------------------------------------------------- through the workflow

CONTINUOUS = DATA.parents[1] / "configs" / "continuous.yaml"


def _snakemake(work, *args, config=CONTINUOUS):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                           str(work), "--configfile", str(config), *args], capture_output=True, text=True,
                          timeout=1200, env=dict(os.environ, PYTHONPATH=str(REPO)))


def _workdir(tmp_path):
    import shutil

    for name, *_ in REAL:
        shutil.copy(DATA / f"{name}.zip", tmp_path / f"{name}.zip")
    return tmp_path


def test_a_box_environment_runs_the_stages_an_actor_has_and_no_other():
    """The config's Box environments get the target action (their run folders ENV/ALGO@action/sigma-S) and
    the stages without a finite set of actions; the discrete ones keep all of theirs."""
    from crop.workflow import layout
    from crop.workflow.config import load_config, run_targets

    assert layout.run_stages("action") == ["loact", "gre", "attack-global"]
    assert layout.run_stages("q") == list(STAGES) and "qrange" not in layout.run_stages("vote")
    assert set(layout.run_files("action")) == {"loact", "loact_episodes", "certified_ratio", "frames", "gre",
                                               "gre_returns", "attack_global"}
    cfg = load_config(CONTINUOUS)
    assert sorted(run_targets(cfg)) == [("MountainCarContinuous-v0", "MyPPO", "0.05", "action"),
                                        ("Pendulum-v1", "MySAC", "0.05", "action")]


def test_the_continuous_config_plans_checkpoint_loact_gre_and_the_global_attack_only(tmp_path):
    p = _snakemake(_workdir(tmp_path), "-n", "--quiet", "rules")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    counts = {}
    for line in p.stdout.splitlines():
        words = line.split()
        if len(words) == 2 and words[1].isdigit():
            counts[words[0]] = int(words[1])
    assert {k: v for k, v in counts.items() if k != "total"} == {
        "checkpoint": 2, "loact": 2, "gre": 2, "attack_global": 2, "aggregate": 1, "audit": 1, "all": 1}, counts


@pytest.mark.parametrize("change,needle", [
    ({"target": "q"}, "environments.Pendulum-v1.target: its actions are continuous (a Box)"),
    ({"targets": ["vote"]}, "environments.Pendulum-v1.targets: its actions are continuous (a Box)"),
    ({"source": "auto", "algorithms": ["StdTrain"]}, "environments.Pendulum-v1.source: its actions are continuous"),
])
def test_a_box_environment_with_a_target_or_without_files_is_one_line(change, needle):
    import yaml

    from crop.workflow.config import ConfigError, validate_config

    cfg = yaml.safe_load(CONTINUOUS.read_text())
    cfg["environments"]["Pendulum-v1"].update(change)
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_an_actor_file_for_a_discrete_environment_in_a_config_is_one_line():
    from crop.workflow.config import ConfigError, check_policy_files, validate_config

    ec = {"source": "file", "files": {"Mine": {"path": str(DATA / "sac_pendulum.zip")}}, "algorithms": ["Mine"],
          "sigmas": [0.1], "rewards": {"range": [-1.0, 0.0]}}
    with pytest.raises(ConfigError) as e:
        check_policy_files(validate_config({"environments": {"Acrobot-v1": ec}}))
    assert "environments.Acrobot-v1.files.Mine" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_the_continuous_config_runs_end_to_end_and_its_audit_finishes(tmp_path):
    import pandas as pd

    work = _workdir(tmp_path)
    p = _snakemake(work, "--cores", "2")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    res = work / "results-continuous"
    audit = json.loads((res / "audit/audit.json").read_text())
    assert audit["violations"] == 0 and audit["integrity_problems"] == 0 and audit["checked"] > 0
    assert "Pendulum-v1" in (res / "audit/audit.md").read_text()
    for env, algo in (("Pendulum-v1", "MySAC"), ("MountainCarContinuous-v0", "MyPPO")):
        rec = json.loads((res / env / algo / "checkpoint/model.json").read_text())
        assert rec["source"] == "file" and rec["net_spec"]["arch"] == "actor"
        run = res / env / f"{algo}@action" / "sigma-0.05"
        assert sorted(f.name for f in run.iterdir() if not f.name.endswith(".meta.json")) == \
            sorted(RUN_FILES[k] for k in ("loact", "loact_episodes", "certified_ratio", "frames", "gre",
                                          "gre_returns", "attack_global"))
        steps = pd.read_csv(run / RUN_FILES["loact"])   # one row per step and action dimension
        assert set(steps["dim"]) == {0} and len(steps) == 12
        assert len(np.load(run / FRAMES_FILE)["frames"]) == 0
        assert f"{algo} (action)" in (res / f"tables/{env}_benign_return.md").read_text()
        for stem in ("stepwise", "certified_ratio", "all_bounds", "global_median_sigma-0.05"):
            assert (res / "figures" / f"{env}_{stem}.png").is_file()
        assert not list((res / "figures").glob(f"{env}_adasearch*"))   # no LoRe: no empty figure
        # the report's LoAct numbers are per step (every dimension certified), as certified_ratio.csv counts them
        from crop.certify.percentile import step_ratio

        table = pd.read_csv(res / f"tables/{env}_certified_fraction.csv")
        assert len(table) == 1 and table["algo"][0] == f"{algo} (action)"
        assert table["sigma=0.05"][0] == pytest.approx(step_ratio(steps)["certified"].mean(), abs=1e-9)


def test_the_report_reads_a_continuous_run_per_step_and_draws_no_lore_for_it():
    """LoAct's per-dimension table becomes one row per step (certified when every dimension is, at the
    smallest radius); LoRe's metrics are absent, not errors; an environment whose runs are all continuous
    agents' has no adasearch figure and no J̲ row in all_bounds, one with a discrete run keeps them."""
    import pandas as pd

    from crop.report.captions import caption_settings
    from crop.report.metrics import _per_step, metric_value
    from crop.workflow.layout import figure_families, has_lore

    dims = pd.DataFrame({"episode": [0, 0, 0, 0], "step": [0, 0, 1, 1], "dim": [0, 1, 0, 1],
                         "certified": [True, True, True, False], "radius": [0.2, 0.1, 0.3, 0.0]})
    run = {"loact": dims}
    _per_step(run)
    assert run["loact"]["certified"].tolist() == [True, False] and run["loact"]["radius"].tolist() == [0.1, 0.0]
    assert metric_value(run, "certified_fraction") == 0.5 and metric_value(run, "mean_radius") == 0.05
    assert metric_value(run, "lore_bound", 0.0) is None and metric_value(run, "pgd_local_return", 0.0) is None
    assert not has_lore(["MySAC@action", "MyTD3@action"]) and has_lore(["StdTrain", "StdTrain@vote"])
    assert has_lore([])   # algorithms not known: the full list
    assert figure_families("Pendulum-v1", ["0.05", "0.1"], ["MySAC@action"])["adasearch"] == []
    assert figure_families("CartPole-v0", ["0.05"], ["StdTrain@vote"])["adasearch"] == ["CartPole_adasearch_sigma-0.05"]
    import yaml

    from crop.workflow.config import validate_config

    settings = caption_settings(validate_config(yaml.safe_load(CONTINUOUS.read_text())))
    assert all("no adasearch figure" in s["no_lore"] for s in settings.values())


# ---------------------------------------------------------------------- MuJoCo through the workflow, clipped

MUJOCO = DATA.parents[1] / "configs" / "mujoco.yaml"


def _need_mujoco():
    """MuJoCo's environments come with the optional `mujoco` extra (.ci/run installs it)."""
    try:
        import mujoco  # noqa: F401
    except ImportError:
        pytest.skip("mujoco is not importable: pip install -e '.[mujoco]' for the MuJoCo tests")


def test_the_mujoco_fixture_acts_as_sb3_predicts_and_its_config_clips_every_return_stage():
    """sac_hopper.zip (make_agents.py) imports with SB3's own deterministic actions and critic values; the
    MuJoCo config is a Box environment whose rewards are clipped to its declared range, and the clip reaches
    every stage that reports a return (LoAct's benign returns, GRe, the global attack)."""
    _need_mujoco()
    from crop.workflow.config import load_config, run_targets
    from crop.workflow.stage_table import stage_settings

    ref = np.load(DATA / "reference.npz")
    net, _ = check_policy_file(DATA / "sac_hopper.zip", "mlp", "auto", None, "Hopper-v5", "vector")
    obs = torch.as_tensor(ref["sac_hopper_obs"])
    with torch.no_grad():
        np.testing.assert_allclose(net(obs).numpy(), ref["sac_hopper_action"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(net.q(obs, net.raw(obs)).numpy(), ref["sac_hopper_q"], rtol=0, atol=1e-4)
    assert (DATA / "sac_hopper.zip").stat().st_size < 1_000_000
    cfg = load_config(MUJOCO)
    assert run_targets(cfg) == [("Hopper-v5", "MySAC", "0.05", "action")]
    for command in ("loact", "gre", "attack-global"):
        s = stage_settings(cfg, "Hopper-v5", command)
        assert s["clip_rewards"] is True and s["reward_range"] == [-1.0, 3.0], command


def test_the_mujoco_config_plans_the_actor_stages(tmp_path):
    _need_mujoco()
    import shutil

    shutil.copy(DATA / "sac_hopper.zip", tmp_path / "sac_hopper.zip")
    p = _snakemake(tmp_path, "-n", "--quiet", "rules", config=MUJOCO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    counts = {w[0]: int(w[1]) for w in map(str.split, p.stdout.splitlines()) if len(w) == 2 and w[1].isdigit()}
    assert {k: v for k, v in counts.items() if k != "total"} == {
        "checkpoint": 1, "loact": 1, "gre": 1, "attack_global": 1, "aggregate": 1, "audit": 1, "all": 1}, counts


def test_a_gre_bound_and_attacked_returns_of_different_rewards_are_untestable_not_compared():
    """Attacked returns far below GRe's bounds would be a violation of the same rewards; of different rewards
    (GRe clipped, the attack not) they say nothing of the certificate: p = 1, untestable, with why."""
    import pandas as pd

    from crop.audit.audit import classify
    from crop.audit.checks import _same_rewards, check_gre_vs_global_attack

    gre = pd.DataFrame({"eps": [0.0], "p": [0.5], "expectation_bound": [8.0], "percentile_bound": [9.0],
                        "percentile_certified": [True], "j_min": [-10.0], "j_max": [30.0]})
    attack = pd.DataFrame({"eps": [0.0] * 400, "return": [-10.0] * 400})
    key = {"env": "Hopper-v5", "algo": "MySAC@action", "sigma": 0.05, "attack_seed": 1}
    same = [{**key, **r} for r in _same_rewards(check_gre_vs_global_attack(gre, attack),
                                                 {"gre": (-1.0, 3.0), "attack_global": (-1.0, 3.0)})]
    assert {r["status"] for r in classify(same, 0.05)[0]} == {"violation"}
    mixed = [{**key, **r} for r in _same_rewards(check_gre_vs_global_attack(gre, attack),
                                                  {"gre": (-1.0, 3.0), "attack_global": None})]
    rows = classify(mixed, 0.05)[0]
    assert len(rows) == 2 and {r["status"] for r in rows} == {"untestable"}
    assert all("different rewards" in r["reason"] and "rewards clipped to [-1, 3]" in r["reason"] for r in rows)


def test_figures_and_tables_of_a_run_refuse_returns_of_different_rewards(tmp_path):
    """A run whose stages clipped differently: the figures and tables (strict) refuse it in one line."""
    from crop.io import write_json
    from crop.report.integrity import IntegrityError
    from crop.report.metrics import _one_clip

    write_json(tmp_path / meta_name(RUN_FILES["gre"]), {"reward_clip": [-1.0, 3.0]})
    write_json(tmp_path / meta_name(RUN_FILES["loact"]), {})
    assert _one_clip(tmp_path, strict=False) == (-1.0, 3.0)
    with pytest.raises(IntegrityError) as e:
        _one_clip(tmp_path, strict=True)
    assert "returns are of different rewards" in str(e.value) and "loact: unclipped" in str(e.value)
    write_json(tmp_path / meta_name(RUN_FILES["loact"]), {"reward_clip": [-1.0, 3.0]})
    assert _one_clip(tmp_path, strict=True) == (-1.0, 3.0)


@pytest.mark.slow
def test_a_mujoco_agent_runs_the_workflow_and_every_return_is_clipped_and_said_so(tmp_path):
    """Hopper-v5's unbounded rewards clipped to [−1, 3]: LoAct's benign returns, GRe's randomized returns and
    the global attack's all lie in the clipped range's returns and record the clip; the figures' return axes,
    the tables' captions and audit.md say the certificates are for the clipped return."""
    _need_mujoco()
    import shutil

    import pandas as pd

    from crop.report.figures import iter_env_figures
    from crop.report.metrics import load_runs

    shutil.copy(DATA / "sac_hopper.zip", tmp_path / "sac_hopper.zip")
    p = _snakemake(tmp_path, "--cores", "2", config=MUJOCO)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    res, run = tmp_path / "results-mujoco", "Hopper-v5/MySAC@action/sigma-0.05"
    for key in ("loact", "gre", "attack_global"):
        meta = json.loads((res / run / meta_name(RUN_FILES[key])).read_text())
        assert meta["reward_clip"] == [-1.0, 3.0] and "clipped" in meta["reward_clip_note"], key
    episodes = pd.read_csv(res / run / RUN_FILES["loact_episodes"])
    steps = pd.read_csv(res / run / RUN_FILES["loact"])
    assert steps["reward"].between(-1.0, 3.0).all() and steps["dim"].nunique() == 3
    assert (episodes["return"] <= 3.0 * episodes["steps"] + 1e-9).all()
    assert pd.read_csv(res / run / RUN_FILES["gre_returns"])["return"].between(-10.0, 30.0).all()
    assert pd.read_csv(res / run / RUN_FILES["attack_global"])["return"].between(-10.0, 30.0).all()
    audit = json.loads((res / "audit/audit.json").read_text())
    assert audit["violations"] == 0 and audit["integrity_problems"] == 0
    assert audit["clipped_runs"] == {run: {k: [-1.0, 3.0] for k in ("attack_global", "gre", "loact")}}
    md = (res / "audit/audit.md").read_text()
    assert f"Runs with clipped rewards: `{run}` (rewards clipped to [-1, 3]" in md
    assert "certificates (GRe's bounds) are for the return of the clipped rewards" in md
    for table in ("benign_return", "reward_bounds", "tightness"):
        assert "rewards clipped to [-1, 3]" in (res / f"tables/Hopper-v5_{table}.md").read_text(), table
    labels = {}
    for stem, fig in iter_env_figures("Hopper-v5", load_runs(res, [run])):
        labels[stem] = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]
        import matplotlib.pyplot as plt

        plt.close(fig)
    for stem in ("Hopper-v5_global_mean_sigma-0.05", "Hopper-v5_global_median_sigma-0.05", "Hopper-v5_loact_clean"):
        assert labels[stem] and all("(rewards clipped to [-1, 3])" in y for y in labels[stem]), stem
    assert all("clipped" not in y for y in labels["Hopper-v5_stepwise_sigma-0.05"])
    # no LoRe for a continuous agent: no adasearch figure, all_bounds has the two GRe rows only
    assert not [s for s in labels if "adasearch" in s] and len(labels["Hopper-v5_all_bounds"]) == 2
    assert all("(rewards clipped to [-1, 3])" in y for y in labels["Hopper-v5_all_bounds"])


@pytest.mark.slow
def test_a_mujoco_replicate_is_pooled_only_with_its_runs_clip(tmp_path):
    """With ``replicates: 2``, replicate 1's LoAct records the run's clip ([−1, 3]) and is pooled: the audit
    passes and the benign-return table is over 2 replicates.  The same replicate as if run with the
    environment's own rewards is one integrity problem naming its meta file, the stage and both clips (the
    audit FAILs and leaves it out), and the figures and tables refuse it."""
    _need_mujoco()
    import shutil

    from crop.audit.audit import audit
    from crop.report.integrity import IntegrityError
    from crop.report.metrics import load_runs

    shutil.copy(DATA / "sac_hopper.zip", tmp_path / "sac_hopper.zip")
    config = tmp_path / "mujoco.yaml"
    config.write_text(MUJOCO.read_text() + "replicates: 2\n")
    p = _snakemake(tmp_path, "--cores", "2", config=config)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    res, run = tmp_path / "results-mujoco", "Hopper-v5/MySAC@action/sigma-0.05"
    meta = res / run / "rep-1" / meta_name(RUN_FILES["loact"])
    assert json.loads(meta.read_text())["reward_clip"] == [-1.0, 3.0]
    report = json.loads((res / "audit/audit.json").read_text())
    assert report["integrity_problems"] == 0 and f"{run}/rep-1" in report["runs"]
    assert "(2 replicates" in (res / "tables/Hopper-v5_benign_return.md").read_text()
    record = json.loads(meta.read_text())
    meta.write_text(json.dumps({k: v for k, v in record.items() if not k.startswith("reward_clip")}))
    report = audit(res, tmp_path / "audit")
    assert report["verdict"] == "FAIL" and report["violations"] == 0
    (problem,) = report["integrity"]
    assert problem["file"] == str(meta) and problem["problem"].startswith(
        "replicate stage loact ran with the environment's own rewards (no clip), its run "
        f"{res / run} with rewards clipped to [-1, 3] (reward_clip; config rewards.clip)")
    assert f"{run}/rep-1" not in [q["run"] for q in report["provenance"]]
    with pytest.raises(IntegrityError, match="replicate stage loact ran with the environment's own rewards"):
        load_runs(res, [run, f"{run}/rep-1"])


def test_a_continuous_agents_loact_summaries_agree_with_its_steps_until_edited(imported, tmp_path):
    """The audit recomputes a continuous-action agent's certified_ratio.csv and loact_episodes.csv from its
    per-step-and-dimension loact.csv (crop.audit.agreement): the stage's own files agree; an edited summary
    with its meta's hash rewritten does not."""
    import pandas as pd

    from crop.audit.agreement import run_disagreements

    from synthetic_results import rewrite_csv

    d = tmp_path / "Pendulum-v1" / "SAC@action" / "sigma-0.1"
    d.mkdir(parents=True)
    f = {k: d / RUN_FILES[k] for k in ("loact", "loact_episodes", "certified_ratio")}
    main(["loact", "--env", "Pendulum-v1", "--algo", "SAC", "--sigma", "0.1", "--checkpoint", str(imported),
          "--m", "200", "--episodes", "2", "--horizon", "5", "--action-tolerance", "0.5", "--out", str(f["loact"]),
          "--out-episodes", str(f["loact_episodes"]), "--out-ratio", str(f["certified_ratio"])])
    assert run_disagreements(d) == []
    for key, col in (("loact_episodes", "return"), ("certified_ratio", "eta")):
        original = pd.read_csv(f[key])
        rewrite_csv(f[key], original.assign(**{col: original[col] + 0.25}))
        found = run_disagreements(d)
        assert [p["file"] for p in found] == [str(f[key])] and f"column {col}" in found[0]["problem"]
        rewrite_csv(f[key], original)
