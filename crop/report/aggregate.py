"""``crop aggregate``: every figure and table of a results folder, from the per-run result files (reads
results only).

:func:`aggregate` loads the runs (:func:`crop.report.metrics.load_runs`, integrity checked, replicates beside
their run), draws the figures (:mod:`crop.report.figures`) and writes the tables (:mod:`crop.report.tables`)
that :func:`crop.workflow.layout.aggregate_files` names for them, and nothing else.  Colours and markers:
:mod:`crop.report.style`.
"""
from __future__ import annotations

from pathlib import Path

import seaborn as sns

from crop.report.figures import iter_env_figures, lore_skip, save_figure
from crop.report.metrics import load_runs
from crop.report.style import register_labels, series_order
from crop.report.tables import write_env_tables
from crop.workflow.layout import aggregate_files, needs_frames, split_run_algo

__all__ = ["aggregate"]


def aggregate(results: Path, runs, *, table_eps_factors, figures_dir: Path, tables_dir: Path) -> list[Path]:
    """Write every figure and table of :func:`crop.workflow.layout.aggregate_files` for ``runs``, and nothing else.
    Replicate folders among ``runs`` (``ENV/ALGO/sigma-S/rep-K``, config ``replicates``) are read beside
    their run: the tables then show the mean over replicates and its interval."""
    data = load_runs(results, runs)
    register_labels(split_run_algo(k[1])[0] for k in data)  # labels of your own: colours in a fixed order
    figures_dir, tables_dir = Path(figures_dir), Path(tables_dir)
    envs = sorted({k[0] for k in data})
    plan = {}
    for env in envs:
        plan[env] = (series_order(k[1] for k in data if k[0] == env),
                     sorted({k[2] for k in data if k[0] == env}, key=float), lore_skip(env, data))
        for (e, _algo, _lab), d in data.items():
            if e == env and needs_frames(env) and not d["frames_path"].is_file():
                raise FileNotFoundError(f"{d['frames_path']}: missing (the Pong periodic-pattern figure needs "
                                        "the frames LoAct records for Atari runs)")
    figures_dir.mkdir(parents=True, exist_ok=True)
    tables_dir.mkdir(parents=True, exist_ok=True)
    sns.set_theme(style="whitegrid", context="paper")
    written = []
    for env in envs:
        for stem, fig in iter_env_figures(env, data):
            written += save_figure(fig, figures_dir, stem)
        written += write_env_tables(env, data, tables_dir, table_eps_factors)
    expected = set(aggregate_files(figures_dir, tables_dir, plan))
    if set(written) != expected or len(written) != len(expected):
        raise RuntimeError(f"aggregate wrote {sorted(map(str, set(written) - expected))} beyond the layout and "
                           f"missed {sorted(map(str, expected - set(written)))}")
    return written
