"""The stage table (crop/workflow/stage_table.py) is the one statement of each stage's outputs, V-range input and
settings: the workflow's rules, the `crop` subcommands, the integrity check and the file layout all agree
with it, so renaming an output is an edit of the table alone."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crop.report import integrity
from crop.workflow import layout
from crop.workflow.cli import build_parser
from crop.workflow.stage_table import RUN_FILES, STAGES, layout_table, meta_name, stage, with_layout_table

from paths import REPO


def _dry_run_jobs(tmp_path, cfg: dict) -> list[dict]:
    """Every job of a dry run of ``cfg``: rule, output file names, log and the shell command."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                          str(tmp_path), "--configfile", str(tmp_path / "c.yaml"), "-n", "-p", "--cores", "1"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    jobs, job = [], None
    for line in (out.stdout + out.stderr).splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):$", line):
            job = {"rule": m[1]}
            jobs.append(job)
        elif job is not None and (m := re.match(r"^\s+(output|log): (.*)$", line)):
            job[m[1]] = [p.strip() for p in m[2].split(",")]
        elif job is not None and line.startswith("Shell command: "):
            job["shell"] = line.removeprefix("Shell command: ")
    return jobs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    # smoke: every stage; replicates 2: the replicate rules; the vote target: runs without a V range
    cfg = yaml.safe_load((REPO / "tests/configs/smoke.yaml").read_text())
    cfg["replicates"] = 2
    cfg["environments"]["CartPole-v0"].update(algorithms=["StdTrain"], sigmas=[0.1], targets=["q", "vote"])
    return _dry_run_jobs(tmp_path_factory.mktemp("dry"), cfg)


@pytest.mark.slow
def test_every_rule_writes_exactly_its_rows_outputs_and_names_each_on_the_command_line(jobs):
    seen = set()
    for job in jobs:
        base = job["rule"].removesuffix("_replicate")
        if base.replace("_", "-") not in STAGES:
            continue
        row, seen = stage(base), seen | {job["rule"]}
        want = {o.file for o in row.outputs} | {meta_name(o.file) for o in row.outputs if o.meta}
        assert {Path(p).name for p in job["output"]} == want, job["rule"]
        assert Path(job["log"][0]).name == f"{row.rule}.log"
        words = job["shell"].split()
        assert words[:2] == ["crop", row.command]
        for o in row.outputs:  # each output path follows its own flag
            flag = f"--{o.option.replace('_', '-')}"
            assert Path(words[words.index(flag) + 1]).name == o.file, (job["rule"], flag)
        # the V range is read exactly where the row says so, and only by the q target (not ALGO@vote)
        assert ("--qrange" in words) == (row.v_range and "@" not in job["output"][0]), job["shell"]
        assert ("--target" in words) == row.v_range
        assert ("rep-" in job["output"][0]) == job["rule"].endswith("_replicate")
    replicated = {f"{r.rule}_replicate" for r in STAGES.values() if r.replicate}
    assert seen == {r.rule for r in STAGES.values()} | replicated


def test_each_subcommand_takes_the_rows_outputs_and_settings():
    choices = build_parser()._subparsers._group_actions[0].choices
    for name, row in STAGES.items():
        actions = {a.dest: a for a in choices[name]._actions}
        for o in row.outputs:
            assert actions[o.option].required == o.required, (name, o.option)
        assert {a for a in actions if a.startswith("out")} == {o.option for o in row.outputs}, name
        assert ("qrange" in actions) == row.v_range, name
        # qrange takes --target auto only (its pilot, crop/certify/pilot.py)
        assert ("target" in actions) == (row.v_range or name == "qrange"), name
        assert set(row.settings) <= set(actions), name
        assert {f.option for f in row.flags} <= set(actions), name


def test_layout_and_integrity_read_the_table(tmp_path):
    assert layout.RUN_FILES == RUN_FILES == {o.key: o.file for r in STAGES.values() for o in r.outputs}
    assert integrity.STAGE_FILES == {r.rule: tuple(r.files) for r in STAGES.values()}
    assert set(layout.REPLICATE_FILES) == {k for r in STAGES.values() if r.replicate for k in r.files}
    # every output of every stage is checked: a complete run folder missing any one file is named
    run = tmp_path / "CartPole-v0" / "StdTrain" / "sigma-0.1"
    run.mkdir(parents=True)
    missing = {Path(p["file"]).name for p in integrity.check_integrity(run)}
    optional = {f for name in layout.SKIPPABLE for f in STAGES[name].files.values()}
    assert missing == set(RUN_FILES.values()) - optional   # a stage that left no trace is one a config skips
    for name in layout.SKIPPABLE:   # a record of one says it ran: then each of its files is named
        (run / meta_name(next(iter(STAGES[name].files.values())))).write_text("{}")
    missing = {Path(p["file"]).name for p in integrity.check_integrity(run)}
    assert missing == set(RUN_FILES.values())
    # a vote run has no V range
    vote = tmp_path / "CartPole-v0" / "StdTrain@vote" / "sigma-0.1"
    vote.mkdir(parents=True)
    assert {Path(p["file"]).name for p in integrity.check_integrity(vote)} == \
        set(RUN_FILES.values()) - set(stage("qrange").files.values()) - optional


def test_the_table_needs_no_torch():
    code = "import sys, crop.workflow.stage_table as t; t.stage_options('loact'); import crop.workflow.layout; " \
           "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


TOY = '''
from crop.io import write_json
from crop.workflow.stage_table import Flag, Output, StageRow, add_stage

#: the toy's own settings: an environment block of the config, a node like the schema's own
BLOCK = {"type": "object", "additionalProperties": False, "default": {},
         "properties": {"rounds": {"type": "integer", "minimum": 1, "default": 3,
                                   "description": "rounds of the toy's work"}}}


def toy_seconds(cfg, job, u):
    """rounds × 1000 environment steps."""
    return cfg["environments"][job.env]["toy"]["rounds"] * 1000 * u("env_step_s"), "toy rounds"


def toy_device(cfg, env):
    """The toy counts: the CPU, whatever the environment's device."""
    return "cpu"


add_stage(StageRow(
    "toy", "a toy stage", "a toy stage's help", "A toy stage: writes its settings.",
    (Output("toy", "toy.json", "out", "toy.json: its settings", meta=False),),
    {"rounds": "toy.rounds", "alpha": "/alpha"}, v_range=True, replicate=True, cost=toy_seconds, memory=500,
    device=toy_device, block=("toy", BLOCK),
    flags=(Flag("knob", {"type": "integer", "minimum": 1}, "a flag the rule leaves out"),)))


def cmd_toy(args):
    write_json(args.out, {"rounds": args.rounds, "alpha": args.alpha, "knob": args.knob, "target": args.target})
'''

#: the toy's rule and its replicate rule, written like those of rules/certify.smk
TOY_RULES = """

rule toy:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
        qrange=qrange_input,
    output:
        toy=f"{R}/{RUN}/toy.json",
    log:
        f"{R}/logs/{RUN}/toy.log",
    threads: stage_job_threads("toy")
    resources:
        **stage_resources("toy"),
    params:
        command="toy",
        args=stage_args("toy"),
    shell:
        "crop {params.command} {params.args} > {log:q} 2>&1"


use rule toy as toy_replicate with:
    output:
        toy=f"{R}/{REP}/toy.json",
    log:
        f"{R}/logs/{REP}/toy.log",
    params:
        command="toy",
        args=stage_args("toy", replicate=True),
"""

#: run with the toy stage added: its plan, its SLURM resources, its subcommand and its files
TOY_CHECK = """import sys, json, contextlib, io; sys.path.insert(0, sys.argv[1]); import toy_stage
from crop.workflow import cost, layout; from crop.report import integrity; from crop.__main__ import HANDLERS, main
HANDLERS['toy'] = toy_stage.cmd_toy
from crop.workflow.config import load_config
from crop.workflow.stage_table import layout_table
assert layout.RUN_FILES['toy'] == 'toy.json' and 'toy' in layout.REPLICATE_FILES
assert integrity.STAGE_FILES['toy'] == ('toy',)
assert '| `toy`, `toy_replicate` | a toy stage |' in layout_table()
assert '500 MB, `toy_stage:toy_device`' in layout_table()
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(['plan', '--configfile', sys.argv[3], '--json'])
t = cost.unit_costs('cpu')[0]
want = (t['start_s'] + 5 * 1000 * t['envs']['CartPole-v0']['env_step_s']) / 60
toys = [j for j in json.loads(out.getvalue())['jobs'] if j['rule'] in ('toy', 'toy_replicate')]
assert [j['rule'] for j in toys] == ['toy', 'toy_replicate'] and all(j['minutes'] == round(want, 3) for j in toys)
res = cost.job_resources(load_config(sys.argv[3]), 'toy', {'env': 'CartPole-v0', 'algo': 'StdTrain',
                         'sigma': '0.1'}, 1, 0)
assert res == {'runtime': cost.runtime_minutes(want * 60, kind='grouped'), 'mem_mb': 500}, res   # one thread
main(['toy', '--env', 'CartPole-v0', '--algo', 'StdTrain', '--sigma', '0.1', '--checkpoint', 'c',
      '--target', 'vote', '--settings', '{"rounds": 7}', '--knob', '3', '--out', sys.argv[2]])
"""


@pytest.mark.slow
def test_a_stage_added_at_run_time_is_a_rule_a_subcommand_a_price_and_run_files(tmp_path):
    """Adding a per-run stage is its row (with its own settings block and cost function), its handler and its
    rule: the dry run, crop plan, the SLURM resources, the CLI and the layout take it up."""
    (tmp_path / "toy_stage.py").write_text(TOY)
    # the workflow: the repository's Snakefile read after the row is added, then the toy's rules
    (tmp_path / "Snakefile").write_text(f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport toy_stage\n\n"
                                        f"include: {str(REPO / 'Snakefile')!r}\n" + TOY_RULES)
    cfg = yaml.safe_load((REPO / "tests/configs/smoke.yaml").read_text())
    cfg["replicates"] = 2
    cfg["environments"]["CartPole-v0"].update(algorithms=["StdTrain"], sigmas=[0.1], toy={"rounds": 5})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(tmp_path / "Snakefile"), "--directory",
                          str(tmp_path / "run"), "--configfile", str(tmp_path / "c.yaml"), "-n", "-p", "--cores",
                          "1", "all"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    for rule, folder in (("toy", "sigma-0.1"), ("toy_replicate", "rep-1")):
        block = text.split(f"rule {rule}:\n", 1)[1].split("\n\n", 1)[0]
        assert f"{folder}/toy.json" in block and "toy.meta.json" not in block, block
        shell = next(line for line in block.splitlines() if line.startswith("Shell command: "))
        words = shlex.split(shell.removeprefix("Shell command: "))
        assert words[:2] == ["crop", "toy"] and json.loads(words[words.index("--settings") + 1]) == \
            {"rounds": 5, "alpha": 0.05}
        assert "--knob" not in words and "--qrange" in words and words[words.index("--device") + 1] == "cpu"
        assert re.search(r"resources: .*\bmem_mb=500\b", block), block   # its row's memory
    # the aggregate and the audit wait for it
    assert re.search(r"rule audit:\n(?:.*\n)*?\s+input: .*sigma-0.1/toy.json", text)
    # crop plan prices it by its own cost function, SLURM gets its memory; the CLI (its settings from its own
    # block and --settings, its own flag) and the layout
    subprocess.run([sys.executable, "-c", TOY_CHECK, str(tmp_path), str(tmp_path / "toy.json"),
                    str(tmp_path / "c.yaml")], check=True, cwd=REPO)
    assert json.loads((tmp_path / "toy.json").read_text()) == {"rounds": 7, "alpha": 0.05, "knob": 3,
                                                               "target": "vote"}


#: add the toy stage: the loaded schema stays as it was, the toy's block is validated and filled in
TOY_SCHEMA = """import sys, copy; sys.path.insert(0, sys.argv[1])
import yaml
from crop.schema import parsed_schema
before = copy.deepcopy(parsed_schema())
import toy_stage
from crop.workflow.config import ConfigError, validate_config
from crop.workflow.stage_table import STAGES, add_stage, stage_options
assert parsed_schema() == before and 'toy' not in parsed_schema()['$defs']['environment']['properties']
assert stage_options('toy')['rounds'] == ('toy.rounds', toy_stage.BLOCK['properties']['rounds'])
cfg = yaml.safe_load(open(sys.argv[2]).read())
envs = cfg['environments']['CartPole-v0']
assert validate_config(cfg)['environments']['CartPole-v0']['toy'] == {'rounds': 3}
envs['toy'] = {'rounds': 0}
try:
    validate_config(cfg)
    raise AssertionError('rounds 0 accepted')
except ConfigError as exc:
    assert 'environments.CartPole-v0.toy.rounds: 0 must be >= 1' in str(exc), exc
try:
    add_stage(STAGES['toy'].__class__(**{**vars(STAGES['toy']), 'command': 'toy2',
                                        'outputs': (), 'block': ('toy', toy_stage.BLOCK)}))
    raise AssertionError('a second toy block accepted')
except ValueError as exc:
    assert "environment block 'toy' already" in str(exc), exc
assert parsed_schema() == before
"""


def test_an_added_stage_brings_its_block_and_leaves_the_loaded_schema_as_it_was(tmp_path):
    """add_stage keeps a stage's own settings block beside the table: configs are validated against a copy
    that holds it (its defaults filled in, its bounds named), the schema every reader loaded is unchanged."""
    (tmp_path / "toy_stage.py").write_text(TOY)
    subprocess.run([sys.executable, "-c", TOY_SCHEMA, str(tmp_path), str(REPO / "tests/configs/smoke.yaml")],
                   check=True, cwd=REPO)


def test_a_row_without_a_cost_memory_or_device_function_is_refused_when_it_is_made():
    from crop.workflow.stage_table import StageRow

    args = ("toy", "t", "h", "d", (), {}, False, False)
    with pytest.raises(ValueError, match=r"^stage toy: cost = None names no cost function \(module:function"):
        StageRow(*args, cost=None, memory=500, device="toy:device")
    with pytest.raises(ValueError, match="^stage toy: cost = 'toy' names no cost function"):
        StageRow(*args, cost="toy", memory=500, device="toy:device")
    with pytest.raises(ValueError, match="^stage toy: memory = None names no memory"):
        StageRow(*args, cost="toy:seconds", memory=None, device="toy:device")
    with pytest.raises(ValueError, match=r"^stage toy: device = 'cpu' names no device function \(module:function"):
        StageRow(*args, cost="toy:seconds", memory=500, device="cpu")
    row = StageRow(*args, cost="toy:seconds", memory="toy:memory", device="toy:device")
    assert (row.memory, row.device) == ("toy:memory", "toy:device")


def test_a_stage_is_refused_once_the_layout_has_read_the_table():
    code = ("import crop.workflow.layout\nfrom crop.workflow.stage_table import STAGES, add_stage\n"
            "add_stage(STAGES['lore'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "add it before importing crop.workflow.layout" in out.stderr


def test_the_layout_page_holds_the_current_table():
    doc = (REPO / "docs/layout.md").read_text()
    assert with_layout_table(doc) == doc, "regenerate: python -m crop.workflow.stage_table docs/layout.md"
    assert layout_table() in doc


def test_captions_quote_each_stage_with_the_settings_it_ran_with():
    import string

    from crop.report.captions import caption_settings
    from crop.workflow.config import validate_config

    for row in STAGES.values():  # a caption names only its own stage's settings
        fields = {f for _, f, _, _ in string.Formatter().parse(row.caption or "") if f}
        assert fields <= set(row.settings), row.command
    cfg = yaml.safe_load((REPO / "tests/configs/smoke.yaml").read_text())
    env = cfg["environments"]["CartPole-v0"]
    env["loact"]["m"], env["attack"]["local_eps_factors"] = 4321, [0.0, 0.75]
    words = caption_settings(validate_config(cfg))["CartPole-v0"]
    assert words["loact"].startswith("m = 4321 noise samples per state")
    assert words["attack"].endswith("ε/σ ∈ {0, 0.75}") and "-step ℓ2 PGD; global: " in words["attack"]
