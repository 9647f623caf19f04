"""A received results folder cannot steer its audit: what its own records say it holds is there,
and its files agree with each other.

The folder is the synthetic one (tests/synthetic_results.py) with its figures and tables drawn by
``crop aggregate``.  The sender is hostile: an edited file comes with its ``.meta.json`` hash rewritten
(:func:`synthetic_results.rewrite_csv`), so only the files' agreement can give it away."""
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from crop.audit.audit import AuditOptions, audit, verdict_line
from crop.io import meta_name, meta_path, read_json, write_json
from crop.report import aggregate as agg
from crop.workflow import layout
from crop.workflow.layout import RUN_FILES

from paths import REPO
from synthetic_results import audit_cli, make_results, rewrite_csv, runs_of

PLAN = {"CartPole-v0": {"StdTrain": [0.05, 0.1], "GaussAug": [0.1]}}
EPS_FACTORS = [0.0, 0.1]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("received")
    runs = make_results(root, PLAN)
    agg.aggregate(root, runs_of(runs), table_eps_factors=EPS_FACTORS, figures_dir=root / "figures",
                  tables_dir=root / "tables")
    return root


@pytest.fixture
def received(pristine, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(pristine, root)
    return root


def _run(root, algo="StdTrain", lab="0.1"):
    return layout.run_dir(root, "CartPole-v0", algo, lab)


def _first_paragraph(root) -> str:
    return (root / "audit" / "audit.md").read_text().split("\n\n")[1]


def _problems(rep, file) -> list[str]:
    return [p["problem"] for p in rep["integrity"] if p["file"] == str(file)]


def test_an_untouched_folder_passes(received):
    rep = audit(received, received / "audit")
    assert rep["verdict"] == "PASS" and rep["integrity"] == [] and rep["expected_missing"] == []


@pytest.mark.parametrize("forged_name", [False, True])
def test_a_file_gone_from_beside_its_meta_fails_naming_it(received, forged_name):
    gone = _run(received) / RUN_FILES["attack_global"]
    gone.unlink()   # its .meta.json, the tables and the figures made from it are left
    if forged_name:   # the record made to name a file that is there
        meta = json.loads(meta_path(gone).read_text())
        meta["output"]["file"] = RUN_FILES["loact"]
        meta_path(gone).write_text(json.dumps(meta))
    rep = audit(received, received / "audit")
    assert rep["verdict"] == "FAIL"
    assert any("attack_global.meta.json records it as written" in p for p in _problems(rep, gone))
    assert str(gone) in _first_paragraph(received) and str(gone) in verdict_line(rep)


def test_a_qrange_its_stages_read_gone_fails(received):
    d = _run(received)
    m = meta_path(d / RUN_FILES["loact"])   # LoAct records reading this folder's V range, as the workflow runs it
    meta = json.loads(m.read_text())
    meta["inputs"]["qrange"]["path"] = str(d / RUN_FILES["qrange"])
    m.write_text(json.dumps(meta))
    (d / RUN_FILES["qrange"]).unlink()
    rep = audit(received, received / "audit")
    found = _problems(rep, d / RUN_FILES["qrange"])
    assert rep["verdict"] == "FAIL" and any("loact.meta.json records it as read" in p for p in found)


def test_a_table_whose_input_is_gone_fails_naming_it(received):
    d = _run(received, "GaussAug")
    gone = d / RUN_FILES["attack_global"]
    gone.unlink()
    meta_path(gone).unlink()   # no record of it in its run folder: only the tables cite the run
    rep = audit(received, received / "audit")
    assert rep["verdict"] == "FAIL"
    assert any("input of the tables" in p and "CartPole-v0/GaussAug/sigma-0.1" in p for p in _problems(rep, gone))
    assert str(gone) in _first_paragraph(received)


@pytest.mark.parametrize("hostile", [False, True])
def test_a_figure_of_no_run_in_the_folder_fails(received, hostile):
    """A σ's run folders deleted, their figures left; a run folder named after an id crop cannot resolve here
    (whose figures cannot be named) does not switch the check off for the environments it can."""
    shutil.rmtree(_run(received, "StdTrain", "0.05"))
    if hostile:
        shutil.copytree(_run(received), received / "evilmod:CartPole-v1" / "StdTrain" / "sigma-0.1")
    rep = audit(received, received / "audit")
    lost = {Path(p["file"]).stem for p in rep["integrity"] if "its input is gone" in p["problem"]}
    assert rep["verdict"] == "FAIL" and "CartPole_stepwise_sigma-0.05" in lost
    # and the tables cite the run that is gone
    assert any("is gone: run folder" in p["problem"] for p in rep["integrity"])


def _config(tmp_path, plan) -> str:
    """A workflow config of the quick start's settings for the runs of ``plan`` = (algorithms, σ)."""
    cfg = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    env = cfg["environments"]["CartPole-v0"]
    env["algorithms"], env["sigmas"] = plan
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_a_run_the_config_expects_and_the_folder_lacks_is_a_warning_naming_it(received, tmp_path):
    # the config asks for GaussAug at σ = 0.05 as well; nothing in the folder says it ran
    cfg = _config(tmp_path, (["StdTrain", "GaussAug"], [0.05, 0.1]))
    assert audit_cli(received, "--config", cfg, "--out-dir", received / "audit") == 0
    rep = json.loads((received / "audit" / "audit.json").read_text())
    lacking = str(_run(received, "GaussAug", "0.05"))
    assert rep["verdict"] == "WARN" and rep["integrity"] == []
    assert lacking in {p["file"] for p in rep["expected_missing"]}
    assert lacking in _first_paragraph(received) and lacking in verdict_line(rep)
    # the folder's own config: nothing expected is missing
    cfg = _config(tmp_path, (["StdTrain"], [0.05, 0.1]))
    shutil.rmtree(received / "CartPole-v0" / "GaussAug")
    for f in [*(received / "figures").glob("*"), *(received / "tables").glob("*")]:
        f.unlink()
    agg.aggregate(received, ["CartPole-v0/StdTrain/sigma-0.05", "CartPole-v0/StdTrain/sigma-0.1"],
                  table_eps_factors=EPS_FACTORS, figures_dir=received / "figures", tables_dir=received / "tables")
    assert audit_cli(received, "--config", cfg, "--out-dir", received / "audit") == 0
    rep = json.loads((received / "audit" / "audit.json").read_text())
    assert rep["verdict"] == "PASS" and rep["expected_missing"] == []


def test_a_stage_the_config_expects_is_a_warning_a_partial_run_without_one_is_not(received, tmp_path):
    for d in ("figures", "tables"):
        shutil.rmtree(received / d)
    gone = _run(received) / RUN_FILES["attack_global"]
    gone.unlink()
    meta_path(gone).unlink()   # a stage never run: a partial run
    rep = audit(received, received / "audit")
    assert rep["verdict"] == "PASS" and rep["partial_runs"]
    cfg = _config(tmp_path, (["StdTrain", "GaussAug"], [0.05, 0.1]))
    rep = audit(received, received / "audit", AuditOptions(config=cfg))
    assert rep["verdict"] == "WARN" and str(gone) in {p["file"] for p in rep["expected_missing"]}
    assert "attack_global" in _first_paragraph(received)


def _edit(path, change) -> None:
    """Edit a result CSV and forge its meta's sha256 (a hostile sender)."""
    df = pd.read_csv(path)
    change(df)
    rewrite_csv(path, df)


def _disagreement(rep, summary, source) -> str:
    found = [p for p in rep["integrity"] if p["file"] == str(summary) and source.name in p["problem"]]
    assert found, rep["integrity"]
    return found[0]["problem"]


def test_an_attack_local_claiming_certified_flips_its_steps_do_not_show_fails(received):
    d = _run(received)
    _edit(d / RUN_FILES["attack_local"], lambda df: df.__setitem__("flips_certified", df["steps"]))
    rep = audit(received, received / "audit")
    assert rep["verdict"] == "FAIL"
    text = _disagreement(rep, d / RUN_FILES["attack_local"], d / RUN_FILES["attack_local_steps"])
    assert "column flips_certified" in text and "row eps = 0.0, episode = 0" in text
    assert "attack_local_steps.csv" in _first_paragraph(received)


def test_a_certified_ratio_its_loact_does_not_give_fails(received):
    d = _run(received, "GaussAug")
    _edit(d / RUN_FILES["certified_ratio"], lambda df: df.__setitem__("eta", 1.0))
    rep = audit(received, received / "audit")
    text = _disagreement(rep, d / RUN_FILES["certified_ratio"], d / RUN_FILES["loact"])
    assert rep["verdict"] == "FAIL" and "column eta" in text


def test_loact_episodes_its_loact_does_not_give_fails(received):
    d = _run(received)
    _edit(d / RUN_FILES["loact_episodes"], lambda df: df.__setitem__("return", df["return"] + 50))
    rep = audit(received, received / "audit")
    text = _disagreement(rep, d / RUN_FILES["loact_episodes"], d / RUN_FILES["loact"])
    assert rep["verdict"] == "FAIL" and "row episode = 0, column return" in text


def test_a_gre_its_returns_do_not_give_fails(received):
    d = _run(received)

    def lower(df):   # bounds still falling with ε, only lower: no soundness check objects
        df["expectation_bound"] = df["expectation_bound"] - 1.0

    _edit(d / RUN_FILES["gre"], lower)
    rep = audit(received, received / "audit")
    text = _disagreement(rep, d / RUN_FILES["gre"], d / RUN_FILES["gre_returns"])
    assert rep["verdict"] == "FAIL" and "column expectation_bound" in text


def test_gre_counts_its_returns_do_not_give_fail(received):
    d = _run(received)
    _edit(d / RUN_FILES["gre"], lambda df: df.__setitem__("m", df["m"] * 10))
    rep = audit(received, received / "audit")
    text = _disagreement(rep, d / RUN_FILES["gre"], d / RUN_FILES["gre_returns"])
    assert rep["verdict"] == "FAIL" and "column m" in text


def test_a_value_the_recomputation_cannot_use_is_a_disagreement_not_a_traceback(received):
    """A received gre.csv whose horizon is inf (its sha256 forged): the audit reports it, it does not crash."""
    d = _run(received)
    _edit(d / RUN_FILES["gre"], lambda df: df.__setitem__("horizon", float("inf")))
    rep = audit(received, received / "audit")
    text = _disagreement(rep, d / RUN_FILES["gre"], d / RUN_FILES["gre_returns"])
    assert rep["verdict"] == "FAIL" and "OverflowError" in text


def test_a_table_its_runs_do_not_give_fails(received):
    table = received / "tables" / "CartPole_benign_return.csv"
    df = pd.read_csv(table)
    df.iloc[0, 1] = float(df.iloc[0, 1]) + 1.0
    df.to_csv(table, index=False, lineterminator="\n", float_format="%.10g")
    rep = audit(received, received / "audit")
    found = _problems(rep, table)
    assert rep["verdict"] == "FAIL" and found and "run files it was made from" in found[0]
    assert f"column {df.columns[1]}" in found[0] and "CartPole-v0/StdTrain/sigma-0.1" in found[0]


def test_a_table_in_markdown_only_edited_fails(received):
    table = received / "tables" / "CartPole_reward_bounds.md"
    text = table.read_text().splitlines()
    row = next(i for i, line in enumerate(text) if line.startswith("| StdTrain"))
    text[row] = text[row].replace("StdTrain", "StdTrain*", 1)
    table.write_text("\n".join(text) + "\n")
    rep = audit(received, received / "audit")
    found = _problems(rep, table)
    assert rep["verdict"] == "FAIL" and found and f"line {row + 1}" in found[0]


@pytest.mark.parametrize("eps_index", [0, 2])
def test_the_certified_flip_count_allows_the_round_trip_only(received, eps_index):
    """A step whose radius equals ε within the CSV round trip may count either way; one clearly beyond may not
    go uncounted."""
    d = _run(received)
    steps = pd.read_csv(d / RUN_FILES["attack_local_steps"])
    eps = sorted(steps["eps"].unique())[eps_index]
    at = np.flatnonzero(np.isclose(steps["eps"], eps))[0]
    steps.loc[at, "action"] = 1 - steps.loc[at, "clean_action"]
    steps.loc[at, "radius"] = eps * (1 + 1e-11) if eps else 1e-3
    rewrite_csv(d / RUN_FILES["attack_local_steps"], steps)
    al = pd.read_csv(d / RUN_FILES["attack_local"])
    row = np.isclose(al["eps"], eps) & (al["episode"] == steps.loc[at, "episode"])
    al.loc[row, "flips"] += 1
    rewrite_csv(d / RUN_FILES["attack_local"], al)   # the certified flip not counted
    rep = audit(received, received / "audit")
    found = [p for p in rep["integrity"] if p["file"] == str(d / RUN_FILES["attack_local"])]
    assert bool(found) == (eps == 0)


def test_runs_the_tables_do_not_cite_are_no_false_alarm(received):
    """A folder shared by two configs holds complete runs the last aggregate did not tabulate: the tables are
    compared with the runs they cite, so nothing disagrees."""
    from synthetic_results import make_run

    sha = json.loads(layout.checkpoint_record(received, "CartPole-v0", "GaussAug").read_text())["sha256"]
    make_run(received, "CartPole-v0", "GaussAug", 0.05, sha, seed=7)
    rep = audit(received, received / "audit")
    assert rep["verdict"] == "PASS" and rep["integrity"] == []


def _set(path: Path, dotted: str, value) -> None:
    rec = read_json(path)
    *parents, key = dotted.split(".")
    node = rec
    for k in parents:
        node = node[k]
    node[key] = value
    write_json(path, rec)


@pytest.mark.parametrize("name,dotted,value,needle", [
    (meta_name(RUN_FILES["loact"]), None, "[1]", "(top level): [1] is not a mapping"),
    (meta_name(RUN_FILES["loact"]), None, "{not json", "not readable as JSON (JSONDecodeError"),
    (meta_name(RUN_FILES["loact"]), None, "null", "(top level): None is not a mapping"),
    (meta_name(RUN_FILES["loact"]), "settings.horizon", "5", "settings.horizon: '5' is not an integer or null"),
    (meta_name(RUN_FILES["loact"]), "inputs", 3, "inputs: 3 is not a mapping or null"),
    (meta_name(RUN_FILES["loact"]), "inputs.checkpoint", [1], "inputs.checkpoint: [1] is not a mapping or null"),
    (meta_name(RUN_FILES["attack_global"]), "output", None, "output: None is not a mapping"),
    (meta_name(RUN_FILES["attack_global"]), "seed", [1], "seed: [1] is not an integer or null"),
    (meta_name(RUN_FILES["loact"]), "v_max", "x", "v_max: 'x' is not a number or null"),
    (meta_name(RUN_FILES["loact"]), "stage", 3, "stage: 3 is not a string or null"),
    (RUN_FILES["qrange"], "target_choice", [1], "target_choice: [1] is not a mapping or null"),
    (RUN_FILES["qrange"], "provenance.settings", "x", "provenance.settings: 'x' is not a mapping"),
    ("model.json", "net_spec", "x", "net_spec: 'x' is not a mapping or null"),
    ("model.json", "sha256", 3, "sha256: 3 is not a string or null"),
])
def test_a_record_the_report_cannot_read_is_one_problem_naming_file_and_field(received, tmp_path, name, dotted,
                                                                             value, needle):
    """Records written by someone else: the run whose record it is is not read
    further; the folder's other runs are audited as before."""
    path = layout.checkpoint_record(received, "CartPole-v0", "GaussAug") if name == "model.json" \
        else _run(received, "GaussAug") / name
    if dotted is None:
        path.write_text(value)
    else:
        _set(path, dotted, value)
    assert audit_cli(received, "--out-dir", tmp_path / "a") == 1   # FAIL, not a traceback
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert [needle in p for p in _problems(rep, path)] == [True], rep["integrity"]
    assert rep["verdict"] == "FAIL" and needle in (tmp_path / "a" / "audit.md").read_text()
    assert sorted(p["run"] for p in rep["provenance"]) == [str(_run(received, "StdTrain", lab).relative_to(received))
                                                          for lab in ("0.05", "0.1")]


def test_a_field_no_schema_names_is_a_problem_of_its_run_not_a_traceback(received, tmp_path, monkeypatch):
    """The audit's last guard: whatever a received value makes a check raise is a problem of that run."""
    from crop.audit import audit as audit_module
    from crop.audit.checks import run_checks

    def checks(received, run, full):
        if "GaussAug" in run:
            raise TypeError("a received value of a type the check does not read")
        return run_checks(received, run, full)
    monkeypatch.setattr(audit_module, "run_checks", checks)
    assert audit_cli(received, "--out-dir", tmp_path / "a") == 1
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert [p["run"] for p in rep["integrity"]] == [str(_run(received, "GaussAug").relative_to(received))]
    problem = rep["integrity"][0]["problem"]
    assert "cannot be read as the audit reads it" in problem and "a type the check does not read" in problem
    assert rep["checked"] > 0 and len(rep["provenance"]) == 2


@pytest.mark.slow
def test_no_received_record_makes_the_audit_raise(received, tmp_path):
    """Every record of a run and its checkpoint replaced whole, and each of its fields (and the fields of its
    settings, inputs, output and search) set to a value of another type: the audit always ends in a verdict, the
    record's run with an integrity problem or audited as before, never a traceback."""
    from crop.audit.audit import AuditOptions, audit

    run = _run(received, "GaussAug")
    records = sorted(run.glob("*.json")) + [layout.checkpoint_record(received, "CartPole-v0", "GaussAug")]
    cases = []
    for path in records:
        rec = read_json(path)
        cases += [(path, None, text) for text in ("[1]", '"x"', "null", "{not json")]
        fields = [(k,) for k in rec] + [(k, k2) for k in ("settings", "inputs", "output", "search")
                                        if isinstance(rec.get(k), dict) for k2 in rec[k]]
        cases += [(path, f, v) for f in fields for v in ([1], "x", None)]
    raised = []
    for i, (path, field, value) in enumerate(cases):
        root = tmp_path / f"r{i}"
        shutil.copytree(received, root, ignore=shutil.ignore_patterns("audit"))
        target = root / path.relative_to(received)
        if field is None:
            target.write_text(value)
        else:
            rec = read_json(target)
            node = rec
            for k in field[:-1]:
                node = node[k]
            node[field[-1]] = value
            write_json(target, rec)
        try:
            audit(root, root / "audit", AuditOptions())
        except Exception as exc:   # noqa: BLE001 — any exception is the failure this test looks for
            raised.append(f"{path.name} {'.'.join(field or ('(whole)',))}={value!r}: {type(exc).__name__}: {exc}")
        shutil.rmtree(root)
    assert len(cases) > 200 and raised == [], raised[:5]
