"""`crop certify POLICY --env ID`: your own agent certified in one command.

The agent's kind is read from the file by `crop import`'s own reader (crop.agents.importing: a Q-network, a
policy network or a continuous-action actor; SB3, CleanRL or a state dict) and checked against the
environment's spaces before anything is written, and --out DIR must be new, empty, or made by crop certify
for the same agent, environment and label (DIR/crop-certify.json), so nothing of the user's is overwritten
or mixed into the results.  Then DIR/config.yaml (crop.workflow.certify_config) is written and the whole
workflow runs on it, Snakemake's working directory and its .snakemake/ state in DIR — the checkpoint,
LoAct (Theorem 1; per action dimension for a Box agent), GRe (Theorems 2–3), LoRe (Algorithm 3), the
attacks, tables, figures and the audit — followed by the one-file HTML report.  The table printed per σ is
read back from the run's own result files.

Snakemake runs as a child process of this interpreter (``python -m snakemake``), not through
``snakemake.api``: the Snakefile's ``onstart``/``onsuccess`` hooks, Snakemake's logging setup and its
signal handling then stay out of this process, its progress lines go straight to the terminal, and the run is
exactly ``snakemake --configfile DIR/config.yaml --directory DIR``, which repeats it.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from crop import columns as cols
from crop.io import InputError
from crop.workflow import workflow_root
from crop.workflow.certify_config import (
    MARKER,
    REWARDS,
    budget_sizes,
    certify_config,
    identity,
    out_problem,
    quick_horizon,
)

SIZES = ("horizon", "episodes", "m")   # the flags that replace a budget's sizes
_TARGET_WHY = {"auto": ", chosen per σ by a pilot before the certification's noise is drawn; --target fixes it"}
_KIND = {"q": "a Q-network (DQN-style; smoothed Q-values)",
         "policy": "a policy network (PPO/A2C-style; smoothed action probabilities)",
         "actor": "a continuous-action actor (SAC/TD3/DDPG/PPO on Box actions; percentile smoothing)"}


def _agent(path: Path, env: str) -> tuple[dict, bool]:
    """The file's import record (crop import's detection and checks: a file that is no agent, an actor for a
    Discrete environment, a Q-network or policy network for a Box one, sizes that differ are each refused in
    one line) and whether ``env`` has Box actions."""
    from crop.agents.importing import check_policy_file
    from crop.envs import UnknownEnvError, action_bounds, default_profile
    from crop.models import CheckpointError

    try:
        box = action_bounds(env) is not None
    except UnknownEnvError as exc:
        raise InputError(f"--env: {exc}") from None
    try:
        _, info = check_policy_file(path, "mlp", "auto", None, env, default_profile(env))
    except CheckpointError as exc:
        raise InputError(str(exc)) from None
    return info, box


def _rewards(env: str, given) -> dict | None:
    """The config's rewards block: none for the paper's and Atari environments (their facts are known), else
    --reward-range, else the known facts of :data:`REWARDS`; InputError naming --reward-range otherwise."""
    from crop.envs import ENV_SPECS, env_family

    if env in ENV_SPECS:
        if given:
            raise InputError(f"--reward-range: {env} is one of the paper's environments, whose reward range is "
                             "the paper's; leave it out")
        return None
    if given:
        return {"range": [float(given[0]), float(given[1])]}
    if env in REWARDS:
        return REWARDS[env]
    if env_family(env) == "atari":
        return None
    raise InputError(f"--reward-range: GRe and LoRe need the per-step reward range of {env}, which the environment "
                     "does not declare; give it as --reward-range LOW HIGH")


def _claim(args) -> tuple[Path, Path, dict]:
    """The checks that need no network library (torch is not imported yet, so a typo is refused at once): the
    policy file is a readable file, --env an id crop knows, --out a folder this certification may write into
    (:func:`crop.workflow.certify_config.out_problem`).  Returns the policy's and the folder's absolute paths and
    the folder's marker."""
    from crop.envs import UnknownEnvError, env_family

    policy = Path(args.policy).absolute()
    if not policy.is_file():
        raise InputError(f"{policy}: no such file" if not policy.exists() else f"{policy}: not a file")
    try:
        marker = identity(args.env, args.algo, policy)
    except OSError as exc:
        raise InputError(f"{policy}: cannot read the file ({exc.strerror})") from None
    try:
        env_family(args.env)
    except UnknownEnvError as exc:
        raise InputError(f"--env: {exc}") from None
    out = Path(args.out).absolute()
    problem = out_problem(out, marker, args.force)
    if problem:
        raise InputError(problem)
    return policy, out, marker


#: Why a stage of crop certify's runs is not one --skip offers: the report and the audit are built on it.
_ALWAYS = {"qrange": "the V range always runs (LoAct, LoRe and the local attack read it)",
           "loact": "LoAct always runs (the report's certified actions)",
           "gre": "GRe always runs (the report's certified returns)",
           "attack-global": "the global attack always runs (the audit's test of GRe's bounds)"}


def _skip(args) -> list[str]:
    """The stages --skip names (repeated or comma lists), checked before any work: each must be one of
    :data:`crop.workflow.layout.SKIPPABLE`; another stage, or no stage, is refused in one line naming those."""
    from crop.workflow.layout import SKIPPABLE

    names = list(dict.fromkeys(n.strip() for given in args.skip or () for n in given.split(",") if n.strip()))
    for name in names or ([""] if args.skip else []):
        if name not in SKIPPABLE:
            why = _ALWAYS.get(name, "no such stage" if name else "names no stage")
            raise InputError(f"--skip {name or repr(name)}: {why}; the stages crop certify may skip: "
                             f"{', '.join(SKIPPABLE)}")
    return names


def _lore_skip(env: str, box: bool, skip: list[str]) -> str | None:
    """Why LoRe cannot run on ``env`` (``crop.envs.snapshot_problem``: no faithful snapshots, as of a Box2D
    world), where it would otherwise: then it is skipped, and the line printed says why."""
    if box or "lore" in skip:
        return None
    from crop.envs import snapshot_problem

    return snapshot_problem(env)


def _horizon_text(args, sizes: dict) -> str:
    """The horizon the bounds cover, and why it is that one."""
    h = sizes["gre"]["horizon"]
    why = ("--horizon" if args.horizon else quick_horizon(args.env)[1] if args.budget == "quick"
           else "the paper's")
    return f"GRe, LoAct and the global attack over the first {h} steps: {why}"


def _write_config(args) -> tuple[Path, dict, bool]:
    """Every check, then DIR/config.yaml beside DIR/crop-certify.json; nothing is written before all checks
    pass."""
    import yaml

    from crop.workflow.config import ConfigError, check_policy_files, validate_config

    policy, out, marker = _claim(args)
    given = _skip(args)
    info, box = _agent(policy, args.env)
    lore_problem = _lore_skip(args.env, box, given)
    skip = given + (["lore"] if lore_problem else [])
    if box and args.target:
        raise InputError(f"--target: {args.env} has continuous actions, whose LoAct certifies the action per "
                         "dimension by percentile smoothing, with no smoothing target to choose; leave it out")
    target = None if box else (args.target or "auto")
    sizes, sigmas = budget_sizes(args.budget, args.env, args.horizon, args.episodes, args.m)
    cfg = certify_config(args.env, (args.algo, policy), out, sizes, args.sigma or sigmas,
                         _rewards(args.env, args.reward_range), box, target)
    if skip:   # the stages the workflow, the report and the audit leave out (the config's skip)
        cfg["environments"][args.env]["skip"] = skip
    try:   # the checked config has the smoothing target filled in (probs, action), as the workflow's
        checked = check_policy_files(validate_config(cfg, "the config"), "the config")
    except ConfigError as exc:   # a target the network has not is --target's problem, said so
        field = f"environments.{args.env}.target: "
        raise InputError(f"--target: {str(exc).split(field, 1)[1]}" if field in str(exc) else str(exc)) from None
    snakefile = workflow_snakefile()
    if not snakefile.is_file():
        raise InputError(f"{snakefile}: the workflow's Snakefile is not there; run crop certify from a checkout "
                         "of the repository (pip install -e), or set CROP_WORKFLOW to one")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    path = out / "config.yaml"
    command = ["crop", "certify", str(policy), "--env", args.env, "--algo", args.algo, "--sigma",
               *map(str, cfg["environments"][args.env]["sigmas"]), "--budget", args.budget, "--out", str(out),
               *(["--target", target] if target else []),
               *[x for k in SIZES if getattr(args, k) for x in (f"--{k}", str(getattr(args, k)))],
               *(["--reward-range", *map(str, args.reward_range)] if args.reward_range else []),
               *(["--skip", ",".join(given)] if given else [])]
    path.write_text(f"# written by: {shlex.join(command)}\n"
                    f"# repeat: snakemake -s {snakefile} --cores {args.cores} --configfile {path} --directory {out}\n"
                    "# (every path is absolute: any working directory will do)\n"
                    + yaml.safe_dump(cfg, sort_keys=False))
    print(f"agent:  {policy.name}: {_KIND[info['network']]}, {info['format']} format, "
          f"{info['net_spec'].get('arch')} {info['net_spec'].get('hidden', '')}".rstrip(), flush=True)
    print(f"config: {path} ({args.budget} budget; {_horizon_text(args, sizes)}"
          + (f"; smoothing target {target}{_TARGET_WHY.get(target, '')}; bound {cfg['bound']}" if target else "")
          + ")", flush=True)
    if given:
        print(f"skip:   {', '.join(given)} (--skip): not run; the report shows the stages that ran, the audit lists "
              "it as not run", flush=True)
    if lore_problem:
        print(f"skip:   lore: {lore_problem}; the other stages run without it", flush=True)
    return path, checked, box


def workflow_snakefile() -> Path:
    """The Snakefile of the workflow the package runs (:func:`crop.workflow.workflow_root`)."""
    return workflow_root() / "Snakefile"


def snakemake(out: Path, *argv: str) -> subprocess.CompletedProcess:
    """``python -m snakemake -s SNAKEFILE --directory OUT ARGV…`` (:func:`workflow_snakefile`) with this
    interpreter's scripts (crop) first on PATH: Snakemake's own state (.snakemake/) lives in ``out``, not in the
    working directory."""
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(workflow_snakefile()), "--directory", str(out),
                           *argv], env=env)


def _mean(df, col: str) -> float:
    return float(df[col].mean()) if col in df else float("nan")


def loact_line(loact, box: bool) -> str:
    """LoAct's certified fraction and mean radius (Theorem 1) from its table: a step counts as certified where
    its radius is > 0, as in the report's tables and figures; a Box agent's step is certified when every action
    dimension is, at the smallest radius over them (:func:`crop.certify.percentile.step_ratio`), and the mean
    width of its action interval at ε = σ follows."""
    width = ""
    if box:
        from crop.certify.percentile import step_ratio

        width = (loact["upper_e1"] - loact["lower_e1"]).mean()
        width = f"; mean width of the action interval at eps = sigma {width:.4g}"
        loact = step_ratio(loact)
    return (f"  LoAct: {_mean(loact, cols.CERTIFIED):.1%} of {len(loact)} steps certified (radius > 0), mean radius "
            f"{_mean(loact, cols.RADIUS):.4g}{width}")


def _vacuous(bound: float, floor: float) -> str:
    """``bound`` as the table prints it, ``(vacuous)`` beside it where it is the return's floor: it claims
    nothing the reward range did not already say; ``none`` where there is no bound (a percentile GRe cannot
    certify with its m paths at that ε)."""
    from crop.certify.gre import vacuity_floor

    if bound != bound:
        return "none"
    return f"{bound:.4g}" + (" (vacuous)" if bound <= vacuity_floor(floor) else "")


def _obs_bounds(env: str | None) -> tuple:
    """The observation space's low and high of ``env`` (None, None where it has none to read)."""
    try:
        from crop.envs import make_env

        game = make_env(env)
        space = game.unwrapped.observation_space   # the game's own bounds, before any wrapper
        game.close()
        return space.low, space.high
    except Exception:   # a reason's aside only: no bounds, no aside
        return None, None


def _sigma_lines(run: Path, box: bool, env: str | None = None) -> list[str]:
    """One σ's rows: LoAct's line (:func:`loact_line`), GRe's bounds at each ε beside the global attack's
    returns (Theorems 2–3, with Kumar et al.'s CDF bound) over GRe's horizon, each bound that equals the
    return's floor J_min marked vacuous and, where every bound at ε > 0 is, the reason
    (:func:`crop.certify.gre.vacuity_reason`); LoRe's bound (Algorithm 3) over its own horizon."""
    import pandas as pd

    from crop.certify.gre import vacuity_reason
    from crop.workflow.layout import RUN_FILES

    lines = [loact_line(pd.read_csv(run / RUN_FILES["loact"]), box)]
    gre = pd.read_csv(run / RUN_FILES["gre"])
    attack = pd.read_csv(run / RUN_FILES["attack_global"])
    j_min, horizon = float(gre[cols.J_MIN].iloc[0]), int(gre[cols.HORIZON].iloc[0])
    lines.append(f"  GRe and the global attack: the return over the first {horizon} steps (J_min = {j_min:.4g}; "
                 "a bound at J_min is vacuous, none: no bound at that eps)")
    lines.append(f"  {'eps':>8}  {'GRe J_E':>14}  {'GRe J_CDF':>14}  {'GRe J_p':>14}  {'attack mean':>11}  "
                 f"{'attack median':>13}")
    for _, g in gre.iterrows():
        a = attack[(attack[cols.EPS] - g[cols.EPS]).abs() < 1e-12]
        mean = f"{a[cols.RETURN].mean():.4g}" if len(a) else "—"
        median = f"{a[cols.RETURN].median():.4g}" if len(a) else "—"
        lines.append(f"  {g[cols.EPS]:>8.4g}  {_vacuous(g[cols.EXPECTATION_BOUND], j_min):>14}  "
                     f"{_vacuous(g['cdf_expectation_bound'], j_min):>14}  "
                     f"{_vacuous(g[cols.PERCENTILE_BOUND], j_min):>14}  {mean:>11}  {median:>13}")
    reason = vacuity_reason(pd.read_csv(run / RUN_FILES["gre_returns"])[cols.RETURN], gre, *_obs_bounds(env))
    if reason:
        lines.append(f"  why vacuous: {reason}")
    if not box and (run / RUN_FILES["lore"]).is_file():
        lore = pd.read_csv(run / RUN_FILES["lore"])
        settings = json.loads((run / "lore.meta.json").read_text())["settings"]
        h, gamma, r_min = settings["horizon"], settings["gamma"], settings["reward_range"][0]
        floor = r_min * sum(gamma ** t for t in range(h))
        lines.append(f"  LoRe: return over the first {h} steps >= " + ", ".join(
            f"{_vacuous(r[cols.LOWER_BOUND], floor)} at eps {r[cols.EPS]:.4g}" for _, r in lore.iterrows()))
    return lines


def _chosen(run: Path) -> str:
    """`` (target auto chose T; each candidate's predicted radius)`` of a run of ``target: auto``, read from its
    qrange.json (:mod:`crop.certify.pilot`)."""
    from crop.workflow.layout import RUN_FILES

    try:
        choice = json.loads((run / RUN_FILES["qrange"]).read_text())["target_choice"]
        predicted = ", ".join(f"{t} {v['mean_predicted_radius']:.4g}" for t, v in choice["predicted"].items())
        return f" (target auto chose {choice['chosen']}; mean predicted radius {predicted})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return " (target auto: its choice is not readable in qrange.json)"


def results_table(cfg: dict, box: bool) -> list[str]:
    """The per-σ table of a finished run of ``cfg`` (one environment, one label)."""
    from crop.workflow.config import run_targets
    from crop.workflow.layout import run_dir

    lines = []
    for env, algo, sigma_label, target in run_targets(cfg):
        run = run_dir(cfg["results"], env, algo, sigma_label, target)
        lines.append(f"{env} {algo} σ = {sigma_label}" + (
            _chosen(run) if target == "auto" else "" if target in ("q", "action") else f" (target {target})"))
        lines += _sigma_lines(run, box, env)
    return lines


def cmd_certify(args) -> None:
    config, cfg, box = _write_config(args)
    out, results = config.parent, Path(cfg["results"])
    rerun = f"snakemake -s {workflow_snakefile()} --cores {args.cores} --configfile {config} --directory {out}"
    print(f"logs:   {results / 'logs'}/ (one per stage, environment, label and σ)", flush=True)
    # progress ("N of M steps (P%) done") without each job's file lists: those are in the run's log
    if snakemake(out, "--cores", str(args.cores), "--configfile", str(config), "--quiet", "rules", "host").returncode:
        print(f"crop certify: error: the workflow failed (its log is above; each stage's in {results / 'logs'}); "
              f"rerun: {rerun}", file=sys.stderr)
        sys.exit(1)
    report = out / "report.html"
    made = snakemake(out, "--report", str(report), "--configfile", str(config), "--quiet", "all").returncode == 0
    print("\n".join(results_table(cfg, box)))
    from crop.audit.audit import verdict_line

    audit = results / "audit" / "audit.json"
    print(f"audit:  {verdict_line(json.loads(audit.read_text()))} ({audit.with_suffix('.md')})")
    print(f"report: {report}" if made else "report: not written (snakemake --report failed; its log is above)")
