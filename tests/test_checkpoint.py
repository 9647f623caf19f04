"""Checkpoints are untrusted: wrong hash, wrong architecture, pickled code and NaN weights are refused
before any output is written."""

import pytest
import torch

from crop.__main__ import main
from crop.io import read_json, sha256_file, write_json
from crop.models import CheckpointError, load_network, save_network
from crop.workflow.layout import RUN_FILES

from paths import SHARED

SPEC = {"arch": "mlp", "in": 4, "hidden": [16], "out": 2}


def _policy(tmp_path, net, spec=SPEC, sha=None):
    model = tmp_path / "model.pt"
    save_network(net, model)
    write_json(tmp_path / "model.json", {"env": "CartPole-v0", "algo": "StdTrain", "net_spec": spec,
                                         "sha256": sha or sha256_file(model), "profile": "vector"})
    return model


def _qrange_args(model, out):
    return ["qrange", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint",
            str(model), "--m", "50", "--episodes", "1", "--horizon", "5", "--out", str(out)]


def test_wrong_sha256_is_refused_and_nothing_written(tmp_path, mlp_factory, capsys):
    model = _policy(tmp_path, mlp_factory(hidden=(16,)), sha="0" * 64)
    out = tmp_path / RUN_FILES["qrange"]
    with pytest.raises(SystemExit) as e:
        main(_qrange_args(model, out))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "sha256" in err and str(model) in err
    assert not out.exists()


def test_wrong_architecture_names_the_keys(tmp_path, mlp_factory, capsys):
    model = _policy(tmp_path, mlp_factory(hidden=(16, 16)))  # file has two hidden layers, spec one
    out = tmp_path / RUN_FILES["qrange"]
    with pytest.raises(SystemExit):
        main(_qrange_args(model, out))
    err = capsys.readouterr().err
    assert "MLP 4→16→2" in err and "unexpected keys ['4.bias', '4.weight']" in err
    assert not out.exists()


def test_pickled_code_is_never_run(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad = tmp_path / "evil.pt"
    torch.save({"0.weight": Evil()}, bad)
    with pytest.raises(CheckpointError, match="holds code"):
        load_network(bad, SPEC)
    assert not marker.exists()


def test_nan_q_values_abort_with_the_state(tmp_path, mlp_factory, capsys):
    net = mlp_factory(hidden=(16,))
    model = _policy(tmp_path, net)
    with torch.no_grad():   # a model.pt no crop writer writes (save_network refuses it): put in place by hand
        net[0].bias.fill_(float("nan"))
    torch.save(net.state_dict(), model)
    write_json(tmp_path / "model.json", {**read_json(tmp_path / "model.json"),
                                         "sha256": sha256_file(model)})
    out = tmp_path / RUN_FILES["qrange"]
    with pytest.raises(SystemExit) as e:
        main(_qrange_args(model, out))
    assert e.value.code == 1
    assert "NaN or inf at episode 0 step 0" in capsys.readouterr().err
    assert not out.exists()


HIGHWAY = SHARED / "checkpoints" / "crop-highway-fast-v0"


@pytest.mark.skipif(not HIGHWAY.is_dir(), reason="shared CROP checkpoints not present")
def test_published_highway_checkpoints_load_with_both_key_styles():
    spec = {"arch": "mlp", "in": 25, "hidden": [256, 256], "out": 5}
    sums = dict(reversed(line.split()) for line in (HIGHWAY / "SHA256SUMS").read_text().splitlines() if line)
    assert len(sums) == 8
    for name, sha in sums.items():
        net = load_network(HIGHWAY / name, spec, expected_sha256=sha)
        assert net(torch.zeros(3, 25)).shape == (3, 5)
    with pytest.raises(CheckpointError, match="sha256"):
        load_network(HIGHWAY / "highway-fast_nat.pth", spec, expected_sha256="1" * 64)
