"""Your own policy: `crop import` turns a PyTorch state dict, a CleanRL checkpoint or the
q_net of a Stable-Baselines3 DQN .zip — each made here the way its library writes it — into a checkpoint
whose network computes exactly the source's Q-values and whose model.json every certifier accepts; hostile
files are refused before anything is written; a config with `source: file` is validated and planned."""
import io
import json
import subprocess
import sys
import zipfile

import pytest
import torch
import yaml
from torch import nn

from crop.__main__ import main
from crop.agents.importing import PolicyImportError, import_policy
from crop.io import derive_seed, sha256_file
from crop.models import load_network
from crop.train.dqn import greedy_returns
from crop.workflow.config import ConfigError, validate_config
from crop.workflow.layout import RUN_FILES

from networks import mlp, sb3_data, sb3_dqn_state, sb3_zip
from paths import REPO

X = torch.randn(32, 4, generator=torch.Generator().manual_seed(7))


class CleanRLQNetwork(nn.Module):
    """CleanRL's dqn.py QNetwork (120 → 84 hidden units, weights under ``network.``)."""

    def __init__(self, n_in=4, n_out=2):
        super().__init__()
        self.network = nn.Sequential(nn.Linear(n_in, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                     nn.Linear(84, n_out))

    def forward(self, x):
        return self.network(x)


def _import(tmp_path, src, *extra, algo="StdTrain", episodes="3"):
    out = tmp_path / "ck" / "model.pt"
    main(["import", "--env", "CartPole-v0", "--algo", algo, "--file", str(src), "--eval-episodes", episodes,
          "--out", str(out), *extra])
    return out, json.loads(out.with_suffix(".json").read_text())


def _same_q(out, rec, reference):
    net = load_network(out, rec["net_spec"], expected_sha256=rec["sha256"])
    with torch.no_grad():
        assert torch.equal(net(X), reference(X))
    return net


def test_plain_pytorch_state_dict(tmp_path):
    src_net = mlp([4, 16, 16, 2], seed=1)
    src = tmp_path / "mine.pt"
    torch.save(src_net.state_dict(), src)
    out, rec = _import(tmp_path, src)  # architecture mlp (default): sizes read from the weights
    assert rec["net_spec"] == {"arch": "mlp", "in": 4, "hidden": [16, 16], "out": 2}
    assert rec["source"] == "file" and rec["profile"] == "vector" and rec["algo"] == "StdTrain"
    assert rec["imported_from"]["sha256"] == sha256_file(src) and rec["imported_from"]["format"] == "torch"
    assert rec["sha256"] == sha256_file(out)
    net = _same_q(out, rec, src_net)
    # the clean greedy return is the greedy policy's, from the acceptance test's seeds
    rets = greedy_returns(net, "CartPole-v0", [derive_seed(0, "accept-eval", i) for i in range(3)], "vector")
    cgr = rec["clean_greedy_return"]
    assert cgr["episodes"] == 3 and cgr["mean"] == pytest.approx(float(rets.mean())) and 1 <= cgr["mean"] <= 200
    assert cgr["meets_target_return"] == (cgr["mean"] >= 195)


def test_cleanrl_checkpoint(tmp_path):
    q = CleanRLQNetwork().eval()
    src = tmp_path / "runs" / "CartPole-v0__dqn__1__1700000000" / "dqn.cleanrl_model"
    src.parent.mkdir(parents=True)
    torch.save(q.state_dict(), src)  # as cleanrl/dqn.py saves it
    spec = {"arch": "mlp", "in": 4, "hidden": [120, 84], "out": 2}
    out, rec = _import(tmp_path, src, "--arch", json.dumps(spec))
    assert rec["imported_from"]["format"] == "cleanrl" and rec["net_spec"] == spec
    _same_q(out, rec, q)


def test_sb3_dqn_zip_takes_the_online_q_net(tmp_path):
    q_net, target = mlp([4, 64, 64, 2], seed=2), mlp([4, 64, 64, 2], seed=3)
    src = sb3_zip(tmp_path / "dqn_cartpole.zip", sb3_dqn_state(q_net, target), sb3_data("DQN"))
    out, rec = _import(tmp_path, src)
    assert rec["imported_from"]["format"] == "sb3" and rec["imported_from"]["member"] == "policy.pth"
    assert rec["net_spec"] == {"arch": "mlp", "in": 4, "hidden": [64, 64], "out": 2}  # MlpPolicy default
    _same_q(out, rec, q_net)


def test_sb3_cnn_policy_maps_onto_nature_cnn(tmp_path):
    """CnnPolicy: NatureCNN features (cnn.0/2/4, linear.0) and a one-layer head q_net.0."""
    torch.manual_seed(4)
    cnn = nn.Sequential(nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
                        nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten())
    linear, head = nn.Sequential(nn.Linear(3136, 512), nn.ReLU()), nn.Sequential(nn.Linear(512, 6))
    state = {**{f"q_net.features_extractor.cnn.{k}": v for k, v in cnn.state_dict().items()},
             **{f"q_net.features_extractor.linear.{k}": v for k, v in linear.state_dict().items()},
             **{f"q_net.q_net.{k}": v for k, v in head.state_dict().items()}}
    buf = io.BytesIO()
    torch.save(state, buf)
    src = tmp_path / "dqn_pong.zip"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("policy.pth", buf.getvalue())
    net, info = import_policy(src, {"arch": "nature_cnn", "in_channels": 4, "in_size": 84, "out": 6})
    x = torch.rand(2, 4, 84, 84)
    with torch.no_grad():
        assert torch.equal(net(x), head(linear(cnn(x))))
    assert info["format"] == "sb3"


def test_imported_checkpoint_is_certified_by_the_certifiers(tmp_path):
    src_net = mlp([4, 16, 2], seed=5)
    torch.save(src_net.state_dict(), tmp_path / "mine.pt")
    out, _ = _import(tmp_path, tmp_path / "mine.pt", episodes="1")
    q = tmp_path / RUN_FILES["qrange"]
    main(["qrange", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--checkpoint", str(out),
          "--m", "20", "--episodes", "1", "--horizon", "5", "--out", str(q)])
    assert json.loads(q.read_text())["checkpoint_sha256"] == sha256_file(out)


# ------------------------------------------------------------------------------------------ refused

def _refused(tmp_path, capsys, src, *extra, match):
    out = tmp_path / "ck" / "model.pt"
    with pytest.raises(SystemExit) as e:
        main(["import", "--env", "CartPole-v0", "--algo", "StdTrain", "--file", str(src), "--eval-episodes", "1",
              "--out", str(out), *extra])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1, err  # one line
    assert not out.exists() and not out.with_suffix(".json").exists()
    return err


def test_pickled_code_in_policy_pth_is_never_run(tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    buf = io.BytesIO()
    torch.save({"q_net.q_net.0.weight": Evil()}, buf)
    src = sb3_zip(tmp_path / "evil.zip", sb3_dqn_state(mlp([4, 2], 0), mlp([4, 2], 0)),
                  sb3_data("DQN"), policy_bytes=buf.getvalue())
    _refused(tmp_path, capsys, src, match="holds code")
    assert not marker.exists()


def test_zip_with_a_climbing_member_is_refused(tmp_path, capsys):
    src = sb3_zip(tmp_path / "climb.zip", sb3_dqn_state(mlp([4, 2], 0), mlp([4, 2], 0)),
                  sb3_data("DQN"), extra=[("../../escape", b"x")])
    _refused(tmp_path, capsys, src, match="climbs out")
    assert not (tmp_path.parent / "escape").exists()


def test_an_oversized_member_is_not_read(tmp_path):
    src = sb3_zip(tmp_path / "big.zip", sb3_dqn_state(mlp([4, 256, 256, 2], 0), mlp([4, 256, 256, 2], 0)),
                  sb3_data("DQN"))
    with pytest.raises(PolicyImportError, match="over the limit"):
        import_policy(src, "mlp", max_bytes=4096)


def test_a_pinned_sha256_and_nan_weights_and_a_wrong_architecture(tmp_path, capsys):
    net = mlp([4, 16, 2], 0)
    src = tmp_path / "mine.pt"
    torch.save(net.state_dict(), src)
    _refused(tmp_path, capsys, src, "--file-sha256", "0" * 64, match="differs from the pinned")
    _refused(tmp_path, capsys, src, "--arch", '{"arch": "mlp", "in": 4, "hidden": [32], "out": 2}',
             match="shape mismatches")
    _refused(tmp_path, capsys, src, "--profile", "flat25", match="not a preprocessing profile of CartPole-v0")
    with torch.no_grad():
        net[0].bias[3] = float("nan")
    torch.save(net.state_dict(), src)
    _refused(tmp_path, capsys, src, match="non-finite weights")
    _refused(tmp_path, capsys, tmp_path / "absent.pt", match="no such policy file")


# ------------------------------------------------------------------------------------------ workflow

def _file_config(tmp_path, **entry):
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "smoke.yaml").read_text())
    cfg["results"] = str(tmp_path / "results")
    ec = cfg["environments"]["CartPole-v0"]
    ec["source"] = "file"
    ec["files"] = {"StdTrain": {"path": str(tmp_path / "dqn_cartpole.zip"), **entry}}
    return cfg


def test_config_source_file_is_validated(tmp_path):
    cfg = validate_config(_file_config(tmp_path, profile="vector"))
    assert cfg["environments"]["CartPole-v0"]["files"]["StdTrain"]["architecture"] == "mlp"  # default
    bad = _file_config(tmp_path)
    bad["environments"]["CartPole-v0"]["files"] = {}
    with pytest.raises(ConfigError, match=r"source: file but no file: give environments\.CartPole-v0\.files\."
                                          r"StdTrain"):
        validate_config(bad)  # CARRL is derived from StdTrain, whose file is missing
    with pytest.raises(ConfigError, match="files.StdTrain: unknown key 'arch' .did you mean 'architecture'"):
        validate_config(_file_config(tmp_path, arch="mlp"))


@pytest.mark.slow
def test_snakemake_dry_run_plans_the_import(tmp_path):
    sb3_zip(tmp_path / "dqn_cartpole.zip", sb3_dqn_state(mlp([4, 64, 64, 2], 0), mlp([4, 64, 64, 2], 1)),
            sb3_data("DQN"))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(_file_config(tmp_path, format="sb3")))
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                        str(tmp_path), "-n", "-p", "--configfile", str(tmp_path / "c.yaml")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cmds = [ln for ln in p.stdout.splitlines() if "crop checkpoint" in ln]
    std = [c for c in cmds if "--algo StdTrain" in c]
    assert len(std) == 1 and "--source file" in std[0]
    assert f"--file {tmp_path / 'dqn_cartpole.zip'} --format sb3 --arch mlp" in std[0]
    carrl = [c for c in cmds if "--algo CARRL" in c]
    assert len(carrl) == 1 and "--base-checkpoint" in carrl[0] and "--file" not in carrl[0]


# ------------------------------------------------------------------------ a corpus of malformed files

class _Payload:
    """A pickle that, loaded by a full unpickler, would create MARKER (never: weights_only=True)."""

    marker = ""

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _zip_with_lying_size(path, policy_bytes, field):
    """An SB3 archive (stored, uncompressed) whose central directory lies about policy.pth: ``field`` 20 is the
    compressed size, 24 the uncompressed size (and the CRC at 16), each set to a wrong value."""
    import struct

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("data", "{}")
        zf.writestr("policy.pth", policy_bytes)
    data = bytearray(path.read_bytes())
    at = data.rfind(b"PK\x01\x02")  # the last central directory entry: policy.pth
    struct.pack_into("<I", data, at + field, 10)
    path.write_bytes(bytes(data))
    return path


def _bad_files(tmp_path) -> dict:
    """name: path of every kind of malformed policy file, built here."""
    d = tmp_path / "bad"
    d.mkdir()
    _Payload.marker = str(tmp_path / "PWNED")

    def save(name, obj):
        torch.save(obj, d / name)
        return d / name

    def sd(*sizes):
        return mlp(list(sizes), 0).state_dict()

    good = io.BytesIO()
    torch.save(sd(4, 8, 2), good)
    good = good.getvalue()
    files = {
        "empty": d / "empty.pt", "garbage": d / "garbage.pt", "truncated torch zip": d / "trunc.pt",
        "payload in torch.save": save("payload.pt", {"0.weight": _Payload()}),
        "whole pickled module": save("module.pt", mlp([4, 8, 2], 0)),
        "non-chaining layers": save("nonchain.pt", {"0.weight": torch.zeros(8, 4), "0.bias": torch.zeros(8),
                                                    "2.weight": torch.zeros(2, 5), "2.bias": torch.zeros(2)}),
        "input wider than the observation": save("wide.pt", sd(5, 8, 2)),
        "more outputs than actions": save("out3.pt", sd(4, 8, 3)),
        "a list of tensors": save("list.pt", [torch.zeros(2)]),
    }
    files["empty"].write_bytes(b"")
    files["garbage"].write_bytes(b"\x80\x02not a pickle" * 50)
    files["truncated torch zip"].write_bytes(good[: len(good) // 2])
    raw = d / "payload.pkl"  # a bare pickle (protocol 4), not torch.save's zip
    import pickle

    raw.write_bytes(pickle.dumps({"0.weight": _Payload()}, protocol=4))
    files["bare pickle payload"] = raw
    buf = io.BytesIO()
    torch.save({"q_net.q_net.0.weight": _Payload()}, buf)
    tiny = sb3_dqn_state(mlp([4, 2], 0), mlp([4, 2], 0))
    files["SB3 zip with a payload"] = sb3_zip(d / "sb3_payload.zip", tiny, sb3_data("DQN"), policy_bytes=buf.getvalue())
    files["SB3 zip with a garbage policy.pth"] = sb3_zip(d / "sb3_garbage.zip", tiny, sb3_data("DQN"),
                                                         policy_bytes=b"\x00garbage" * 40)
    sb3 = sb3_zip(d / "sb3.zip", sb3_dqn_state(mlp([4, 64, 2], 0), mlp([4, 64, 2], 0)), sb3_data("DQN")).read_bytes()
    corrupt = bytearray(sb3)
    start = sb3.find(b"policy.pth") + 40  # inside policy.pth's deflated data
    corrupt[start:start + 64] = bytes(64)
    (d / "sb3_corrupt.zip").write_bytes(bytes(corrupt))
    files["corrupt SB3 zip"] = d / "sb3_corrupt.zip"
    (d / "sb3_cut.zip").write_bytes(sb3[: len(sb3) - 40])
    files["SB3 zip cut short"] = d / "sb3_cut.zip"
    member = io.BytesIO()
    torch.save({f"q_net.q_net.{k}": v for k, v in sd(4, 2).items()}, member)
    for field, what in ((16, "checksum"), (20, "compressed size"), (24, "size")):
        files[f"SB3 zip lying about its {what}"] = _zip_with_lying_size(d / f"sb3_lie{field}.zip",
                                                                         member.getvalue(), field)
    return files


@pytest.mark.parametrize("command", ["import", "checkpoint"])
def test_every_malformed_file_is_one_line_and_nothing_is_written(tmp_path, capfd, command):
    """Every malformed file of the corpus, through `crop import` and `crop checkpoint` (source: file): exit
    status 2, exactly one line on stderr (no traceback, no warning), nothing written, nothing run."""
    files = _bad_files(tmp_path)
    source = ["--source", "file"] if command == "checkpoint" else []
    for name, src in files.items():
        out = tmp_path / "out" / name.replace(" ", "_") / "model.pt"
        with pytest.raises(SystemExit) as e:
            main([command, "--env", "CartPole-v0", "--algo", "StdTrain", *source, "--file", str(src),
                  "--eval-episodes", "1", "--out", str(out)])
        captured = capfd.readouterr()
        assert e.value.code == 2, (name, captured.err)
        assert captured.err.count("\n") == 1 and captured.err.startswith(f"crop {command}: error: "), \
            (name, captured.err)
        assert "weights_only=False" not in captured.err and "Traceback" not in captured.err, name
        assert not (tmp_path / "out").exists(), name
        assert not (tmp_path / "PWNED").exists(), name
        if "payload" in name or "module" in name:
            assert "holds code" in captured.err and "was not run" in captured.err, (name, captured.err)
        elif "chaining" in name:
            assert "do not chain" in captured.err, captured.err
        elif "zip" in name and "SB3" in name and "policy.pth" not in name:
            assert "corrupt zip archive" in captured.err or "not a readable" in captured.err, captured.err


@pytest.mark.parametrize("arch, words", [
    ('{"arch": "mlp", "in": NaN, "hidden": [8], "out": 2}', "NaN is not a size"),
    ('{"arch": "mlp", "in": "x", "hidden": [8], "out": 2}', "does not describe a network of architecture 'mlp'"),
    ('{"arch": "mlp", "in": -4, "hidden": [8], "out": 2}', "sizes must be positive integers"),
    ('{"arch": "mlp", "in": 4, "hidden": 8, "out": 2}', "sizes must be positive integers"),
    ('{"arch": "mlp", "hidden": [8]}', "architecture 'mlp': 'in' is missing or unknown"),
])
def test_a_malformed_architecture_is_one_line(tmp_path, capsys, arch, words):
    src = tmp_path / "mine.pt"
    torch.save(mlp([4, 8, 2], 0).state_dict(), src)
    _refused(tmp_path, capsys, src, "--arch", arch, match=words)
