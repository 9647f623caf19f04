"""The ``crop`` command (``python -m crop``): each subcommand and the function that runs it.

The top of the house (docs/layout.md): it imports every handler, so the import graph holds each subcommand's
dependency.  The handlers import torch and the algorithms inside their functions, so ``crop --help`` and a
refused argument start without them.  The parser is :mod:`crop.workflow.cli`'s.
"""
from crop.handlers import certify, policies, report, stages
from crop.workflow import cli, commands

#: ``{subcommand: function}``, the function called with the parsed arguments: the checkpoint's subcommands, one
#: per row of the stage table (crop/workflow/stage_table.py), the report's and the tools'.
HANDLERS = {
    "certify": certify.cmd_certify,
    "train": policies.cmd_train,
    "derive": policies.cmd_derive,
    "fetch": policies.cmd_fetch,
    "checkpoint": policies.cmd_checkpoint,
    "import": policies.cmd_import,
    "qrange": stages.cmd_qrange,
    "loact": stages.cmd_loact,
    "gre": stages.cmd_gre,
    "lore": stages.cmd_lore,
    "attack-local": stages.cmd_attack_local,
    "attack-global": stages.cmd_attack_global,
    "aggregate": report.cmd_aggregate,
    "audit": report.cmd_audit,
    "validate-config": commands.cmd_validate_config,
    "calibrate": commands.cmd_calibrate,
    "plan": commands.cmd_plan,
}


def main(argv=None) -> None:
    """Run the ``crop`` command line ``argv`` (the process's by default)."""
    cli.run(HANDLERS, argv)


if __name__ == "__main__":
    main()
