"""The per-run rules (rules/certify.smk, rules/attacks.smk) spell out their files; the stage table
(crop/workflow/stage_table.py) states what is not Snakemake's (flags, settings, cost, device).  The two agree:
every row has its rule (and its replicate rule where the row says so), which writes exactly the row's files and
the provenance beside each, in the run folder of crop.workflow.layout, with its log and benchmark where
layout.job_log puts them, reads the V range where the row says so, and runs the row's subcommand."""
import json
import subprocess
import sys

import pytest

from crop.workflow import layout
from crop.workflow.config import load_config
from crop.workflow.stage_table import STAGES, meta_name

from paths import REPO

SMOKE = REPO / "tests" / "configs" / "smoke.yaml"

#: Reads the workflow with Snakemake's API (no DAG, no job) and prints each rule's files, params and inputs,
#: its patterns without the wildcards' constraints.  ``WorkflowApi._workflow`` is the parsed workflow of the
#: Snakemake pyproject.toml pins (9.27.1); in a process of its own, since parsing it changes the working folder.
LOAD = r"""
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.io import strip_wildcard_constraints as strip
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

snakefile, config, workdir = map(Path, sys.argv[1:])
with SnakemakeApi(OutputSettings()) as api:
    workflow = api.workflow(ResourceSettings(cores=1), ConfigSettings(configfiles=[config]), snakefile=snakefile,
                            workdir=workdir)._workflow
    rules = {r.name: {"output": [[name, strip(str(f))] for name, f in r.output.items()],
                      "files": len(r.output),
                      "log": [strip(str(f)) for f in r.log],
                      "benchmark": strip(str(r.benchmark)) if r.benchmark else None,
                      "params": {k: v for k, v in r.params.items() if isinstance(v, str)},
                      "input": sorted(name for name, _ in r.input.items()),
                      "shell": r.shellcmd} for r in workflow.rules}
print("RULES " + json.dumps(rules))
"""


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    work = tmp_path_factory.mktemp("rules")
    p = subprocess.run([sys.executable, "-c", LOAD, str(REPO / "Snakefile"), str(SMOKE), str(work)],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RULES ")), None)
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(line.removeprefix("RULES "))


def _wanted(row, replicate):
    """The rule's name, output block, log and benchmark that the stage table and the layout say."""
    results = load_config(SMOKE)["results"]
    rep = "{rep}" if replicate else 0
    run = layout.run_dir(results, "{env}", "{algo}", "{sigma}", replicate=rep)
    outputs = []
    for o in row.outputs:
        outputs.append([o.key, str(run / o.file)])
        if o.meta:
            outputs.append([f"{o.key}_meta", str(run / meta_name(o.file))])
    log = layout.job_log(results, row.rule, "{env}", "{algo}", "{sigma}", rep)
    benchmark = layout.job_log(results, row.rule, "{env}", "{algo}", "{sigma}", rep, "benchmarks", "tsv")
    return row.rule + ("_replicate" if replicate else ""), outputs, [str(log)], str(benchmark)


def test_every_stage_and_only_a_stage_has_a_per_run_rule(rules):
    per_run = {name for name, r in rules.items() if any("/sigma-{sigma}/" in f for _, f in r["output"])}
    assert per_run == {r.rule for r in STAGES.values()} | {f"{r.rule}_replicate" for r in STAGES.values()
                                                            if r.replicate}


@pytest.mark.parametrize("command, replicate", [(c, False) for c in STAGES] +
                         [(c, True) for c, r in STAGES.items() if r.replicate])
def test_each_rule_writes_its_rows_files_with_its_log_and_runs_its_subcommand(rules, command, replicate):
    row = STAGES[command]
    name, outputs, log, benchmark = _wanted(row, replicate)
    rule = rules[name]
    assert rule["output"] == outputs and rule["files"] == len(outputs)   # every file named, in the table's order
    assert (rule["log"], rule["benchmark"]) == (log, benchmark)
    assert rule["params"] == {"command": row.command}
    # its algorithm's checkpoint, and the run's V range exactly where the row reads one
    assert rule["input"] == sorted({"model", "record"} | ({"qrange"} if row.v_range else set()))


def test_every_stage_runs_one_shell_string(rules):
    """The same `crop {params.command} …` for every stage: Snakemake reruns a job whose rule's shell string
    changed, so a results folder stays current across stages and replicates."""
    shells = {rules[r.rule]["shell"] for r in STAGES.values()}
    assert shells == {"crop {params.command} {params.args} > {log:q} 2>&1"}
