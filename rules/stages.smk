# Stages 2-4 of every run folder, one rule per row of the stage table (crop/workflow/stage_table.py: the V range, LoAct,
# GRe, LoRe, the local and global attacks; docs/layout.md lists each rule's files and flags).  A row with
# `replicate` also makes NAME_replicate: the same stage with replicate k's own derived seed (other initial
# states and noise), in its rep-{k} folder, on its own V range (config `replicates`).  Every block reads the
# row through rules/common.smk's stage_* helpers; the command is `crop COMMAND`, whose --help says the rest.
for row in STAGES.values():
    for replicate in (False, True) if row.replicate else (False,):

        rule:
            name:
                row.rule + ("_replicate" if replicate else "")
            input:
                unpack(stage_inputs(row.command)),
            output:
                **stage_outputs(row.command, replicate),
            log:
                stage_log(row.command, replicate),
            benchmark:
                stage_benchmark(row.command, replicate)
            priority: gpu_first(stage_job_gpus(row.command))
            conda:
                "../envs/crop.yaml"
            threads: stage_job_threads(row.command)
            resources:
                **stage_resources(row.command),
            params:
                command=row.command,
                args=stage_args(row.command, replicate),
            # a literal: Snakemake evaluates a shell expression again when the job runs, after the loop
            shell:
                "crop {params.command} {params.args} > {log:q} 2>&1"
