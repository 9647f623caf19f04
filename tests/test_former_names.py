"""LoAct's smoothed-output columns under their former names (``q_top``, …, as older folders wrote them for every
target): the stages write the current names, and a folder with the former header is read, compared and audited
exactly as the same folder with the current one."""
import shutil

from crop import columns as cols
from crop.audit.audit import AuditOptions, audit
from crop.io import meta_path, read_json, sha256_file, write_json
from crop.report.records import read_table, same_table
from crop.workflow.layout import RUN_FILES, run_dir

from synthetic_results import make_results, tiny_real_run

PLAN = {"CartPole-v0": {"StdTrain": [0.1]}}
#: The tables that hold the smoothed-output columns.
TABLES = ("loact", "lore_states", "attack_local_steps")


def _former_header(path):
    """Rewrite ``path``'s header with the former names, its provenance hash updated (as an older run wrote it)."""
    head, rest = path.read_text().split("\n", 1)
    former = {new: old for old, new in cols.FORMER_NAMES.items()}
    old = ",".join(former.get(n, n) for n in head.split(","))
    assert old != head
    path.write_text(old + "\n" + rest)
    meta = read_json(meta_path(path))
    meta["output"].update(sha256=sha256_file(path), bytes=path.stat().st_size)
    write_json(meta_path(path), meta)


def test_the_loact_stage_writes_the_current_names(tmp_path):
    d = tiny_real_run(tmp_path / "results")
    header = (d / RUN_FILES["loact"]).read_text().split("\n", 1)[0].split(",")
    assert header[-4:] == [cols.SMOOTHED_TOP, cols.SMOOTHED_RUNNER_UP, cols.SMOOTHED_TOP_LOWER,
                           cols.SMOOTHED_OTHERS_UPPER_MAX]
    assert not set(header) & set(cols.FORMER_NAMES)


def test_a_former_header_is_read_and_audited_as_the_current_one(tmp_path):
    new, old = tmp_path / "new", tmp_path / "old"
    make_results(new, PLAN)
    shutil.copytree(new, old)
    d_new, d_old = run_dir(new, "CartPole-v0", "StdTrain", "0.1"), run_dir(old, "CartPole-v0", "StdTrain", "0.1")
    for key in TABLES:
        _former_header(d_old / RUN_FILES[key])
        a, b = read_table(d_new / RUN_FILES[key]), read_table(d_old / RUN_FILES[key])
        assert list(a.columns) == list(b.columns) and a.equals(b)
        assert same_table(d_new / RUN_FILES[key], d_old / RUN_FILES[key])
    # a changed value is no header: the tables then differ
    text = (d_old / RUN_FILES["loact"]).read_text()
    (d_old / "changed.csv").write_text(text[:-2] + ("1" if text[-2] != "1" else "2") + "\n")
    assert not same_table(d_new / RUN_FILES["loact"], d_old / "changed.csv")
    (d_old / "changed.csv").unlink()

    reps = [audit(r, r / "audit", AuditOptions(config_hash="abc123")) for r in (new, old)]
    assert reps[1]["integrity_problems"] == 0 and reps[1]["verdict"] == reps[0]["verdict"] == "PASS"
    assert reps[1]["checks"] == reps[0]["checks"]
    # the checks that read these columns ran on them (an unread column would leave them untestable)
    for check in ("loact_certified_steps_not_flipped", "lore_vs_pgd_local"):
        statuses = {c["status"] for c in reps[1]["checks"] if c["check"] == check}
        assert "ok" in statuses and statuses <= {"ok", "vacuous"}


def test_a_former_name_beside_its_current_one_is_an_integrity_problem_not_a_crash(tmp_path):
    """A received table naming one column twice (``q_top_lower`` beside ``smoothed_top_lower``): which of the
    two is meant is not guessed; the table is refused in one line naming both, and the audit fails on it."""
    make_results(tmp_path, PLAN)
    path = run_dir(tmp_path, "CartPole-v0", "StdTrain", "0.1") / RUN_FILES["loact"]
    head, rest = path.read_text().split("\n", 1)
    path.write_text(head.replace(cols.SMOOTHED_TOP + ",", "q_top_lower,", 1) + "\n" + rest)
    meta = read_json(meta_path(path))
    meta["output"].update(sha256=sha256_file(path), bytes=path.stat().st_size)
    write_json(meta_path(path), meta)
    try:
        read_table(path)
    except ValueError as exc:
        assert str(exc).endswith(f"column(s) {cols.SMOOTHED_TOP_LOWER} named twice (a former name beside the "
                                 "current one)")
    else:
        raise AssertionError("a column named twice was read")
    rep = audit(tmp_path, tmp_path / "audit", AuditOptions(config_hash="abc123"))
    assert rep["verdict"] == "FAIL" and rep["integrity_problems"] >= 1
    assert cols.SMOOTHED_TOP_LOWER in (tmp_path / "audit" / "audit.md").read_text()
