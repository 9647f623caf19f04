# Stage 1: obtain the policy's checkpoint from the source the config selects (crop/registry.yaml):
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
        policy_file=import_args,
    shell:
        "crop checkpoint --env {wildcards.env:q} --algo {wildcards.algo:q} --source {params.source:q} "
        "--seed {params.seed:q} --threads {threads} --settings {params.settings} {params.base} {params.fetch} "
        "{params.policy_file} --out {output.model:q} > {log:q} 2>&1"
