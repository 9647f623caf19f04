"""Names of every file the workflow writes — one place, read by the Snakefile and the report code.

Per (env, algo, σ):   results/{env}/{algo}/sigma-{σ}/{qrange.json, loact.csv, gre.csv, lore.csv, …}
Per (env, algo):      results/{env}/{algo}/checkpoint/model.pt (+ model.json: sha256, architecture)
Figures:              results/figures/{Env}_{kind}[_sigma-{σ}].{pdf,png}  (the paper's file names)
Tables:               results/tables/{Env}_{name}.{csv,md}
Audit:                results/audit/audit.{md,json}
"""
from __future__ import annotations

from pathlib import Path

from crop.envs import env_spec

RUN_FILES = {
    "qrange": "qrange.json",
    "loact": "loact.csv",
    "loact_episodes": "loact_episodes.csv",
    "certified_ratio": "certified_ratio.csv",
    "gre": "gre.csv",
    "gre_returns": "gre_returns.csv",
    "lore": "lore.csv",
    "attack_local": "attack_local.csv",
    "attack_global": "attack_global.csv",
    "frames": "frames.npz",
}

FIGURE_FORMATS = ("pdf", "png")
TABLE_FORMATS = ("csv", "md")
TABLES = ("mean_radius", "benign_return", "reward_bounds")


def run_dir(results, env: str, algo: str, sigma_label: str) -> Path:
    return Path(results) / env / algo / f"sigma-{sigma_label}"


def checkpoint_path(results, env: str, algo: str) -> Path:
    return Path(results) / env / algo / "checkpoint" / "model.pt"


def figure_stems(env: str, sigma_labels) -> list[str]:
    s = env_spec(env)
    stems = [f"{s.clean_name}_loact_clean"]
    for lab in sigma_labels:
        stems += [f"{s.paper_name}_stepwise_sigma-{lab}", f"{s.paper_name}_certified_ratio_sigma-{lab}",
                  f"{s.paper_name}_global_mean_sigma-{lab}", f"{s.paper_name}_global_median_sigma-{lab}",
                  f"{s.paper_name}_adasearch_sigma-{lab}"]
    return stems


def figure_files(figures_dir, env: str, sigma_labels) -> list[Path]:
    return [Path(figures_dir) / f"{stem}.{fmt}" for stem in figure_stems(env, sigma_labels)
            for fmt in FIGURE_FORMATS]


def table_files(tables_dir, env: str) -> list[Path]:
    s = env_spec(env)
    return [Path(tables_dir) / f"{s.paper_name}_{name}.{fmt}" for name in TABLES for fmt in TABLE_FORMATS]
