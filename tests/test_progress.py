"""Progress in the logs: with stderr not a terminal, a long loop writes whole lines with
its position, rate and ETA at the configured interval, so `tail -f` on a Snakemake log shows where it is."""
import re
import time

import pytest

from crop.progress import pbar


@pytest.fixture
def log(capsys):
    """What the loop writes to stderr, which is not a terminal under pytest's capture (as in a rule's log)."""
    import sys

    assert not sys.stderr.isatty()

    class _Read:
        def getvalue(self):
            return capsys.readouterr().err

    return _Read()


def test_a_loop_writes_lines_with_position_rate_and_eta_to_a_log(log):
    for _ in pbar(range(6), desc="LoAct σ=0.1", interval=0.05):
        time.sleep(0.03)
    text = log.getvalue()
    lines = text.splitlines()
    assert "\r" not in text
    progress = [ln for ln in lines if re.match(r"LoAct σ=0\.1: [1-5]/6 it \(\d+ %\) \[", ln)]
    assert len(progress) >= 2, lines       # several intermediate positions, not one line at the end
    assert all(re.search(r"\d+\.\d+it/s\]$", ln) and " left, " in ln for ln in progress), progress
    assert lines[-1].startswith("LoAct σ=0.1: 6/6 it (100 %)")


def test_the_interval_bounds_the_number_of_lines(log, monkeypatch):
    monkeypatch.setenv("CROP_PROGRESS_INTERVAL", "3600")
    bar = pbar(desc="LoRe σ=0.1", unit="node")
    for _ in range(200):
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("LoRe σ=0.1: 200 node [")  # the start and the end


def test_progress_false_is_silent(log):
    for _ in pbar(range(50), desc="quiet", progress=False, interval=0):
        pass
    assert log.getvalue() == ""


def test_a_postfix_does_not_print_out_of_schedule(log, monkeypatch):
    """Training sets a postfix at every evaluation: that must not write a line (it wrote one per call, ~1/s,
    each with the position and ETA of the last scheduled line)."""
    monkeypatch.setenv("CROP_PROGRESS_INTERVAL", "3600")
    bar = pbar(range(300), desc="train CartPole-v0 StdTrain")
    for i in bar:
        if i % 5 == 0:
            bar.set_postfix(quick=float(i), recent=1.0)
            bar.set_description("train CartPole-v0 StdTrain")
    bar.close()
    lines = log.getvalue().splitlines()
    assert 2 <= len(lines) <= 3, lines  # the start and the end (tqdm repeats the last on close)
    assert lines[0].startswith("train CartPole-v0 StdTrain: 0/300") and "300/300" in lines[-1]
    assert "quick=295" in lines[-1]  # the postfix shows on the scheduled lines


def test_positions_move_between_lines(log):
    bar = pbar(range(40), desc="train", interval=0.05)
    for i in bar:
        time.sleep(0.01)
        bar.set_postfix(step=i)
    bar.close()
    positions = [int(m.group(1)) for m in re.finditer(r"^train: (\d+)/40", log.getvalue(), re.M)]
    assert len(positions) >= 3 and positions == sorted(positions)
    assert len(set(positions)) >= 3, positions  # the position moves: not the frozen one of the last line
