"""Where a policy's checkpoint comes from: trained here, derived from another checkpoint, or fetched; one
function per `crop` subcommand, each writing model.pt and its record model.json (sha256, architecture,
source, clean greedy return, provenance).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from crop.handlers.stages import recorded_settings, setup
from crop.io import InputError, json_object

__all__ = ["cmd_train", "cmd_derive", "cmd_fetch", "cmd_import", "cmd_checkpoint"]


def _source(args, prefer: str, kind: str | None = None, refusal: str = "") -> dict:
    """The registry entry (with its ``kind``) for (env, algo) under ``prefer``; InputError ``refusal`` unless
    it is of ``kind`` (a derived one must name its base).  ``--file`` (source: file) is the policy file."""
    from crop.agents.registry import resolve_source

    files = {args.algo: {"path": args.file}} if getattr(args, "file", None) else None
    try:
        found, src = resolve_source(args.env, args.algo, prefer, *([files] if files else []))
    except KeyError as exc:
        raise InputError(exc.args[0]) from None
    if kind and (found != kind or (kind == "derive" and "base" not in src)):
        raise InputError(f"{args.env}/{args.algo} {refusal} (source: {found})")
    return {"kind": found, **src}


def _train_settings(args) -> dict:
    """The schema's train-block defaults ← ``--settings`` JSON ← explicit flags."""
    from crop.workflow.config import target_return, train_defaults

    settings = {**train_defaults(), **json_object(args.settings, "a config's train block")}
    settings.update({k: getattr(args, k) for k in ("hidden", "total_steps", "min_steps", "eval_episodes")
                     if getattr(args, k, None) is not None})
    if hasattr(args, "target_return"):   # explicit: a number, or none = no threshold
        settings["target_return"] = args.target_return
    else:
        settings["target_return"] = target_return(args.env, settings.get("target_return"))
    return settings


def _save_policy(args, net, record: dict, stage: str, device: str, started: float, inputs=None) -> None:
    from crop.io import provenance, sha256_file, write_json
    from crop.models import save_network

    out = Path(args.out)
    save_network(net, out)
    record.update(env=args.env, algo=args.algo, sha256=sha256_file(out),
                  provenance=provenance(stage, recorded_settings(args), seed=args.seed, device=device, started=started,
                                        inputs=inputs))
    write_json(out.with_suffix(".json"), record)


def cmd_train(args) -> None:
    """Train a policy.  Its state is saved to OUT.resume every --checkpoint-every seconds and on SIGTERM (exit
    status 143), and the same command resumes from it; it is deleted once model.pt and model.json are written,
    or when training fails its acceptance test (a final result as well)."""
    from crop.train import prepare_training, train_policy
    from crop.train.defaults import CHECKPOINT_EVERY
    from crop.train.dqn import TrainingFailed
    from crop.train.resume import ResumeOptions

    started, src = setup(args), _source(args, "train", "train", "is not trained locally")
    recipe, settings = src.get("recipe", args.algo), _train_settings(args)
    settings["recipe"] = (settings.pop("recipes", None) or {}).get(args.algo, {})
    try:
        prepare_training(args.env, recipe, settings)   # every check before any work
    except ValueError as exc:
        raise InputError(f"{args.env}/{args.algo}: {exc}") from None
    resume = Path(args.out).with_name(Path(args.out).name + ".resume")
    every = getattr(args, "checkpoint_every", None) or CHECKPOINT_EVERY
    try:
        net, info = train_policy(args.env, recipe, args.seed, settings, profile=src.get("profile"),
                                 progress=args.progress, resume=ResumeOptions(resume, every))
    except TrainingFailed:
        resume.unlink(missing_ok=True)
        raise
    record = {"net_spec": info["net_spec"], "profile": src.get("profile"), "source": "train", "recipe": recipe,
              "hyperparameters": info["hyperparameters"], "training": info, "clean_greedy_return": info["acceptance"]}
    _save_policy(args, net, record, "train", info["device"], started)
    resume.unlink(missing_ok=True)  # only now: a kill before model.pt and model.json are written resumes from it
    print(f"trained {args.env}/{args.algo}: greedy return {info['acceptance']['mean']:.1f} over "
          f"{info['acceptance']['episodes']} episodes after {info['steps']} steps "
          f"({info['cpu_s']:.0f} s CPU); sha256 {record['sha256']}")


def _acceptance(args, net, episodes: int, profile, target) -> tuple[dict, float]:
    """The clean greedy return of a derived policy and the CPU seconds it took; nothing can be retrained, so
    the trained policies' threshold is reported, not enforced."""
    from crop.io import derive_seed
    from crop.train.dqn import greedy_returns

    t0 = time.process_time()
    rets = greedy_returns(net, args.env, [derive_seed(args.seed, "accept-eval", i) for i in range(episodes)], profile)
    accept = {"step": 0, "mean": float(rets.mean()), "std": float(rets.std()), "min": float(rets.min()),
              "episodes": len(rets)}
    accept["meets_target_return"] = None if target is None else bool(accept["mean"] >= target)
    return accept, round(time.process_time() - t0, 2)


def _derivation(args, src: dict, settings: dict):
    """(recipe, hyper-parameters) of a derived policy: the registry's values ← the config's recipe overrides;
    every check before any work."""
    from crop.train import prepare_training

    overrides = {k: src[k] for k in ("eps", "norm", "method") if k in src}       # the registry's values
    overrides.update((settings.pop("recipes", None) or {}).get(args.algo, {}))   # ← the config's
    try:
        _, recipe, hp = prepare_training(args.env, src.get("recipe", args.algo), {"recipe": overrides})
    except ValueError as exc:
        raise InputError(f"{args.env}/{args.algo}: {exc}") from None
    return recipe, hp


def cmd_derive(args) -> None:
    """A policy built from another algorithm's checkpoint without training (CARRL from StdTrain)."""
    from crop.io import sha256_file
    from crop.models import load_checkpoint

    started = setup(args)
    src = _source(args, getattr(args, "source", "auto"), "derive", "is not derived from another checkpoint")
    if not args.base_checkpoint:
        raise InputError(f"{args.env}/{args.algo} is derived from {src['base']}: give --base-checkpoint")
    settings, base = _train_settings(args), Path(args.base_checkpoint)
    recipe, hp = _derivation(args, src, settings)
    base_net, meta = load_checkpoint(base, args.env, src["base"],
                                     f" ({args.algo} on {args.env} is derived from {args.env}/{src['base']})")
    if meta["net_spec"].get("arch") != "mlp" or meta.get("network", "q") != "q":
        raise InputError(f"{base}: {args.algo} needs an MLP Q-network as its base, got {meta['net_spec']} "
                         f"({meta.get('network', 'q')} network)")
    net, spec = recipe.derive(base_net, meta["net_spec"], hp)
    target = settings.get("target_return")
    accept, cpu_s = _acceptance(args, net, settings["eval_episodes"], meta.get("profile"), target)
    record = {"net_spec": spec, "profile": meta.get("profile"), "source": "derive", "recipe": recipe.name,
              "hyperparameters": hp, "base": {"algo": src["base"], "path": str(base), "sha256": meta["sha256"]},
              "clean_greedy_return": accept, "evaluation_cpu_s": cpu_s}
    _save_policy(args, net, record, "derive", "cpu", started,
                 inputs={"base_checkpoint": {"path": str(base), "sha256": sha256_file(base)}})
    note = "" if accept["meets_target_return"] in (None, True) else f" (below the target return {target})"
    print(f"derived {args.env}/{args.algo} from {src['base']}: greedy return {accept['mean']:.1f} over "
          f"{accept['episodes']} episodes{note}; sha256 {record['sha256']}")


def cmd_fetch(args) -> None:
    """Download a published checkpoint (pinned sha256, mirror, lock file), check that it loads into its
    architecture, then write model.pt and its record model.json (with its clean greedy return)."""
    from crop.agents.checkpoints import DEFAULT_LOCK, clean_greedy_return, fetch_checkpoint
    from crop.io import provenance, write_json

    if getattr(args, "configfile", None):
        return _fill_cache(args)
    missing = [f"--{k}" for k in ("env", "algo", "out") if getattr(args, k) is None]
    if missing:
        raise InputError(f"give {', '.join(missing)} (or --configfile FILE: every checkpoint a config fetches, "
                         "into the cache)")
    args.lock = args.lock or DEFAULT_LOCK
    started = setup(args)
    src = _source(args, "published", "published", "has no published checkpoint")
    episodes, target = _eval_settings(args)
    record = fetch_checkpoint(src, args.out, mirror=args.mirror, cache=args.cache, lock=args.lock,
                              progress=args.progress,
                              evaluate=lambda net: clean_greedy_return(net, args.env, src["profile"], episodes,
                                                                       args.seed, target))
    record = {"env": args.env, "algo": args.algo, **record,
              "provenance": provenance("fetch", recorded_settings(args), seed=args.seed, device="cpu",
                                       started=started)}
    write_json(Path(args.out).with_suffix(".json"), record)
    clean = record["clean_greedy_return"]
    print(f"fetched {args.env}/{args.algo} from {record['fetched_from']}"
          f"{' member ' + record['member'] if record.get('member') else ''}: greedy return {clean['mean']:.1f} "
          f"over {clean['episodes']} episodes; sha256 {record['sha256']}")


def _fill_cache(args) -> None:
    """Every published checkpoint the workflow config ``--configfile`` fetches, into the cache once each (its
    checkpoints block's mirror, cache and lock unless given as flags): run on a login node, it leaves the
    compute nodes nothing to download."""
    from crop.agents.checkpoints import FetchError, cached_archive
    from crop.agents.registry import checkpoint_source
    from crop.workflow.config import ConfigError, load_config

    if any(getattr(args, k) is not None for k in ("env", "algo", "out")):
        raise InputError("--configfile fetches every checkpoint of the config: give it without --env, --algo, --out")
    try:
        cfg = load_config(args.configfile)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    c = cfg["checkpoints"]
    mirror, cache, lock = args.mirror or c["mirror"], args.cache or c["cache"], args.lock or c["lock"]
    archives: dict[str, tuple[dict, list[str]]] = {}   # url: (entry, the env/algo it holds)
    for env, ec in cfg["environments"].items():
        algos = list(ec["algorithms"])
        algos += [s["base"] for a in ec["algorithms"]
                  if (s := checkpoint_source(env, a, ec["source"], ec.get("files")))["kind"] == "derive"]
        for algo in dict.fromkeys(algos):
            src = checkpoint_source(env, algo, ec["source"], ec.get("files"))
            if src["kind"] == "published":
                archives.setdefault(src["url"], (src, []))[1].append(f"{env}/{algo}")
    if not archives:
        print(f"{args.configfile}: no checkpoint of this config is published (each is trained, derived or your own "
              "file): nothing to fetch")
        return
    for entry, names in archives.values():
        try:
            got = cached_archive(entry, mirror=mirror, cache=cache, lock=lock, progress=args.progress)
        except FetchError as exc:
            raise InputError(str(exc)) from None
        print(f"cached {got['path']} (sha256 {got['download_sha256']}, pinned by "
              f"{'lock file ' + str(lock) if got['pinned_by_lock'] else 'registry'}) for {', '.join(names)}")
    print(f"{len(archives)} archive(s) in the cache for {sum(len(n) for _, n in archives.values())} checkpoint(s) "
          f"of {args.configfile}")


def _eval_settings(args) -> tuple[int, float | None]:
    """Episodes and target of the clean greedy return of a fetched or imported checkpoint: under the workflow
    (`crop checkpoint`) the config's train block, as for a trained policy; on its own --eval-episodes, else
    EVAL_EPISODES_ALONE; the environment's threshold."""
    if hasattr(args, "settings"):
        settings = _train_settings(args)
        return settings["eval_episodes"], settings.get("target_return")
    from crop.train.defaults import EVAL_EPISODES_ALONE
    from crop.workflow.config import target_return

    return args.eval_episodes or EVAL_EPISODES_ALONE, target_return(args.env, None)


def cmd_import(args) -> None:
    """Your own policy: import a state dict (PyTorch, CleanRL DQN or PPO, Stable-Baselines3 DQN, PPO or A2C zip)
    into model.pt and its record model.json (sha256 of the source and of the result, architecture, profile,
    ``network``: ``q`` or ``policy``, clean greedy return)."""
    from crop.agents.checkpoints import clean_greedy_return
    from crop.agents.importing import check_policy_file
    from crop.envs import default_profile, profiles
    from crop.models import CheckpointError, spec_summary

    started = setup(args)
    if not args.file:
        raise InputError("give --file, the policy file to import (docs/own-policy.md)")
    profile = args.profile or default_profile(args.env)
    try:
        from crop.envs import check_profile

        check_profile(args.env, profile)
    except ValueError:
        raise InputError(f"--profile {profile!r} is not a preprocessing profile of {args.env}; known: "
                         f"{profiles(args.env)}") from None
    episodes, target = _eval_settings(args)
    try:  # what the config's validation checks too, before anything runs or is written
        net, info = check_policy_file(args.file, args.arch, args.format, args.file_sha256, args.env, profile)
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    clean = clean_greedy_return(net, args.env, profile, episodes, args.seed, target)
    if not math.isfinite(clean["mean"]):
        raise InputError(f"{args.file}: {_non_finite_return(net, args.env, profile, clean)}; refusing it")
    spec, network = info.pop("net_spec"), info.pop("network")
    record = {"net_spec": spec, "network": network, "profile": profile, "source": "file", "imported_from": info,
              "clean_greedy_return": clean}
    _save_policy(args, net, record, "import", "cpu", started,
                 inputs={"file": {"path": info["path"], "sha256": info["sha256"]}})
    print(f"imported {args.env}/{args.algo} from {args.file} ({info['format']}, {network} network, "
          f"{spec_summary(spec)}, profile "
          f"{profile}): greedy return {clean['mean']:.1f} over {clean['episodes']} episodes; sha256 "
          f"{record['sha256']}")


def _non_finite_return(net, env: str, profile: str | None, clean: dict) -> str:
    """Why an imported network's clean greedy return is NaN or inf, in words: its outputs on a first
    observation of ``env`` are not finite (then its largest weight, the usual cause, is named), else the
    episodes' rewards or observations are not.  A return that is not a number certifies nothing, and every
    certifier would stop on the same outputs later, so the import refuses it now."""
    import torch

    from crop.envs import make_env, to_obs
    from crop.names import network_name

    e = make_env(env, profile)
    try:
        obs, _ = e.reset(seed=0)
    finally:
        e.close()
    with torch.no_grad():
        finite = bool(torch.isfinite(net(torch.as_tensor(to_obs(obs)).unsqueeze(0))).all())
    weights = [float(w.abs().max()) for w in net.state_dict().values() if w.is_floating_point() and w.numel()]
    why = (f"its outputs are not finite (weights of magnitude up to {max(weights, default=0.0):.0e})" if not finite
           else "its outputs are finite on a first observation; the episodes' rewards or observations are not")
    return (f"the imported {network_name(net)}'s greedy return is {clean['mean']} over {clean['episodes']} "
            f"episodes: {why}")


def cmd_checkpoint(args) -> None:
    """Obtain a policy's checkpoint from the source the config selects (train here, fetch, derive or import)."""
    kind = _source(args, args.source)["kind"]
    {"published": cmd_fetch, "train": cmd_train, "derive": cmd_derive, "file": cmd_import}[kind](args)
