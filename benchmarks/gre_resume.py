"""What GRe's resume file costs and keeps, on a quick-start-sized CartPole job (not a test).

    python benchmarks/gre_resume.py [--m 10000] [--repeats 3] [--kill-at 0.6]

The policy is a 128×128 MLP (the quick start's architecture) that balances the pole: every trajectory runs the
whole horizon H = 200, as a trained policy's do.  Lines:

* ``overhead_m<M>``: CPU seconds of :func:`crop.certify.gre.sample_randomized_returns` without a resume file and
  with one (its blocks saved after each block), median of ``--repeats`` alternating runs, and their ratio;
  ``overhead_m<10M>`` the same at ten times m, where CartPole runs 9 blocks of 12,288, beside ``one_block``:
  the same m in one block (no block is kept then);
* ``kill_m<10M>``: ``crop gre`` at ten times m run to the end, then run again and sent SIGTERM after
  ``--kill-at`` of the first run's wall time, then rerun: the trajectories the killed run kept, the CPU seconds
  of each process, and the fraction of the work kept (1 − (killed + rerun − uninterrupted) / killed's CPU).
  The returns are compared: ``identical`` when the resumed gre_returns.csv equals the uninterrupted one.

CPU seconds are the process's own and its children's (``resource``); note the load (``uptime``) beside them.
"""
from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from crop.certify.gre import GReSettings, sample_randomized_returns
from crop.certify.gre_resume import GReResume
from crop.envs import ENV_SPECS
from crop.io import sha256_file, write_json
from crop.models import build_network, save_network

SPEC = {"arch": "mlp", "in": 4, "hidden": [128, 128], "out": 2}


def balancer():
    """A 128×128 MLP Q-network that pushes towards the side of 0.1·x + 0.5·ẋ + θ + θ̇ (keeps the pole up)."""
    net = build_network(SPEC)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        w = torch.tensor([0.1, 0.5, 1.0, 1.0])
        net[0].weight[0], net[0].weight[1] = w, -w
        net[2].weight[0, 0] = net[2].weight[1, 1] = 1.0
        net[4].weight[1, 0] = net[4].weight[0, 1] = 1.0
    return net.eval()


def _cpu(settings, resume) -> float:
    net = balancer()
    t = time.process_time()
    sample_randomized_returns("CartPole-v0", net, settings, progress=False, resume=resume)
    return time.process_time() - t


def overhead(m: int, repeats: int, folder: Path) -> None:
    """CPU seconds at m trajectories in CartPole's blocks (those ``crop gre`` runs), without and with saves."""
    settings = GReSettings(0.05, m, 200, 1.0, seed=0, env_seed=1, batch=ENV_SPECS["CartPole-v0"].gre_block(m))
    plain, saved = [], []
    for i in range(repeats):
        plain.append(_cpu(settings, None))
        path = folder / f"overhead{i}.resume"
        saved.append(_cpu(settings, GReResume(path, (0.0, 200.0))))
        path.unlink()
    a, b = statistics.median(plain), statistics.median(saved)
    print(f"overhead_m{m}: {b / a:.3f}  # CPU s without {a:.2f} ({plain}), with saves {b:.2f} ({saved})", flush=True)
    if settings.batch < m:
        one = statistics.median(_cpu(replace(settings, batch=m), None) for _ in range(repeats))
        print(f"one_block_m{m}: {a / one:.3f}  # CPU s in blocks of {settings.batch} {a:.2f}, in one block "
              f"{one:.2f}", flush=True)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd, kill_after=None):
    """CPU seconds and wall seconds of ``cmd``, sent SIGTERM after ``kill_after`` seconds if given."""
    before, t = _children_cpu(), time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        try:
            p.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGTERM)
    err = p.communicate()[1]
    return _children_cpu() - before, time.time() - t, p.returncode, err


def kill_and_resume(m: int, kill_at: float, folder: Path) -> None:
    save_network(balancer(), folder / "model.pt")
    write_json(folder / "model.json", {"env": "CartPole-v0", "algo": "StdTrain", "profile": "vector", "net_spec": SPEC,
                                       "sha256": sha256_file(folder / "model.pt")})

    def cmd(out):
        return [sys.executable, "-m", "crop", "gre", "--env", "CartPole-v0", "--algo", "StdTrain", "--sigma", "0.05",
                "--checkpoint", str(folder / "model.pt"), "--m", str(m), "--horizon", "200", "--no-progress",
                "--out", str(folder / out / "gre.csv"), "--out-returns", str(folder / out / "gre_returns.csv")]

    full_cpu, full_wall, rc, err = _run(cmd("clean"))
    assert rc == 0, err
    killed_cpu, _, rc, err = _run(cmd("killed"), kill_after=kill_at * full_wall)
    kept = next((line for line in err.splitlines() if "trajectories saved" in line), f"rc {rc}: {err[-300:]}")
    rerun_cpu, _, rc, err = _run(cmd("killed"))
    assert rc == 0, err
    same = (folder / "clean/gre_returns.csv").read_bytes() == (folder / "killed/gre_returns.csv").read_bytes() and \
        (folder / "clean/gre.csv").read_bytes() == (folder / "killed/gre.csv").read_bytes()
    wasted = killed_cpu + rerun_cpu - full_cpu
    print(f"kill_m{m}_at_{kill_at:g}: kept {1 - wasted / killed_cpu:.2f} of the killed run's work  # uninterrupted "
          f"{full_cpu:.2f} CPU s ({full_wall:.1f} s wall), killed {killed_cpu:.2f}, rerun {rerun_cpu:.2f}; {kept}; "
          f"{'identical' if same else 'DIFFERENT'} gre.csv and gre_returns.csv", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kill-at", type=float, default=0.6)
    ap.add_argument("--skip-overhead", action="store_true", help="leave out the run at m")
    ap.add_argument("--skip-kill", action="store_true", help="leave out the kill and rerun")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        if not args.skip_overhead:
            overhead(args.m, args.repeats, Path(d))
        overhead(10 * args.m, args.repeats, Path(d))
        if not args.skip_kill:
            kill_and_resume(10 * args.m, args.kill_at, Path(d))


if __name__ == "__main__":
    main()
