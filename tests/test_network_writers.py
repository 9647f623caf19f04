"""No model.pt holds a value that is not a finite number: every writer of a network checks it before its
atomic write (``crop train``, ``crop import``, ``crop derive`` through crop.models.save_network; ``crop
fetch`` before the download is put in place), and a refusal is one line with nothing written."""
import io
import json

import pytest
import torch

from crop.agents.checkpoints import fetch_checkpoint
from crop.io import InputError, sha256_file
from crop.models import CheckpointError, build_network, save_network

SPEC = {"arch": "mlp", "in": 4, "hidden": [8], "out": 2}


def _net(bad: float | None = None):
    torch.manual_seed(0)
    net = build_network(SPEC)
    if bad is not None:
        with torch.no_grad():
            net[2].bias[1] = bad
    return net


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_save_network_refuses_a_non_finite_network_and_writes_nothing(tmp_path, bad):
    out = tmp_path / "model.pt"
    with pytest.raises(CheckpointError, match=r"not written: the network's 2.bias: 1 of 2 values NaN or ±inf"):
        save_network(_net(bad), out)
    assert not list(tmp_path.iterdir())
    save_network(_net(), out)   # a finite one is written
    assert out.is_file()


def test_fetch_refuses_a_published_network_with_nan_weights(tmp_path):
    """Its sha256 is the pinned one and it loads into its architecture; a NaN weight still keeps it out."""
    site = tmp_path / "site"
    site.mkdir()
    buf = io.BytesIO()
    torch.save(_net(float("nan")).state_dict(), buf)
    (site / "m.pt").write_bytes(buf.getvalue())
    entry = {"url": "http://publisher.invalid/m.pt", "sha256": sha256_file(site / "m.pt"), "mirror_path": "m.pt",
             "net_spec": SPEC, "profile": "vector"}
    out = tmp_path / "out" / "model.pt"
    with pytest.raises(InputError, match=r"m.pt: the network's 2.bias: 1 of 2 values NaN or ±inf; refusing it"):
        fetch_checkpoint(entry, out, mirror=str(site), cache=tmp_path / "cache")
    assert not out.parent.exists() or not list(out.parent.iterdir())


def test_crop_train_writes_no_model_when_training_diverges(tmp_path, capsys):
    """A learning rate of 1e30 drives the weights to NaN: one line naming the tensor, no model.pt, no
    model.json, no resume file."""
    from crop.__main__ import main

    settings = {"total_steps": 80, "target_return": None, "eval_episodes": 1, "hidden": [8],
                "dqn": {"learning_starts": 10, "lr": 1e30, "batch_size": 8}}
    with pytest.raises(SystemExit) as exc:
        main(["train", "--env", "CartPole-v0", "--algo", "StdTrain", "--settings", json.dumps(settings),
              "--target-return", "none", "--no-progress", "--out", str(tmp_path / "model.pt")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("crop train")]
    assert exc.value.code != 0 and len(err) == 1, err
    assert "the trained network's 0.weight" in err[0] and "NaN or ±inf" in err[0]
    assert not list(tmp_path.iterdir())
