"""A received name or value is shown as it is named, in every format the report writes: audit.md and the
Markdown tables (:func:`crop.report.markdown.md_text`), the LaTeX tables, the figures' titles and labels
(:func:`crop.report.style.figure_label`, no mathtext), and the report's captions (config names only, which the
schema restricts)."""
import io
import json
import re
import shutil

import pandas as pd
import pytest

from crop.io import meta_name
from crop.report.integrity import STAGE_FILES
from crop.report.markdown import md_code, md_text, pipe_table, printable
from crop.workflow import layout
from crop.workflow.layout import RUN_FILES

from synthetic_results import audit_cli, make_results

HTML = "<img src=x onerror=alert(1)>"
ROW = "x\n| **PASS**: forged line |"
TEX = "a\\input{/etc/passwd}%$x$&_#"
MATH = r"$\undefinedcommand{$"
HOSTILE = (HTML, ROW, TEX, MATH, "tab\tesc\x1b[31m|pipe`tick")


@pytest.mark.parametrize("name", HOSTILE)
def test_markdown_text_and_code_spans_hold_a_name_as_written(name):
    text, code = md_text(name), md_code(name)
    assert "\n" not in text + code and "\x1b" not in text + code
    assert not re.search(r"(?<!\\)\|", text) and "<" not in text and ">" not in text
    assert not re.search(r"&(?!amp;|lt;|gt;)", text)
    fence = re.match(r"`+", code).group()
    assert code.endswith(fence) and fence not in code[len(fence):-len(fence)]
    assert printable(name) == name.encode("unicode_escape").decode("ascii").replace("\\\\", "\\") or "\\" in name


def test_a_pipe_table_row_stays_one_row():
    table = pipe_table([{"run": n, "n": 1} for n in HOSTILE])
    lines = table.splitlines()
    assert len(lines) == 2 + len(HOSTILE)
    assert all(len(re.findall(r"(?<!\\)\|", ln)) == 3 for ln in lines)
    assert "<img" not in table and "&lt;img src=x onerror=alert(1)&gt;" in table
    plain = pipe_table([{"run": n} for n in HOSTILE], pad=False)
    assert all(len(re.findall(r"(?<!\\)\|", ln)) == 2 for ln in plain.splitlines())


def test_the_tables_escape_a_received_algorithm_name():
    from crop.report.tables import latex_table, markdown_table

    df = pd.DataFrame({"algo": list(HOSTILE), "sigma=0.1": [1.0] * len(HOSTILE)})
    md = markdown_table(df, "caption")
    assert "<img" not in md and len(md.strip().splitlines()) == 2 + 2 + len(HOSTILE)
    tex = latex_table(df, "caption\nwith a second line")
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip().splitlines()
    assert len(body) == len(HOSTILE) and tex.splitlines()[0] == r"% caption\nwith a second line"
    for line in body:   # every markup character printed by its command
        cells = line.removesuffix(r" \\").split(" & ")
        assert len(cells) == 2 and not re.search(r"(?<!\\)[%$&#_<>|]", cells[0]), cells
    assert r"\textbackslash{}input\{/etc/passwd\}\%\$x\$\&\_\#" in tex


def test_a_figure_draws_a_received_name_as_text():
    """A legend and a title with an odd or unknown mathtext command: drawn (no ValueError), the name shown."""
    import matplotlib.pyplot as plt

    from crop.report.figures import legend_figure
    from crop.report.style import figure_label

    fig = legend_figure(list(HOSTILE), title=figure_label(MATH))
    fig.savefig(io.BytesIO(), format="png")
    shown = [t.get_text() for t in fig.legends[0].get_texts()]
    assert shown[:len(HOSTILE)] == [figure_label(n) for n in HOSTILE]
    assert figure_label(MATH) == r"\$\undefinedcommand{\$" and "\n" not in figure_label(ROW)
    plt.close(fig)


def test_the_captions_quote_only_names_the_config_schema_allows():
    """The report's captions quote the validated config (crop.report.captions): its algorithm and environment
    names match the schema's patterns, which no hostile name does."""
    from crop.schema import parsed_schema as schema

    defs = schema()["$defs"]
    patterns = [defs["label"]["pattern"]] + [d["pattern"] for d in defs.values()
                                             if isinstance(d, dict) and "pattern" in d and "/" in d["pattern"]]
    for name in HOSTILE:
        assert not any(re.search(p, name) for p in patterns), name


@pytest.fixture
def hostile_folder(tmp_path):
    """The synthetic folder with a partial run of each hostile algorithm name (its LoRe and attacks gone)."""
    root = tmp_path / "results"
    make_results(root, {"CartPole-v0": {"StdTrain": [0.1]}})
    env = root / "CartPole-v0"
    for name in (HTML, ROW):
        shutil.copytree(env / "StdTrain", env / name)
        run = env / name / "sigma-0.1"
        for key in (k for stage in ("lore", "attack_local", "attack_global") for k in STAGE_FILES[stage]):
            for f in (run / RUN_FILES[key], run / meta_name(RUN_FILES[key])):
                f.unlink(missing_ok=True)
    return root


def test_audit_md_shows_a_hostile_folder_name_as_text(hostile_folder, tmp_path, capsys):
    code = audit_cli(hostile_folder, "--out-dir", tmp_path / "a")
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and not any(ln.startswith("| **PASS**") for ln in printed.splitlines())
    rep = json.loads((tmp_path / "a" / "audit.json").read_text())
    md = (tmp_path / "a" / "audit.md").read_text()
    assert code in (0, 1) and {layout.run_dir(hostile_folder, "CartPole-v0", n, "0.1").relative_to(
        hostile_folder).as_posix() for n in (HTML, ROW)} <= set(rep["runs"])
    text = re.sub(r"(`+) .*? \1|`[^`\n]*`", "", md)   # code spans show HTML as text
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    assert not any(ln.startswith("| **PASS**") for ln in md.splitlines())
    assert [p["run"] for p in rep["partial_runs"]] == sorted(p["run"] for p in rep["partial_runs"])
    assert len(rep["partial_runs"]) == 2 and rep["integrity"] == []
    for block in md.split("\n\n"):   # every table row has its header's cell count
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        if rows:
            cells = {len(re.findall(r"(?<!\\)\|", ln)) for ln in rows}
            assert len(cells) == 1, block
