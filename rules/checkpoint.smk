# Stage 1: obtain the policy's checkpoint from the source the config selects (crop/agents/registry.yaml):
# trained here (seeded, acceptance-tested), downloaded (sha256-pinned, mirror, lock file), derived
# without training from another algorithm's checkpoint (CARRL from StdTrain), or imported from your own
# policy file (source: file; docs/own-policy.md).


rule checkpoint:
    input:
        unpack(base_checkpoint),
    output:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
    log:
        str(layout.job_log(R, "checkpoint", "{env}", "{algo}")),
    priority: gpu_first(checkpoint_gpus)
    conda:
        "../envs/crop.yaml"
    resources:
        mem_mb=checkpoint_mem_mb,
        runtime=predicted("checkpoint", "runtime", checkpoint_gpus),
        gpu=checkpoint_gpus,
    params:
        args=checkpoint_args,
    shell:
        "crop checkpoint {params.args} > {log:q} 2>&1"
