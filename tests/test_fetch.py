"""Published checkpoints through the same code path users hit: pooch download from a mirror served on
127.0.0.1, sha256 pinning (registry or lock file), safe archive extraction."""
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from crop.__main__ import main
from crop.agents.checkpoints import ArchiveError, FetchError, extract_member, fetch_published
from crop.agents.registry import resolve_source
from crop.envs import make_env
from crop.io import sha256_file
from crop.models import load_network

from archives import state_bytes, tar_archive
from paths import SHARED

CKPTS = SHARED / "checkpoints"
HIGHWAY = CKPTS / "crop-highway-fast-v0"
needs_shared = pytest.mark.skipif(not HIGHWAY.is_dir(), reason="../shared/checkpoints not present")


def _cached(cache: Path) -> list[str]:
    """The files a cache holds beside its archives' locks (NAME.lock, which stay: a lock is held, not removed)."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.suffix != ".lock")


@pytest.mark.slow
@needs_shared
def test_fetch_through_the_cli_from_a_mirror(tmp_path, serve):
    mirror = serve(CKPTS)
    out = tmp_path / "ck" / "model.pt"
    main(["fetch", "--env", "highway-fast-v0", "--algo", "StdTrain", "--mirror", mirror, "--eval-episodes", "1",
          "--cache", str(tmp_path / "cache"), "--lock", str(tmp_path / "lock.json"), "--out", str(out)])
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["clean_greedy_return"]["episodes"] == 1
    _, entry = resolve_source("highway-fast-v0", "StdTrain", "published")
    assert rec["sha256"] == entry["sha256"] == sha256_file(out)
    assert rec["fetched_from"].startswith(mirror) and rec["url"] == entry["url"]
    load_network(out, rec["net_spec"], expected_sha256=rec["sha256"])


@needs_shared
def test_wrong_sha256_is_refused_and_leaves_no_file(tmp_path, serve, monkeypatch, capsys):
    mirror = serve(CKPTS)
    _, entry = resolve_source("highway-fast-v0", "StdTrain", "published")
    bad = dict(entry, sha256="0" * 64)
    monkeypatch.setattr("crop.agents.registry.resolve_source", lambda env, algo, prefer: ("published", bad))
    out = tmp_path / "ck" / "model.pt"
    with pytest.raises(SystemExit) as e:
        main(["fetch", "--env", "highway-fast-v0", "--algo", "StdTrain", "--mirror", mirror,
              "--cache", str(tmp_path / "cache"), "--out", str(out)])
    assert e.value.code == 2
    assert "refusing" in capsys.readouterr().err
    assert not out.exists() and not out.with_suffix(".json").exists()
    assert _cached(tmp_path / "cache") == [], "a file with the wrong hash stayed in the cache"


@pytest.mark.slow
@needs_shared
def test_every_published_highway_checkpoint_loads_and_plays(tmp_path, serve):
    mirror = serve(CKPTS)
    spec = {"arch": "mlp", "in": 25, "hidden": [256, 256], "out": 5}
    sums = [line.split() for line in (HIGHWAY / "SHA256SUMS").read_text().splitlines() if line.strip()]
    assert len(sums) == 8
    for sha, name in sums:
        entry = {"url": f"https://example.invalid/{name}", "sha256": sha,
                 "mirror_path": f"crop-highway-fast-v0/{name}"}
        dest = tmp_path / name
        fetch_published(entry, dest, mirror=mirror, cache=tmp_path / "cache")
        net = load_network(dest, spec, expected_sha256=sha)
        env = make_env("highway-fast-v0")
        obs, _ = env.reset(seed=0)
        steps, done = 0, False
        while not done:
            a = int(net(torch.as_tensor(obs).unsqueeze(0)).argmax(1))
            obs, r, term, trunc, _ = env.step(a)
            steps += 1
            done = term or trunc
        assert steps >= 1 and np.isfinite(r)


def test_lock_file_pins_the_first_download_and_refuses_a_change(tmp_path, serve):
    site = tmp_path / "site"
    site.mkdir()
    tar_archive(site / "models.tar.gz", [({"name": "models/Pong-natural.model"}, state_bytes(0))])
    mirror = serve(site)
    entry = {"url": "http://publisher.invalid/models.tar.gz", "member": "models/Pong-natural.model",
             "mirror_path": "models.tar.gz"}
    lock = tmp_path / "lock.json"
    fetch_published(entry, tmp_path / "a.pt", mirror=mirror, cache=tmp_path / "cache", lock=lock)
    pinned = json.loads(lock.read_text())[entry["url"]]["sha256"]
    assert pinned == sha256_file(site / "models.tar.gz")
    fetch_published(entry, tmp_path / "b.pt", mirror=mirror, cache=tmp_path / "cache2", lock=lock)  # same file: ok
    tar_archive(site / "models.tar.gz", [({"name": "models/Pong-natural.model"}, state_bytes(1))])  # publisher changed
    with pytest.raises(FetchError, match="refusing"):
        fetch_published(entry, tmp_path / "c.pt", mirror=mirror, cache=tmp_path / "cache3", lock=lock)
    assert not (tmp_path / "c.pt").exists()


@pytest.mark.parametrize("hostile", [
    [({"name": "../escape.model"}, b"x")],
    [({"name": "/tmp/crop-absolute.model"}, b"x")],
    [({"name": "models/link", "type": tarfile.SYMTYPE, "linkname": "../../../etc/passwd"}, None)],
    [({"name": "models/hard", "type": tarfile.LNKTYPE, "linkname": "/etc/passwd"}, None)],
    [({"name": "dev", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, None)],
], ids=["dotdot", "absolute", "symlink-escape", "hardlink-absolute", "device"])
def test_hostile_tar_members_are_refused(tmp_path, hostile):
    arc = tar_archive(tmp_path / "a.tar.gz", [({"name": "models/Pong-natural.model"}, state_bytes())] + hostile)
    out = tmp_path / "out" / "model.pt"
    before = set(Path("/tmp").iterdir())
    with pytest.raises(ArchiveError, match="refusing"):
        extract_member(arc, "models/Pong-natural.model", out)
    assert not out.exists()
    assert not Path("/tmp/crop-absolute.model").exists() and set(Path("/tmp").iterdir()) - before <= {tmp_path}


def test_zip_with_dotdot_and_bomb_are_refused(tmp_path):
    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("ok/Pong.pt", state_bytes())
        zf.writestr("../../escape.pt", b"x")
    with pytest.raises(ArchiveError, match="climbs out"):
        extract_member(z, "ok/Pong.pt", tmp_path / "o1.pt")
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("PongNoFrameskip-v4_robust.pt", b"\0" * (8 << 20))  # 8 MiB of zeros, a few KB zipped
    assert bomb.stat().st_size < 100_000
    with pytest.raises(ArchiveError, match="limit"):
        extract_member(bomb, "PongNoFrameskip-v4_robust.pt", tmp_path / "o2.pt", max_bytes=1 << 20)
    assert not (tmp_path / "o2.pt").exists() and not list(tmp_path.glob(".o2.pt.*"))


def test_member_found_by_basename_in_a_subfolder(tmp_path):
    z = tmp_path / "DQN_trained_models.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("DQN_trained_models/PongNoFrameskip-v4_robust.pt", b"weights")
    extract_member(z, "PongNoFrameskip-v4_robust.pt", tmp_path / "m.pt")
    assert (tmp_path / "m.pt").read_bytes() == b"weights"


# ------------------------------------------------------------------ local mirrors, offline, clean return

@needs_shared
@pytest.mark.parametrize("form", ["file-url", "folder"])
def test_file_url_and_plain_folder_mirrors_with_the_same_sha256_rules(tmp_path, form):
    """A file:// URL or a plain folder is a mirror like an http one: the pinned sha256 must match, and a
    mismatch is refused without keeping a file."""
    mirror = CKPTS.resolve().as_uri() if form == "file-url" else str(CKPTS)
    _, entry = resolve_source("highway-fast-v0", "StdTrain", "published")
    dest = tmp_path / "a.pt"
    origin = fetch_published(entry, dest, mirror=mirror, cache=tmp_path / "cache")
    assert sha256_file(dest) == entry["sha256"] == origin["download_sha256"]
    assert origin["fetched_from"].startswith(mirror) and origin["pinned_by"] == "registry"
    with pytest.raises(FetchError, match="refusing"):
        fetch_published(dict(entry, sha256="0" * 64), tmp_path / "b.pt", mirror=mirror, cache=tmp_path / "c2")
    assert not (tmp_path / "b.pt").exists() and _cached(tmp_path / "c2") == []
    assert sha256_file(HIGHWAY / "highway-fast_nat.pth") == entry["sha256"]  # the mirror itself is untouched


def test_a_local_mirror_pins_an_unpinned_source_and_names_a_missing_file(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    tar_archive(site / "models.tar.gz", [({"name": "models/Pong-natural.model"}, state_bytes(0))])
    entry = {"url": "http://publisher.invalid/models.tar.gz", "member": "models/Pong-natural.model",
             "mirror_path": "models.tar.gz"}
    lock = tmp_path / "lock.json"
    fetch_published(entry, tmp_path / "a.pt", mirror=site.as_uri(), cache=tmp_path / "cache", lock=lock)
    assert json.loads(lock.read_text())[entry["url"]]["sha256"] == sha256_file(site / "models.tar.gz")
    assert (site / "models.tar.gz").is_file()  # copied, not moved
    tar_archive(site / "models.tar.gz", [({"name": "models/Pong-natural.model"}, state_bytes(1))])
    with pytest.raises(FetchError, match="refusing"):
        fetch_published(entry, tmp_path / "b.pt", mirror=str(site), cache=tmp_path / "cache2", lock=lock)
    with pytest.raises(FetchError, match="no such file in the mirror"):
        fetch_published(dict(entry, mirror_path="elsewhere.tar.gz"), tmp_path / "c.pt", mirror=str(site),
                        cache=tmp_path / "cache3", lock=lock)


def test_an_unknown_protocol_is_named_as_such(tmp_path):
    with pytest.raises(FetchError, match="unsupported protocol 's3'; give an http.s.:// or ftp:// URL, a file:// "
                                         "URL or a folder"):
        fetch_published({"url": "https://x.invalid/m.pt", "sha256": "0" * 64}, tmp_path / "m.pt",
                        mirror="s3://bucket/models", cache=tmp_path / "cache")


def test_offline_fetch_says_to_use_a_mirror(tmp_path, capsys, monkeypatch):
    _, entry = resolve_source("highway-fast-v0", "StdTrain", "published")
    offline = dict(entry, url="https://crop-no-such-host.invalid/highway-fast_nat.pth")
    monkeypatch.setattr("crop.agents.registry.resolve_source", lambda env, algo, prefer: ("published", offline))
    monkeypatch.delenv("CROP_CHECKPOINT_MIRROR", raising=False)
    out = tmp_path / "ck" / "model.pt"
    with pytest.raises(SystemExit) as e:
        main(["fetch", "--env", "highway-fast-v0", "--algo", "StdTrain", "--cache", str(tmp_path / "cache"),
              "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot resolve the host 'crop-no-such-host.invalid'" in err
    assert "--mirror" in err and "CROP_CHECKPOINT_MIRROR" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow
@needs_shared
def test_fetched_model_json_records_the_clean_greedy_return(tmp_path):
    out = tmp_path / "ck" / "model.pt"
    main(["fetch", "--env", "highway-fast-v0", "--algo", "StdTrain", "--mirror", str(CKPTS), "--eval-episodes", "2",
          "--cache", str(tmp_path / "cache"), "--out", str(out)])
    rec = json.loads(out.with_suffix(".json").read_text())
    from crop.io import derive_seed
    from crop.train.dqn import greedy_returns

    net = load_network(out, rec["net_spec"], expected_sha256=rec["sha256"])
    rets = greedy_returns(net, "highway-fast-v0", [derive_seed(0, "accept-eval", i) for i in range(2)], "flat25")
    cgr = rec["clean_greedy_return"]
    assert cgr["episodes"] == 2 and cgr["mean"] == pytest.approx(float(rets.mean())) and cgr["mean"] > 0
