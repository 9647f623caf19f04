# CROP certification workflow (Wu et al., ICLR 2022).
# Per environment × algorithm × σ: checkpoint → qrange → LoAct, GRe, LoRe → PGD attacks → tables and
# figures → audit.  Rules only wire files; every computation is a `crop` subcommand.
import os

from snakemake.utils import min_version

min_version("9.0")


# config.yaml is the default; a --configfile given on the command line replaces it (it is not merged
# into it), so a config that names only some environments runs only those.
if not workflow.overwrite_configfiles:

    configfile: os.path.join(workflow.basedir, "config.yaml")


report: "report/workflow.rst"


# With `snakemake --sdm apptainer` every step runs inside this Apptainer image, built from the definition
# file containers/crop.def (see README, Containers).  Without --sdm apptainer the directive is ignored.
container: os.path.join(workflow.basedir, "containers", "crop.sif")


include: "rules/common.smk"
include: "rules/checkpoint.smk"
include: "rules/qrange.smk"
include: "rules/loact.smk"
include: "rules/gre.smk"
include: "rules/lore.smk"
include: "rules/attack.smk"
include: "rules/aggregate.smk"
include: "rules/audit.smk"


rule all:
    default_target: True
    input:
        aggregate_outputs(),
        audit_outputs(),
