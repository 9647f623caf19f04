"""Whether a received folder's files agree with each other: every summary that can be recomputed from the
per-step file it was made from is recomputed and compared.

A sender who edits a summary and forges its ``.meta.json`` hash passes the integrity check; the summary then no
longer follows from its per-step file, which the audit's checks read.  So, per run folder
(:func:`run_disagreements`):

* ``attack_local.csv`` against ``attack_local_steps.csv``: per (ε, episode) the attacked steps, the flips
  (attacked action ≠ clean action) and the certified flips (those at a step certified beyond ε), counted as
  :func:`crop.certify.attack.run_local_attack` counts them, and ``same_start_as_lore`` (episode 0);
* ``certified_ratio.csv`` against ``loact.csv``: :func:`crop.certify.loact.certified_ratio` itself (through
  :func:`crop.certify.percentile.step_ratio` for a continuous-action agent, as the stage does) over the file's radii;
* ``loact_episodes.csv`` against ``loact.csv``: per episode its return (the sum of its rewards), its steps, mean
  radius and certified fraction, as the LoAct stage sums them;
* ``gre.csv`` against ``gre_returns.csv``: :func:`crop.certify.gre.gre_bounds` itself on the returns, with the settings
  each row records (σ, H, α, ε, p, J_min, J_max);

and the aggregate tables against the run files they cite (:func:`table_disagreements`): the same function that
wrote them (:func:`crop.report.tables.env_table_texts`) on the runs their rows name, text for text.

Numbers are compared within the CSV round trip (``%.10g``: :data:`REL_TOL`), a count exactly; a certified flip
whose radius equals ε within that round trip may count either way.  A disagreement is an integrity problem
naming both files and the first row and column that differ.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from crop import columns as cols
from crop.io import ReceivedFileError, read_csv, read_received_bytes
from crop.report.records import read_table
from crop.workflow.layout import ACTION_TARGET, RUN_FILES, base_run, replicate_of, run_files, run_target
from crop.workflow.stage_table import STAGES

__all__ = ["run_disagreements", "table_disagreements", "first_difference", "REL_TOL"]

#: Two numbers agree when they differ by at most this, relative to the larger (the CSV files' ``%.10g``), or
#: by ABS_TOL near 0.
REL_TOL = 1e-8
ABS_TOL = 1e-12

_RULE = {key: row.rule for row in STAGES.values() for key in row.files}


#: What a received file's values can raise when a summary is recomputed from them (a horizon of inf, a σ of
#: text, a column missing): a disagreement to report, never a traceback of the audit.
_UNUSABLE = (ValueError, KeyError, TypeError, ArithmeticError, pd.errors.ParserError)


def run_disagreements(run_dir: Path) -> list[dict]:
    """Each summary of a run folder that its per-step file contradicts (the module docstring), where both are
    there."""
    d = Path(run_dir)
    target = run_target(d)
    run = {"target": target, "sigma": float(Path(base_run(d)).name.removeprefix("sigma-"))}
    out = []
    for summary, source, recompute in _PAIRS:
        if summary not in run_files(target) or not all((d / RUN_FILES[k]).is_file() for k in (summary, source)):
            continue
        try:
            recorded, src = read_table(d / RUN_FILES[summary]), read_table(d / RUN_FILES[source])
            found = recompute(recorded, src, run)
        except _UNUSABLE as exc:
            found = f"cannot be recomputed from it ({type(exc).__name__}: {exc})"
        if found:
            out.append(_problem(d / RUN_FILES[summary], d / RUN_FILES[source], found, _RULE[summary]))
    return out


def _problem(summary: Path, source: Path, found: str, rule: str) -> dict:
    return {"file": str(summary), "against": str(source),
            "problem": f"disagrees with {source.name}, from which it was made: {found}; the two files are not "
                       f"one run's (edited after writing?); rerun the stage (`snakemake --forcerun {rule}`)"}


def first_difference(recorded: pd.DataFrame, recomputed: pd.DataFrame, keys=()) -> str:
    """Where ``recorded`` first differs from ``recomputed`` ('' where it does not): a row count, a missing
    column, or the first row (named by its ``keys``, in their order) and column whose values differ — numbers
    beyond :data:`REL_TOL`, text exactly, empty only with empty."""
    if len(recorded) != len(recomputed):
        return f"{len(recorded)} rows, recomputed {len(recomputed)}"
    for col in recomputed.columns:
        if col not in recorded:
            return f"no column {col}"
    keys = list(keys)
    if keys:   # rows in another order say the same
        recorded, recomputed = (df.sort_values(keys, kind="stable").reset_index(drop=True)
                                for df in (recorded, recomputed))
    for i in range(len(recomputed)):
        for col in recomputed.columns:
            a, b = recorded[col].iloc[i], recomputed[col].iloc[i]
            if not _same(a, b):
                where = ", ".join(f"{k} = {recomputed[k].iloc[i]}" for k in keys) or f"{i + 1}"
                return f"row {where}, column {col}: {a} recorded, {b} recomputed"
    return ""


def _same(a, b) -> bool:
    na, nb = _missing(a), _missing(b)
    if na or nb:
        return na and nb
    if isinstance(a, (bool, np.bool_)) or isinstance(b, (bool, np.bool_)):
        return str(a).lower() == str(b).lower()
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)
    return math.isclose(fa, fb, rel_tol=REL_TOL, abs_tol=ABS_TOL) or (math.isinf(fa) and fa == fb)


def _missing(v) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _truth(values) -> np.ndarray:
    """A CSV column of booleans (read as bool, or as text where a row is empty) as a boolean array."""
    return pd.Series(values).astype(str).str.lower().eq("true").to_numpy()


def _local_attack(recorded: pd.DataFrame, steps: pd.DataFrame, run: dict) -> str:
    """attack_local.csv's counts per (ε, episode) against its attacked steps."""
    keys = [cols.EPS, cols.EPISODE]
    if not len(steps.columns):   # no step was attacked: an empty file
        steps = pd.DataFrame({c: [] for c in (cols.EPS, cols.EPISODE, cols.ACTION, cols.CLEAN_ACTION,
                                              cols.CERTIFIED, cols.RADIUS)})
    eps, radius = steps[cols.EPS].to_numpy(float), steps[cols.RADIUS].to_numpy(float)
    episode = steps[cols.EPISODE].to_numpy(int)
    flip = (steps[cols.ACTION] != steps[cols.CLEAN_ACTION]).to_numpy()
    certified_flip = flip & _truth(steps[cols.CERTIFIED])
    margin = REL_TOL * np.abs(eps)
    rows, seen = [], np.zeros(len(eps), bool)
    for e, ep in recorded[keys].itertuples(index=False):
        at = np.isclose(eps, float(e), rtol=REL_TOL, atol=ABS_TOL) & (episode == int(ep))
        seen |= at
        rows.append({cols.EPS: e, cols.EPISODE: ep, cols.STEPS: int(at.sum()), "flips": int((at & flip).sum()),
                     "strict": int((at & certified_flip & (radius > eps + margin)).sum()),
                     "loose": int((at & certified_flip & (radius > eps - margin)).sum())})
    if not seen.all():
        i = int(np.argmin(seen))
        return f"its attacked steps of ε = {eps[i]}, episode {episode[i]} have no row"
    want = pd.DataFrame(rows, columns=[*keys, cols.STEPS, "flips", "strict", "loose"])
    want[cols.SAME_START_AS_LORE] = want[cols.EPISODE] == 0
    found = first_difference(recorded, want[[*keys, cols.STEPS, "flips", cols.SAME_START_AS_LORE]], keys)
    if found:
        return found
    # a certified flip at a radius equal to ε within the round trip may count either way
    for i, (rec, lo, hi) in enumerate(zip(recorded[cols.FLIPS_CERTIFIED], want["strict"], want["loose"])):
        if not lo <= int(rec) <= hi:
            return (f"row eps = {want[cols.EPS].iloc[i]}, episode = {want[cols.EPISODE].iloc[i]}, column "
                    f"{cols.FLIPS_CERTIFIED}: {rec} recorded, {lo if lo == hi else f'{lo} to {hi}'} recomputed")
    return ""


def _per_step(loact: pd.DataFrame, target: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per step as LoAct's summaries count them, the step rows with their reward) of loact.csv: a
    continuous-action agent's rows are per step and action dimension (:func:`crop.certify.percentile.step_ratio`)."""
    if target != ACTION_TARGET:
        return loact, loact
    from crop.certify.percentile import step_ratio

    return step_ratio(loact), loact.drop_duplicates([cols.EPISODE, cols.STEP])


def _certified_ratio(recorded: pd.DataFrame, loact: pd.DataFrame, run: dict) -> str:
    """certified_ratio.csv against :func:`crop.certify.loact.certified_ratio` of loact.csv over the file's radius grid
    (σ·linspace(0, 4, n) as the stage wrote it, where the file's r are those within the round trip)."""
    from crop.certify.loact import certified_ratio

    steps, _ = _per_step(loact, run["target"])
    grid = np.array(list(dict.fromkeys(recorded[cols.R].to_numpy(float))))
    exact = run["sigma"] * np.linspace(0, 4, len(grid))
    if len(grid) and np.allclose(exact, grid, rtol=REL_TOL, atol=ABS_TOL):
        grid = exact
    # a radius equal to a grid point within the round trip may count either way: both ends of that doubt
    lo, hi = (certified_ratio(steps.assign(**{cols.RADIUS: steps[cols.RADIUS].to_numpy(float) * f}), grid)
              for f in (1 - REL_TOL, 1 + REL_TOL))
    keys = [cols.R, cols.EPISODE]
    found = first_difference(recorded, lo[keys] if len(lo) else pd.DataFrame(columns=keys), keys)
    if found:
        return found
    recorded, lo, hi = (df.sort_values(keys, kind="stable").reset_index(drop=True) for df in (recorded, lo, hi))
    for i in range(len(lo)):
        a = float(recorded[cols.ETA].iloc[i])
        low, high = float(lo[cols.ETA].iloc[i]), float(hi[cols.ETA].iloc[i])
        if not (min(low, high) - ABS_TOL <= a <= max(low, high) + ABS_TOL or math.isclose(a, low, rel_tol=REL_TOL)):
            return (f"row r = {recorded[cols.R].iloc[i]}, episode = {recorded[cols.EPISODE].iloc[i]}, column "
                    f"{cols.ETA}: {a} recorded, {low} recomputed")
    return ""


def _loact_episodes(recorded: pd.DataFrame, loact: pd.DataFrame, run: dict) -> str:
    """loact_episodes.csv per episode: the sum of its rewards in step order, its steps, mean radius and certified
    fraction, from loact.csv."""
    steps, rewards = _per_step(loact, run["target"])
    rows = []
    for ep in recorded[cols.EPISODE]:
        g, r = steps[steps[cols.EPISODE] == ep], rewards[rewards[cols.EPISODE] == ep]
        row = {cols.EPISODE: ep, cols.STEPS: len(g)}
        if "reward" in r:
            ret = 0.0
            for v in r.sort_values(cols.STEP)["reward"]:   # summed in step order, as the episode ran
                ret += float(v)
            row[cols.RETURN] = ret
        if len(g):
            row["mean_radius"] = float(g[cols.RADIUS].to_numpy(float).mean())
            row["certified_fraction"] = float(_truth(g[cols.CERTIFIED]).mean())
        rows.append(row)
    missing = sorted(set(steps[cols.EPISODE]) - set(recorded[cols.EPISODE]))
    if missing:
        return f"its steps of episode {missing[0]} have no row"
    want = pd.DataFrame(rows)
    return first_difference(recorded, want[[c for c in want.columns if c in recorded]], [cols.EPISODE])


def _gre(recorded: pd.DataFrame, returns: pd.DataFrame, run: dict) -> str:
    """gre.csv against :func:`crop.certify.gre.gre_bounds` of gre_returns.csv with the settings its rows record."""
    from crop.certify.gre import gre_bounds

    if not len(recorded):
        return "" if not len(returns) else "no bound for the returns"
    first = recorded.iloc[0]
    want = gre_bounds(returns[cols.RETURN].to_numpy(float), sigma=float(first[cols.SIGMA]),
                      horizon=int(first[cols.HORIZON]), alpha=float(first[cols.ALPHA]),
                      eps_grid=list(dict.fromkeys(recorded[cols.EPS].to_numpy(float))),
                      percentiles=list(dict.fromkeys(recorded[cols.P].to_numpy(float))),
                      j_min=float(first[cols.J_MIN]), j_max=float(first[cols.J_MAX]))
    if cols.EXPECTATION_BOUND_RAW not in recorded:
        # a gre.csv of a release before the raw column held Theorem 2's value itself as its expectation bound
        want = want.assign(**{cols.EXPECTATION_BOUND: want[cols.EXPECTATION_BOUND_RAW]})
        want = want.drop(columns=cols.EXPECTATION_BOUND_RAW)
    return first_difference(recorded, want, [cols.EPS, cols.P])


#: (summary, the per-step file it is made from, the comparison), by their keys in :data:`RUN_FILES`.
_PAIRS = (("attack_local", "attack_local_steps", _local_attack),
          ("certified_ratio", "loact", _certified_ratio),
          ("loact_episodes", "loact", _loact_episodes),
          ("gre", "gre_returns", _gre))


def table_disagreements(results: Path, runs) -> list[dict]:
    """Each table in ``results/tables`` whose files differ from what :func:`crop.report.tables.env_table_texts`
    writes for the runs its environment's tables cite (:func:`crop.audit.completeness.table_runs`, with their
    replicates) at the ε factors its reward-bounds table shows: one problem per table, at its first differing
    file (CSV, Markdown, LaTeX).  Nothing for an environment without that table, or whose tables cite a run
    that is absent or incomplete (a lost input: :func:`crop.audit.completeness.report_inputs_missing`) or
    cannot be read whole (an integrity problem of the run)."""
    from crop.audit.completeness import folder_plan, table_runs
    from crop.envs import env_spec
    from crop.report.integrity import IntegrityError
    from crop.report.metrics import load_runs, parse_run
    from crop.report.tables import env_table_texts
    from crop.workflow.layout import absent_skippable

    results = Path(results)
    tables = results / "tables"
    complete = [r for r in runs if not replicate_of(r)
                and all((results / r / f).is_file()
                        for f in run_files(run_target(r), absent_skippable(results / r)).values())]
    plan = folder_plan(results, [r for r in runs if not replicate_of(r)])
    out = []
    for env in sorted({parse_run(r)[0] for r in complete} & set(plan)):
        paper = env_spec(env).paper_name
        bounds = tables / f"{paper}_reward_bounds.csv"
        cited = {r for f in sorted(tables.glob(f"{paper}_*.csv")) for r in table_runs(f, env, plan)}
        if not bounds.is_file() or not cited or not cited <= set(complete):
            continue
        mine = sorted(cited)   # the runs the tables were made from (a folder may hold others, of another config)
        mine += [r for r in runs if replicate_of(r) and any(r.startswith(m + "/") for m in mine)]
        try:
            factors = _eps_factors(read_csv(bounds, root=results))
            texts = env_table_texts(env, load_runs(results, mine), factors)
        except (IntegrityError, FileNotFoundError):
            continue   # a run that cannot be read whole: its integrity problem is reported with the run
        except _UNUSABLE as exc:
            out.append({"file": str(bounds), "against": str(results / mine[0]),
                        "problem": f"cannot be recomputed from the runs it cites ({type(exc).__name__}: {exc})"})
            continue
        reported = set()
        for name, text in texts.items():
            f, stem = tables / name, name.rsplit(".", 1)[0]
            if stem in reported or not f.is_file() or _text(f, results) == text:
                continue
            reported.add(stem)
            out.append({"file": str(f), "against": ", ".join(str(results / r) for r in mine),
                        "problem": f"disagrees with the run files it was made from ({', '.join(mine)}): "
                                   f"{_text_difference(f, text)}; rerun the aggregate "
                                   "(`snakemake --forcerun aggregate`)"})
    return out


def _eps_factors(bounds: pd.DataFrame) -> list[float]:
    """The ε/σ factors (config ``report.table_eps_factors``) of a reward-bounds table, in its order."""
    if not len(bounds):
        return []
    return list(dict.fromkeys(float(f"{e / s:.10g}") for e, s in zip(bounds[cols.EPS], bounds[cols.SIGMA])))


def _text(path: Path, root: Path | None = None) -> str:
    """A received table's text (:func:`crop.io.read_received_bytes`); a file that cannot be read that way reads
    as a line naming why, which differs from any table."""
    try:
        return read_received_bytes(path, kind="text", root=root).decode("utf-8", errors="replace")
    except (ReceivedFileError, OSError) as exc:
        return f"(not read: {exc})"


def _text_difference(path: Path, text: str) -> str:
    """The first row and column where a table file differs from its recomputed text: a CSV's cells within the
    round trip (:func:`first_difference`), any other file's first differing line."""
    import io

    if path.suffix == ".csv":
        try:
            want = pd.read_csv(io.StringIO(text))
            found = first_difference(read_csv(path), want, [c for c in ("algo", "sigma", "eps") if c in want])
        except (ValueError, pd.errors.ParserError):
            found = ""
        if found:
            return found
    have, want = _text(path).splitlines(), text.splitlines()
    for i, (a, b) in enumerate(zip(have, want)):
        if a != b:
            return f"line {i + 1}: {a!r} recorded, {b!r} recomputed"
    return f"{len(have)} lines, recomputed {len(want)}"
