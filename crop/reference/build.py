"""Build ``crop/reference/crop-paper.csv`` — the paper's published numbers as a tidy reference table — from
the CROP leaderboard's data (``crop-leaderboard-csv.tar.gz``; see ``../shared/reference/README.md``).

    python -m crop.reference.build [--tarball PATH] [--out PATH]

The tarball is read member by member with :mod:`tarfile` (``filter="data"`` semantics: regular files only,
no links, no absolute or ``..`` paths); nothing is extracted to disk.  One output row per published value::

    env, algo, sigma, metric, eps, value, convention, source

``env`` is this project's environment id, ``algo`` its algorithm slug (the leaderboard's ``RegPGD`` /
``SA-MDP (PGD)`` is ``SA-MDP-PGD``, ``RegCVX`` / ``SA-MDP (CVX)`` is ``SA-MDP-CVX``), ``source`` the member's
path in the tarball.  Metrics:

=========================  ============================================================================
mean_radius_certified      LoAct (``Interactive_LoAct``): the mean over time steps t of the published
                           per-step mean radius y_t, which averages over the episodes *certified* at step
                           t (uncertified steps were dropped; a step no episode certified reads 0).
                           convention ``certified_only``; no ε.
benign_return              ``Interactive_LoAct_benign``: the smoothed policy's return at σ = x; no ε.
expectation_bound          ``Interactive_GRe_mean`` (J̲_E), linear interpolation of the published curve.
percentile_bound           ``Interactive_GRe_median`` (J̲_p, p = 50 %), linear interpolation.
lore_bound                 ``Interactive_LoRe`` (J̲): a step function of ε, the value of the last
                           published point at or below ε.
pgd_global_mean            ``Interactive_GRe_mean/…_attack``: the attack curve's points as published.
pgd_global_median          ``Interactive_GRe_median/…_attack``.
pgd_local_return           ``Interactive_LoRe/…_attack``.
=========================  ============================================================================

The bound curves are dense (up to ~800 points per σ); the table keeps each at ε = f·σ for the factors
:data:`EPS_FACTORS` (every ε-factor of this project's configs) and at the ε of the published attack curve of
the same (env, algo, σ), within the curve's published range — so the bounds and the attacks can be compared
at the same ε, and a run of ``configs/paper.yaml`` finds its grid.
"""
from __future__ import annotations

import argparse
import io
import math
import re
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd

from crop.reference import PAPER_REFERENCE

__all__ = ["build_reference", "ALGO_NAMES", "ENV_DIRS", "EPS_FACTORS", "COLUMNS"]

COLUMNS = ["env", "algo", "sigma", "metric", "eps", "value", "convention", "source"]
DEFAULT_TARBALL = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "crop-leaderboard-csv.tar.gz"
ENV_DIRS = {"CartPole-v0": "CartPole-v0", "highway-fast-v0": "highway-fast-v0",
            "PongNoFrameskip-v4": "PongNoFrameskip-v4", "FreewayNoFrameskip-v4": "FreewayNoFrameskip-v4"}
ALGO_NAMES = {"StdTrain": "StdTrain", "GaussAug": "GaussAug", "AdvTrain": "AdvTrain", "RegPGD": "SA-MDP-PGD",
              "RegCVX": "SA-MDP-CVX", "SA-MDP (PGD)": "SA-MDP-PGD", "SA-MDP (CVX)": "SA-MDP-CVX",
              "RadialRL": "RadialRL", "CARRL": "CARRL", "NoisyNet": "NoisyNet", "GradDQN": "GradDQN"}
# Every ε/σ factor of configs/*.yaml (GRe, global and local attacks, tables).
EPS_FACTORS = (0.0, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 1.0, 1.5, 2.0)
KINDS = {  # folder -> (metric of the curve, metric of its _attack file, how the curve is read between points)
    "Interactive_GRe_mean": ("expectation_bound", "pgd_global_mean", "linear"),
    "Interactive_GRe_median": ("percentile_bound", "pgd_global_median", "linear"),
    "Interactive_LoRe": ("lore_bound", "pgd_local_return", "step"),
}
_MEMBER = re.compile(r"^lb/(?P<env>[^/]+)/(?P<kind>Interactive_[A-Za-z_]+)/data/data_\d+_[^/]*?_"
                     r"(?P<family>stepwise_clean|stepwise|global_mean|global_median|tree)_(?P<algo>[^/]+)/"
                     r"(?P<file>[^/]+\.csv)$")
_SIGMA = re.compile(r"_sigma-(?P<sigma>[0-9.]+)(?P<attack>_attack)?\.csv$")


class BuildError(ValueError):
    pass


def _members(tarball: Path):
    """(name, DataFrame) of every CSV member; refuses what ``filter="data"`` would refuse."""
    with tarfile.open(tarball, "r:gz") as tar:
        for m in tar:
            if m.isdir():
                continue
            tarfile.data_filter(m, "/nonexistent")  # raises on links, devices, absolute or '..' paths
            if not m.isfile() or not m.name.endswith(".csv"):
                continue
            yield m.name, pd.read_csv(io.BytesIO(tar.extractfile(m).read()))


def _curve_at(x: np.ndarray, y: np.ndarray, eps: float, how: str) -> float | None:
    if not len(x) or eps < x[0] - 1e-15 or eps > x[-1] + 1e-15:
        return None
    if how == "step":
        return float(y[np.searchsorted(x, eps + 1e-15, side="right") - 1])
    return float(np.interp(eps, x, y))


def _round(x: float) -> float:
    return float(f"{x:.12g}")


def build_reference(tarball: Path) -> pd.DataFrame:
    rows, curves, attacks = [], {}, {}
    for name, df in _members(tarball):
        m = _MEMBER.match(name)
        if m is None:
            raise BuildError(f"{name}: unexpected member (layout in ../shared/reference/README.md)")
        env, kind, algo = m["env"], m["kind"], m["algo"]
        if env not in ENV_DIRS or algo not in ALGO_NAMES:
            raise BuildError(f"{name}: unknown environment {env!r} or algorithm {algo!r}")
        env, algo, source = ENV_DIRS[env], ALGO_NAMES[algo], name[len("lb/"):]
        if kind == "Interactive_LoAct_benign":
            for x, y in zip(df["x"], df["y"]):
                rows.append((env, algo, float(x), "benign_return", math.nan, float(y), "mean_over_episodes", source))
            continue
        s = _SIGMA.search(m["file"])
        if s is None:
            raise BuildError(f"{name}: no _sigma-<σ> in the file name")
        sigma = float(s["sigma"])
        df = df.sort_values("x", kind="stable")
        if kind == "Interactive_LoAct":
            rows.append((env, algo, sigma, "mean_radius_certified", math.nan, float(df["y"].mean()),
                         "certified_only", source))
            continue
        if kind not in KINDS:
            raise BuildError(f"{name}: unknown folder {kind}")
        key = (env, algo, sigma, kind)
        if s["attack"]:
            attacks[key] = (df, source)
        else:
            curves[key] = (df, source)
    for key, (df, source) in sorted(attacks.items()):
        env, algo, sigma, kind = key
        for x, y in zip(df["x"], df["y"]):
            rows.append((env, algo, sigma, KINDS[kind][1], _round(x), float(y), "as_published", source))
    for key, (df, source) in sorted(curves.items()):
        env, algo, sigma, kind = key
        metric, _, how = KINDS[kind]
        x, y = df["x"].to_numpy(float), df["y"].to_numpy(float)
        # ε to 12 significant digits: 0.1·0.1 and a published 0.01 are one ε
        grid = {_round(f * sigma) for f in EPS_FACTORS}
        if key in attacks:
            grid |= {_round(x) for x in attacks[key][0]["x"].astype(float)}
        for eps in sorted(grid):
            v = _curve_at(x, y, eps, how)
            if v is not None:
                rows.append((env, algo, sigma, metric, eps, v,
                             "step_function" if how == "step" else "interpolated", source))
    out = pd.DataFrame(rows, columns=COLUMNS)
    out = out.sort_values(["env", "algo", "metric", "sigma", "eps"], kind="stable", na_position="first")
    dup = out.duplicated(subset=["env", "algo", "sigma", "metric", "eps"], keep="first")
    return out[~dup].reset_index(drop=True)  # a curve point that is also an attack ε is kept once


HEADER = ("# The CROP paper's published numbers (Wu et al., ICLR 2022), from the CROP leaderboard's data\n"
          "# (crop-leaderboard-csv.tar.gz). Built by `python -m crop.reference.build`; do not edit by hand.\n"
          "# Conventions: mean_radius_certified = mean over time steps of the published per-step mean radius\n"
          "# over certified steps only; bound curves read at eps = f*sigma and at the attack curve's eps.\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m crop.reference.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tarball", default=str(DEFAULT_TARBALL))
    ap.add_argument("--out", default=str(PAPER_REFERENCE))
    args = ap.parse_args(argv)
    if not Path(args.tarball).is_file():
        print(f"error: {args.tarball}: no such tarball", file=sys.stderr)
        return 2
    try:
        table = build_reference(Path(args.tarball))
    except (BuildError, tarfile.TarError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        f.write(HEADER)
        table.to_csv(f, index=False, lineterminator="\n")
    tmp.replace(out)
    print(f"{out}: {len(table)} rows, {table['env'].nunique()} environments, {table['metric'].nunique()} metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
