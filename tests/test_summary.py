"""The closing summary of a workflow run (crop/audit/summary.py, the Snakefile's onsuccess): the audit's
verdict as audit.json states it, or that there is none; where the figures, tables and report are."""
import json
import os
import time

import pandas as pd
import pytest

from crop.audit.audit import audit
from crop.audit.summary import run_summary
from crop.workflow.layout import RUN_FILES

from synthetic_results import make_results, rewrite_csv

PLAN = {"CartPole-v0": {"StdTrain": [0.1]}}


def _lines(text: str) -> dict[str, str]:
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in text.splitlines()
            if not line.startswith(" ")}


def test_summary_without_audit_says_there_is_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_results(tmp_path / "res", PLAN)
    text = run_summary("res", [tmp_path / "configs" / "quick.yaml"])
    got = _lines(text)
    assert got["Summary"] == "results in res/"
    assert got["audit"].startswith("none in res yet") and "PASS" not in text and "FAIL" not in text
    assert got["figures"].startswith("none yet") and got["tables"].startswith("none yet")
    # the report command names the run's own config, as the reader would type it (relative path)
    assert got["report"].startswith("snakemake --report report.html --configfile configs/quick.yaml ")


@pytest.mark.slow
def test_summary_states_the_audits_verdict_and_counts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = make_results(tmp_path / "res", PLAN)
    rep = audit(tmp_path / "res", tmp_path / "res" / "audit")
    assert rep["passed"]
    for name in ("a.png", "a.pdf", "b.png", "b.pdf"):
        (tmp_path / "res" / "figures").mkdir(exist_ok=True)
        (tmp_path / "res" / "figures" / name).write_bytes(b"x")
    (tmp_path / "res" / "tables").mkdir()
    (tmp_path / "res" / "tables" / "t.csv").write_text("a\n1\n")
    got = _lines(run_summary(tmp_path / "res"))
    st = rep["statuses"]
    assert got["audit"] == (f"soundness {rep['verdict']}: {rep['checked']} checks ({st['ok']} ok, 0 violation, "
                            f"0 suspicious, {st['untestable']} untestable, {st['vacuous']} vacuous), "
                            f"{len(rep['pooled'])} pooled counts (0 violation), 0 integrity problem(s) "
                            "(res/audit/audit.md)")
    assert got["figures"] == "2 PNG, 2 PDF in res/figures/"
    assert got["tables"].startswith("1 tables") and got["tables"].endswith("in res/tables/")
    assert got["report"].startswith("snakemake --report report.html ") and "--configfile" not in got["report"]

    # a planted soundness violation: the audit says FAIL, and so does the summary, with its count
    lore = next(iter(runs.values())) / RUN_FILES["lore"]
    df = pd.read_csv(lore)
    df["lower_bound"] = df["lower_bound"] + 1e6
    rewrite_csv(lore, df)
    rep = audit(tmp_path / "res", tmp_path / "res" / "audit")
    assert not rep["passed"] and rep["violations"] > 0
    text = run_summary(tmp_path / "res")
    assert _lines(text)["audit"].startswith(f"soundness FAIL: {rep['checked']} checks")
    assert f"{rep['statuses']['violation']} violation," in _lines(text)["audit"] and "pooled counts" in text
    assert "out of date" not in text


def test_summary_flags_an_audit_older_than_the_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = make_results(tmp_path / "res", PLAN)
    audit(tmp_path / "res", tmp_path / "res" / "audit")
    loact = next(iter(runs.values())) / RUN_FILES["loact"]
    later = time.time() + 5
    os.utime(loact, (later, later))
    text = run_summary(tmp_path / "res")
    assert "soundness PASS" in text and "out of date" in text and str(loact.relative_to(tmp_path)) in text


def test_summary_of_an_unreadable_audit_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "res" / "audit").mkdir(parents=True)
    (tmp_path / "res" / "audit" / "audit.json").write_text(json.dumps({"passed": True}))  # counts missing
    got = _lines(run_summary("res"))
    assert got["audit"] == "res/audit/audit.json is unreadable (KeyError): rerun the audit"
