# Stage 1: obtain the policy's checkpoint: trained here (seeded, acceptance-tested), or derived without
# training from another algorithm's checkpoint (CARRL from StdTrain; crop/registry.yaml says which).


rule checkpoint:
    output:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
    log:
        f"{R}/logs/{{env}}/{{algo}}/checkpoint.log",
    params:
        settings=train_settings_arg,
        seed=CFG["seed"],
    threads: 1
    resources:
        mem_mb=1500,
        runtime=60,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop train --env {wildcards.env} --algo {wildcards.algo} --seed {params.seed} "
        "--threads {threads} --settings {params.settings} --out {output.model} > {log} 2>&1"


rule derive_checkpoint:
    input:
        unpack(base_checkpoint),
    output:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
    log:
        f"{R}/logs/{{env}}/{{algo}}/derive.log",
    params:
        settings=train_settings_arg,
        seed=CFG["seed"],
    wildcard_constraints:
        algo="|".join(map(re.escape, DERIVED)) or "(?!)",
    threads: 1
    resources:
        mem_mb=1500,
        runtime=30,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop derive --env {wildcards.env} --algo {wildcards.algo} --seed {params.seed} "
        "--threads {threads} --settings {params.settings} --base-checkpoint {input.model} "
        "--out {output.model} > {log} 2>&1"


ruleorder: derive_checkpoint > checkpoint
