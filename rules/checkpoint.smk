# Stage 1: obtain the policy's checkpoint from the source the config selects (crop/registry.yaml):
# trained here (seeded, acceptance-tested), downloaded (sha256-pinned, mirror, lock file), or derived
# without training from another algorithm's checkpoint (CARRL from StdTrain).


rule checkpoint:
    input:
        unpack(base_checkpoint),
    output:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
    log:
        f"{R}/logs/{{env}}/{{algo}}/checkpoint.log",
    conda:
        "../envs/crop.yaml"
    threads: 1
    resources:
        mem_mb=checkpoint_mem_mb,
        runtime=checkpoint_runtime,
        gpu=checkpoint_gpus,
    params:
        source=lambda w: env_cfg(w)["source"],
        settings=train_settings_arg,
        base=lambda w, input: f"--base-checkpoint {shlex.quote(input.base)}" if "base" in input.keys() else "",
        fetch=(
            f"--lock {shlex.quote(CFG['checkpoints']['lock'])}"
            + (f" --mirror {shlex.quote(CFG['checkpoints']['mirror'])}" if CFG["checkpoints"]["mirror"] else "")
            + (f" --cache {shlex.quote(CFG['checkpoints']['cache'])}" if CFG["checkpoints"]["cache"] else "")
        ),
        seed=CFG["seed"],
    shell:
        "crop checkpoint --env {wildcards.env} --algo {wildcards.algo} --source {params.source} "
        "--seed {params.seed} --threads {threads} --settings {params.settings} {params.base} {params.fetch} "
        "--out {output.model} > {log} 2>&1"
