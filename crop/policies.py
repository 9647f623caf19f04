"""Where a policy's checkpoint comes from: trained here, derived from another checkpoint, or fetched; one
function per `crop` subcommand, each writing model.pt and its record model.json (sha256, architecture,
source, clean greedy return, provenance).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from crop.io import InputError
from crop.stages import recorded_settings, setup

__all__ = ["cmd_train", "cmd_derive", "cmd_fetch", "cmd_checkpoint"]


def _source(args, prefer: str, kind: str | None = None, refusal: str = "") -> dict:
    """The registry entry (with its ``kind``) for (env, algo) under ``prefer``; InputError ``refusal`` unless
    it is of ``kind`` (a derived one must name its base)."""
    from crop.registry import resolve_source

    try:
        found, src = resolve_source(args.env, args.algo, prefer)
    except KeyError as exc:
        raise InputError(exc.args[0]) from None
    if kind and (found != kind or (kind == "derive" and "base" not in src)):
        raise InputError(f"{args.env}/{args.algo} {refusal} (source: {found})")
    return {"kind": found, **src}


def _train_settings(args) -> dict:
    """The schema's train-block defaults ← ``--settings`` JSON ← explicit flags."""
    from crop.config import target_return, train_defaults

    settings = {**train_defaults(), **json_object(args.settings, "a config's train block")}
    settings.update({k: getattr(args, k) for k in ("hidden", "total_steps", "min_steps", "eval_episodes")
                     if getattr(args, k, None) is not None})
    if hasattr(args, "target_return"):   # explicit: a number, or none = no threshold
        settings["target_return"] = args.target_return
    else:
        settings["target_return"] = target_return(args.env, settings.get("target_return"))
    return settings


def json_object(text: str | None, what: str) -> dict:
    if not text:
        return {}
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--settings is not valid JSON: {exc}") from None
    if not isinstance(given, dict):
        raise InputError(f"--settings must be a JSON object ({what})")
    return given


def _save_policy(args, net, record: dict, stage: str, device: str, started: float, inputs=None) -> None:
    from crop.io import provenance, sha256_file, write_json
    from crop.models import save_q_network

    out = Path(args.out)
    save_q_network(net, out)
    record.update(env=args.env, algo=args.algo, sha256=sha256_file(out),
                  provenance=provenance(stage, recorded_settings(args), seed=args.seed, device=device, started=started,
                                        inputs=inputs))
    write_json(out.with_suffix(".json"), record)


def cmd_train(args) -> None:
    from crop.train import prepare_training, train_policy

    started, src = setup(args), _source(args, "train", "train", "is not trained locally")
    recipe, settings = src.get("recipe", args.algo), _train_settings(args)
    settings["recipe"] = (settings.pop("recipes", None) or {}).get(args.algo, {})
    try:
        prepare_training(args.env, recipe, settings)   # every check before any work
    except ValueError as exc:
        raise InputError(f"{args.env}/{args.algo}: {exc}") from None
    net, info = train_policy(args.env, recipe, args.seed, settings, profile=src.get("profile"),
                             progress=args.progress)
    record = {"net_spec": info["net_spec"], "profile": src.get("profile"), "source": "train", "recipe": recipe,
              "hyperparameters": info["hyperparameters"], "training": info, "clean_greedy_return": info["acceptance"]}
    _save_policy(args, net, record, "train", info["device"], started)
    print(f"trained {args.env}/{args.algo}: greedy return {info['acceptance']['mean']:.1f} over "
          f"{info['acceptance']['episodes']} episodes after {info['steps']} steps "
          f"({info['cpu_s']:.0f} s CPU); sha256 {record['sha256']}")


def _acceptance(args, net, episodes: int, profile, target) -> tuple[dict, float]:
    """The clean greedy return of a derived policy and the CPU seconds it took; nothing can be retrained, so
    the trained policies' threshold is reported, not enforced."""
    from crop.io import derive_seed
    from crop.train import greedy_returns

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
    if meta["net_spec"].get("arch") != "mlp":
        raise InputError(f"{base}: {args.algo} needs an MLP base network, got {meta['net_spec']}")
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
    architecture, then write model.pt and its record model.json."""
    from crop.checkpoints import fetch_checkpoint
    from crop.io import provenance, write_json

    started = setup(args)
    src = _source(args, "published", "published", "has no published checkpoint")
    record = fetch_checkpoint(src, args.out, mirror=args.mirror, cache=args.cache, lock=args.lock,
                              progress=args.progress)
    record = {"env": args.env, "algo": args.algo, **record,
              "provenance": provenance("fetch", recorded_settings(args), seed=None, device="cpu", started=started)}
    write_json(Path(args.out).with_suffix(".json"), record)
    print(f"fetched {args.env}/{args.algo} from {record['fetched_from']}"
          f"{' member ' + record['member'] if record.get('member') else ''}: sha256 {record['sha256']}")


def cmd_checkpoint(args) -> None:
    """Obtain a policy's checkpoint from the source the config selects (train here, fetch or derive)."""
    kind = _source(args, args.source)["kind"]
    {"published": cmd_fetch, "train": cmd_train, "derive": cmd_derive}[kind](args)


