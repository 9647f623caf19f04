# Stage 4 of every run folder results/{env}/{algo}/sigma-{sigma}: ℓ2 PGD attacks, how tight the certificates
# are.  The local attack targets LoAct's and LoRe's smoothed policy (it reads the run's qrange.json for the
# targets q and auto), the global attack GRe's σ-randomized one.  Read like rules/certify.smk: the command is
# `crop COMMAND` with the stage table's flags, the files are the stage table's (tests/test_rules.py).


rule attack_local:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
        qrange=qrange_input,
    output:
        attack_local=f"{R}/{RUN}/attack_local.csv",
        attack_local_meta=f"{R}/{RUN}/attack_local.meta.json",
        attack_local_steps=f"{R}/{RUN}/attack_local_steps.csv",
        attack_local_steps_meta=f"{R}/{RUN}/attack_local_steps.meta.json",
    log:
        f"{R}/logs/{RUN}/attack_local.log",
    benchmark:
        f"{R}/benchmarks/{RUN}/attack_local.tsv"
    priority: gpu_first(stage_job_gpus("attack-local"))
    conda:
        "../envs/crop.yaml"
    threads: stage_job_threads("attack-local")
    resources:
        **stage_resources("attack-local"),
    params:
        command="attack-local",
        args=stage_args("attack-local"),
    shell:
        "crop {params.command} {params.args} > {log:q} 2>&1"


rule attack_global:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
    output:
        attack_global=f"{R}/{RUN}/attack_global.csv",
        attack_global_meta=f"{R}/{RUN}/attack_global.meta.json",
    log:
        f"{R}/logs/{RUN}/attack_global.log",
    benchmark:
        f"{R}/benchmarks/{RUN}/attack_global.tsv"
    priority: gpu_first(stage_job_gpus("attack-global"))
    conda:
        "../envs/crop.yaml"
    threads: stage_job_threads("attack-global")
    resources:
        **stage_resources("attack-global"),
    params:
        command="attack-global",
        args=stage_args("attack-global"),
    shell:
        "crop {params.command} {params.args} > {log:q} 2>&1"
