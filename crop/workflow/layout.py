"""Names of every file the workflow writes — one place, read by the Snakefile and the report code.

Per (env, algo, σ):   results/{env}/{algo}/sigma-{σ}/{qrange.json, loact.csv, gre.csv, lore.csv, …}
                      (+ frames.npz for Atari: raw RGB frames of LoAct episode 0, read by the Pong figure)
                      Another smoothing target than q: results/{env}/{algo}@{target}/sigma-{σ}/
                      (:func:`run_dir`; no qrange.json there but for target auto, whose qrange.json
                      carries the pilot's choice, :func:`run_files`).  "@" is in no method label
                      (letters, digits and -_.+), so ``{algo}@{target}`` never names another algorithm's runs;
                      its tables and figures call it "{algo} ({target})" (:func:`series_label`).
Replicate k ≥ 1:      results/{env}/{algo}/sigma-{σ}/rep-{k}/{qrange.json, loact.csv, loact_episodes.csv, …}
                      (config ``replicates: N``; the stages of :data:`REPLICATE_STAGES` only, with the seed
                      :func:`replicate_seed`; replicate 0 is the run folder itself, so ``replicates: 1`` writes
                      exactly what a run without replicates writes)
Per (env, algo):      results/{env}/{algo}/checkpoint/model.pt (+ model.json: sha256, architecture, source)
Logs:                 results/logs/{env}/{algo}/checkpoint.log, results/logs/{env}/{algo}/sigma-{σ}/{rule}.log
                      (:func:`job_log`), results/logs/{aggregate,audit}.log
Figures:              results/figures/{Env}_{kind}[_sigma-{σ}].{pdf,png}  (the paper's file names)
Tables:               results/tables/{Env}_{name}.{csv,md,tex}
Audit:                results/audit/audit.{md,json}

``{Env}`` is the paper's spelling of the environment (``CartPole``, ``highway-fast``, ``Pong``, ``Freeway``);
``{Clean}`` is the spelling of the paper's benign-return and legend files (``Cartpole`` for CartPole, else
the same as ``{Env}``).

Figure families (:func:`figure_families`; every file as PDF and PNG), per environment:

  stepwise         {Env}_stepwise_sigma-{σ} (one σ each) and {Env}_stepwise (one panel per σ in one row, one
                   legend on top) — Fig. 1 (fig:statewise), whose rows are the multi-panel file.  The
                   multi-panel files ({Env}_stepwise, {Env}_certified_ratio, {Env}_all_bounds) show every σ
                   run except Freeway's large σ, which have their own figure (large_sigma).
  certified_ratio  {Env}_certified_ratio_sigma-{σ} and {Env}_certified_ratio — App. F.1 (fig:cert-ratio)
  global_mean      {Env}_global_mean_sigma-{σ} — Fig. 3 (fig:all-bounds), row J̲_E, PGD dashed
  global_median    {Env}_global_median_sigma-{σ} — Fig. 3, row J̲_p (p = 50 %), PGD dashed
  adasearch        {Env}_adasearch_sigma-{σ} — Fig. 3, row J̲ (LoRe), PGD dashed; none for an environment
                   whose runs are all continuous-action agents' (ALGO@action: no LoRe, :func:`has_lore`)
  all_bounds       {Env}_all_bounds: rows J̲_E, J̲_p, J̲ and a column per σ — Fig. 3 (and the CartPole /
                   highway bound grids of App. F) as one file; without the J̲ row where adasearch has none
  loact_clean      {Clean}_loact_clean, every σ run — Fig. 2 (fig:statewise-clean); with Freeway's large σ
                   in the run it is App. F.2's fig:clean-full
  legend           {Clean}_legend: the environment's algorithms (colour and marker, the same in every
                   figure of the run) and the solid/dashed key — the legend strip the paper puts above each
                   figure; the only legend file
  large_sigma      Freeway_large_sigma: rows stepwise / adasearch, a column per large σ ∈ {1.5, 2.0, 4.0}
                   that ran — App. F.2 (fig:statewise-large); its panels are also written as the ordinary
                   per-σ files Freeway_stepwise_sigma-1.5, Freeway_adasearch_sigma-1.5, …
  periodic         Pong_periodic_sigma-{σ}_{algo}: certified radius over the window of recorded steps,
                   with the game frames at marked steps below — App. F.3 (fig:pong-periodic); one per
                   algorithm and σ, because each smoothed policy plays its own episode (its own frames)
"""
from __future__ import annotations

import re
from pathlib import Path

from crop.envs import env_spec
from crop.names import ACTION_TARGET, AUTO_TARGET, TARGET_NAMES
from crop.workflow import stage_table

#: ``{key: file name}`` of a complete run folder (the stage table's outputs, crop/workflow/stage_table.py).
RUN_FILES = stage_table.RUN_FILES

# Atari LoAct runs also write the raw frames of episode 0 (``frames``: uint8 [T, 210, 160, 3],
# ``steps``: int [T]); the periodic-pattern figure is drawn from them for these environments.
FRAMES_FILE = RUN_FILES["frames"]
PERIODIC_ENVS = ("PongNoFrameskip-v4",)

# Appendix F.2: Freeway under large smoothing (σ ∈ {1.5, 2.0, 4.0}).
LARGE_SIGMAS = {"FreewayNoFrameskip-v4": (1.5, 2.0, 4.0)}

FIGURE_FORMATS = ("pdf", "png")
TABLE_FORMATS = ("csv", "md", "tex")
TABLES = ("mean_radius", "mean_radius_certified", "certified_fraction", "benign_return", "reward_bounds",
          "tightness")
FIGURE_FAMILIES = ("stepwise", "certified_ratio", "global_mean", "global_median", "adasearch", "all_bounds",
                   "loact_clean", "legend", "large_sigma", "periodic")


#: Between an algorithm and a smoothing target other than q in a run folder's name (see the docstring).
TARGET_SEP = "@"


def run_algo(algo: str, target: str = "q") -> str:
    """The run folder's algorithm component: ``algo`` for the target q, else algo@target."""
    return algo if target == "q" else f"{algo}{TARGET_SEP}{target}"


#: The targets a run folder's name spells after :data:`TARGET_SEP`: every smoothing target but q, the pilot's
#: choice (auto) and a continuous-action agent's (action).
SPELLED_TARGETS = tuple(t for t in (*TARGET_NAMES, AUTO_TARGET, ACTION_TARGET) if t != "q")


def run_algo_pattern(algos) -> str:
    """The regular expression of the run folders' algorithm components of ``algos`` (:func:`run_algo` of each
    with each target): the rules' ``{algo}`` wildcard."""
    def one_of(names):
        return "(?:" + "|".join(map(re.escape, names)) + ")"

    return f"{one_of(algos)}(?:{re.escape(TARGET_SEP)}{one_of(SPELLED_TARGETS)})?"


def split_run_algo(name: str) -> tuple[str, str]:
    """(algorithm, smoothing target) of a run folder's algorithm component (:func:`run_algo` inverted)."""
    algo, sep, target = name.partition(TARGET_SEP)
    return algo, target if sep else "q"


def series_label(name: str) -> str:
    """How tables and figures name a run folder's algorithm component: StdTrain, StdTrain (vote)."""
    algo, target = split_run_algo(name)
    return algo if target == "q" else f"{algo} ({target})"




def run_stages(target: str = "q", skip=()) -> list[str]:
    """The stages a run of ``target`` runs (the one place that decides): every row of the stage table, less
    qrange for the targets bounded in [0, 1] (probs, vote), which need no V range (auto keeps it: its pilot
    chooses the target there), less every stage that needs a finite set of actions (the row's
    ``discrete``) for a continuous-action agent's target, and less the stages its environment's config
    ``skip`` lists (:data:`SKIPPABLE`)."""
    return [name for name, row in stage_table.STAGES.items()
            if not (name == "qrange" and target not in QRANGE_TARGETS)
            and not (row.discrete and target == ACTION_TARGET) and name not in skip]


#: The stages a run may go without (an environment's config ``skip``): those a continuous-action agent's run
#: already goes without (the rows' ``discrete``), which the report and the audit read as optional, less the V
#: range that other stages read.
SKIPPABLE = tuple(name for name, row in stage_table.STAGES.items() if row.discrete and name != "qrange")


#: The targets whose runs have a qrange stage: q (the V range) and auto (the pilot's choice, and the V range
#: of a Q-network).
QRANGE_TARGETS = ("q", AUTO_TARGET)


def run_files(target: str = "q", skip=()) -> dict:
    """The files of a complete run of ``target`` without the stages ``skip``: the files of its stages
    (:func:`run_stages`)."""
    return {k: v for name in run_stages(target, skip) for k, v in stage_table.STAGES[name].files.items()}


def absent_skippable(run) -> tuple[str, ...]:
    """The :data:`SKIPPABLE` stages of which the run folder ``run`` holds no file, result or record: stages it
    went without (its config's ``skip``), which the report and the audit do not ask of it.  A stage whose
    file is gone while another record names it is :func:`crop.audit.completeness.recorded_missing`'s."""
    d = Path(run)
    return tuple(name for name in SKIPPABLE
                 if not any((d / f).exists() or (d / stage_table.meta_name(f)).exists()
                            for f in stage_table.STAGES[name].files.values()))


def run_target(run) -> str:
    """The smoothing target of a run folder ENV/ALGO[@TARGET]/sigma-S (or of one of its replicates)."""
    return split_run_algo(Path(base_run(run)).parent.name)[1]


# Stages a replicate repeats (config ``replicates``): the V-range estimate and LoAct — the cheap ones, whose
# spread over seeds (which states the episodes visit, the V range's own noise) the report's intervals show.
# GRe, LoRe and the attacks run once per (env, algo, σ), in replicate 0.
REPLICATE_STAGES = tuple(name for name, row in stage_table.STAGES.items() if row.replicate)
REPLICATE_FILES = tuple(k for name in REPLICATE_STAGES for k in stage_table.STAGES[name].files)
REPLICATE_PREFIX = "rep-"


def replicate_seed(seed: int, replicate: int = 0) -> int:
    """The base seed of replicate ``replicate``: the config's seed for replicate 0 (the run folder itself),
    an independent derived seed (:func:`crop.io.derive_seed`, below 2³¹) for every other."""
    if replicate == 0:
        return int(seed)
    from crop.io import derive_seed

    return derive_seed(seed, "replicate", int(replicate)) % (2**31)


def run_dir(results, env: str, algo: str, sigma_label: str, target: str = "q", replicate: int = 0) -> Path:
    """The folder of one run (the one place that decides): ``algo@target`` for a target other than q;
    replicate k ≥ 1 of it lives in its ``rep-{k}`` subfolder."""
    d = Path(results) / env / run_algo(algo, target) / f"sigma-{sigma_label}"
    # a string is a Snakemake wildcard ("{rep}"), never replicate 0
    return d if replicate in (0, None) else d / f"{REPLICATE_PREFIX}{replicate}"


def replicate_of(run: str | Path) -> int:
    """The replicate index of a run folder (``ENV/ALGO/sigma-S`` → 0, ``ENV/ALGO/sigma-S/rep-K`` → K)."""
    name = Path(run).name
    return int(name[len(REPLICATE_PREFIX):]) if name.startswith(REPLICATE_PREFIX) else 0


def base_run(run: str | Path) -> str:
    """The ``ENV/ALGO/sigma-S`` folder a replicate folder belongs to (itself for replicate 0)."""
    p = Path(run)
    return str(p.parent if replicate_of(p) else p)


def checkpoint_path(results, env: str, algo: str) -> Path:
    return Path(results) / env / algo / "checkpoint" / "model.pt"


def checkpoint_record(results, env: str, algo: str) -> Path:
    return checkpoint_path(results, env, algo).with_suffix(".json")


def job_log(results, rule: str, env: str, algo: str, sigma_label: str | None = None, replicate=0,
            kind: str = "logs", ext: str = "log") -> Path:
    """A job's log (``kind`` benchmarks, ``ext`` tsv: its benchmark file): ``results/logs/{env}/{algo}/{rule}.log`` for
    a checkpoint job, ``results/logs/{env}/{algo}/sigma-{σ}[/rep-{k}]/{rule}.log`` for a run's stage (``rule``: the
    stage's, replicates included)."""
    if sigma_label is None:
        return Path(results) / kind / env / algo / f"{rule}.{ext}"
    return run_dir(Path(results) / kind, env, algo, sigma_label, replicate=replicate) / f"{rule}.{ext}"


def needs_frames(env: str) -> bool:
    """Whether the report reads ``frames.npz`` of this environment's runs (the Pong periodic figure)."""
    return env in PERIODIC_ENVS


def has_lore(algos, skip=()) -> bool:
    """Whether an environment's runs ``algos`` (run folder names, ``ALGO`` or ``ALGO@TARGET``) include one with
    LoRe: not where its config skips LoRe (``skip``), nor where every one is a continuous-action agent's
    (``ALGO@action``), whose stages leave it out (:func:`run_stages`); its adasearch figures are then not drawn
    at all, and all_bounds has no LoRe row.  Without ``algos`` (not known): True unless skipped."""
    algos = list(algos)
    return "lore" not in skip and (not algos or any(split_run_algo(a)[1] != ACTION_TARGET for a in algos))


def large_sigma_labels(env: str, sigma_labels) -> list[str]:
    """The run's σ labels that belong to the paper's large-σ study of ``env`` (in the paper's order)."""
    large = LARGE_SIGMAS.get(env, ())
    return [lab for lab in sorted(sigma_labels, key=float) if any(abs(float(lab) - s) < 1e-12 for s in large)]


def main_sigma_labels(env: str, sigma_labels) -> list[str]:
    """The σ of the main-text multi-panel figures: every σ run except the large-σ study's (App. F.2), which
    has its own figure — unless only large σ ran."""
    labs = sorted(sigma_labels, key=float)
    large = set(large_sigma_labels(env, labs))
    return [lab for lab in labs if lab not in large] or labs


def figure_families(env: str, sigma_labels, algos=(), skip=()) -> dict[str, list[str]]:
    """Figure stems of one environment by family (see the module docstring); ``algos`` names the
    algorithms run (the periodic-pattern figure depends on them, and adasearch, which an environment whose runs
    are all continuous-action agents' has none of, nor one whose config skips LoRe: :func:`has_lore`)."""
    s = env_spec(env)
    p, c = s.paper_name, s.clean_name
    labs = sorted(sigma_labels, key=float)
    fam = {
        "stepwise": [f"{p}_stepwise_sigma-{lab}" for lab in labs] + [f"{p}_stepwise"],
        "certified_ratio": [f"{p}_certified_ratio_sigma-{lab}" for lab in labs] + [f"{p}_certified_ratio"],
        "global_mean": [f"{p}_global_mean_sigma-{lab}" for lab in labs],
        "global_median": [f"{p}_global_median_sigma-{lab}" for lab in labs],
        "adasearch": [f"{p}_adasearch_sigma-{lab}" for lab in labs] if has_lore(algos, skip) else [],
        "all_bounds": [f"{p}_all_bounds"],
        "loact_clean": [f"{c}_loact_clean"],
        "legend": [f"{c}_legend"],
        "large_sigma": [f"{p}_large_sigma"] if large_sigma_labels(env, labs) else [],
        "periodic": ([f"{p}_periodic_sigma-{lab}_{a}" for lab in labs for a in algos]
                     if needs_frames(env) else []),
    }
    assert tuple(fam) == FIGURE_FAMILIES
    return fam


def figure_stems(env: str, sigma_labels, algos=(), skip=()) -> list[str]:
    return [stem for stems in figure_families(env, sigma_labels, algos, skip).values() for stem in stems]


def figure_files(figures_dir, env: str, sigma_labels, algos=(), skip=()) -> list[Path]:
    return [Path(figures_dir) / f"{stem}.{fmt}" for stem in figure_stems(env, sigma_labels, algos, skip)
            for fmt in FIGURE_FORMATS]


def table_files(tables_dir, env: str) -> list[Path]:
    s = env_spec(env)
    return [Path(tables_dir) / f"{s.paper_name}_{name}.{fmt}" for name in TABLES for fmt in TABLE_FORMATS]


def aggregate_files(figures_dir, tables_dir, plan: dict) -> list[Path]:
    """Every file ``crop aggregate`` writes for ``plan`` = {env: (algos, sigma_labels[, skip])}, nothing else
    (``skip``: the stages no run of the environment has, its config's ``skip``)."""
    out = []
    for env, (algos, labels, *skip) in plan.items():
        out += figure_files(figures_dir, env, labels, algos, *skip)
        out += table_files(tables_dir, env)
    return out
