"""The handlers of the report subcommands, ``crop aggregate`` and ``crop audit``: they read a results folder's
complete runs (or the run files given by --inputs) and write the figures and tables, or the audit's report.
"""
from __future__ import annotations

import builtins
import sys
from pathlib import Path

from crop.io import InputError

__all__ = ["cmd_aggregate", "cmd_audit"]


def _results_and_runs(args) -> tuple[Path, list[str] | None]:
    """The results root and its ENV/ALGO/sigma-S run folders: from --inputs (the run files), or RESULTS."""
    if args.inputs:
        from crop.report.metrics import run_depth
        from crop.workflow.layout import base_run

        dirs = sorted({Path(f).parent for f in args.inputs})  # replicate folders: RESULTS/ENV/ALGO/sigma-S/rep-K
        roots = {Path(base_run(d)).parents[run_depth(base_run(d)) - 1] for d in dirs}
        if len(roots) != 1 or not all(Path(base_run(d)).name.startswith("sigma-") for d in dirs):
            raise InputError(f"inputs do not lie in RESULTS/ENV/ALGO/sigma-S folders of one results folder: "
                             f"{dirs[:3]}")
        root = roots.pop()
        return root, [str(d.relative_to(root)) for d in dirs]
    results = args.results or getattr(args, "results_opt", None)
    if not results:
        raise InputError("give a results folder or --inputs")
    if not Path(results).is_dir():
        raise InputError(f"{results}: no such results folder")
    return Path(results), args.runs


def _complete_runs(results: Path) -> list[str]:
    """Every complete run folder under ``results``; InputError naming what incomplete ones miss, or the first
    file that is not a regular file of the folder within its cap
    (:func:`crop.report.records.received_file_problems`)."""
    from crop.audit.audit import discover_run_folders, discover_runs
    from crop.report.records import received_file_problems
    from crop.workflow.layout import RUN_FILES

    unread = [p for r in discover_run_folders(results) for p in received_file_problems(results / r)]
    if unread:
        raise InputError(f"{unread[0]['file']}: {unread[0]['problem']}"
                         + (f" ({len(unread) - 1} more such file(s))" if len(unread) > 1 else ""))
    incomplete = discover_runs(results, incomplete=True)
    if incomplete:  # name what is missing rather than silently dropping runs
        missing = {r: sorted(f for f in RUN_FILES.values() if not (results / r / f).is_file()) for r in incomplete}
        raise InputError(f"incomplete runs under {results}: "
                         + "; ".join(f"{r}: {', '.join(m)}: missing" for r, m in missing.items()))
    return discover_runs(results)


def cmd_aggregate(args) -> None:
    from crop.io import ReceivedFileError
    from crop.report.aggregate import aggregate
    from crop.report.integrity import IntegrityError

    results, runs = _results_and_runs(args)
    runs = runs or _complete_runs(results)
    if not runs:
        raise InputError(f"no complete runs to aggregate under {results}")
    if not args.inputs:  # a folder: each run's replicate folders (config `replicates`) with it
        from crop.workflow.layout import REPLICATE_PREFIX

        runs = list(runs) + [str(d.relative_to(results)) for r in runs
                             for d in sorted((results / r).glob(f"{REPLICATE_PREFIX}*")) if d.is_dir()]
    figures = Path(args.figures) if args.figures else results / "figures"
    tables = Path(args.tables) if args.tables else results / "tables"
    try:
        written = aggregate(results, runs, table_eps_factors=args.table_eps_factors, figures_dir=figures,
                            tables_dir=tables)
    except (FileNotFoundError, IntegrityError, ReceivedFileError) as exc:
        raise InputError(str(exc)) from None
    print(f"aggregate: wrote {len(written)} files for {len(runs)} runs to {figures} and {tables}")


def _config_hash(args) -> str | None:
    """--config-hash, or the hash of --config (validated); InputError when both are given and differ."""
    if not args.config:
        return args.config_hash
    from crop.audit.provenance import config_hash
    from crop.workflow.config import ConfigError, load_config

    try:
        h = config_hash(load_config(args.config, args.trust_env))
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    if args.config_hash and args.config_hash != h:
        raise InputError(f"--config-hash {args.config_hash} is not the hash of {args.config} ({h})")
    return h


def _print_audit(results: Path, out_dir: Path, report: dict) -> None:
    from crop.audit.audit import verdict_line
    from crop.report.markdown import printable

    def print(line):   # a received name holds no newline or escape sequence on the terminal
        builtins.print(printable(line))

    ref = report["reference"]
    print(f"audit of {results}: {len(report['runs'])} runs: {verdict_line(report)} ({out_dir / 'audit.md'})")
    for v in report["suspicious_list"][:20]:
        print(f"  suspicious: {v['env']}/{v['algo']}/sigma={v['sigma']} eps={v['eps']}: {v['check']} "
              f"bound {v['bound']} observed {v['observed']} (raw p {v['p_value']:.3g})")
    for v in report["violation_list"][:20]:
        print(f"  violation: {v['env']}/{v['algo']}/sigma={v['sigma']} eps={v['eps']}: {v['check']} "
              f"bound {v['bound']} observed {v['observed']}")
    for p in report["integrity"][:20]:
        print(f"  integrity: {p['file']}: {p['problem']}")
    for j in [j for j in (report.get("rerun") or {}).get("jobs", []) if j["result"] in ("differ", "not_run")][:20]:
        print(f"  rerun {j['result']}: {j['job']}: {j['note']}")
    for r in (ref["comparisons"] if ref else []):
        if r["verdict"] == "differs":
            print(f"  differs: {r['env']}/{r['algo']}/sigma={r['sigma']} {r['metric']} eps={r['eps']}: "
                  f"reproduced {r['reproduced']} vs reference {r['reference']} (allowed ±{r['allowed']}"
                  + (f" beyond the interval [{r['interval_lo']:.4g}, {r['interval_hi']:.4g}]"
                     if r.get("interval_lo") is not None and r.get("interval_hi") is not None else "") + ")")


def cmd_audit(args) -> None:
    from crop.audit.audit import AuditOptions, audit, exit_status
    from crop.audit.reference import ReferenceError

    results, runs = _results_and_runs(args)
    out_dir = Path(args.out_dir) if args.out_dir else results / "audit"
    try:
        options = AuditOptions(alpha=args.alpha, reference=args.reference, tolerances=args.tolerances,
                               abs_tol=args.abs_tol, rel_tol=args.rel_tol, config_hash=_config_hash(args),
                               strict=args.strict, trusted_envs=tuple(_config_envs(args)), rerun=args.rerun,
                               rerun_seed=args.seed, rerun_budget=args.rerun_budget, config=args.config,
                               skipped=_declared_skips(args, results, runs))
        report = audit(results, out_dir, options, runs=runs)
    except ReferenceError as exc:
        raise InputError(str(exc)) from None
    _print_audit(results, out_dir, report)
    sys.exit(exit_status(report, strict=args.strict, report_only=args.report_only))


def _declared_skips(args, results: Path, runs) -> tuple:
    """``(run, stages)`` of each run folder whose config skips stages (its ``skip``): read from --config, or
    from --inputs, the run files the workflow's audit rule gives (the config's: a skippable stage of the run
    with no file among them is one its config skips)."""
    from crop.report.metrics import parse_run
    from crop.workflow.layout import SKIPPABLE, replicate_of, run_stages, run_target
    from crop.workflow.stage_table import STAGES

    if args.config:
        from crop.audit.audit import discover_run_folders
        from crop.workflow.config import ConfigError, load_config

        try:
            envs = load_config(args.config, args.trust_env)["environments"]
        except ConfigError as exc:
            raise InputError(str(exc)) from None
        return tuple((r, tuple(envs[parse_run(r)[0]]["skip"])) for r in runs or discover_run_folders(results)
                     if not replicate_of(r) and (envs.get(parse_run(r)[0]) or {}).get("skip"))
    if not args.inputs:
        return ()
    given: dict[str, set] = {}
    for f in map(Path, args.inputs):
        given.setdefault(str(f.parent.relative_to(results)), set()).add(f.name)
    out = []
    for run in (r for r in runs if not replicate_of(r)):
        stages = tuple(s for s in SKIPPABLE if s in run_stages(run_target(run))
                       and not set(STAGES[s].files.values()) & given.get(run, set()))
        out += [(run, stages)] if stages else []
    return tuple(out)


def _config_envs(args) -> list[str]:
    """The environment ids the user vouched for (``--trust-env``, and ``--config``'s ids that set
    ``import_module: true``: crop.workflow.config.trusted_env_ids): the only ids whose ``module:Id`` form may import a
    module during an audit.  A config may be received with the folder, so its other ids import nothing."""
    if not args.config:
        return list(args.trust_env)
    from crop.workflow.config import ConfigError, load_config, trusted_env_ids

    try:
        trusted = trusted_env_ids(load_config(args.config, args.trust_env), args.trust_env)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    return sorted(trusted)
