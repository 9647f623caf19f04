# Stage 4: 10-step ℓ2 PGD at every step — (a) local, against the smoothed policy (LoAct/LoRe tightness);
# (b) global, against the σ-randomized policy (GRe tightness).


rule attack_local:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
        qrange=qrange_input,
    output:
        table=run_file("attack_local"),
        meta=meta_file("attack_local"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/attack_local.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/attack_local.tsv"
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        gpu=GPUS,
        mem_mb=1000,
        runtime=15,
    params:
        common=common_args,
        target=target_args,
        settings=stage_settings_arg("attack-local"),
    shell:
        "crop attack-local {params.common} --threads {threads} --checkpoint {input.model:q} "
        "{params.target} --settings {params.settings} --out {output.table:q} > {log:q} 2>&1"


rule attack_global:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
    output:
        table=run_file("attack_global"),
        meta=meta_file("attack_global"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/attack_global.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/attack_global.tsv"
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        gpu=GPUS,
        mem_mb=1000,
        runtime=20,
    params:
        common=common_args,
        settings=stage_settings_arg("attack-global"),
    shell:
        "crop attack-global {params.common} --threads {threads} --checkpoint {input.model:q} "
        "--settings {params.settings} --out {output.table:q} > {log:q} 2>&1"
