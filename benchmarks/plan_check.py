"""The cost model against a finished run: per stage job, the predicted seconds (crop plan's) against the
wall and CPU seconds Snakemake measured (its ``benchmark:`` files, RESULTS/benchmarks/…/RULE.tsv), and the
fraction of jobs within 0.5–2× of their prediction.  Each job's time is also split into its start (the interpreter,
imports, loading: the benchmark's wall time less the stage's own ``runtime_s``, which its handler records in the main
output's provenance) and its work (``runtime_s``), each against its part of the prediction (``start_s`` and the rest),
so a loaded machine's slow starts are told apart from a model that misprices the work.

    python benchmarks/plan_check.py RESULTS_DIR --configfile configs/quickstart.yaml [--calibration FILE]

RESULTS_DIR is the run's results folder (the config's ``results``; give it when the run used --directory).
Exit status 1 when fewer than --goal (default 80 %) of the stage jobs are within 0.5–2× by wall time.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

from crop.io import meta_path
from crop.workflow import layout
from crop.workflow.config import load_config
from crop.workflow.cost import predict
from crop.workflow.stage_table import STAGES


def benchmark_file(results: Path, job) -> Path:
    run = layout.run_dir(results, job.env, job.algo, job.sigma, replicate=job.rep or 0)
    rel = run.relative_to(results)
    return results / "benchmarks" / rel / f"{job.rule.removesuffix('_replicate')}.tsv"


def read_benchmark(path: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of a Snakemake benchmark file (its first repetition)."""
    with open(path, newline="") as f:
        row = next(csv.DictReader(f, delimiter="\t"))
    cpu = row.get("cpu_time", "NA")
    return float(row["s"]), float(cpu) if cpu not in ("", "NA") else float("nan")


def work_seconds(results: Path, job) -> float:
    """The seconds the stage's handler measured for its own work (``runtime_s`` of its main output's provenance:
    the ``.meta.json`` beside it, or a JSON output's own ``provenance``), NaN where that record is missing."""
    row = STAGES[job.rule.removesuffix("_replicate").replace("_", "-")]
    main = layout.run_dir(results, job.env, job.algo, job.sigma, replicate=job.rep or 0) / row.outputs[0].file
    try:
        record = json.loads((main if main.suffix == ".json" else meta_path(main)).read_text())
        value = record.get("provenance", record).get("runtime_s")
        return float(value) if value is not None else math.nan
    except (OSError, ValueError, TypeError):
        return math.nan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="the finished run's results folder")
    ap.add_argument("--configfile", required=True)
    ap.add_argument("--calibration", help="calibration file (default: crop plan's)")
    ap.add_argument("--gpus", type=int, help="GPUs the run had (default: 1 unless every environment's device, else the "
                                               "config's, is cpu)")
    ap.add_argument("--goal", type=float, default=0.8, help="fraction of jobs that must be within 0.5-2x")
    ap.add_argument("--worst", type=int, default=5, help="how many of the worst jobs to list")
    args = ap.parse_args(argv)
    cfg = load_config(args.configfile)
    jobs, sources = predict(cfg, args.gpus, args.calibration)
    for dev, src in sources.items():
        print(f"unit costs ({dev}): {src}")
    rows, missing = [], 0
    for j in jobs:
        if j.env is None or j.sigma is None:   # checkpoint, aggregate, audit: no benchmark file
            continue
        path = benchmark_file(Path(args.results), j)
        if not path.is_file():
            missing += 1
            continue
        wall, cpu = read_benchmark(path)
        rows.append((j, wall, cpu, work_seconds(Path(args.results), j)))
    if not rows:
        print(f"no benchmark files under {args.results}/benchmarks for this config's stage jobs", file=sys.stderr)
        return 2
    print(f"{'rule':<22}{'env':<22}{'algo':<14}{'sigma':<8}{'pred s':>9}{'wall s':>9}{'cpu s':>9}{'wall/pred':>10}"
          f"{'start pred':>11}{'start':>7}{'work pred':>10}{'work':>8}")
    for j, wall, cpu, work in rows:
        print(f"{j.rule:<22}{j.env:<22}{j.algo:<14}{j.sigma + (f'/{j.rep}' if j.rep else ''):<8}"
              f"{j.seconds:>9.1f}{wall:>9.1f}{cpu:>9.1f}{wall / j.seconds:>10.2f}"
              f"{j.start_s:>11.1f}{wall - work:>7.1f}{j.seconds - j.start_s:>10.1f}{work:>8.1f}")

    def within(col):
        return sum(0.5 <= r[col] / r[0].seconds <= 2 for r in rows) / len(rows)

    print(f"\n{len(rows)} stage jobs ({missing} without a benchmark file): {within(1):.0%} within 0.5-2x of the "
          f"prediction by wall time, {within(2):.0%} by CPU time (goal {args.goal:.0%})")
    split = [(j, wall - work, work) for j, wall, _, work in rows if not math.isnan(work)]
    if split:
        work_in = sum(0.5 <= work / (j.seconds - j.start_s) <= 2 for j, _, work in split) / len(split)
        starts = [start / j.start_s for j, start, _ in split]
        print(f"apart ({len(split)} jobs with a recorded runtime): the work {work_in:.0%} within 0.5-2x of its "
              f"prediction; the start took {statistics.median(starts):.2f}x its predicted "
              f"{statistics.median(j.start_s for j, _, _ in split):.2f} s (median; min {min(starts):.2f}, "
              f"max {max(starts):.2f})")
    per_rule = {}
    for j, wall, *_ in rows:
        per_rule.setdefault(j.rule, []).append(wall / j.seconds)
    for rule, ratios in per_rule.items():
        ratios.sort()
        print(f"  {rule:<22} {len(ratios):>4} jobs, wall/pred median {ratios[len(ratios) // 2]:.2f} "
              f"(min {ratios[0]:.2f}, max {ratios[-1]:.2f})")
    worst = sorted(rows, key=lambda r: -abs(math.log(r[1] / r[0].seconds)))[:args.worst]
    print("worst:")
    for j, wall, *_ in worst:
        print(f"  {j.rule} {j.env}/{j.algo}/sigma-{j.sigma}: predicted {j.seconds:.1f} s, took {wall:.1f} s "
              f"({wall / j.seconds:.2f}x){' — ' + j.note if j.note else ''}")
    return 0 if within(1) >= args.goal else 1


if __name__ == "__main__":
    sys.exit(main())
