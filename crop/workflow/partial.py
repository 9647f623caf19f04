"""Results from whatever finished: the figures, tables and audit of every run that finished when a job failed
(the Snakefile's ``onerror:``), and the files of a config's runs that the aggregate and audit rules read.

Snakemake's ``keep-going`` (set in both profiles) runs every job that does not wait on a failed one, but the
aggregate and audit rules take every run of the config as input, so one failed checkpoint job leaves a run with
neither.  At the end of such a run, in Snakemake's main process (the login node under SLURM), before Snakemake
exits with its error, :func:`report_finished` does what those two rules would have done, over what is there:

* ``crop aggregate`` over the runs whose every file (replicates included) is there, after removing the figures
  and tables the config's aggregate writes, as Snakemake removes a job's outputs before it runs it (one drawn
  from a run that is now gone would otherwise stay);
* ``crop audit --config`` over every run folder with a file in it: a run a failed stage cut short is audited as
  a partial run, and every checkpoint, run file, figure and table the config's jobs write and the folder lacks
  is listed in ``expected_missing`` (WARN at best), with the job that failed and its log
  (:func:`crop.audit.completeness.config_missing`).

Their output goes to the rules' own logs (``logs/aggregate.log``, ``logs/audit.log``).  Once the cause is fixed,
rerunning the same command runs the failed jobs and everything after them, the aggregate and audit rules
included, which replace these files.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from crop.workflow import layout
from crop.workflow.config import run_targets, sigma_label, smoothing_targets

__all__ = ["config_plan", "config_run_files", "report_finished", "wants_report"]


def config_plan(cfg: dict) -> dict[str, tuple[list[str], list[str], tuple[str, ...]]]:
    """``{env: (run folder algorithms, σ labels, the stages its config skips)}`` of a validated
    config: what the aggregate draws and tabulates
    (:func:`crop.workflow.layout.aggregate_files`)."""
    return {env: ([layout.run_algo(a, t) for a in ec["algorithms"] for t in smoothing_targets(ec)],
                  [sigma_label(s) for s in ec["sigmas"]], tuple(ec.get("skip", ())))
            for env, ec in cfg["environments"].items()}


def config_run_files(cfg: dict, results) -> dict[str, tuple[list[str], list[str]]]:
    """``{run folder: (its result files, its replicates' files)}`` of every run of a validated config (replicates
    1 … N−1 of config ``replicates``; no V range for the targets bounded in [0, 1])."""
    out = {}
    for env, algo, sig, t in run_targets(cfg):
        d = layout.run_dir(results, env, algo, sig, t)
        names = layout.run_files(t, cfg["environments"][env].get("skip", ()))
        reps = [str(layout.run_dir(results, env, algo, sig, t, replicate=k) / layout.RUN_FILES[key])
                for k in range(1, cfg["replicates"]) for key in layout.REPLICATE_FILES if key in names]
        out[str(d)] = ([str(d / n) for n in names.values()], reps)
    return out


def wants_report(workflow) -> bool:
    """Whether a Snakemake run that failed should end with :func:`report_finished`: a job failed (Snakemake's
    scheduler lists it; an interrupt, Ctrl-C or SIGTERM, fails none) and the run's targets include the aggregate
    or the audit (a run asked for some run files only is left as it is)."""
    failed = getattr(getattr(workflow, "scheduler", None), "failed", None)
    dag = getattr(workflow, "dag", None)
    rules = {job.rule.name for job in dag.jobs} if dag is not None else {"aggregate"}
    return failed != set() and bool(rules & {"aggregate", "audit"})


def _run(words: list[str], log: Path) -> int:
    """``crop WORDS`` with its output in ``log`` (as the rule's shell command writes it); its exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        return subprocess.run([sys.executable, "-m", "crop", *words], stdout=out, stderr=subprocess.STDOUT).returncode


def _said(log: Path, prefix: str) -> str:
    """The line of ``log`` that starts with ``prefix`` (the command's own summary), else its last line."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    return next((ln for ln in lines if ln.startswith(prefix)), lines[-1] if lines else "(no output)")


def report_finished(results, cfg: dict, valid: dict, *, aggregate_words: list[str], audit_words: list[str],
                    say=print) -> bool:
    """Tables, figures and the audit of every run of ``cfg`` (validated, policy files checked; ``valid``: as
    validated, whose hash the audit records) that finished; False, doing nothing, when every checkpoint and run
    file is there (what failed is the aggregate or audit job itself: its log says why).  ``aggregate_words``: the
    aggregate rule's flags but its inputs; ``audit_words``: the audit rule's options but its inputs, output
    folder and config hash."""
    results = Path(results)
    runs = config_run_files(cfg, results)
    checkpoints = {layout.checkpoint_record(results, env, algo) for env, algo, _, _ in run_targets(cfg)}
    finished = {r: main + reps for r, (main, reps) in runs.items() if all(Path(f).is_file() for f in main + reps)}
    if len(finished) == len(runs) and all(p.is_file() for p in checkpoints):
        return False
    for main, reps in runs.values():   # the run folders failed jobs left empty (Snakemake made them)
        for d in sorted({Path(f).parent for f in main + reps}, key=lambda p: -len(p.parts)):
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
    figures, tables = results / "figures", results / "tables"
    for p in layout.aggregate_files(figures, tables, config_plan(cfg)):
        p.unlink(missing_ok=True)
    logs = results / "logs"
    say(f"A job failed: the figures, tables and audit of the {len(finished)} of {len(runs)} runs that finished "
        f"(crop/workflow/partial.py; logs {logs / 'aggregate.log'}, {logs / 'audit.log'})")
    if finished:
        files = [f for fs in finished.values() for f in fs]
        _run(["aggregate", "--inputs", *files, *aggregate_words, "--figures", str(figures), "--tables", str(tables)],
             logs / "aggregate.log")
    say(f"  {_said(logs / 'aggregate.log', 'aggregate: ')}" if finished else "  aggregate: no run finished")
    present = [f for main, reps in runs.values() for f in main + reps if Path(f).is_file()]
    with tempfile.TemporaryDirectory(prefix="crop-config-") as tmp:
        config = Path(tmp) / "config.yaml"   # the run's config as validated: the audit's hash is the rules'
        config.write_text(yaml.safe_dump(valid, sort_keys=False))
        _run(["audit", *(["--inputs", *present] if present else [str(results)]), "--out-dir", str(results / "audit"),
              "--config", str(config), "--report-only", *audit_words], logs / "audit.log")
    say(f"  {_said(logs / 'audit.log', 'audit of ')}")
    return True
