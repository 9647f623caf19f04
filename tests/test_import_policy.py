"""Policy-gradient agents: SB3 PPO / A2C ``.zip`` files (MlpPolicy, CnnPolicy) and CleanRL's
ppo.py / ppo_atari.py agents — each made here the way its library writes it — import as policy networks whose
output is exactly the actor's logits; the record says ``network: policy``; the certifiers smooth their
probabilities by default and refuse the q target in one line."""
import io
import json
import zipfile

import pytest
import torch
from torch import nn

from crop.__main__ import main
from crop.agents.importing import PolicyImportError, import_policy
from crop.models import load_network

from networks import CleanRLAgent, mlp, sb3_data, sb3_mlp_policy, sb3_zip

X = torch.randn(32, 4, generator=torch.Generator().manual_seed(3))


def _nature_trunk(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten())


def _same_logits(net, reference, x=X):
    with torch.no_grad():
        assert torch.allclose(net(x), reference(x), atol=1e-6, rtol=0)


def test_sb3_ppo_mlp_policy_is_the_policy_branch_and_action_net(tmp_path):
    state, logits = sb3_mlp_policy([4, 64, 64], [4, 64, 64], 2, seed=1)
    src = sb3_zip(tmp_path / "ppo_cartpole.zip", state, sb3_data())
    net, info = import_policy(src, "mlp")
    assert info["network"] == "policy" and info["format"] == "sb3"
    assert info["net_spec"] == {"arch": "mlp", "in": 4, "hidden": [64, 64], "out": 2, "activation": "tanh"}
    _same_logits(net, logits)


def test_sb3_a2c_with_relu_from_its_policy_kwargs(tmp_path):
    state, logits = sb3_mlp_policy([4, 32], [4, 16, 16], 3, seed=2, act=nn.ReLU)
    kwargs = {":type:": "<class 'dict'>", ":serialized:": "gAWV…",
              "activation_fn": "<class 'torch.nn.modules.activation.ReLU'>", "net_arch": [32]}
    net, info = import_policy(sb3_zip(tmp_path / "a2c.zip", state, sb3_data("A2C", kwargs)), "mlp")
    assert info["net_spec"] == {"arch": "mlp", "in": 4, "hidden": [32], "out": 3}
    _same_logits(net, logits)
    kwargs["activation_fn"] = "<class 'torch.nn.modules.activation.ELU'>"
    with pytest.raises(PolicyImportError, match="activation .*ELU.* is not supported"):
        import_policy(sb3_zip(tmp_path / "elu.zip", state, sb3_data(policy_kwargs=kwargs)), "mlp")


@pytest.mark.slow
def test_sb3_ppo_cnn_policy_maps_onto_nature_cnn(tmp_path):
    """CnnPolicy: the NatureCNN features extractor (shared: also under pi_/vf_features_extractor), no policy
    layers in mlp_extractor, action_net on its 512 features; the value head is dropped."""
    cnn = _nature_trunk(4)
    torch.manual_seed(5)
    linear, action_net, value_net = nn.Sequential(nn.Linear(3136, 512), nn.ReLU()), nn.Linear(512, 6), nn.Linear(512, 1)
    fe = {**{f"cnn.{k}": v for k, v in cnn.state_dict().items()},
          **{f"linear.{k}": v for k, v in linear.state_dict().items()}}
    state = {f"{p}features_extractor.{k}": v for p in ("", "pi_", "vf_") for k, v in fe.items()}
    state.update({f"action_net.{k}": v for k, v in action_net.state_dict().items()})
    state.update({f"value_net.{k}": v for k, v in value_net.state_dict().items()})
    net, info = import_policy(sb3_zip(tmp_path / "ppo_pong.zip", state, sb3_data()),
                              {"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 6})
    assert info["network"] == "policy"
    _same_logits(net, lambda x: action_net(linear(cnn(x))), torch.rand(2, 4, 84, 84))


class CleanRLAtariAgent(nn.Module):
    """cleanrl/ppo_atari.py's Agent: shared NatureCNN ``network``, ``actor`` and ``critic`` heads; its forward
    takes pixels and divides by 255 (crop's Atari observations are already in [0, 1])."""

    def __init__(self, n_out=6):
        super().__init__()
        self.network = nn.Sequential(*_nature_trunk(6), nn.Linear(3136, 512), nn.ReLU())
        self.actor, self.critic = nn.Linear(512, n_out), nn.Linear(512, 1)


def test_cleanrl_ppo_agents(tmp_path):
    agent = CleanRLAgent().eval()
    src = tmp_path / "runs" / "CartPole-v1__ppo__1__1700000000" / "ppo.cleanrl_model"
    src.parent.mkdir(parents=True)
    torch.save(agent.state_dict(), src)  # as cleanrl/ppo.py saves it
    net, info = import_policy(src, "mlp")
    assert info["network"] == "policy" and info["format"] == "cleanrl"
    assert info["net_spec"]["activation"] == "tanh" and info["net_spec"]["hidden"] == [64, 64]
    _same_logits(net, agent.actor)
    atari = CleanRLAtariAgent().eval()
    torch.save(atari.state_dict(), tmp_path / "ppo_atari.cleanrl_model")
    net, info = import_policy(tmp_path / "ppo_atari.cleanrl_model",
                              {"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 6})
    pixels = torch.randint(0, 256, (2, 4, 84, 84)).float()
    _same_logits(net, lambda x: atari.actor(atari.network(x)), pixels / 255.0)


def test_a_q_network_import_stays_a_q_network(tmp_path):
    q = mlp([4, 16, 2], 0, nn.ReLU)
    torch.save(q.state_dict(), tmp_path / "q.pt")
    assert import_policy(tmp_path / "q.pt", "mlp")[1]["network"] == "q"


def _import_ppo(tmp_path):
    state, logits = sb3_mlp_policy([4, 64, 64], [4, 64, 64], 2, seed=1)
    src = sb3_zip(tmp_path / "ppo.zip", state, sb3_data())
    out = tmp_path / "ck" / "model.pt"
    main(["import", "--env", "CartPole-v0", "--algo", "StdTrain", "--file", str(src), "--eval-episodes", "2",
          "--out", str(out)])
    return out, logits


@pytest.mark.slow
def test_certifiers_smooth_a_policy_networks_probabilities_and_refuse_q(tmp_path, capsys):
    out, logits = _import_ppo(tmp_path)
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["network"] == "policy"
    _same_logits(load_network(out, rec["net_spec"], rec["sha256"]), logits)
    common = ["--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", str(out),
              "--m", "200", "--episodes", "2", "--horizon", "5"]
    for target in ("probs", "vote", None):
        steps = tmp_path / f"loact-{target}.csv"
        main(["loact", *common, *(["--target", target] if target else []), "--out", str(steps)])
        meta = json.loads((tmp_path / f"loact-{target}.meta.json").read_text())
        assert meta["target"] == (target or "probs") and (meta["v_min"], meta["v_max"]) == (0.0, 1.0)
        assert "qrange" not in meta["inputs"]
    capsys.readouterr()
    for argv in (["loact", *common, "--target", "q", "--out", str(tmp_path / "q.csv")],
                 ["qrange", *common[:-6], "--out", str(tmp_path / "qr.json")]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "policy network" in err, err
    assert not (tmp_path / "q.csv").exists() and not (tmp_path / "qr.json").exists()


def _one_line_refusal(match, *args):
    with pytest.raises(PolicyImportError, match=match) as e:
        import_policy(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_the_files_activation_completes_or_contradicts_an_explicit_mlp_spec(tmp_path):
    """An explicit mlp spec of a Tanh actor gets the file's Tanh, not crop's ReLU default; a spec that says
    otherwise is refused naming both; sizes are still read when the spec gives only the activation."""
    state, logits = sb3_mlp_policy([4, 64, 64], [4, 64, 64], 2, seed=1)
    src = sb3_zip(tmp_path / "ppo.zip", state, sb3_data())
    sizes = {"arch": "mlp", "in": 4, "hidden": [64, 64], "out": 2}
    net, info = import_policy(src, sizes)
    assert info["net_spec"] == {**sizes, "activation": "tanh"}
    _same_logits(net, logits)
    err = _one_line_refusal("activation", src, {**sizes, "activation": "relu"})
    assert "'relu'" in err and "'tanh'" in err
    net, info = import_policy(src, {"arch": "mlp", "activation": "tanh"})
    assert info["net_spec"] == {**sizes, "activation": "tanh"}
    _same_logits(net, logits)


def test_an_actor_critic_whose_activation_the_file_does_not_tell_needs_it_given(tmp_path):
    """No Tanh guess: an SB3 MlpPolicy without a readable `data` (missing, too large) and a state dict with
    actor.* keys that is not CleanRL ppo.py's layout are refused unless the architecture gives the activation."""
    state, logits = sb3_mlp_policy([4, 32, 32], [4, 32, 32], 2, seed=3, act=nn.ReLU)
    buf = io.BytesIO()
    torch.save(state, buf)
    no_data = tmp_path / "no_data.zip"
    with zipfile.ZipFile(no_data, "w") as zf:
        zf.writestr("policy.pth", buf.getvalue())
    big = sb3_zip(tmp_path / "big.zip", state,
                  sb3_data(policy_kwargs={"activation_fn": "<class 'torch.nn.modules.activation.ReLU'>",
                                                 "pad": "x" * (5 << 20)}))
    for src, why in ((no_data, "'data' member is missing"), (big, "'data' member is .* over the limit")):
        err = _one_line_refusal(why, src, "mlp")
        assert '--arch \'{"arch": "mlp", "activation": "tanh"}\'' in err
        net, info = import_policy(src, {"arch": "mlp", "activation": "relu"})
        assert info["network"] == "policy" and info["net_spec"]["activation"] == "relu"
        _same_logits(net, logits)
    # A user's own ReLU actor-critic saved with actor.* / critic.* keys (two layers each: not ppo.py's three)
    actor, critic = mlp([4, 32, 2], 4, nn.ReLU), mlp([4, 32, 1], 5, nn.ReLU)
    own = {**{f"actor.{k}": v for k, v in actor.state_dict().items()},
           **{f"critic.{k}": v for k, v in critic.state_dict().items()}}
    torch.save(own, tmp_path / "own.pt")
    _one_line_refusal("not CleanRL ppo.py's layout", tmp_path / "own.pt", "mlp")
    net, info = import_policy(tmp_path / "own.pt", {"arch": "mlp", "activation": "relu"})
    assert info["network"] == "policy"
    _same_logits(net, actor)


@pytest.mark.slow
def test_sb3_layouts_crop_cannot_smooth_as_they_were_trained_are_refused(tmp_path):
    """SB3 < 1.8's shared_net, a continuous-action policy (log_std) and a CnnPolicy trained on raw pixels
    (normalize_images False) are each refused in one line."""
    state, _ = sb3_mlp_policy([4, 64, 64], [4, 64, 64], 2, seed=1)
    shared = {**state, "mlp_extractor.shared_net.0.weight": torch.zeros(4, 4),
              "mlp_extractor.shared_net.0.bias": torch.zeros(4)}
    _one_line_refusal("shared_net", sb3_zip(tmp_path / "old.zip", shared,
                                            sb3_data()), "mlp")
    _one_line_refusal("continuous-action", sb3_zip(tmp_path / "cont.zip", {**state, "log_std": torch.zeros(2)},
                                                   sb3_data()),
                      "mlp")
    cnn = _nature_trunk(4)
    torch.manual_seed(5)
    linear, action_net = nn.Sequential(nn.Linear(3136, 512), nn.ReLU()), nn.Linear(512, 6)
    fe = {**{f"features_extractor.cnn.{k}": v for k, v in cnn.state_dict().items()},
          **{f"features_extractor.linear.{k}": v for k, v in linear.state_dict().items()},
          **{f"action_net.{k}": v for k, v in action_net.state_dict().items()}}
    spec = {"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 6}
    raw = sb3_zip(tmp_path / "raw.zip", fe,
                  sb3_data(policy_kwargs={":type:": "<class 'dict'>", "normalize_images": False}))
    _one_line_refusal("normalize_images", raw, spec)
    assert import_policy(sb3_zip(tmp_path / "ok.zip", fe,
                                 sb3_data(policy_kwargs={"normalize_images": True})), spec)[1]["network"] == "policy"


def test_probs_of_a_q_network_is_refused_in_one_line(tmp_path, capsys):
    """softmax(Q) depends on the Q-values' scale: a Q-network is smoothed through q or vote, never probs."""
    q = mlp([4, 16, 2], 0, nn.ReLU)
    torch.save(q.state_dict(), tmp_path / "q.pt")
    out = tmp_path / "ck" / "model.pt"
    main(["import", "--env", "CartPole-v0", "--algo", "StdTrain", "--file", str(tmp_path / "q.pt"),
          "--eval-episodes", "1", "--out", str(out)])
    common = ["--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", str(out),
              "--m", "100", "--episodes", "1", "--horizon", "3"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["loact", *common, "--target", "probs", "--out", str(tmp_path / "p.csv")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "Q-network" in err and "vote" in err, err
    assert not (tmp_path / "p.csv").exists()
    main(["loact", *common, "--target", "vote", "--out", str(tmp_path / "v.csv")])
    assert (tmp_path / "v.csv").is_file()
