"""Property-based: any configuration is either accepted (and its DAG builds in a dry-run) or refused with
a ConfigError naming a field — never a Python traceback."""
import copy
import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crop.workflow.config import ConfigError, validate_config

from paths import REPO

BASE = yaml.safe_load((REPO / "config.yaml").read_text())

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 20000), st.floats(allow_nan=True),
                    st.text(max_size=8), st.sampled_from(["auto", "train", "published", "hoeffding", "cpu",
                                                          "StdTrain", "CartPole-v0", "Pong"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_configs(draw):
    cfg = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(cfg) if p]
        path = draw(st.sampled_from(paths))
        parent = cfg
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
        if not isinstance(cfg, dict):
            break
    return cfg


def _dry_run(cfg, tmp_path):
    """Build the DAG in-process (no job runs)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        OutputSettings,
        ResourceSettings,
        StorageSettings,
        WorkflowSettings,
    )

    cfg = dict(cfg, results=str(tmp_path / "results"))
    with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=1),
                          config_settings=ConfigSettings(config=cfg),
                          storage_settings=StorageSettings(), workflow_settings=WorkflowSettings(),
                          snakefile=REPO / "Snakefile", workdir=tmp_path)
        dag = wf.dag()
        dag.execute_workflow(executor="dryrun")


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_every_config_is_accepted_or_refused_naming_a_field(cfg):
    _accepted_or_refused_naming_a_field(cfg)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_a_few_configs_are_accepted_or_refused_naming_a_field(cfg):
    """The fast run's counterpart of the test above, on fewer configs."""
    _accepted_or_refused_naming_a_field(cfg)


def _accepted_or_refused_naming_a_field(cfg):
    try:
        out = validate_config(cfg)
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith("config: "), msg
        # names a field path (or the top level) after "invalid configuration:" / before a colon
        # (a key that is not a plain name is written as JSON in brackets: results["'"])
        assert re.search(r'(invalid configuration: (?:[\w.\[\]()\-/ ]|\["(?:[^"\\]|\\.)*"\])+:|environments\.[^:]+:)',
                         msg), msg
        return
    assert out["environments"] and all(e["sigmas"] for e in out["environments"].values())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@pytest.mark.slow
@given(mutated_configs())
def test_accepted_configs_build_their_dag(tmp_path, cfg):
    try:
        validate_config(cfg)
    except ConfigError:
        return
    _dry_run(cfg, tmp_path)
