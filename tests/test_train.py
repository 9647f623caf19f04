"""Training recipes (crop/train): each loss/data hook does what it claims on a tiny batch; NoisyNet and CARRL
are deterministic functions at certification time; bad settings are refused before any work."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from crop.__main__ import main
from crop.io import sha256_file, write_json
from crop.models import CheckpointError, build_network, load_network, save_network
from crop.models.carrl import derive_carrl
from crop.models.noisy import NoisyLinear, resample_noise
from crop.schema import load_schema
from crop.train import prepare_training, train_policy
from crop.train.dqn import Batch, DQNConfig, TrainContext, _Replay, is_pixel_obs
from crop.train.recipes import RECIPES
from crop.workflow.config import ALGORITHMS

torch.set_num_threads(1)

SPEC = {"arch": "mlp", "in": 4, "hidden": [32, 32], "out": 2}


def _ctx(net, algo, step=10**6, env="CartPole-v0", **hp):
    recipe = RECIPES[algo]
    return recipe, TrainContext(q=net, target=net, step=step, hp=recipe.hyperparameters(env, hp),
                                n_actions=net[-1].out_features, gen=torch.Generator().manual_seed(0),
                                rng=np.random.default_rng(0))


def _batch(n=64, seed=0, d=4, n_actions=2):
    g = torch.Generator().manual_seed(seed)
    return Batch(s=torch.randn(n, d, generator=g), a=torch.randint(n_actions, (n,), generator=g),
                 r=torch.ones(n), s2=torch.randn(n, d, generator=g), d=torch.zeros(n), w=torch.ones(n))


def _net(seed=0, spec=SPEC):
    torch.manual_seed(seed)
    return build_network(spec)


def _td_parts(net, batch, gamma=0.99):
    with torch.no_grad():
        y = batch.r + gamma * (1 - batch.d) * net(batch.s2).max(1).values
    q_all = net(batch.s)
    td = F.smooth_l1_loss(q_all.gather(1, batch.a[:, None]).squeeze(1), y, reduction="none")
    return q_all, y, td


# ---------------------------------------------------------------------------------------------- registry

def test_every_algorithm_has_a_recipe_and_the_schema_lists_its_hyperparameters():
    assert sorted(RECIPES) == sorted(ALGORITHMS)
    schema = load_schema()["$defs"]["environment"]["properties"]["train"]["properties"]["recipes"]["properties"]
    for algo, recipe in RECIPES.items():
        envs = ("CartPole-v0", "highway-fast-v0") + (("PongNoFrameskip-v4", "FreewayNoFrameskip-v4")
                                                     if recipe.images else ())
        for env in envs:
            keys = set(recipe.hyperparameters(env))
            assert keys == set(schema.get(algo, {}).get("properties", {})), (algo, env)


def test_bad_settings_are_refused_before_any_work():
    with pytest.raises(ValueError, match="no training recipe"):
        prepare_training("CartPole-v0", "DQN++", {})
    with pytest.raises(ValueError, match=r"unknown hyper-parameter\(s\) \['sigma'\]"):
        prepare_training("CartPole-v0", "AdvTrain", {"recipe": {"sigma": 0.1}})
    with pytest.raises(ValueError, match="unknown training setting"):
        prepare_training("CartPole-v0", "StdTrain", {"epochs": 3})
    with pytest.raises(ValueError, match="unknown dqn setting"):
        prepare_training("CartPole-v0", "StdTrain", {"dqn": {"momentum": 0.9}})
    with pytest.raises(ValueError, match="fraction"):
        prepare_training("CartPole-v0", "AdvTrain", {"recipe": {"fraction": 1.5}})
    with pytest.raises(ValueError, match="norm"):
        prepare_training("CartPole-v0", "SA-MDP-PGD", {"recipe": {"norm": 1}})
    with pytest.raises(ValueError, match="derived"):
        train_policy("CartPole-v0", "CARRL", 0, {})
    with pytest.raises(KeyError, match="unknown environment"):
        prepare_training("Breakout-v5", "StdTrain", {})


def test_settings_merge_environment_defaults_config_and_recipe_overrides():
    cfg, recipe, hp = prepare_training("highway-fast-v0", "RadialRL",
                                       {"total_steps": 500, "target_return": None, "dqn": {"lr": 1e-4},
                                        "recipes": {"RadialRL": {"eps": 0.01}, "GaussAug": {"sigma": 9.0}}})
    assert cfg.total_steps == 500 and cfg.target_return is None and cfg.lr == 1e-4 and cfg.gamma == 0.8
    assert hp["eps"] == 0.01 and hp["ramp_steps"] == 2000 and recipe.name == "RadialRL"
    # A recipe's own DQN defaults sit between the environment's and the config's.
    assert prepare_training("CartPole-v0", "GradDQN", {})[0].target_update == 100
    assert prepare_training("CartPole-v0", "StdTrain", {})[0].target_update == 500
    assert prepare_training("CartPole-v0", "GradDQN", {"dqn": {"target_update": 7}})[0].target_update == 7


# ---------------------------------------------------------------------------------------------- data hooks

def test_gaussaug_adds_noise_of_the_stated_sigma_to_every_observation():
    net = _net()
    recipe, ctx = _ctx(net, "GaussAug", sigma=0.05)
    batch = _batch(n=4096)
    out = recipe.perturb(ctx, batch)
    for clean, noisy in ((batch.s, out.s), (batch.s2, out.s2)):
        diff = noisy - clean
        assert (diff != 0).all()
        assert abs(diff.std().item() - 0.05) < 0.002 and abs(diff.mean().item()) < 0.002
    assert torch.equal(out.a, batch.a) and torch.equal(out.r, batch.r) and torch.equal(out.d, batch.d)
    # The noise comes from the recipe's seeded generator.
    _, ctx2 = _ctx(net, "GaussAug", sigma=0.05)
    assert torch.equal(recipe.perturb(ctx2, batch).s, out.s)


def test_advtrain_perturbs_half_the_batch_within_the_l2_ball_and_raises_the_attack_loss():
    net = _net(1)
    recipe, ctx = _ctx(net, "AdvTrain", eps=0.3)
    batch = _batch(n=64)
    out = recipe.perturb(ctx, batch)
    changed = (out.s != batch.s).any(1)
    assert changed.sum().item() == 32                       # exactly 50 % of the frames
    delta = (out.s - batch.s)[changed]
    assert (delta.norm(dim=1) <= 0.3 * (1 + 1e-5)).all()
    assert (delta.norm(dim=1) > 0.3 * 0.5).float().mean() > 0.9    # the attack uses its budget
    greedy = net(batch.s).argmax(1)
    with torch.no_grad():
        before = F.cross_entropy(net(batch.s[changed]), greedy[changed], reduction="none")
        after = F.cross_entropy(net(out.s[changed]), greedy[changed], reduction="none")
    assert (after >= before - 1e-6).all() and (after > before).float().mean() > 0.9
    assert torch.equal(out.s2, batch.s2)                     # only the observation the action was taken on
    # Before the ε schedule starts nothing is perturbed.
    _, early = _ctx(net, "AdvTrain", step=0, eps=0.3)
    assert torch.equal(recipe.perturb(early, batch).s, batch.s)


def test_graddqn_adversarial_states_lie_in_the_ball_and_lower_the_true_value():
    net = _net(2, {"arch": "mlp", "in": 4, "hidden": [32], "out": 3})
    recipe, ctx = _ctx(net, "GradDQN", eps=0.5)
    batch = _batch(n=256, n_actions=3)
    out = recipe.perturb(ctx, batch)
    delta = out.s - batch.s
    assert (delta.norm(dim=1) <= 0.5 * (1 + 1e-5)).all()
    changed = (delta != 0).any(1)
    assert 0 < changed.sum() < len(changed)
    with torch.no_grad():
        q_clean = net(batch.s)
        induced = net(out.s).argmax(1)
        v_induced = q_clean.gather(1, induced[:, None]).squeeze(1)
        v_greedy = q_clean.max(1).values
    assert (v_induced[changed] < v_greedy[changed]).all()     # the adversary makes the agent act worse
    assert torch.equal(out.s[~changed], batch.s[~changed])


# ---------------------------------------------------------------------------------------------- loss hooks

@pytest.mark.parametrize("algo", ["SA-MDP-PGD", "SA-MDP-CVX"])
def test_sa_mdp_regulariser_is_nonnegative_and_zero_for_a_large_margin(algo):
    net = _net(3)
    recipe, ctx = _ctx(net, algo, eps=0.05, hinge_c=0.1)
    batch = _batch()
    labels = net(batch.s).argmax(1)
    reg = recipe.regulariser(ctx, batch.s, labels, 0.05)
    assert reg.shape == (64,) and (reg >= 0).all() and (reg > 0).any()
    with torch.no_grad():
        net[-1].bias.copy_(torch.tensor([100.0, 0.0]))       # action 0 ahead by ~100 everywhere nearby
    labels = net(batch.s).argmax(1)
    assert (labels == 0).all()
    assert torch.equal(recipe.regulariser(ctx, batch.s, labels, 0.05), torch.zeros(64))
    # The total loss adds κ·regulariser to the TD loss and is differentiable.
    with torch.no_grad():
        net[-1].bias.zero_()
    q_all, y, td = _td_parts(net, batch)
    loss = recipe.loss(ctx, batch, q_all, y, td)
    assert loss.item() >= td.mean().item()
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())


def test_sa_mdp_cvx_bounds_the_pgd_inner_maximum_from_above():
    net = _net(4, {"arch": "mlp", "in": 4, "hidden": [32, 32], "out": 3})
    batch = _batch(n=128, n_actions=3)
    labels = net(batch.s).argmax(1)
    pgd_r, pgd_ctx = _ctx(net, "SA-MDP-PGD", eps=0.1)
    cvx_r, cvx_ctx = _ctx(net, "SA-MDP-CVX", eps=0.1)
    for step in (0, 10**6):                                  # β = 1 (CROWN-IBP) and β = 0 (IBP)
        cvx_ctx.step = step
        with torch.no_grad():
            found = pgd_r.inner_max(pgd_ctx, batch.s, labels, 0.1)
            bound = cvx_r.inner_max(cvx_ctx, batch.s, labels, 0.1)
        assert (bound >= found - 1e-5).all()


@pytest.mark.slow
def test_radial_worst_case_loss_is_at_least_the_nominal_loss():
    net = _net(5)
    recipe, ctx = _ctx(net, "RadialRL", eps=0.05)
    batch = _batch()
    q_all, y, td = _td_parts(net, batch)
    wc = recipe.worst_case_loss(ctx, batch, q_all, y, 0.05)
    assert (wc >= td - 1e-6).all() and (wc > td + 1e-4).any()
    # With ε = 0 the bounds are Q itself: the worst-case loss is the TD loss of the taken action.
    torch.testing.assert_close(recipe.worst_case_loss(ctx, batch, q_all, y, 0.0), td, atol=1e-5, rtol=1e-5)
    # κ goes from 1 (pure TD) to kappa_end along the ε schedule.
    ctx.step = 0
    torch.testing.assert_close(recipe.loss(ctx, batch, q_all, y, td), td.mean())
    ctx.step = 10**6
    full = recipe.loss(ctx, batch, q_all, y, td)
    torch.testing.assert_close(full, 0.5 * td.mean() + 0.5 * wc.mean(), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- NoisyNet

def test_noisynet_eval_forward_is_deterministic_and_equals_the_mean_network(tmp_path):
    spec = {"arch": "noisy_mlp", "in": 4, "hidden": [16, 16], "out": 2, "sigma0": 0.5}
    torch.manual_seed(0)
    net = build_network(spec)
    g = torch.Generator().manual_seed(1)
    resample_noise(net, g)
    x = torch.randn(50, 4)
    net.train()
    noisy1 = net(x)
    resample_noise(net, g)
    assert not torch.allclose(noisy1, net(x))                # training: the weights are sampled
    net.eval()
    mu = build_network({"arch": "mlp", "in": 4, "hidden": [16, 16], "out": 2})
    mu.load_state_dict({k.replace("weight_mu", "weight").replace("bias_mu", "bias"): v
                        for k, v in net.state_dict().items() if k.endswith("_mu")})
    torch.testing.assert_close(net(x), mu(x), rtol=0, atol=0)
    torch.testing.assert_close(net(x), net(x), rtol=0, atol=0)
    # State dict: μ and σ only (no noise), and it round-trips through a checkpoint.
    assert sorted(net.state_dict()) == sorted(f"{i}.{p}_{s}" for i in (0, 2, 4) for p in ("weight", "bias")
                                              for s in ("mu", "sigma"))
    save_network(net, tmp_path / "m.pt")
    loaded = load_network(tmp_path / "m.pt", spec)
    assert not loaded.training
    torch.testing.assert_close(loaded(x), mu(x), rtol=0, atol=0)
    assert isinstance(loaded[0], NoisyLinear) and loaded[0].weight_sigma.abs().sum() > 0


# ---------------------------------------------------------------------------------------------- CARRL

def test_carrl_output_is_a_lower_bound_of_q_in_the_l2_ball_and_deterministic(tmp_path):
    base = _net(6)
    net, spec = derive_carrl(base, SPEC, eps=0.1, norm=2)
    assert spec == {"arch": "carrl", "base": SPEC, "eps": 0.1, "norm": 2, "method": "crown"}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 4, generator=g)
    with torch.no_grad():
        lb = net(x)
        assert torch.equal(lb, net(x))
        d = torch.randn(2000, 20, 4, generator=g)
        d = d / d.norm(dim=-1, keepdim=True) * 0.1 * torch.rand(2000, 20, 1, generator=g) ** 0.25
        q = base((x + d).flatten(0, 1)).reshape(2000, 20, 2)
    assert (q >= lb - 1e-5).all()
    assert (lb <= base(x)).all() and (lb < base(x) - 1e-4).any()
    # ε = 0: CARRL is the base network.
    torch.testing.assert_close(derive_carrl(base, SPEC, eps=0.0)[0](x), base(x))
    # The checkpoint is the base weights; the spec makes load_network rebuild CARRL.
    assert set(net.state_dict()) == set(base.state_dict())
    save_network(net, tmp_path / "carrl.pt")
    loaded = load_network(tmp_path / "carrl.pt", spec)
    torch.testing.assert_close(loaded(x), lb)
    with torch.inference_mode():                             # as the smoothing engine calls it
        torch.testing.assert_close(loaded(x), lb)


def test_carrl_refuses_a_base_it_cannot_bound():
    # build_network turns a spec its builder refuses into one CheckpointError carrying the builder's reason
    with pytest.raises(CheckpointError, match="MLP base"):
        build_network({"arch": "carrl", "base": {"arch": "noisy_mlp", "in": 4, "out": 2}, "eps": 0.1})
    with pytest.raises(CheckpointError, match="eps"):
        build_network({"arch": "carrl", "base": SPEC, "eps": -1})


def test_carrl_bounds_a_chunk_in_blocks_with_the_same_bits_and_a_crop_process_reuses_their_memory():
    """CARRL's bound of a smoothing chunk (1,000 rows of CartPole's width 128: 65 MB matrices whole) is computed
    in blocks, row by row the same bits as whole; in a process set up as ``crop`` sets its own
    (keep_freed_memory), a second chunk faults in almost none of its memory (whole and returned to the system
    at every call, it faulted in ~16,000 pages a call)."""
    import subprocess
    import sys

    from crop.models.bounds_ibp import CrownSettings, crown_bounds

    spec = {"arch": "mlp", "in": 4, "hidden": [128, 128], "out": 2}
    torch.manual_seed(0)
    net, _ = derive_carrl(build_network(spec), spec, eps=0.1)
    x = torch.randn(1000, 4, requires_grad=True)
    whole = crown_bounds(net, x, net.eps, net.norm, settings=CrownSettings(upper=False))[0]
    blocks = net(x)
    assert torch.equal(blocks, whole)
    assert torch.equal(torch.autograd.grad(blocks.sum(), x)[0], torch.autograd.grad(whole.sum(), x)[0])
    code = ("import resource, torch\n"
            "from crop.__main__ import keep_freed_memory\n"
            "from crop.models import build_network\n"
            "from crop.models.carrl import derive_carrl\n"
            "keep_freed_memory(); torch.set_num_threads(1)\n"
            f"spec = {spec!r}\n"
            "net, _ = derive_carrl(build_network(spec), spec, eps=0.1)\n"
            "x = torch.randn(1000, 4)\n"
            "with torch.no_grad():\n"
            "    net(x)\n"
            "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "    net(x)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    faults = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert faults < 1000, f"{faults} page faults in a second chunk's bound"


# ---------------------------------------------------------------------------------------------- replay

def test_prioritized_replay_samples_in_proportion_to_priority():
    cfg = DQNConfig(prioritized=True, per_alpha=1.0)
    buf = _Replay(4, 1, cfg)
    for i in range(4):
        buf.add(np.array([i]), 0, 0.0, np.array([i]), 0.0)
    buf.update(np.arange(4), np.array([1.0, 1.0, 1.0, 7.0]))
    idx, batch = buf.sample(np.random.default_rng(0), 20000, beta=1.0)
    freq = np.bincount(idx, minlength=4) / len(idx)
    np.testing.assert_allclose(freq, [0.1, 0.1, 0.1, 0.7], atol=0.015)
    w = batch.w.numpy()
    assert w.max() == pytest.approx(1.0) and w[idx == 3].max() < w[idx == 0].min()


# ---------------------------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_training_is_deterministic_and_records_the_clean_return():
    settings = {"total_steps": 1200, "target_return": None, "eval_episodes": 2, "hidden": [16],
                "dqn": {"learning_starts": 200, "eps_decay_steps": 500},
                "recipes": {"AdvTrain": {"ramp_start": 300, "ramp_steps": 300}}}
    a, info_a = train_policy("CartPole-v0", "AdvTrain", 3, settings, progress=False)
    b, info_b = train_policy("CartPole-v0", "AdvTrain", 3, settings, progress=False)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k])
    acc = info_a["acceptance"]
    assert acc == info_b["acceptance"] and acc["episodes"] == 2 and acc["step"] == 1200
    assert info_a["hyperparameters"]["eps"] == 0.1 and info_a["hyperparameters"]["fraction"] == 0.5
    assert info_a["net_spec"] == {"arch": "mlp", "in": 4, "hidden": [16], "out": 2}


def test_cli_train_refuses_bad_settings_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "model.pt"
    with pytest.raises(SystemExit) as e:
        main(["train", "--env", "CartPole-v0", "--algo", "GaussAug", "--settings",
              json.dumps({"recipes": {"GaussAug": {"eps": 0.1}}}), "--out", str(out)])
    assert e.value.code == 2 and "unknown hyper-parameter" in capsys.readouterr().err
    assert not out.exists()


def _fake_stdtrain(tmp_path, spec=SPEC, algo="StdTrain"):
    d = tmp_path / "StdTrain"
    d.mkdir()
    net = _net(7, spec)
    save_network(net, d / "model.pt")
    write_json(d / "model.json", {"env": "CartPole-v0", "algo": algo, "net_spec": spec, "profile": "vector",
                                  "sha256": sha256_file(d / "model.pt")})
    return d / "model.pt", net


def test_cli_derive_builds_carrl_from_stdtrain(tmp_path):
    base, net = _fake_stdtrain(tmp_path)
    out = tmp_path / "CARRL" / "model.pt"
    main(["derive", "--env", "CartPole-v0", "--algo", "CARRL", "--base-checkpoint", str(base),
          "--settings", json.dumps({"eval_episodes": 3, "recipes": {"CARRL": {"eps": 0.05}}}),
          "--target-return", "none", "--out", str(out)])
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["net_spec"]["arch"] == "carrl" and rec["net_spec"]["eps"] == 0.05   # the config overrides
    assert rec["net_spec"]["base"] == SPEC and rec["source"] == "derive"
    assert rec["base"]["sha256"] == sha256_file(base) and rec["clean_greedy_return"]["episodes"] == 3
    assert rec["clean_greedy_return"]["meets_target_return"] is None
    carrl = load_network(out, rec["net_spec"], expected_sha256=rec["sha256"])
    x = torch.randn(5, 4)
    torch.testing.assert_close(carrl(x), derive_carrl(net, SPEC, 0.05)[0](x))
    # Nothing can be retrained, so a derived policy below the trained policies' threshold is recorded as such.
    main(["derive", "--env", "CartPole-v0", "--algo", "CARRL", "--base-checkpoint", str(base),
          "--eval-episodes", "2", "--target-return", "1e9", "--out", str(out)])
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["clean_greedy_return"]["meets_target_return"] is False and rec["net_spec"]["eps"] == 0.1
    # The config's null target_return is the environment's threshold (CartPole-v0: 195).
    main(["derive", "--env", "CartPole-v0", "--algo", "CARRL", "--base-checkpoint", str(base),
          "--settings", json.dumps({"eval_episodes": 2, "target_return": None}), "--out", str(out)])
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["clean_greedy_return"]["meets_target_return"] is (rec["clean_greedy_return"]["mean"] >= 195)
    assert rec["provenance"]["settings"]["settings"] is not None


def test_cli_derive_refuses_the_wrong_base(tmp_path, capsys):
    base, _ = _fake_stdtrain(tmp_path, algo="GaussAug")
    out = tmp_path / "CARRL.pt"
    with pytest.raises(SystemExit) as e:
        main(["derive", "--env", "CartPole-v0", "--algo", "CARRL", "--base-checkpoint", str(base),
              "--out", str(out)])
    assert e.value.code == 2 and "derived from CartPole-v0/StdTrain" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit) as e:
        main(["derive", "--env", "CartPole-v0", "--algo", "StdTrain", "--base-checkpoint", str(base),
              "--out", str(out)])
    assert e.value.code == 2


def test_registry_lists_a_recipe_for_every_local_policy():
    from crop.agents.registry import registry

    for env, algos in registry()["policies"].items():
        for algo, entries in algos.items():
            for kind in ("train", "derive"):
                if kind in entries:
                    assert RECIPES[entries[kind]["recipe"]].kind == kind, (env, algo)
    assert set(registry()["policies"]["CartPole-v0"]) == set(ALGORITHMS)
    assert set(registry()["policies"]["highway-fast-v0"]) == set(ALGORITHMS)


# ---------------------------------------------------------------------------------------------- Atari

SMALL_CNN = {"arch": "nature_cnn", "in_channels": 2, "in_size": 36, "out": 3}   # 36×36: the smallest trunk


def _pong_frames(n=40, seed=0):
    from crop.envs import make_env

    env = make_env("PongNoFrameskip-v4", "cleanrl")
    obs, _ = env.reset(seed=seed)
    frames = [obs]
    for t in range(n - 1):
        obs, *_ = env.step(t % 6)
        frames.append(obs)
    env.close()
    return np.stack(frames)


def test_atari_settings_follow_cleanrl_and_refuse_what_has_no_cnn():
    cfg, recipe, hp = prepare_training("PongNoFrameskip-v4", "GaussAug", {"total_steps": 1_500_000})
    assert (cfg.lr, cfg.buffer_size, cfg.learning_starts, cfg.train_every, cfg.target_update, cfg.batch_size,
            cfg.eps_end, cfg.eps_decay_fraction, cfg.gamma, cfg.device) == \
        (1e-4, 100_000, 80_000, 4, 1000, 32, 0.01, 0.1, 0.99, "cpu")
    assert hp == {"sigma": 0.005}
    assert prepare_training("FreewayNoFrameskip-v4", "AdvTrain", {})[2]["eps"] == 0.05
    # An explicit step count replaces the default fraction.
    assert prepare_training("PongNoFrameskip-v4", "StdTrain",
                            {"dqn": {"eps_decay_steps": 5}})[0].eps_decay_fraction is None
    for algo in ("NoisyNet", "CARRL"):
        with pytest.raises(ValueError, match="no image"):
            prepare_training("PongNoFrameskip-v4", algo, {})
    with pytest.raises(ValueError, match="device"):
        prepare_training("PongNoFrameskip-v4", "StdTrain", {"dqn": {"device": "tpu"}})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            prepare_training("PongNoFrameskip-v4", "StdTrain", {"dqn": {"device": "cuda"}})
    spec = RECIPES["StdTrain"].net_spec_for((4, 84, 84), [128], 3, {})
    assert spec == {"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 3}


def test_pixel_replay_is_uint8_and_returns_observations_bit_for_bit():
    frames = _pong_frames()
    assert is_pixel_obs(frames[0]) and len(np.unique(frames)) > 2
    buf = _Replay(len(frames) - 1, frames.shape[1:], DQNConfig(prioritized=False), pixels=True)
    for i in range(len(frames) - 1):
        buf.add(frames[i], 0, 0.0, frames[i + 1], 0.0)
    assert buf.s.dtype == np.uint8 and buf.s.nbytes + buf.s2.nbytes == (len(frames) - 1) * 2 * 4 * 84 * 84
    idx, batch = buf.sample(np.random.default_rng(0), 64, beta=1.0)
    assert batch.s.dtype == torch.float32
    assert torch.equal(batch.s, torch.as_tensor(frames[idx]))
    assert torch.equal(batch.s2, torch.as_tensor(frames[idx + 1]))
    # A frame that is not k/255 is refused rather than silently rounded.
    off = frames[0] + np.float32(0.001)
    assert not is_pixel_obs(off)
    with pytest.raises(ValueError, match="k/255"):
        buf.add(off, 0, 0.0, frames[1], 0.0)


@pytest.mark.parametrize("algo", ["GaussAug", "AdvTrain", "GradDQN"])
def test_perturbed_image_batches_stay_in_the_pixel_domain(algo):
    net = _net(8, SMALL_CNN)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 2, (16, 2, 36, 36), generator=g).float()          # pixels at 0 and 1: clamping bites
    batch = Batch(s=x, a=torch.zeros(16, dtype=torch.long), r=torch.zeros(16), s2=x.clone(), d=torch.zeros(16),
                  w=torch.ones(16))
    hp = {"sigma": 0.1} if algo == "GaussAug" else {"eps": 2.0}
    recipe, free = _ctx(net, algo, env="PongNoFrameskip-v4", **hp)
    _, boxed = _ctx(net, algo, env="PongNoFrameskip-v4", **hp)
    boxed.domain = (0.0, 1.0)
    unclamped, out = recipe.perturb(free, batch), recipe.perturb(boxed, batch)
    assert (unclamped.s < 0).any() or (unclamped.s > 1).any()              # without the domain it leaves [0, 1]
    assert not torch.equal(out.s, batch.s)
    for t in (out.s, out.s2):
        assert t.min() >= 0 and t.max() <= 1


@pytest.mark.parametrize("algo", ["SA-MDP-PGD", "SA-MDP-CVX", "RadialRL"])
def test_loss_recipes_run_on_a_cnn(algo):
    net = _net(9, SMALL_CNN)
    recipe, ctx = _ctx(net, algo, env="PongNoFrameskip-v4")
    ctx.domain = (0.0, 1.0)
    g = torch.Generator().manual_seed(2)
    batch = Batch(s=torch.rand(8, 2, 36, 36, generator=g), a=torch.randint(3, (8,), generator=g),
                  r=torch.ones(8), s2=torch.rand(8, 2, 36, 36, generator=g), d=torch.zeros(8), w=torch.ones(8))
    q_all, y, td = _td_parts(net, batch)
    loss = recipe.loss(ctx, batch, q_all, y, td)
    assert torch.isfinite(loss) and loss.item() >= td.mean().item() - 1e-6   # each adds a term ≥ 0 (RadialRL: wc ≥ TD)
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())


def _tiny_atari(env, algo, seed=0):
    settings = {"total_steps": 300, "target_return": None, "eval_episodes": 1,
                "dqn": {"learning_starts": 100, "buffer_size": 300, "batch_size": 8, "eval_max_steps": 50}}
    return train_policy(env, algo, seed, settings, progress=False)


@pytest.mark.slow
def test_tiny_atari_training_is_a_deterministic_cnn_that_loads_back(tmp_path):
    a, info = _tiny_atari("PongNoFrameskip-v4", "StdTrain")
    spec = info["net_spec"]
    assert spec == {"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 6}
    assert info["replay_dtype"] == "uint8" and info["device"] == "cpu" and info["eps_decay_steps"] == 30
    assert info["acceptance"]["step"] == 300 and info["acceptance"]["episodes"] == 1
    b, _ = _tiny_atari("PongNoFrameskip-v4", "StdTrain")
    torch.manual_seed(0)
    init = build_network(spec)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k                      # same seed, same weights (CPU)
    assert any(not torch.equal(v, init.state_dict()[k]) for k, v in a.state_dict().items())   # it learned
    save_network(a, tmp_path / "model.pt")
    loaded = load_network(tmp_path / "model.pt", spec, expected_sha256=sha256_file(tmp_path / "model.pt"))
    x = torch.as_tensor(_pong_frames(8))
    with torch.no_grad():
        assert torch.equal(loaded(x), a(x))


@pytest.mark.slow
def test_tiny_atari_gaussaug_on_freeway():
    net, info = _tiny_atari("FreewayNoFrameskip-v4", "GaussAug")
    assert info["net_spec"]["out"] == 3 and info["hyperparameters"] == {"sigma": 0.005}
    assert info["replay_dtype"] == "uint8" and not net.training


def test_greedy_evaluation_stops_at_eval_max_steps(monkeypatch):
    import gymnasium as gym

    import crop.train.dqn as dqn

    steps = []

    class Count(gym.Wrapper):
        def step(self, a):
            steps.append(a)
            return self.env.step(a)

    real = dqn.make_env
    monkeypatch.setattr(dqn, "make_env", lambda *a, **k: Count(real(*a, **k)))
    net = build_network({"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 6})
    out = dqn.greedy_returns(net, "PongNoFrameskip-v4", [0, 1], "cleanrl", max_steps=7)
    assert len(out) == 2 and len(steps) == 14
