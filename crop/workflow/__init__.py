"""Layer 7, the workflow's plumbing: the config and its schema (``config``), the stage table (``stage_table``:
one row per stage), where every file goes (``layout``), what a job costs (``cost``, ``cost_units``,
``calibrate``), the sample sizes the audit needs (``audit_sizes``), stale locks (``runlock``) and the ``crop``
command's parser (``cli``); the function each subcommand runs is the entry point's (``crop/__main__.py``)."""
from __future__ import annotations

import os
from pathlib import Path


def workflow_root() -> Path:
    """The folder of the workflow the package runs (its Snakefile, rules/ and configs/, which are no package
    data): the setting ``CROP_WORKFLOW`` where it is given (the package installed apart from its repository),
    else the repository the package sits in (a checkout, ``pip install -e``)."""
    given = os.environ.get("CROP_WORKFLOW")
    return Path(given).expanduser().absolute() if given else Path(__file__).resolve().parents[2]
