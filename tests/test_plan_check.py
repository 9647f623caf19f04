"""benchmarks/plan_check.py tells a job's start from its work: the benchmark's wall time less the stage's own
recorded ``runtime_s`` is the start, each judged against its own part of the prediction."""
import importlib.util
import json
import re

from crop.workflow import layout

from paths import REPO


def _plan_check():
    spec = importlib.util.spec_from_file_location("plan_check", REPO / "benchmarks" / "plan_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_slow_start_is_reported_apart_from_the_work(tmp_path, capsys):
    results = tmp_path / "res"
    run = layout.run_dir(results, "CartPole-v0", "StdTrain", "0.05")
    run.mkdir(parents=True)
    (run / "gre.meta.json").write_text(json.dumps({"runtime_s": 1.5}))
    bench = results / "benchmarks" / run.relative_to(results) / "gre.tsv"
    bench.parent.mkdir(parents=True)
    bench.write_text("s\th:m:s\tmax_rss\tcpu_time\n31.5\t0:00:31\t100\t30.0\n")   # a start of 30 s: a loaded machine
    _plan_check().main([str(results), "--configfile", str(REPO / "configs" / "quickstart.yaml"), "--goal", "0"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("gre ") and "StdTrain" in line and "0.05" in line)
    *_, start_pred, start, work_pred, work = row.split()
    assert (float(start), float(work)) == (30.0, 1.5)
    assert float(start_pred) > 0 and float(work_pred) > 0
    assert "1 stage jobs" in out and "apart (1 jobs with a recorded runtime): the work 100% within" in out
    took = float(re.search(r"the start took ([0-9.]+)x", out).group(1))
    assert abs(took - 30.0 / float(start_pred)) < 0.1 * took
