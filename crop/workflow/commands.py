"""The workflow's own subcommands: ``crop validate-config``, ``crop calibrate`` and ``crop plan``."""
from __future__ import annotations

import sys

from crop.io import InputError


def cmd_validate_config(args) -> None:
    """The checks the workflow makes before any job: the schema and the registry, then every policy file
    opened as its checkpoint job will open it."""
    from crop.workflow.config import ConfigError, check_policy_files, load_config

    try:
        cfg = check_policy_files(load_config(args.config, args.trust_env), args.config)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    n = sum(len(e["algorithms"]) * len(e["sigmas"]) for e in cfg["environments"].values())
    print(f"{args.config}: valid ({n} certification targets)")


def cmd_calibrate(args) -> None:
    from crop.workflow.calibrate import PAPER_ENVS, calibrate

    try:
        calibrate(args.device, args.env or PAPER_ENVS, args.out)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _plan_table(jobs) -> list[str]:
    """Per rule: jobs, minutes per job (least–most) and the rule's total hours."""
    rows = {}
    for j in jobs:
        rows.setdefault((j.rule, j.device), []).append(j.minutes)
    lines = [f"{'rule':<24}{'device':<7}{'jobs':>6}  {'minutes per job':>19}  {'total h':>9}"]
    for (rule, dev), mins in rows.items():
        per = f"{min(mins):.3g}" if min(mins) == max(mins) else f"{min(mins):.3g}–{max(mins):.3g}"
        lines.append(f"{rule:<24}{dev:<7}{len(mins):>6}  {per:>19}  {sum(mins) / 60:>9.3g}")
    return lines


def cmd_plan(args) -> None:
    import json

    from crop.workflow.config import ConfigError, load_config
    from crop.workflow.cost import CostError, plan, runtime_minutes, stage_gpus

    try:
        cfg = load_config(args.configfile, args.trust_env)
        gpus = args.gpus if args.gpus is not None else stage_gpus(cfg)
        result, extra = plan(cfg, args.cores, gpus, args.nodes, args.calibration)
    except (ConfigError, CostError) as exc:
        raise InputError(str(exc)) from None
    for dev, src in extra["sources"].items():
        print(f"unit costs ({dev}): {src}", file=sys.stderr)
    for b in result.get("borrowed_units", []):
        print(f"borrowed unit costs: {b['note']}", file=sys.stderr)
    for j in extra["over_cap"]:
        where = "/".join(str(x) for x in (j.env, j.algo, j.sigma) if x is not None)
        print(f"over slurm.max_runtime = {extra['cap']} min: {j.rule} {where} is predicted {j.minutes:.0f} min "
              f"(asks {runtime_minutes(j.seconds)} with headroom); SLURM will stop it at the cap", file=sys.stderr)
    for j in extra["over_mem"]:
        where = "/".join(str(x) for x in (j.env, j.algo, j.sigma) if x is not None)
        print(f"over slurm.max_mem_mb = {extra['mem_cap']} MB: {j.rule} {where} is predicted {j.mem_mb} MB; it asks "
              "for the cap, and SLURM will stop it if it needs more", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print("\n".join(_plan_table(extra["jobs"])))
    t = result["total"]
    print(f"{t['jobs']} jobs: {t['cpu_hours']:.3g} CPU-hours, {t['gpu_hours']:.3g} GPU-hours; makespan "
          f"{result['makespan_hours']:.3g} h on {args.nodes} × ({args.cores} cores, {gpus} GPU)")
    print(f"asked of SLURM ({t['allocations']} allocations, the stage jobs grouped per environment and algorithm): "
          f"{t['requested_cpu_hours']:.3g} CPU-hours ({_ratio(t['requested_cpu_hours'], t['cpu_hours'])} planned), "
          f"{t['requested_gpu_hours']:.3g} GPU-hours ({_ratio(t['requested_gpu_hours'], t['gpu_hours'])} planned)")


def _ratio(asked: float, planned: float) -> str:
    return f"{asked / planned:.2f}× the" if planned else "none"
