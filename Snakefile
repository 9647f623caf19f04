# CROP certification workflow (Wu et al., ICLR 2022).
# Per environment × algorithm × σ: checkpoint → qrange → LoAct, GRe, LoRe → PGD attacks → tables and
# figures → audit.  Rules only wire files; every computation is a `crop` subcommand.
import os
import tempfile

from snakemake.utils import min_version

min_version("9.0")


# config.yaml is the default; a --configfile given on the command line replaces it (it is not merged
# into it), so a config that names only some environments runs only those.
if not workflow.overwrite_configfiles:

    configfile: os.path.join(workflow.basedir, "config.yaml")


report: "report/workflow.rst"


# With `snakemake --sdm apptainer` every step runs inside this Apptainer image, built from the definition
# file containers/crop.def (docs/hpc.md, Containers).  Without --sdm apptainer the directive is ignored.
container: os.path.join(workflow.basedir, "containers", "crop.sif")


# Matplotlib's cache (the figures' font list) in /tmp, per user, not in the working directory: Snakemake
# runs a container's steps with --home set to the working directory, where matplotlib would otherwise
# leave .cache/matplotlib.  The steps inherit this environment (locally, in containers and on SLURM).
os.environ.setdefault("MPLCONFIGDIR", os.path.join(tempfile.gettempdir(), f"crop-matplotlib-{os.getuid()}"))


include: "rules/common.smk"


# A run killed with SIGKILL leaves Snakemake's lock behind; clear it when its owner is provably gone, so
# rerunning the same command resumes (a live run's lock still stops a second workflow).  Once, in the main
# process, before Snakemake takes its lock (onstart would be too late); not in the jobs' own processes.
if workflow.is_main_process:
    from crop.workflow.runlock import clear_stale_lock

    _cleared = clear_stale_lock()
    if _cleared:
        logger.warning(_cleared)


onstart:
    # Before any job: record this run as the lock's owner; a read-only, unwritable or full results folder is
    # one clear error.
    from crop.io import OutputError, check_writable
    from crop.workflow.runlock import record_owner

    record_owner()
    try:
        check_writable(R)
    except OutputError as exc:
        raise WorkflowError(exc.strerror)


include: "rules/checkpoint.smk"
include: "rules/certify.smk"
include: "rules/attacks.smk"
include: "rules/aggregate.smk"
include: "rules/audit.smk"


rule all:
    default_target: True
    input:
        aggregate_outputs(),
        audit_outputs(),


# At the end of every run (not dry runs, not the jobs SLURM runs): the audit's verdict and where the
# figures, tables and report are (crop/audit/summary.py).
onsuccess:
    from crop.audit.summary import print_summary

    print_summary(R, workflow.overwrite_configfiles)


# When a job failed (with keep-going, both profiles' setting: once every job that could run has run): the
# figures, tables and audit of every run that finished, what failed listed as missing with its job's log
# (crop/workflow/partial.py; docs/hpc.md).  Not after an interrupt (Ctrl-C, SIGTERM), nor for a run asked
# for some run files only.
onerror:
    from crop.audit.summary import print_summary
    from crop.workflow.partial import report_finished, wants_report

    words = ["--table-eps-factors", *floats(CFG["report"]["table_eps_factors"]).split()]
    if wants_report(workflow) and report_finished(
        R,
        CFG,
        VALID,
        aggregate_words=words,
        audit_words=shlex.split(audit_options()),
        say=logger.warning,
    ):
        print_summary(R, workflow.overwrite_configfiles)
