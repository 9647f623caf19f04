"""The policy files of a config, opened and checked as their checkpoint jobs will open them, before any job;
a passed check is remembered by the sha256 of the file's bytes."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
from pathlib import Path

from crop.agents.registry import resolve_source
from crop.io import sha256_file
from crop.names import ACTION_TARGET, smoothing_targets
from crop.schema import ConfigError

__all__ = ["check_policy_files"]


def _policy_checks_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "crop" / "policy-checks"


def _policy_check_key(path, arch, fmt, sha256, env, profile) -> str | None:
    """What a policy file's check depends on, hashed: the sha256 of the file's bytes, every setting of the
    check and crop's version.  None (no memo) when the path is not a regular file within the size limit: the
    check itself then says what is wrong."""
    from crop import __version__
    from crop.agents.checkpoints import MAX_MEMBER_BYTES

    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MEMBER_BYTES:
        return None
    try:
        digest = sha256_file(path)
    except OSError:
        return None
    facts = {"file_sha256": digest, "architecture": arch, "format": fmt, "pinned_sha256": sha256, "env": env,
             "profile": profile, "crop": __version__}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _checked_network(key: str | None) -> str | None:
    """The network kind ("q" or "policy") a passed check of the same bytes and settings found, or None."""
    if key is None:
        return None
    try:
        kind = (_policy_checks_dir() / key).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return kind if kind in ("q", "policy") else None


def _remember_check(key: str, kind: str) -> None:
    """Remember a passed check (best effort: an unwritable cache only means checking again next time)."""
    folder = _policy_checks_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}"
        tmp.write_text(kind)
        os.replace(tmp, folder / key)
    except OSError:
        pass


def check_policy_files(cfg: dict, source: str = "config") -> dict:
    """Open and check every ``files.<label>`` entry of a validated config as its checkpoint job will
    (:func:`crop.agents.importing.check_policy_file`: a regular, readable file within the size limit, its pinned
    sha256, tensors only, finite real weights that fit the architecture, a network that takes the
    environment's observations and gives one value per action), then judge each environment's smoothing
    targets by what its networks are: a policy network has no Q-values (no q target), softmax of a
    Q-network's values is no policy (no probs target).  An environment that gives neither ``target`` nor
    ``targets`` smooths q for Q-networks and probs for policy networks (filled in as ``target: probs``).

    Returns the config (a copy where a target was filled in); raises :class:`ConfigError` in one line naming
    the entry.  Reads the files (torch is imported only when a config has one).  The workflow parses this
    config in its main process and again in every job's (each SLURM job's too): a check that passed is
    remembered under ``$XDG_CACHE_HOME/crop/policy-checks/``, keyed by the sha256 of the file's bytes, the
    check's settings and crop's version (:func:`_policy_check_key`), so the same bytes are checked once, and
    a changed file, setting or release is checked afresh.  (The checkpoint job's ``crop import`` checks the
    file again whatever the memo holds.)"""
    out = None
    for env, ec in cfg["environments"].items():
        if ec["source"] != "file" or not ec.get("files"):
            continue
        from crop.envs import default_profile

        networks = {}
        for label, f in ec["files"].items():
            check = (f["path"], f["architecture"], f["format"], f["sha256"], env,
                     f.get("profile") or default_profile(env))
            key = _policy_check_key(*check)
            networks[label] = _checked_network(key)
            if networks[label] is None:
                from crop.agents.importing import check_policy_file  # torch: only when a file is checked
                from crop.models import CheckpointError

                try:
                    _, info = check_policy_file(*check)
                except CheckpointError as exc:
                    raise ConfigError(f"{source}: environments.{env}.files.{label}: {exc}") from None
                networks[label] = info["network"]
                if key is not None and _policy_check_key(*check) == key:   # the file did not change meanwhile
                    _remember_check(key, info["network"])
        # A derived policy (CARRL) is a Q-network built from its base's file, which must be one.
        for algo in ec["algorithms"]:
            kind, entry = resolve_source(env, algo, "file", ec["files"])
            if kind == "derive":
                if networks.get(entry["base"]) == "policy":
                    raise ConfigError(f"{source}: environments.{env}.files.{entry['base']}: {algo} is derived from "
                                      f"{entry['base']}'s Q-network, but {ec['files'][entry['base']]['path']} holds a "
                                      "policy network")
                networks[algo] = "q"
        used = {a: networks[a] for a in ec["algorithms"]}

        for algo, network in used.items():   # a Box environment takes actors, a Discrete one none
            if (network == "actor") != (ec.get("target") == ACTION_TARGET):
                what = ("a continuous-action actor" if network == "actor" else f"a discrete-action {network} network")
                held = ec["files"].get(algo, {}).get("path", f"{algo} (derived)")
                kind = "discrete" if network == "actor" else "continuous (a Box)"
                raise ConfigError(f"{source}: environments.{env}.files.{algo}: {held} holds {what}, but {env}'s "
                                  f"actions are {kind}")
        if "target" in ec or "targets" in ec:
            key = "targets" if "targets" in ec else "target"
            for algo, network in used.items():
                wrong = "q" if network == "policy" else "probs"
                if wrong in smoothing_targets(ec):
                    why = ("has no Q-values to smooth; use probs or vote" if network == "policy" else
                           "is a Q-network: softmax of its values is no policy; use vote or q")
                    raise ConfigError(f"{source}: environments.{env}.{key}: {wrong} for {algo}, which {why}")
            continue
        kinds = sorted(set(used.values()))
        if kinds == ["policy"]:
            out = out or copy.deepcopy(cfg)
            out["environments"][env]["target"] = "probs"
        elif len(kinds) > 1:
            policy = sorted(a for a, n in used.items() if n == "policy")
            q = sorted(a for a, n in used.items() if n == "q")
            raise ConfigError(f"{source}: environments.{env}: {', '.join(policy)} policy network(s) and "
                              f"{', '.join(q)} Q-network(s) have no smoothing target in common by default (probs, "
                              "q); give target: vote (any network), or certify them with separate configs")
    return out or cfg
