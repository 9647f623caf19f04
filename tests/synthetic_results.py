"""A small, sound results folder in the workflow's file formats, for tests of the report and the audit (and a
real tiny run folder, each stage run by the CLI: :func:`tiny_real_run`).

Numbers are drawn at random but obey what the certifiers guarantee: bounds fall with ε, every attacked
return is at or above its bound, no certified step flips.  Tests then plant violations, mismatches and
tampering with :func:`rewrite_csv` (which keeps the provenance hash consistent, as a real rerun would) or by
editing files directly (which the integrity check must catch).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm

from crop.certify.gre import gre_bounds
from crop.envs import env_spec
from crop.io import provenance, read_json, write_csv, write_json, write_with_meta
from crop.workflow.layout import FRAMES_FILE, RUN_FILES, checkpoint_path, needs_frames, run_dir

from networks import random_mlp

EPISODES = 3
HORIZON = 30
GRE_FACTORS = (0.0, 0.05, 0.1, 0.2)
LOCAL_FACTORS = (0.0, 0.5, 1.0, 2.0)
GLOBAL_FACTORS = (0.0, 0.05, 0.1, 0.2)
GLOBAL_EPISODES = 12
GRE_M = 2000            # GRe's randomized returns: enough for bounds as tight as the attacks here test
V_MIN, V_MAX = 0.0, 10.0
M_ATTACK = 10_000       # the local attack's Monte-Carlo samples per state (recorded in its settings)
ALPHA_STATE = 1e-3      # per-state miscoverage of LoAct's and the local attack's certificates
LORE_ALPHA_SPENT = 1e-3  # the α LoRe's search spent
P_TOP_LOWER = 0.6       # normalised L(a1) of every synthetic LoAct step
LOCAL_HORIZON = 6       # the local attack's planned horizon
LORE_FAR = 10.0         # LoRe's radius (in σ) of every action other than a₁ at the states the attack visits


def digest(d: Path, t: int, episode: int = 0) -> str:
    """A stand-in for the digest of the observation at step t of a local-attack episode of run folder d."""
    return hashlib.blake2b(f"{d}/{episode}/{t}".encode(), digest_size=16).hexdigest()


def _meta(stage, sha, seed, runtime=0.5, **settings):
    m = provenance(stage, {"stage": stage, **settings}, seed=seed,
                   inputs={"checkpoint": {"path": "model.pt", "sha256": sha}},
                   device="cpu")
    m["runtime_s"] = runtime
    return m


def make_checkpoint(root: Path, env: str, algo: str) -> str:
    ck = checkpoint_path(root, env, algo)
    ck.parent.mkdir(parents=True, exist_ok=True)
    payload = f"weights of {env}/{algo}".encode()
    ck.write_bytes(payload)
    sha = hashlib.sha256(payload).hexdigest()
    write_json(ck.with_suffix(".json"), {"env": env, "algo": algo, "sha256": sha, "source": "train",
                                         "recipe": "dqn", "profile": env_spec(env).profile,
                                         "net_spec": {"arch": "mlp", "out": env_spec(env).n_actions},
                                         "provenance": {"git_commit": "abc"}})
    return sha


def make_run(root: Path, env: str, algo: str, sigma: float, sha: str, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    spec = env_spec(env)
    lab = repr(float(sigma))
    d = run_dir(root, env, algo, lab)
    d.mkdir(parents=True, exist_ok=True)
    write_json(d / RUN_FILES["qrange"], {"env": env, "algo": algo, "sigma": sigma, "v_min": V_MIN, "v_max": V_MAX,
                                   "checkpoint_sha256": sha,
                                   "provenance": _meta("qrange", sha, seed, 0.1)})
    # LoAct: a periodic radius pattern, some steps uncertified; episodes of different lengths.
    rows = []
    for e in range(EPISODES):
        for t in range(HORIZON - e):
            certified = bool(rng.random() < 0.8)
            radius = sigma * (0.5 + 0.5 * np.sin(t / 3.0 + e)) * rng.uniform(0.5, 1.5) if certified else 0.0
            rows.append({"episode": e, "step": t, "action": int(rng.integers(spec.n_actions)),
                         "certified": certified, "radius": radius if certified else 0.0,
                         "reward": float(rng.integers(0, 2)), "smoothed_top": 1.0, "smoothed_runner_up": 0.5,
                         **margins(radius if certified else 0.0, sigma)})
    steps = pd.DataFrame(rows)
    m = _meta("loact", sha, seed + 1)
    q_sha = hashlib.sha256((d / RUN_FILES["qrange"]).read_bytes()).hexdigest()
    m["inputs"]["qrange"] = {"path": RUN_FILES["qrange"], "sha256": q_sha}   # as the stage records what it read
    m.update(v_min=V_MIN, v_max=V_MAX, per_state_alpha=ALPHA_STATE)
    write_with_meta(d / RUN_FILES["loact"], lambda p: write_csv(p, steps), m, rows=len(steps))
    for key, df in loact_summaries(steps, sigma).items():
        write_with_meta(d / RUN_FILES[key], lambda p, df=df: write_csv(p, df), m, rows=len(df))
    # GRe: bounds falling with ε; returns of the randomized policy.
    j_min, j_max = spec.return_range(HORIZON)
    returns = rng.uniform(0.7, 1.0, GRE_M) * (j_max - j_min) + j_min
    # the bounds as the GRe stage computes them from its returns (the audit recomputes and compares them)
    gre = gre_bounds(returns, sigma=sigma, horizon=HORIZON, alpha=0.05, eps_grid=[f * sigma for f in GRE_FACTORS],
                     percentiles=[0.5], j_min=j_min, j_max=j_max)
    m = _meta("gre", sha, seed + 2)
    write_with_meta(d / RUN_FILES["gre"], lambda p: write_csv(p, gre), m, rows=len(gre))
    write_with_meta(d / RUN_FILES["gre_returns"], lambda p: write_csv(p, pd.DataFrame({"return": returns})), m,
                    rows=len(returns))
    # LoRe: a falling step function of ε.
    lore = pd.DataFrame({"eps": [0.0, 0.5 * sigma, 1.5 * sigma], "lower_bound": [6.0, 4.0, 1.0]})
    m = _meta("lore", sha, seed + 3, horizon=LOCAL_HORIZON, gamma=1.0)
    m["search"] = {"valid_until_eps": None, "distinct_states_smoothed": 10, "alpha_spent": LORE_ALPHA_SPENT,
                   "reward_modification": spec.lore_reward,
                   "per_state_alpha_first": LORE_ALPHA_SPENT * 6 / np.pi ** 2}   # alpha_mode family
    write_with_meta(d / RUN_FILES["lore"], lambda p: write_csv(p, lore), m, rows=len(lore))
    # LoRe's smoothed states: those the local attack from s₀ visits, every other action far out of the tree.
    path = [digest(d, t) for t in range(LOCAL_HORIZON)]
    states = pd.DataFrame({"obs_digest": path, "step": range(LOCAL_HORIZON), "eps": 0.0, "action": 0,
                           "certified": True, "smoothed_top_lower": V_MIN + (V_MAX - V_MIN) * P_TOP_LOWER,
                           "alpha": LORE_ALPHA_SPENT / LOCAL_HORIZON,
                           **{f"radius_{a}": 0.0 if a == 0 else LORE_FAR * sigma for a in range(spec.n_actions)}})
    write_with_meta(d / RUN_FILES["lore_states"], lambda p: write_csv(p, states), m, rows=len(states))
    # Attacks: every return at or above its bound, no certified step flipped.
    loc, att = [], []
    for f in LOCAL_FACTORS:
        eps = f * sigma
        bound = float(lore[lore["eps"] <= eps]["lower_bound"].iloc[-1])
        for e in range(2):
            loc.append({"eps": eps, "episode": e, "return": bound + float(rng.integers(0, 3)), "steps": LOCAL_HORIZON,
                        "flips": 0, "flips_certified": 0, "horizon": LOCAL_HORIZON,
                        "same_start_as_lore": e == 0})
            for t in range(LOCAL_HORIZON):
                radius = sigma * (0.5 + 0.5 * np.sin(t + e)) + 1e-3 * sigma
                att.append({"eps": eps, "episode": e, "step": t,
                            "obs_digest": path[t] if e == 0 else digest(d, t, e), "clean_action": 0, "action": 0,
                            "certified": True, "radius": radius, **margins(radius, sigma)})
    loc, att = pd.DataFrame(loc), pd.DataFrame(att)
    am = _meta("attack_local", sha, seed + 4, m=M_ATTACK, alpha=ALPHA_STATE, horizon=LOCAL_HORIZON, gamma=1.0)
    am["per_state_alpha"], am["reward_modification"] = ALPHA_STATE, spec.lore_reward
    write_with_meta(d / RUN_FILES["attack_local"], lambda p: write_csv(p, loc), am, rows=len(loc))
    write_with_meta(d / RUN_FILES["attack_local_steps"], lambda p: write_csv(p, att), am, rows=len(att))
    glob = []
    for f, g in zip(GLOBAL_FACTORS, gre.itertuples()):
        top = max(g.expectation_bound, g.percentile_bound)
        for e in range(GLOBAL_EPISODES):
            ret = min(j_max, top + rng.uniform(0, 0.1) * (j_max - j_min))
            glob.append({"eps": f * sigma, "episode": e, "return": ret, "horizon": HORIZON})
    glob = pd.DataFrame(glob)
    write_with_meta(d / RUN_FILES["attack_global"], lambda p: write_csv(p, glob), _meta("attack_global", sha, seed + 5),
                    rows=len(glob))
    frames = []  # (step, RGB frame): Atari runs only, as the LoAct stage writes them
    if needs_frames(env):
        for i, t in enumerate(range(5, 25)):
            f = np.zeros((210, 160, 3), dtype=np.uint8)
            f[:, :, 1] = 60
            f[30 + 5 * i: 40 + 5 * i, 140:144, :] = 255  # a moving paddle
            frames.append((t, f))
    from crop.io import write_frames as _write_frames

    write_with_meta(d / FRAMES_FILE, lambda p: _write_frames(p, frames, env), _meta("loact", sha, seed + 1),
                    rows=len(frames))
    return d


def loact_summaries(steps: pd.DataFrame, sigma: float) -> dict:
    """``{key: table}`` of LoAct's per-episode summary and certified ratio of its per-step table, as the stage
    makes them (the audit recomputes and compares them)."""
    ep = steps.groupby("episode").agg(**{"return": ("reward", "sum"), "steps": ("step", "size"),
                                         "mean_radius": ("radius", "mean"),
                                         "certified_fraction": ("certified", "mean")}).reset_index()
    r_grid = sigma * np.linspace(0.0, 4.0, 21)
    ratio = pd.DataFrame([{"r": r, "episode": e, "eta": float(((g["radius"] >= r) & g["certified"]).mean())}
                          for r in r_grid for e, g in steps.groupby("episode")])
    return {"loact_episodes": ep, "certified_ratio": ratio}


def rewrite_loact(d: Path, steps: pd.DataFrame, sigma: float) -> None:
    """Replace a run's loact.csv and its summaries with theirs (:func:`loact_summaries`), hashes updated: a
    consistent LoAct rerun."""
    rewrite_csv(d / RUN_FILES["loact"], steps)
    for key, df in loact_summaries(steps, sigma).items():
        rewrite_csv(d / RUN_FILES[key], df)


def margins(radius: float, sigma: float) -> dict:
    """LoAct's recorded bounds for a step of Theorem-1 radius ``radius`` (0: not certified): L(a1) at
    P_TOP_LOWER of the V range, max U(a) where r = σ/2·(Φ⁻¹(p_L) − Φ⁻¹(p_U)) puts it."""
    w = V_MAX - V_MIN
    z_l = norm.ppf(P_TOP_LOWER)
    p_u = norm.cdf(z_l - 2 * radius / sigma) if radius > 0 else P_TOP_LOWER + 0.05
    return {"smoothed_top_lower": V_MIN + w * P_TOP_LOWER, "smoothed_others_upper_max": V_MIN + w * float(p_u)}


def make_results(root: Path, plan: dict, seed: int = 0) -> dict:
    """``plan`` = {env: {algo: [σ, …]}}; returns {(env, algo, σ label): run folder}."""
    root = Path(root)
    out = {}
    for i, (env, algos) in enumerate(plan.items()):
        for j, (algo, sigmas) in enumerate(algos.items()):
            sha = make_checkpoint(root, env, algo)
            for k, s in enumerate(sigmas):
                out[(env, algo, repr(float(s)))] = make_run(root, env, algo, s, sha, seed=seed + 100 * i + 10 * j + k)
    return out


def rewrite_csv(path: Path, df: pd.DataFrame) -> None:
    """Replace a result CSV and update the hash in its provenance (a consistent, re-computed result)."""
    meta_file = path.with_name(path.stem + ".meta.json")
    meta = read_json(meta_file)
    meta.pop("output", None)
    write_with_meta(path, lambda p: write_csv(p, df), meta, rows=len(df))


def runs_of(results: dict) -> list[str]:
    return [f"{e}/{a}/sigma-{s}" for e, a, s in results]


def write_reference(path: Path, rows: list[dict]) -> Path:
    pd.DataFrame(rows, columns=["env", "algo", "sigma", "metric", "eps", "value"]).to_csv(path, index=False)
    return path


__all__ = ["make_results", "make_run", "make_checkpoint", "rewrite_csv", "rewrite_loact", "loact_summaries", "runs_of",
           "write_reference", "margins", "digest", "tiny_checkpoint", "tiny_real_run"]


def audit_cli(*args) -> int:
    """``crop audit ARGS…`` in-process; its exit status (0, or the code it exited with)."""
    from crop.__main__ import main

    try:
        main(["audit", *map(str, args)])
    except SystemExit as e:
        return e.code
    return 0


# ------------------------------------------------------------------------- a real run folder

def tiny_checkpoint(results: Path, algo: str = "StdTrain") -> Path:
    """A random CartPole Q-network with its model.json, where the workflow puts it."""
    from crop.io import sha256_file, write_json
    from crop.models import save_network

    ck = checkpoint_path(results, "CartPole-v0", algo)
    ck.parent.mkdir(parents=True)
    save_network(random_mlp(n_in=4, n_out=2, hidden=(16,), seed=1, scale=3.0), ck)
    write_json(ck.with_suffix(".json"), {"env": "CartPole-v0", "algo": algo, "profile": "vector",
                                         "net_spec": {"arch": "mlp", "in": 4, "hidden": [16], "out": 2},
                                         "sha256": sha256_file(ck)})
    return ck


def tiny_real_run(results: Path) -> Path:
    """A real (tiny) run folder: a random CartPole Q-network, its V range, LoAct and the global attack, each
    stage run by the CLI as the workflow runs it."""
    from crop.__main__ import main

    ck = tiny_checkpoint(results)
    d = run_dir(results, "CartPole-v0", "StdTrain", "0.1")
    d.mkdir(parents=True)
    base = ["--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.1", "--seed", "3", "--device", "cpu",
            "--checkpoint", str(ck), "--no-progress"]
    main(["qrange", *base, "--settings", json.dumps({"m": 100, "episodes": 1, "horizon": 5}),
          "--out", str(d / RUN_FILES["qrange"])])
    main(["loact", *base, "--qrange", str(d / RUN_FILES["qrange"]), "--settings",
          json.dumps({"m": 100, "episodes": 1, "horizon": 5}), "--out", str(d / RUN_FILES["loact"]),
          "--out-episodes", str(d / RUN_FILES["loact_episodes"]), "--out-ratio", str(d / RUN_FILES["certified_ratio"]),
          "--out-frames", str(d / RUN_FILES["frames"])])
    main(["attack-global", *base, "--settings", json.dumps({"episodes": 2, "eps_factors": [0.0, 0.5], "horizon": 5,
                                                            "n_eot": 2, "pgd_steps": 2}),
          "--out", str(d / RUN_FILES["attack_global"])])
    return d
