"""Published checkpoints: download through pooch with the sha256 pinned, a cache, a mirror, a lock file,
and safe extraction from archives.  Downloaded files are untrusted until their hash matches.

* Sources with a published or pinned sha256 (CROP's highway models): pooch refuses a mismatch and keeps
  no file.
* Sources whose publisher gives no checksum (SA-DQN's tarball, RADIAL-RL's zip): the sha256 of the first
  download is pinned in a lock file (``checkpoints.lock.json`` by default) and any later mismatch is
  refused.
* Mirror (offline and air-gapped sites): ``--mirror URL`` (config ``checkpoints.mirror``) or the
  environment variable ``CROP_CHECKPOINT_MIRROR``; a file is then fetched from ``{mirror}/{mirror_path}``
  and must still match the pinned hash.  The mirror is an http(s)/ftp URL, a ``file://`` URL or a plain
  folder: a local file is copied by pooch's own machinery (a custom downloader), so the same sha256 rules
  apply to it as to a download.
* Concurrency: however many processes ask for one archive at once, on however many nodes sharing the cache,
  it is downloaded once: under its lock in the cache (``CACHE/NAME.lock``, :mod:`crop.agents.cache_lock`),
  into a staging folder of its own, and moved into place whole; the lock file's pins are read, added to and
  written under that file's own lock.  ``crop fetch --configfile`` fills the cache ahead of a run (compute
  nodes without internet).
* Archives: every member name is checked (no absolute paths, no ``..``, no links leaving the archive, no
  device files — ``tarfile.data_filter`` semantics), and only the wanted regular member is streamed to
  our own path, with a byte limit that also stops decompression bombs.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tarfile
import time
import zipfile
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse
from urllib.request import url2pathname

from crop.agents.cache_lock import held, say
from crop.io import atomic_write_text, sha256_file, temp_file

__all__ = ["ArchiveError", "FetchError", "cached_archive", "fetch_published", "fetch_checkpoint", "extract_member",
           "mirror_url", "DEFAULT_LOCK", "MAX_MEMBER_BYTES", "cache_dir", "local_path", "clean_greedy_return"]

DEFAULT_LOCK = "checkpoints.lock.json"
MAX_MEMBER_BYTES = 1 << 30          # 1 GiB for one checkpoint file
MAX_ARCHIVE_BYTES = 8 << 30         # declared uncompressed size of a whole archive
MAX_ARCHIVE_MEMBERS = 10000
REMOTE_SCHEMES = ("http", "https", "ftp", "sftp", "doi")   # what pooch downloads
MIRROR_HINT = ("offline or behind a firewall? give --mirror (an http(s) URL, a file:// URL or a folder holding a "
               "copy of the files; config checkpoints.mirror) or set CROP_CHECKPOINT_MIRROR")


class FetchError(RuntimeError):
    """A download that must not be used (hash mismatch, unreachable, not pinned)."""


class ArchiveError(FetchError):
    """An archive that is unsafe or does not hold the expected member."""


def cache_dir(cache: str | os.PathLike | None = None) -> Path:
    import pooch

    return Path(cache or os.environ.get("CROP_CACHE") or pooch.os_cache("crop"))


def mirror_url(entry: dict, mirror: str | None) -> str:
    """The URL a source is fetched from: its own, or ``{mirror}/{mirror_path}``."""
    mirror = mirror or os.environ.get("CROP_CHECKPOINT_MIRROR") or None
    if not mirror:
        return entry["url"]
    path = entry.get("mirror_path") or PurePosixPath(urlparse(entry["url"]).path).name
    return mirror.rstrip("/") + "/" + path.lstrip("/")


def _read_lock(lock: Path) -> dict:
    if not lock.is_file():
        return {}
    try:
        return json.loads(lock.read_text())
    except json.JSONDecodeError as exc:
        raise FetchError(f"lock file {lock} is not valid JSON: {exc}") from None


def local_path(url: str) -> Path | None:
    """The local file a ``file://`` URL or a plain path names; None for a remote URL."""
    p = urlparse(url)
    if p.scheme == "file":
        if p.netloc not in ("", "localhost"):
            raise FetchError(f"{url}: a file:// URL names a file on this machine (file:///path), not on "
                             f"host {p.netloc!r}")
        return Path(url2pathname(p.path))
    if p.scheme == "" or (len(p.scheme) == 1 and os.name == "nt"):  # a folder; C:\\ on Windows
        return Path(url)
    if p.scheme not in REMOTE_SCHEMES:
        raise FetchError(f"{url}: unsupported protocol {p.scheme!r}; give an http(s):// or ftp:// URL, a "
                         "file:// URL or a folder")
    return None


class _CopyFrom:
    """A pooch downloader that copies a local file (a ``file://`` or folder mirror), at most ``limit`` bytes,
    so that pooch applies the same hash check and cache to it as to a download."""

    def __init__(self, path: Path, limit: int = MAX_ARCHIVE_BYTES):
        self.path, self.limit = path, limit

    def __call__(self, url, output_file, pooch_obj=None, check_only=False):
        if not self.path.is_file():
            raise FetchError(f"{self.path}: no such file in the mirror (expected the source's mirror_path "
                             "under the mirror folder, as in crop/agents/registry.yaml)")
        if check_only:
            return True
        if self.path.stat().st_size > self.limit:
            raise FetchError(f"{self.path}: over the limit of {self.limit} bytes; refusing it")
        out = open(output_file, "wb") if isinstance(output_file, (str, os.PathLike)) else output_file
        try:
            with open(self.path, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
        finally:
            if out is not output_file:
                out.close()
        return None


def _reason(exc: Exception, url: str) -> str:
    """A download error in a few words (requests' messages run to several hundred characters)."""
    text = str(exc)
    host = urlparse(url).hostname
    if any(s in text for s in ("NameResolutionError", "Failed to resolve", "Name or service not known",
                               "Temporary failure in name resolution", "nodename nor servname")):
        return f"cannot resolve the host {host!r} (no network or no DNS)"
    if "Connection refused" in text:
        return f"connection refused by {host!r}"
    if "timed out" in text.lower():
        return f"{host!r} timed out"
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first[:200]}"


def _download(url: str, known_sha256: str | None, fname: str, folder: Path, progress: bool | None,
              mirrored: bool = False) -> Path:
    """``folder/fname`` through pooch: downloaded (or copied from a local mirror) unless a whole one is there
    already, checked against ``known_sha256`` when given (a mismatch keeps no file)."""
    import pooch

    local = local_path(url)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        path = pooch.retrieve(url, known_hash=f"sha256:{known_sha256}" if known_sha256 else None, fname=fname,
                              path=folder, progressbar=bool(progress) and local is None,
                              downloader=_CopyFrom(local) if local is not None else None)
    except FetchError:
        raise
    except ValueError as exc:  # pooch: hash mismatch; the downloaded file is not kept
        raise FetchError(f"{url}: {exc}; refusing it") from None
    except Exception as exc:  # network errors
        where = "check the mirror's URL and that it serves the file" if mirrored else MIRROR_HINT
        raise FetchError(f"{url}: download failed: {_reason(exc, url)}; {where}") from None
    return Path(path)


def _pin(lock_path: Path, original: str, digest: str, url: str) -> None:
    """Pin the first download of an unpinned source in the lock file: read, add, write under the lock file's own
    lock, so that concurrent first downloads of other sources keep their pins.  A pin another process wrote
    meanwhile (another cache) must be this one."""
    with held(lock_path.with_name(lock_path.name + ".lock"), f"pinning {original} in {lock_path.name}"):
        data = _read_lock(lock_path)
        pinned = (data.get(original) or {}).get("sha256")
        if pinned not in (None, digest):
            raise FetchError(f"{url}: sha256 {digest} differs from the {pinned} pinned meanwhile in {lock_path}; "
                             "refusing it")
        if pinned is None:
            data[original] = {"sha256": digest, "fetched_from": url,
                              "pinned_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            atomic_write_text(lock_path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _clear_partial(staging: Path, name: str) -> None:
    """Remove what a fetch that ended without finishing left in the archive's staging folder: pooch's
    half-written temporary files.  A whole download there (``name``: pooch moves it in only once complete) is
    kept, and checked like any other."""
    for f in sorted(staging.iterdir()) if staging.is_dir() else []:
        if f.name != name and f.is_file():
            say(f"{f}: a half-written download of {name} ({f.stat().st_size} bytes) left by a fetch that ended "
                "without finishing; removed")
            f.unlink(missing_ok=True)


def cached_archive(entry: dict, *, mirror: str | None = None, cache=None,
                   lock: str | os.PathLike | None = DEFAULT_LOCK, progress: bool | None = None) -> dict:
    """The verified file of a published source in the cache, downloaded once however many processes ask for it
    at once: ``{"path", "url", "fetched_from", "download_sha256", "pinned_by_lock"}``.

    Under the archive's lock (``CACHE/NAME.lock``, :mod:`crop.agents.cache_lock`), the file ``CACHE/{sha256[:16]}-NAME``
    is used when its sha256 is the pinned one; else it is downloaded into ``CACHE/NAME.partial/``, checked,
    pinned in the lock file where the publisher gives no checksum, and moved into place in one rename.  A cache
    file of another sha256 (half-written, changed) is fetched again, with one line saying so."""
    url = mirror_url(entry, mirror)
    original = entry["url"]
    lock_path = Path(lock) if lock else None
    if entry.get("sha256") is None and lock_path is None:
        raise FetchError(f"{original}: the publisher gives no checksum and no lock file is configured")
    name = PurePosixPath(urlparse(original).path).name or "download"
    cache = cache_dir(cache)
    with held(cache / f"{name}.lock", f"fetching {name}"):
        known, pinned_by_lock = entry.get("sha256"), False
        if known is None:  # read under the lock: a process that held it before may have pinned it
            rec = _read_lock(lock_path).get(original)
            known, pinned_by_lock = (rec["sha256"], True) if rec is not None else (None, False)
        final = cache / f"{known[:16]}-{name}" if known else None
        if final is not None and final.is_file():
            digest = sha256_file(final)
            if digest == known:
                return {"path": final, "url": original, "fetched_from": url, "download_sha256": digest,
                        "pinned_by_lock": pinned_by_lock}
            say(f"{final}: a cache file whose sha256 {digest} is not the pinned {known} (half-written or changed); "
                "fetching it again")
            final.unlink()
        staging = cache / f"{name}.partial"
        _clear_partial(staging, name)
        try:
            path = _download(url, known, name, staging, progress, mirrored=url != original)
            digest = sha256_file(path)
            if known is None:  # first download of an unpinned source: pin it so every later fetch must match
                _pin(lock_path, original, digest, url)
            elif digest != known:  # defence in depth: pooch already checked
                path.unlink(missing_ok=True)
                raise FetchError(f"{url}: sha256 {digest} differs from the pinned {known}; refusing it")
            final = cache / f"{digest[:16]}-{name}"
            os.replace(path, final)
        finally:
            with contextlib.suppress(OSError):   # kept only while it holds a whole download not yet in place
                staging.rmdir()
    return {"path": final, "url": original, "fetched_from": url, "download_sha256": digest,
            "pinned_by_lock": pinned_by_lock or entry.get("sha256") is None}


def fetch_published(entry: dict, dest: Path, *, mirror: str | None = None, cache=None,
                    lock: str | os.PathLike | None = DEFAULT_LOCK, progress: bool | None = None) -> dict:
    """Download (or take from the cache, :func:`cached_archive`) a published checkpoint and write it to ``dest``.

    ``entry``: ``url``, ``sha256`` (of the file, or of the archive when ``member`` is set) or none,
    ``member`` (path inside an archive), ``mirror_path``.  Returns provenance for the checkpoint record.
    ``dest`` is written atomically only after every check passed.
    """
    got = cached_archive(entry, mirror=mirror, cache=cache, lock=lock, progress=progress)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if entry.get("member"):
        extract_member(got["path"], entry["member"], dest)
    else:
        fd, tmp = temp_file(dest)
        with os.fdopen(fd, "wb") as out, open(got["path"], "rb") as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)
        os.replace(tmp, dest)
    return {"url": got["url"], "fetched_from": got["fetched_from"], "download_sha256": got["download_sha256"],
            "pinned_by": "lock file" if got["pinned_by_lock"] else "registry",
            "lock_file": str(Path(lock)) if entry.get("sha256") is None else None,
            "member": entry.get("member")}


def fetch_checkpoint(entry: dict, out: str | os.PathLike, *, mirror: str | None = None, cache=None,
                     lock: str | os.PathLike | None = DEFAULT_LOCK, progress: bool | None = None,
                     evaluate=None) -> dict:
    """Fetch a published checkpoint (registry ``entry``) to ``out``, verified to load safely into its
    architecture before it is put in place; returns the fields of its record model.json, with
    ``clean_greedy_return`` = ``evaluate(net)`` when given.  Raises :class:`crop.io.InputError` (nothing is
    written then)."""
    from crop.io import InputError
    from crop.models import CheckpointError, load_network, non_finite

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file(out)   # a name of its own: two fetches of one output never share it
    os.close(fd)
    tmp = Path(tmp)
    try:
        origin = fetch_published(entry, tmp, mirror=mirror, cache=cache, lock=lock, progress=progress)
        sha = sha256_file(tmp)
        net = load_network(tmp, entry["net_spec"], expected_sha256=sha)  # architecture and safe loading
        bad = non_finite(net)
        if bad:
            raise CheckpointError(f"{entry['url']}: the network's {bad}; refusing it")
        clean = None if evaluate is None else evaluate(net)
        tmp.replace(out)
    except (FetchError, CheckpointError) as exc:
        raise InputError(str(exc)) from None
    finally:
        tmp.unlink(missing_ok=True)
    record = {"net_spec": entry["net_spec"], "profile": entry["profile"], "source": "published", **origin,
              "sha256": sha}
    if clean is not None:
        record["clean_greedy_return"] = clean
    return record


# ------------------------------------------------------------------------------------------ archives

def _check_name(name: str) -> None:
    p = PurePosixPath(name.replace("\\", "/"))
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or p.is_absolute():
        raise ArchiveError(f"archive member {name!r} has an absolute path; refusing the archive")
    if ".." in p.parts:
        raise ArchiveError(f"archive member {name!r} climbs out of the archive ('..'); refusing the archive")
    if "\x00" in name:
        raise ArchiveError(f"archive member {name!r} has a NUL byte; refusing the archive")


def _find(names: list[str], member: str) -> str:
    if member in names:
        return member
    base = PurePosixPath(member).name
    hits = [n for n in names if PurePosixPath(n).name == base]
    if len(hits) != 1:
        raise ArchiveError(f"archive has {len(hits)} members named {base!r} (wanted {member!r})")
    return hits[0]


def _stream(src, dest: Path, limit: int, what: str) -> None:
    fd, tmp = temp_file(dest)
    n = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for block in iter(lambda: src.read(1 << 20), b""):
                n += len(block)
                if n > limit:
                    raise ArchiveError(f"{what} expands beyond the limit of {limit} bytes; refusing it")
                out.write(block)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def extract_member(archive: Path, member: str, dest: Path, max_bytes: int = MAX_MEMBER_BYTES) -> None:
    """Validate the whole archive, then stream one regular member to ``dest`` (atomically)."""
    archive, dest = Path(archive), Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_ARCHIVE_MEMBERS:
                raise ArchiveError(f"{archive}: {len(infos)} members; refusing it")
            total = 0
            for info in infos:
                _check_name(info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise ArchiveError(f"{archive}: member {info.filename!r} is a symbolic link; refusing the archive")
                total += info.file_size
            if total > MAX_ARCHIVE_BYTES:
                raise ArchiveError(f"{archive}: declares {total} uncompressed bytes; refusing it")
            name = _find([i.filename for i in infos if not i.is_dir()], member)
            info = zf.getinfo(name)
            if info.file_size > max_bytes:
                raise ArchiveError(f"{archive}: member {name!r} declares {info.file_size} bytes, over the "
                                   f"limit of {max_bytes}; refusing it")
            with zf.open(info) as src:  # the byte count also stops a member that lies about its size
                _stream(src, dest, max_bytes, f"{archive}: member {name!r}")
        return
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            members = []
            total = 0
            for m in tf:
                if len(members) >= MAX_ARCHIVE_MEMBERS:
                    raise ArchiveError(f"{archive}: too many members; refusing it")
                _check_name(m.name)
                try:  # Python's own "data" filter: links that escape, device files, absolute link targets
                    tarfile.data_filter(m, "/nonexistent-crop-extract-root")
                except tarfile.FilterError as exc:
                    raise ArchiveError(
                        f"{archive}: member {m.name!r} is unsafe ({exc}); refusing the archive") from None
                total += m.size
                members.append(m)
            if total > MAX_ARCHIVE_BYTES:
                raise ArchiveError(f"{archive}: declares {total} uncompressed bytes; refusing it")
            name = _find([m.name for m in members if m.isreg()], member)
            m = tf.getmember(name)
            if m.size > max_bytes:
                raise ArchiveError(f"{archive}: member {name!r} has {m.size} bytes, over the limit of "
                                   f"{max_bytes}; refusing it")
            src = tf.extractfile(m)
            _stream(src, dest, max_bytes, f"{archive}: member {name!r}")
        return
    raise ArchiveError(f"{archive} is neither a zip nor a tar archive")


# ------------------------------------------------------------------------------------- clean return

def clean_greedy_return(net, env: str, profile: str | None, episodes: int, seed: int = 0,
                        target: float | None = None) -> dict:
    """The clean greedy return of a checkpoint that was not trained here (fetched or imported), as trained
    checkpoints record it in ``model.json``: argmax_a Q(s, a), no noise, from the acceptance test's reset seeds
    (``derive_seed(seed, "accept-eval", i)``), an episode cut at the environment's ``eval_max_steps``.
    Nothing is retrained, so ``target`` (the trained policies' threshold) is reported, not enforced."""
    from crop.io import derive_seed
    from crop.progress import pbar
    from crop.train.defaults import ENV_DQN_DEFAULTS
    from crop.train.dqn import greedy_returns

    max_steps = ENV_DQN_DEFAULTS.get(env, {}).get("eval_max_steps")
    seeds = [derive_seed(seed, "accept-eval", i) for i in range(episodes)]
    t0 = time.process_time()
    # an Atari episode takes minutes: progress per episode, in the log too
    rets = greedy_returns(net, env, pbar(seeds, desc=f"greedy return {env}", unit="episode"), profile, max_steps)
    return {"mean": float(rets.mean()), "std": float(rets.std()), "min": float(rets.min()), "episodes": len(rets),
            "max_steps": max_steps, "meets_target_return": None if target is None else bool(rets.mean() >= target),
            "cpu_s": round(time.process_time() - t0, 2)}
