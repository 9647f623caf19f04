"""The ``crop`` command (``python -m crop``): each subcommand and the function that runs it.

The top of the house (docs/layout.md): it imports every handler, so the import graph holds each subcommand's
dependency.  The handlers import torch and the algorithms inside their functions, so ``crop --help`` and a
refused argument start without them.  The parser is :mod:`crop.workflow.cli`'s.
"""
import ctypes
import platform

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


def keep_freed_memory() -> None:
    """Let this process's allocator (glibc's malloc; elsewhere nothing is done) keep the memory it frees for
    reuse instead of giving it back to the system: blocks up to 32 MB from its heap, never trimmed.  A
    smoothing block's tensors are the same at every call; given back, they are mapped and faulted in anew each
    time, which costs a CARRL network's smoothing (its bound's matrices: crop.models.carrl) 1.2-1.6x its CPU
    time, more on a busy machine, so that ``crop calibrate`` could not measure it steadily."""
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)   # M_MMAP_THRESHOLD: glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
        libc.mallopt(-1, 1 << 30)    # M_TRIM_THRESHOLD


def main(argv=None) -> None:
    """Run the ``crop`` command line ``argv`` (the process's by default), every job and ``crop calibrate``
    with the same allocator (:func:`keep_freed_memory`)."""
    keep_freed_memory()
    cli.run(HANDLERS, argv)


if __name__ == "__main__":
    main()
