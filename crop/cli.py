"""The ``crop`` command: one subcommand per workflow rule.

Each subcommand parses its arguments, checks them before doing any work, calls one function of the
package, and writes its outputs atomically with a provenance file beside each.  Exit status 2 means bad
input (config, checkpoint, arguments); nothing is written then.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]


class InputError(Exception):
    """Bad input detected before any work: reported as one line, exit status 2."""


def _positive_float(text: str) -> float:
    v = float(text)
    if not v > 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def _alpha(text: str) -> float:
    v = float(text)
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return v


def _nonneg_float(text: str) -> float:
    v = float(text)
    if not v >= 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def _pos_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return v


def _env(text: str) -> str:
    from crop.envs import ENV_SPECS

    if text not in ENV_SPECS:
        raise argparse.ArgumentTypeError(f"unknown environment {text!r}; known: {sorted(ENV_SPECS)}")
    return text


def _algo(text: str) -> str:
    from crop.config import ALGORITHMS

    if text not in ALGORITHMS:
        raise argparse.ArgumentTypeError(f"unknown algorithm {text!r}; known: {ALGORITHMS}")
    return text


def _common(p: argparse.ArgumentParser, sigma: bool = True, checkpoint: bool = True) -> None:
    p.add_argument("--env", type=_env, required=True)
    p.add_argument("--algo", type=_algo, required=True)
    if sigma:
        p.add_argument("--sigma", type=_positive_float, required=True)
    if checkpoint:
        p.add_argument("--checkpoint", required=True, help="model.pt (its model.json must sit beside it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--threads", type=_pos_int, default=1)
    p.add_argument("--chunk", type=_pos_int, default=1000)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars (default: only on a terminal)")


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--settings", default=None,
                   help="the config's train block as JSON (hidden, total_steps, …, dqn, recipes)")
    p.add_argument("--hidden", type=_pos_int, nargs="+", default=None)
    p.add_argument("--total-steps", type=_pos_int, default=None)
    p.add_argument("--min-steps", type=int, default=None)
    p.add_argument("--eval-episodes", type=_pos_int, default=None)
    p.add_argument("--target-return", type=_return_or_none, default=argparse.SUPPRESS,
                   help="acceptance threshold of the greedy mean return (default: the environment's, e.g. "
                        "195 for CartPole-v0; 'none': no threshold, record the return only)")
    p.add_argument("--base-checkpoint", default=None,
                   help="derived algorithms (CARRL): the base algorithm's model.pt (model.json beside it)")


def _fetch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mirror", default=None,
                   help="mirror: base URL, file:// URL or folder (default: $CROP_CHECKPOINT_MIRROR)")
    p.add_argument("--cache", default=None, help="download cache (default: $CROP_CACHE or user cache)")
    p.add_argument("--lock", default="checkpoints.lock.json",
                   help="lock file pinning first downloads of sources published without a checksum")


def _import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--file", default=None, help="your policy file: a PyTorch state dict, a CleanRL checkpoint "
                                                "or a Stable-Baselines3 DQN .zip (docs/own-policy.md)")
    p.add_argument("--arch", default="mlp",
                   help='its architecture: a network spec as JSON ({"arch": "mlp", "in": 4, "hidden": [64, 64], '
                        '"out": 2}; nature_cnn, dueling_cnn) or mlp, sizes read from the weights (default)')
    p.add_argument("--profile", default=None,
                   help="the preprocessing profile it was trained with (crop/envs PROFILES; default: the env's)")
    p.add_argument("--format", default="auto", choices=["auto", "torch", "cleanrl", "sb3"],
                   help="file format (auto: an SB3 zip by its policy.pth, CleanRL by .cleanrl_model)")
    p.add_argument("--file-sha256", default=None, help="refuse the file unless it has this sha256")


# The names of crop.smoothing.BOUNDS (kept here so that building the parser does not import torch).
BOUND_NAMES = ["hoeffding", "empirical_bernstein", "betting", "clopper_pearson"]


def _certifier_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--qrange", required=True, help="qrange.json of the same env/algo/sigma")
    p.add_argument("--m", type=_pos_int, default=10000)
    p.add_argument("--alpha", type=_alpha, default=0.05)
    p.add_argument("--bound", default="hoeffding", choices=BOUND_NAMES,
                   help="confidence bound for the smoothed Q-values (hoeffding: the paper's)")
    p.add_argument("--alpha-mode", default="state", choices=["state", "family"],
                   help="state: each state holds w.p. >= 1-alpha (the paper); family: alpha is split so that a "
                        "whole episode (alpha/H per state) or LoRe tree (alpha*6/(pi^2 i^2)) holds jointly")


def _state_alpha(args, horizon: int) -> float:
    """Per-state α of LoAct / local-attack episodes of ≤ ``horizon`` states under ``--alpha-mode``."""
    from crop.stats import loact_state_alpha

    return loact_state_alpha(args.alpha, args.alpha_mode, horizon)


def _setup(args) -> float:
    import torch

    torch.set_num_threads(args.threads)
    return time.time()


def _load_policy(args):
    """Verify the checkpoint against its recorded sha256 and architecture, then load it."""
    return _load_checkpoint(args.checkpoint, args.env, args.algo)


def _load_checkpoint(path, env: str, algo: str, why: str = ""):
    """``path`` (model.pt) verified against its record model.json — for ``env``/``algo``, its sha256 and
    architecture — then loaded; ``why`` is added to a mismatch's message."""
    from crop.io import read_json
    from crop.models import CheckpointError, load_q_network

    ckpt = Path(path)
    meta_file = ckpt.with_suffix(".json")
    if not ckpt.is_file():
        raise InputError(f"{ckpt}: no such checkpoint file; give a model.pt written by `crop checkpoint`, "
                         "`crop fetch` or `crop import` (your own policy: `crop import`)")
    if not meta_file.is_file():
        raise InputError(f"{ckpt}: no checkpoint record {meta_file.name} beside it (sha256 and architecture); "
                         f"import your own policy with `crop import --file {ckpt} …` (docs/own-policy.md)")
    meta = read_json(meta_file)
    for key in ("sha256", "net_spec", "env", "algo"):
        if key not in meta:
            raise InputError(f"{meta_file}: missing field {key!r}")
    if meta["env"] != env or meta["algo"] != algo:
        raise InputError(f"{ckpt}: recorded for {meta['env']}/{meta['algo']}, not {env}/{algo}{why}")
    try:
        net = load_q_network(ckpt, meta["net_spec"], expected_sha256=meta["sha256"])
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    return net, meta


def _load_qrange(path: str, args) -> tuple[float, float]:
    from crop.io import read_json

    q = read_json(path)
    if q.get("env") != args.env or q.get("algo") != args.algo or not math.isclose(q.get("sigma", -1), args.sigma):
        raise InputError(f"{path}: Q range was estimated for {q.get('env')}/{q.get('algo')}/σ={q.get('sigma')}, "
                         f"not {args.env}/{args.algo}/σ={args.sigma}")
    v_min, v_max = q.get("v_min"), q.get("v_max")
    if not (isinstance(v_min, (int, float)) and isinstance(v_max, (int, float)) and v_max > v_min):
        raise InputError(f"{path}: invalid Q range [{v_min}, {v_max}]")
    return float(v_min), float(v_max)


def _episode_seeds(seed: int, env: str, n: int, kind: str = "episode") -> list[int]:
    """Initial-state seeds shared by every algorithm and σ, so their numbers compare like for like."""
    from crop.io import derive_seed

    return [derive_seed(seed, env, kind, i) % (2**31) for i in range(n)]


def _stage_seed(args, stage: str) -> int:
    from crop.io import derive_seed

    return derive_seed(args.seed, args.env, args.algo, repr(float(args.sigma)), stage)


def _smoother(args, net, meta, v_min, v_max, stage: str, alpha: float | None = None):
    from crop.models import n_actions
    from crop.smoothing import SmoothedQ

    alpha = args.alpha if alpha is None else alpha
    # The action count is the checkpoint's (SA-DQN's Pong networks use 4 of the 6 actions).
    return SmoothedQ(net, args.sigma, args.m, v_min, v_max, alpha, n_actions(meta["net_spec"]),
                     bound=args.bound, chunk=args.chunk, seed=_stage_seed(args, stage), device=args.device)


def _settings(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("func", "progress")}


def _inputs(args, *names) -> dict:
    from crop.io import sha256_file

    return {n: {"path": str(getattr(args, n)), "sha256": sha256_file(getattr(args, n))} for n in names}


# ----------------------------------------------------------------------------------------------- commands

def _return_or_none(text: str) -> float | None:
    if text.lower() in ("none", "null"):
        return None
    v = float(text)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number or 'none', got {text}")
    return v


def _train_settings(args) -> dict:
    """The schema's train-block defaults ← ``--settings`` JSON ← explicit flags."""
    import json

    from crop.config import target_return, train_defaults

    settings = train_defaults()
    if args.settings:
        try:
            given = json.loads(args.settings)
        except json.JSONDecodeError as exc:
            raise InputError(f"--settings is not valid JSON: {exc}") from None
        if not isinstance(given, dict):
            raise InputError("--settings must be a JSON object (a config's train block)")
        settings.update(given)
    for key in ("hidden", "total_steps", "min_steps", "eval_episodes"):
        if getattr(args, key, None) is not None:
            settings[key] = getattr(args, key)
    if getattr(args, "target_return", "unset") != "unset":
        settings["target_return"] = args.target_return   # explicit: a number, or none = no threshold
    else:
        settings["target_return"] = target_return(args.env, settings.get("target_return"))
    return settings


def cmd_train(args) -> None:
    from crop.io import provenance, sha256_file, write_json
    from crop.models import save_q_network
    from crop.registry import resolve_source
    from crop.train import prepare_training, train_policy

    started = _setup(args)
    try:
        kind, src = resolve_source(args.env, args.algo, "train")
    except KeyError as exc:
        raise InputError(exc.args[0]) from None
    if kind != "train":
        raise InputError(f"{args.env}/{args.algo} is not trained locally (source: {kind})")
    recipe = src.get("recipe", args.algo)
    settings = _train_settings(args)
    settings["recipe"] = (settings.pop("recipes", None) or {}).get(args.algo, {})
    try:
        prepare_training(args.env, recipe, settings)   # every check before any work
    except ValueError as exc:
        raise InputError(f"{args.env}/{args.algo}: {exc}") from None
    net, info = train_policy(args.env, recipe, args.seed, settings, profile=src.get("profile"),
                             progress=args.progress)
    out = Path(args.out)
    save_q_network(net, out)
    record = {"env": args.env, "algo": args.algo, "net_spec": info["net_spec"], "profile": src.get("profile"),
              "source": "train", "recipe": recipe, "hyperparameters": info["hyperparameters"],
              "sha256": sha256_file(out), "training": info, "clean_greedy_return": info["acceptance"],
              "provenance": provenance("train", _settings(args), seed=args.seed, device=info["device"],
                                        started=started)}
    write_json(out.with_suffix(".json"), record)
    print(f"trained {args.env}/{args.algo}: greedy return {info['acceptance']['mean']:.1f} over "
          f"{info['acceptance']['episodes']} episodes after {info['steps']} steps "
          f"({info['cpu_s']:.0f} s CPU); sha256 {record['sha256']}")


def cmd_derive(args) -> None:
    """A policy built from another algorithm's checkpoint without training (CARRL from StdTrain)."""
    from crop.io import derive_seed, provenance, sha256_file, write_json
    from crop.models import save_q_network
    from crop.registry import resolve_source
    from crop.train import greedy_returns, prepare_training

    started = _setup(args)
    try:
        kind, src = resolve_source(args.env, args.algo, getattr(args, "source", "auto"))
    except KeyError as exc:
        raise InputError(exc.args[0]) from None
    if kind != "derive" or "base" not in src:
        raise InputError(f"{args.env}/{args.algo} is not derived from another checkpoint (source: {kind})")
    if not args.base_checkpoint:
        raise InputError(f"{args.env}/{args.algo} is derived from {src['base']}: give --base-checkpoint")
    settings = _train_settings(args)
    overrides = {k: src[k] for k in ("eps", "norm", "method") if k in src}       # the registry's values
    overrides.update((settings.pop("recipes", None) or {}).get(args.algo, {}))   # ← the config's
    try:
        _, recipe, hp = prepare_training(args.env, src.get("recipe", args.algo), {"recipe": overrides})
    except ValueError as exc:
        raise InputError(f"{args.env}/{args.algo}: {exc}") from None
    base = Path(args.base_checkpoint)
    base_net, meta = _load_checkpoint(base, args.env, src["base"],
                                      f" ({args.algo} on {args.env} is derived from {args.env}/{src['base']})")
    if meta["net_spec"].get("arch") != "mlp":
        raise InputError(f"{base}: {args.algo} needs an MLP base network, got {meta['net_spec']}")
    net, spec = recipe.derive(base_net, meta["net_spec"], hp)
    seeds = [derive_seed(args.seed, "accept-eval", i) for i in range(settings["eval_episodes"])]
    t0 = time.process_time()
    rets = greedy_returns(net, args.env, seeds, meta.get("profile"))
    accept = {"step": 0, "mean": float(rets.mean()), "std": float(rets.std()), "min": float(rets.min()),
              "episodes": len(rets)}
    # Nothing can be retrained here, so the trained policies' threshold is reported, not enforced.
    target = settings.get("target_return")
    accept["meets_target_return"] = None if target is None else bool(accept["mean"] >= target)
    out = Path(args.out)
    save_q_network(net, out)
    record = {"env": args.env, "algo": args.algo, "net_spec": spec, "profile": meta.get("profile"),
              "source": "derive", "recipe": recipe.name, "hyperparameters": hp,
              "base": {"algo": src["base"], "path": str(base), "sha256": meta["sha256"]},
              "sha256": sha256_file(out), "clean_greedy_return": accept,
              "evaluation_cpu_s": round(time.process_time() - t0, 2),
              "provenance": provenance("derive", _settings(args), seed=args.seed, device="cpu", started=started,
                                       inputs={"base_checkpoint": {"path": str(base),
                                                                   "sha256": sha256_file(base)}})}
    write_json(out.with_suffix(".json"), record)
    note = "" if accept["meets_target_return"] in (None, True) else f" (below the target return {target})"
    print(f"derived {args.env}/{args.algo} from {src['base']}: greedy return {accept['mean']:.1f} over "
          f"{len(rets)} episodes{note}; sha256 {record['sha256']}")


def cmd_fetch(args) -> None:
    """Download a published checkpoint (pinned sha256, mirror, lock file), check that it loads into its
    architecture, then write model.pt and its record model.json."""
    from crop.checkpoints import FetchError, clean_greedy_return, fetch_published
    from crop.io import provenance, sha256_file, write_json
    from crop.models import CheckpointError, load_q_network
    from crop.registry import resolve_source

    started = _setup(args)
    try:
        kind, src = resolve_source(args.env, args.algo, "published")
    except KeyError as exc:
        raise InputError(exc.args[0]) from None
    if kind != "published":
        raise InputError(f"{args.env}/{args.algo} has no published checkpoint (source: {kind})")
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.fetching")
    try:
        origin = fetch_published(src, tmp, mirror=args.mirror, cache=args.cache, lock=args.lock,
                                 progress=args.progress)
        sha = sha256_file(tmp)
        net = load_q_network(tmp, src["net_spec"], expected_sha256=sha)  # architecture and safe loading
        episodes, target = _eval_settings(args)
        clean = clean_greedy_return(net, args.env, src["profile"], episodes, args.seed, target)
        tmp.replace(out)
    except (FetchError, CheckpointError) as exc:
        raise InputError(str(exc)) from None
    finally:
        tmp.unlink(missing_ok=True)
    record = {"env": args.env, "algo": args.algo, "net_spec": src["net_spec"], "profile": src["profile"],
              "source": "published", **origin, "sha256": sha, "clean_greedy_return": clean,
              "provenance": provenance("fetch", _settings(args), seed=args.seed, device="cpu", started=started)}
    write_json(out.with_suffix(".json"), record)
    print(f"fetched {args.env}/{args.algo} from {origin['fetched_from']}"
          f"{' member ' + origin['member'] if origin.get('member') else ''}: greedy return {clean['mean']:.1f} "
          f"over {clean['episodes']} episodes; sha256 {sha}")


def _eval_settings(args) -> tuple[int, float | None]:
    """Episodes and target of the clean greedy return of a fetched or imported checkpoint: under the workflow
    (`crop checkpoint`) the config's train block, as for a trained policy; on its own --eval-episodes, else
    EVAL_EPISODES_ALONE; the environment's threshold."""
    if hasattr(args, "settings"):
        settings = _train_settings(args)
        return settings["eval_episodes"], settings.get("target_return")
    from crop.config import target_return

    return args.eval_episodes or EVAL_EPISODES_ALONE, target_return(args.env, None)


# Episodes of the clean greedy return of `crop fetch` / `crop import` run by hand (a highway episode takes
# about 1.5 s on one core); the workflow uses the config's train.eval_episodes.
EVAL_EPISODES_ALONE = 10


def cmd_import(args) -> None:
    """Your own policy: import a state dict (PyTorch, CleanRL, Stable-Baselines3 DQN zip) into model.pt and its
    record model.json (sha256 of the source and of the result, architecture, profile, clean greedy return)."""
    from crop.checkpoints import clean_greedy_return
    from crop.envs import PROFILES, env_spec
    from crop.importing import import_policy
    from crop.io import provenance, sha256_file, write_json
    from crop.models import CheckpointError, save_q_network, spec_summary

    started = _setup(args)
    if not args.file:
        raise InputError("give --file, the policy file to import (docs/own-policy.md)")
    profile = args.profile or env_spec(args.env).profile
    if profile not in PROFILES.get(args.env, []):
        raise InputError(f"--profile {profile!r} is not a preprocessing profile of {args.env}; known: "
                         f"{PROFILES.get(args.env, [])}")
    episodes, target = _eval_settings(args)
    try:
        net, info = import_policy(args.file, args.arch, args.format, args.file_sha256)
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    clean = clean_greedy_return(net, args.env, profile, episodes, args.seed, target)
    out = Path(args.out)
    save_q_network(net, out)
    spec = info.pop("net_spec")
    record = {"env": args.env, "algo": args.algo, "net_spec": spec, "profile": profile, "source": "file",
              "imported_from": info, "sha256": sha256_file(out), "clean_greedy_return": clean,
              "provenance": provenance("import", _settings(args), seed=args.seed, device="cpu", started=started,
                                       inputs={"file": {"path": info["path"], "sha256": info["sha256"]}})}
    write_json(out.with_suffix(".json"), record)
    print(f"imported {args.env}/{args.algo} from {args.file} ({info['format']}, {spec_summary(spec)}, profile "
          f"{profile}): greedy return {clean['mean']:.1f} over {clean['episodes']} episodes; sha256 "
          f"{record['sha256']}")


def cmd_checkpoint(args) -> None:
    """Obtain a policy's checkpoint from the source the config selects (train here, fetch, derive or import)."""
    from crop.registry import resolve_source

    files = {args.algo: {"path": args.file}} if getattr(args, "file", None) else None
    try:
        kind, _ = resolve_source(args.env, args.algo, args.source, files)
    except KeyError as exc:
        raise InputError(exc.args[0]) from None
    {"published": cmd_fetch, "train": cmd_train, "derive": cmd_derive, "file": cmd_import}[kind](args)


def cmd_qrange(args) -> None:
    from crop.io import provenance, write_json
    from crop.qrange import estimate_qrange

    if args.method == "quantile" and not args.quantile < 0.5:
        raise InputError(f"--quantile must be in (0, 0.5), got {args.quantile}")
    started = _setup(args)
    net, meta = _load_policy(args)
    res = estimate_qrange(args.env, net, args.sigma, args.m, args.episodes, args.horizon,
                          _episode_seeds(args.seed, args.env, args.episodes, "qrange-episode"),
                          seed=_stage_seed(args, "qrange"), chunk=args.chunk, device=args.device,
                          profile=meta.get("profile"), progress=args.progress, method=args.method,
                          quantile=args.quantile)
    out = {"env": args.env, "algo": args.algo, "sigma": args.sigma, **res,
           "checkpoint_sha256": meta["sha256"],
           "provenance": provenance("qrange", _settings(args), seed=_stage_seed(args, "qrange"),
                                    inputs=_inputs(args, "checkpoint"), device=args.device, started=started)}
    write_json(args.out, out)
    print(f"qrange {args.env}/{args.algo} σ={args.sigma}: [{res['v_min']:.6g}, {res['v_max']:.6g}] "
          f"({args.method}) from {res['states']} states × {args.m} samples")


def cmd_loact(args) -> None:
    from crop.io import provenance, write_csv, write_with_meta
    from crop.loact import certified_ratio, run_loact

    started = _setup(args)
    net, meta = _load_policy(args)
    v_min, v_max = _load_qrange(args.qrange, args)
    sm = _smoother(args, net, meta, v_min, v_max, "loact", alpha=_state_alpha(args, args.horizon))
    frames: list = []
    steps, episodes = run_loact(args.env, sm, args.episodes, args.horizon,
                                _episode_seeds(args.seed, args.env, args.episodes), profile=meta.get("profile"),
                                progress=args.progress, frames=frames, frames_window=tuple(args.frames_window))
    r_grid = args.sigma * np.linspace(0.0, 4.0, 81)
    ratio = certified_ratio(steps, r_grid)
    prov = provenance("loact", _settings(args), seed=_stage_seed(args, "loact"),
                      inputs=_inputs(args, "checkpoint", "qrange"), device=str(sm.device), started=started)
    longest = int(episodes["steps"].max())
    prov.update({"v_min": v_min, "v_max": v_max, "states_certified": int(len(steps)),
                 "alpha_mode": args.alpha_mode, "per_state_alpha": sm.alpha, "per_bound_alpha": sm.alpha_each,
                 "confidence": {"per_state": 1 - sm.alpha,
                                "per_episode": max(0.0, 1 - sm.alpha * longest),
                                "rule": "union bound: the 2|A| one-sided bounds of a state each at per_bound_alpha; "
                                        f"an episode of <= {longest} states at per_state_alpha each"},
                 "note": "radius is 0 at uncertified steps and counts in every mean"})
    write_with_meta(args.out, lambda p: write_csv(p, steps), prov, rows=len(steps))
    write_with_meta(args.out_episodes, lambda p: write_csv(p, episodes), prov, rows=len(episodes))
    write_with_meta(args.out_ratio, lambda p: write_csv(p, ratio), prov, rows=len(ratio))
    write_with_meta(args.out_frames, lambda p: _write_frames(p, frames, args.env), prov, rows=len(frames))
    print(f"LoAct {args.env}/{args.algo} σ={args.sigma}: {steps['certified'].mean():.1%} of {len(steps)} steps "
          f"certified, mean radius {steps['radius'].mean():.4g} (uncertified = 0), "
          f"benign return {episodes['return'].mean():.1f} ± {episodes['return'].std(ddof=0):.1f}")


def _write_frames(path, frames, env: str) -> None:
    """Raw game frames of LoAct episode 0 (Atari only; empty for vector observations)."""
    import io

    from crop.io import atomic_write_bytes

    buf = io.BytesIO()
    if frames:
        arr = np.stack([f for _, f in frames]).astype(np.uint8)
        st = np.array([t for t, _ in frames], dtype=np.int64)
    else:
        arr, st = np.zeros((0, 0, 0, 3), np.uint8), np.zeros(0, np.int64)
    np.savez_compressed(buf, frames=arr, steps=st, env=np.array(env))
    atomic_write_bytes(path, buf.getvalue())


def cmd_gre(args) -> None:
    import pandas as pd

    from crop.envs import env_spec
    from crop.gre import gre_bounds, sample_randomized_returns
    from crop.io import derive_seed, provenance, write_csv, write_with_meta

    started = _setup(args)
    net, meta = _load_policy(args)
    returns = sample_randomized_returns(args.env, net, args.sigma, args.m, args.horizon, args.gamma,
                                        seed=_stage_seed(args, "gre"),
                                        env_seed=derive_seed(args.seed, args.env, "gre-initial-states") % 2**31,
                                        chunk=max(args.chunk, 1), device=args.device,
                                        profile=meta.get("profile"), progress=args.progress,
                                        workers=args.workers or args.threads,
                                        batch=args.batch)
    j_min, j_max = env_spec(args.env).return_range(args.horizon, args.gamma)
    table = gre_bounds(returns, sigma=args.sigma, horizon=args.horizon, alpha=args.alpha,
                       eps_grid=[f * args.sigma for f in args.eps_factors], percentiles=args.percentiles,
                       j_min=j_min, j_max=j_max)
    prov = provenance("gre", _settings(args), seed=_stage_seed(args, "gre"), inputs=_inputs(args, "checkpoint"),
                      device=args.device, started=started)
    prov.update({"j_min": j_min, "j_max": j_max,
                 "note": "each bound (expectation_bound, cdf_expectation_bound, percentile_bound) holds with "
                         "probability >= 1 - alpha; empty percentile_bound = no k qualifies"})
    write_with_meta(args.out, lambda p: write_csv(p, table), prov, rows=len(table))
    write_with_meta(args.out_returns, lambda p: write_csv(p, pd.DataFrame({"return": returns})), prov,
                    rows=len(returns))
    print(f"GRe {args.env}/{args.algo} σ={args.sigma}: {args.m} randomized returns, mean {returns.mean():.2f}, "
          f"median {np.median(returns):.1f}")


def cmd_lore(args) -> None:
    from crop.envs import env_spec
    from crop.io import provenance, write_csv, write_with_meta
    from crop.lore import run_lore
    from crop.stats import lore_schedule_text, lore_state_alpha

    started = _setup(args)
    net, meta = _load_policy(args)
    v_min, v_max = _load_qrange(args.qrange, args)
    sm = _smoother(args, net, meta, v_min, v_max, "lore")
    spec = env_spec(args.env)
    eps_max = math.inf if args.eps_max_factor is None else args.eps_max_factor * args.sigma
    # Appendix E: negative rewards count as 0 in LoRe (named in the output); pruning needs rewards ≥ 0.
    reward_fn = spec.lore_reward_fn()
    alpha_of = None if args.alpha_mode == "state" else (lambda i: lore_state_alpha(args.alpha, "family", i))
    table, info = run_lore(args.env, sm, args.horizon, _episode_seeds(args.seed, args.env, 1)[0],
                           gamma=args.gamma, eps_max=eps_max,
                           prune=spec.nonnegative_rewards or reward_fn is not None,
                           profile=meta.get("profile"), progress=args.progress, reward_fn=reward_fn,
                           resume_file=Path(args.out).with_name(Path(args.out).name + ".resume"),
                           checkpoint_every=args.checkpoint_every, alpha_of=alpha_of)
    info["reward_modification"] = spec.lore_reward
    prov = provenance("lore", _settings(args), seed=_stage_seed(args, "lore"),
                      inputs=_inputs(args, "checkpoint", "qrange"), device=str(sm.device), started=started)
    prov.update({"v_min": v_min, "v_max": v_max, "search": info,
                 "alpha_mode": args.alpha_mode,
                 "per_state_alpha_schedule": lore_schedule_text(args.alpha, args.alpha_mode),
                 "confidence": {"per_state_lowest": 1 - (info["per_state_alpha_first"] or args.alpha),
                                "tree": info["confidence_tree"],
                                "rule": "union bound over the distinct states smoothed (search.alpha_spent = "
                                        "sum of their per-state alphas; each state's 2|A| bounds at alpha_i/(2|A|))"},
                 "initial_state": "the initial state of LoAct episode 0"})
    write_with_meta(args.out, lambda p: write_csv(p, table), prov, rows=len(table))
    print(f"LoRe {args.env}/{args.algo} σ={args.sigma}: {len(table)} critical radii, "
          f"{info['distinct_states_smoothed']} states smoothed, {info['nodes_per_s']} nodes/s, "
          f"bound at ε=0: {table['lower_bound'].iloc[0]}")


def cmd_attack_local(args) -> None:
    from crop.attack import run_local_attack
    from crop.envs import env_spec
    from crop.io import provenance, write_csv, write_with_meta

    started = _setup(args)
    net, meta = _load_policy(args)
    v_min, v_max = _load_qrange(args.qrange, args)
    sm = _smoother(args, net, meta, v_min, v_max, "attack-local", alpha=_state_alpha(args, args.horizon))
    spec = env_spec(args.env)
    # Returns over LoRe's horizon with LoRe's reward modification, so the two compare like for like.
    table = run_local_attack(args.env, sm, [f * args.sigma for f in args.eps_factors],
                             _episode_seeds(args.seed, args.env, args.episodes), args.horizon,
                             steps=args.pgd_steps, m_grad=args.m_grad, seed=_stage_seed(args, "attack-local-pgd"),
                             gamma=args.gamma, profile=meta.get("profile"), progress=args.progress,
                             reward_fn=spec.lore_reward_fn())
    table["same_start_as_lore"] = table["episode"] == 0
    prov = provenance("attack_local", _settings(args), seed=_stage_seed(args, "attack-local"),
                      inputs=_inputs(args, "checkpoint", "qrange"), device=str(sm.device), started=started)
    prov["reward_modification"] = spec.lore_reward
    prov.update({"alpha_mode": args.alpha_mode, "per_state_alpha": sm.alpha,
                 "confidence": {"per_state": 1 - sm.alpha, "per_episode": max(0.0, 1 - sm.alpha * args.horizon)}})
    write_with_meta(args.out, lambda p: write_csv(p, table), prov, rows=len(table))
    print(f"local PGD {args.env}/{args.algo} σ={args.sigma}: min return per ε "
          f"{table.groupby('eps')['return'].min().round(2).to_dict()}")


def cmd_attack_global(args) -> None:
    from crop.attack import run_global_attack
    from crop.io import provenance, write_csv, write_with_meta

    started = _setup(args)
    net, meta = _load_policy(args)
    table = run_global_attack(args.env, net, args.sigma, [f * args.sigma for f in args.eps_factors],
                              _episode_seeds(args.seed, args.env, args.episodes, "global-attack-episode"),
                              args.horizon, steps=args.pgd_steps, n_eot=args.n_eot, gamma=args.gamma,
                              seed=_stage_seed(args, "attack-global"), device=args.device,
                              profile=meta.get("profile"), progress=args.progress)
    prov = provenance("attack_global", _settings(args), seed=_stage_seed(args, "attack-global"),
                      inputs=_inputs(args, "checkpoint"), device=args.device, started=started)
    write_with_meta(args.out, lambda p: write_csv(p, table), prov, rows=len(table))
    print(f"global PGD {args.env}/{args.algo} σ={args.sigma}: median return per ε "
          f"{table.groupby('eps')['return'].median().round(2).to_dict()}")


def _runs_from_inputs(files) -> tuple[Path, list[str]]:
    """The results root and ENV/ALGO/sigma-S run folders that a list of run files lives in."""
    dirs = sorted({Path(f).parent for f in files})
    roots = {d.parents[2] for d in dirs}
    if len(roots) != 1 or not all(d.name.startswith("sigma-") for d in dirs):
        raise InputError(f"inputs do not lie in RESULTS/ENV/ALGO/sigma-S folders of one results folder: {dirs[:3]}")
    root = roots.pop()
    return root, [str(d.relative_to(root)) for d in dirs]


def _results_and_runs(args) -> tuple[Path, list[str] | None]:
    if args.inputs:
        return _runs_from_inputs(args.inputs)
    args.results = args.results or getattr(args, "results_opt", None)
    if not args.results:
        raise InputError("give a results folder or --inputs")
    if not Path(args.results).is_dir():
        raise InputError(f"{args.results}: no such results folder")
    return Path(args.results), args.runs


def cmd_aggregate(args) -> None:
    from crop.report.aggregate import aggregate
    from crop.report.audit import discover_runs

    results, runs = _results_and_runs(args)
    if not runs:
        from crop.layout import RUN_FILES

        incomplete = discover_runs(results, incomplete=True)
        if incomplete:  # name what is missing rather than silently dropping runs
            missing = {r: sorted(f for f in RUN_FILES.values() if not (results / r / f).is_file()) for r in incomplete}
            raise InputError("incomplete runs under " + str(results) + ": "
                             + "; ".join(f"{r}: {', '.join(m)}: missing" for r, m in missing.items()))
        runs = discover_runs(results)
    if not runs:
        raise InputError(f"no complete runs to aggregate under {results}")
    figures = Path(args.figures) if args.figures else results / "figures"
    tables = Path(args.tables) if args.tables else results / "tables"
    from crop.report.integrity import IntegrityError

    try:
        written = aggregate(results, runs, table_eps_factors=args.table_eps_factors, figures_dir=figures,
                            tables_dir=tables)
    except (FileNotFoundError, IntegrityError) as exc:
        raise InputError(str(exc)) from None
    print(f"aggregate: wrote {len(written)} files for {len(runs)} runs to {figures} and {tables}")


def cmd_audit(args) -> None:
    from crop.report.audit import audit
    from crop.report.reference import ReferenceError

    results, runs = _results_and_runs(args)
    chash = args.config_hash
    if args.config:
        from crop.config import ConfigError, load_config
        from crop.report.provenance import config_hash

        try:
            h = config_hash(load_config(args.config))
        except ConfigError as exc:
            raise InputError(str(exc)) from None
        if chash and chash != h:
            raise InputError(f"--config-hash {chash} is not the hash of {args.config} ({h})")
        chash = h
    out_dir = Path(args.out_dir) if args.out_dir else results / "audit"
    try:
        report = audit(results, out_dir=out_dir, runs=runs, alpha=args.alpha, reference=args.reference,
                       tolerances=args.tolerances, abs_tol=args.abs_tol, rel_tol=args.rel_tol,
                       config_hash=chash, strict=args.strict)
    except ReferenceError as exc:
        raise InputError(str(exc)) from None
    ref = report["reference"]
    print(f"audit of {results}: {len(report['runs'])} runs, {report['checked']} soundness checks, "
          f"{report['violations']} violations, {report['integrity_problems']} integrity problems"
          + (f", reference {ref['counts']['match']} match / {ref['counts']['differs']} differ / "
             f"{ref['counts']['missing']} missing" if ref else "")
          + f" -> {'PASS' if report['passed'] else 'FAIL'} ({out_dir / 'audit.md'})")
    for v in report["violation_list"][:20]:
        print(f"  violation: {v['env']}/{v['algo']}/sigma={v['sigma']} eps={v['eps']}: {v['check']} "
              f"bound {v['bound']} observed {v['observed']}")
    for p in report["integrity"][:20]:
        print(f"  integrity: {p['file']}: {p['problem']}")
    for r in (ref["comparisons"] if ref else []):
        if r["verdict"] == "differs":
            print(f"  differs: {r['env']}/{r['algo']}/sigma={r['sigma']} {r['metric']} eps={r['eps']}: "
                  f"reproduced {r['reproduced']} vs reference {r['reference']} (allowed ±{r['allowed']})")
    if args.strict and not report["passed"]:
        sys.exit(1)


def cmd_validate(args) -> None:
    from crop.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    print(f"{args.config}: valid ({sum(len(e['algorithms']) * len(e['sigmas']) for e in cfg['environments'].values())}"
          " certification targets)")


# ----------------------------------------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="crop", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a policy locally (Double DQN and its variants)")
    _common(p, sigma=False, checkpoint=False)
    _train_args(p)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("derive", help="derive a policy from another algorithm's checkpoint (CARRL)")
    _common(p, sigma=False, checkpoint=False)
    _train_args(p)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_derive)

    p = sub.add_parser("fetch", help="download a published checkpoint (sha256-pinned)")
    _common(p, sigma=False, checkpoint=False)
    _fetch_args(p)
    p.add_argument("--eval-episodes", type=_pos_int, default=None,
                   help="episodes of the clean greedy return recorded in model.json (default: 10)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser("checkpoint",
                       help="obtain a checkpoint from the configured source (train, fetch, derive or import)")
    _common(p, sigma=False, checkpoint=False)
    p.add_argument("--source", choices=["auto", "train", "published", "file"], default="auto")
    _train_args(p)
    _fetch_args(p)
    _import_args(p)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_checkpoint)

    p = sub.add_parser("import", help="import your own policy (PyTorch, CleanRL or SB3 DQN file) as a checkpoint",
                       description="Import a Q-network trained elsewhere into model.pt and its record model.json "
                                   "(sha256 of the file and of the result, architecture, preprocessing profile, "
                                   "clean greedy return), so that every certifier accepts it.")
    _common(p, sigma=False, checkpoint=False)
    _import_args(p)
    p.add_argument("--eval-episodes", type=_pos_int, default=None,
                   help="episodes of the clean greedy return recorded in model.json (default: 10)")
    p.add_argument("--out", required=True, help="model.pt to write (model.json beside it)")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("qrange", help="estimate V_min, V_max (Appendix B.1)")
    _common(p)
    p.add_argument("--m", type=_pos_int, default=10000)
    p.add_argument("--episodes", type=_pos_int, default=3)
    p.add_argument("--horizon", type=_pos_int, default=200)
    p.add_argument("--method", default="smoothed", choices=["smoothed", "samples", "quantile"],
                   help="smoothed: min/max of the smoothed Q over actions and visited states (the paper's); "
                        "samples: of every single noisy output; quantile: of per-state q / 1-q quantiles")
    p.add_argument("--quantile", type=_positive_float, default=0.01,
                   help="q of --method quantile (0 < q < 0.5)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_qrange)

    p = sub.add_parser("loact", help="LoAct: per-state certified radii (Algorithm 1)")
    _common(p)
    _certifier_args(p)
    p.add_argument("--episodes", type=_pos_int, default=10)
    p.add_argument("--horizon", type=_pos_int, default=200)
    p.add_argument("--out", required=True)
    p.add_argument("--out-episodes", required=True)
    p.add_argument("--out-ratio", required=True)
    p.add_argument("--out-frames", required=True, help="frames.npz: raw frames of episode 0 (Atari)")
    p.add_argument("--frames-window", type=int, nargs=2, default=[0, 200], metavar=("START", "END"),
                   help="steps of episode 0 whose raw frames are kept (Atari)")
    p.set_defaults(func=cmd_loact)

    p = sub.add_parser("gre", help="GRe: expectation and percentile bounds (Algorithm 2)")
    _common(p)
    p.add_argument("--m", type=_pos_int, default=10000)
    p.add_argument("--alpha", type=_alpha, default=0.05)
    p.add_argument("--horizon", type=_pos_int, default=200)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--percentiles", type=float, nargs="+", default=[0.5])
    p.add_argument("--eps-factors", type=float, nargs="+", required=True)
    p.add_argument("--batch", type=_pos_int, default=None,
                   help="trajectories stepped together (bounds the memory of the environment copies; "
                        "default: all m)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes stepping the environments (default: --threads; CartPole is vectorised)")
    p.add_argument("--out", required=True)
    p.add_argument("--out-returns", required=True)
    p.set_defaults(func=cmd_gre)

    p = sub.add_parser("lore", help="LoRe: adaptive search for the absolute reward bound (Algorithm 3)")
    _common(p)
    _certifier_args(p)
    p.add_argument("--horizon", type=_pos_int, default=10)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--eps-max-factor", type=_positive_float, default=None)
    p.add_argument("--checkpoint-every", type=float, default=60.0,
                   help="seconds between saves of the resumable search state (OUT.resume)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_lore)

    p = sub.add_parser("attack-local", help="PGD against the locally smoothed policy")
    _common(p)
    _certifier_args(p)
    p.add_argument("--episodes", type=_pos_int, default=5)
    p.add_argument("--horizon", type=_pos_int, default=10)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--m-grad", type=_pos_int, default=256)
    p.add_argument("--pgd-steps", type=_pos_int, default=10)
    p.add_argument("--eps-factors", type=float, nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_attack_local)

    p = sub.add_parser("attack-global", help="PGD against the σ-randomized policy")
    _common(p)
    p.add_argument("--episodes", type=_pos_int, default=20)
    p.add_argument("--horizon", type=_pos_int, default=200)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--n-eot", type=_pos_int, default=32)
    p.add_argument("--pgd-steps", type=_pos_int, default=10)
    p.add_argument("--eps-factors", type=float, nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_attack_global)

    p = sub.add_parser("aggregate", help="tables and figures named as in the paper")
    p.add_argument("results", nargs="?", help="results folder (every complete run in it, or --runs)")
    p.add_argument("--results", dest="results_opt", help=argparse.SUPPRESS)
    p.add_argument("--runs", nargs="+", help="only these ENV/ALGO/sigma-S folders under RESULTS")
    p.add_argument("--inputs", nargs="+", help="the run files themselves (instead of RESULTS)")
    p.add_argument("--table-eps-factors", type=float, nargs="+", default=[0.0, 0.05, 0.1],
                   help="ε, as multiples of σ, of the reward-bound tables")
    p.add_argument("--figures", help="figures folder (default RESULTS/figures)")
    p.add_argument("--tables", help="tables folder (default RESULTS/tables)")
    p.set_defaults(func=cmd_aggregate)

    p = sub.add_parser("audit", help="soundness, integrity, provenance and reference audit of a results folder",
                       description="Audit a results folder; writes OUT_DIR/audit.md and OUT_DIR/audit.json. "
                                   "Exit status: 0 done (or passed, with --strict), 1 --strict and the audit "
                                   "failed (a violation, an integrity problem or a reference value outside "
                                   "tolerance), 2 bad input.")
    p.add_argument("results", nargs="?", help="results folder (every run folder in it is audited)")
    p.add_argument("--out-dir", help="where audit.md and audit.json go (default RESULTS/audit)")
    p.add_argument("--runs", nargs="*", default=None, help="only these ENV/ALGO/sigma-S folders")
    p.add_argument("--inputs", nargs="+", help="the run files themselves (instead of RESULTS)")
    p.add_argument("--alpha", type=_alpha, default=0.05,
                   help="significance level of the tests of GRe bounds against attacked returns")
    p.add_argument("--reference", help="reference CSV: env,algo,sigma,metric,eps,value (see README)")
    p.add_argument("--tolerances", help="YAML/JSON per-metric tolerances {metric|default: {abs, rel}}")
    p.add_argument("--abs-tol", type=_nonneg_float, default=None, help="absolute tolerance for every metric (overrides)")
    p.add_argument("--rel-tol", type=_nonneg_float, default=None, help="relative tolerance for every metric (overrides)")
    p.add_argument("--config-hash", help="hash of the workflow config the results came from (the workflow "
                                         "passes it)")
    p.add_argument("--config", help="workflow config file: validated and hashed (instead of --config-hash)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on any soundness violation, integrity problem or reference value outside "
                        "tolerance (reference values missing from the results do not fail)")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("validate-config", help="check a workflow config against the schema")
    p.add_argument("config")
    p.set_defaults(func=cmd_validate)
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except InputError as exc:
        print(f"crop {args.command}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:  # FloatingPointError (NaN Q), CheckpointError, TrainingFailed, …
        from crop.io import OutputError
        from crop.models import CheckpointError

        if isinstance(exc, OutputError):  # full disk, read-only folder: one line, nothing half-written
            print(f"crop {args.command}: error: {exc.strerror}", file=sys.stderr)
            sys.exit(1)
        from crop.smoothing import NonFiniteQError
        from crop.train.dqn import TrainingFailed

        if isinstance(exc, (NonFiniteQError, CheckpointError, TrainingFailed)):
            print(f"crop {args.command}: error: {exc}", file=sys.stderr)
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
