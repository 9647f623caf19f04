"""``crop calibrate`` on a busy machine against a quiet one: the unit costs are CPU seconds of the measured work
(crop.workflow.calibrate), so processes beside it should not inflate them.

Runs ``crop calibrate --device cpu`` for the environments given, first as the machine is, then with ``--busy``
processes spinning beside it (as many as the cores by default), and prints every unit's ratio busy / quiet with
the load averages the two calibrations recorded.  Goal: every unit within 1.3x (both ways).

    python benchmarks/calibrate_load.py [--env CartPole-v0 highway-fast-v0] [--busy 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL = 1.3


def _spin() -> None:
    while True:
        pass


def _calibrate(envs, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "crop", "calibrate", "--device", "cpu", "--env", *envs,
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["cpu"]


def _units(table: dict) -> dict:
    out = {"start_s": table["start_s"]}
    for env, units in table["envs"].items():
        for name, value in units.items():
            if isinstance(value, dict):   # an algorithm's own units
                out.update({f"{env} {name}.{a}.{k}": v for a, us in value.items() for k, v in us.items()})
            elif not isinstance(value, bool):
                out[f"{env} {name}"] = value
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", nargs="+", default=["CartPole-v0", "highway-fast-v0"])
    ap.add_argument("--busy", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=None, help="folder for the two calibration files (default: a temporary one)")
    args = ap.parse_args(argv)
    folder = Path(args.out or tempfile.mkdtemp(prefix="crop-calibrate-load-"))
    folder.mkdir(parents=True, exist_ok=True)
    quiet = _calibrate(args.env, folder / "quiet.json")
    spinners = [mp.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    try:
        busy = _calibrate(args.env, folder / "busy.json")
    finally:
        for p in spinners:
            p.terminate()
            p.join()
    print(f"as the machine was: load average {quiet['machine'].get('load')}")
    print(f"with {args.busy} busy processes beside it: load average {busy['machine'].get('load')}")
    q, b = _units(quiet), _units(busy)
    worst = 1.0
    for name in q:
        ratio = b[name] / q[name]
        worst = max(worst, ratio, 1 / ratio)
        print(f"  {name:<52} {q[name]:>11.4g} {b[name]:>11.4g}  {ratio:5.2f}x")
    print(f"worst ratio busy / quiet: {worst:.2f}x (goal within {GOAL}x); files in {folder}")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
