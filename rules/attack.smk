# Stage 4: 10-step ℓ2 PGD at every step — (a) local, against the smoothed policy (LoAct/LoRe tightness);
# (b) global, against the σ-randomized policy (GRe tightness).


rule attack_local:
    input:
        unpack(stage_inputs("attack-local")),
    output:
        **stage_outputs("attack-local"),
    log:
        stage_log("attack-local"),
    benchmark:
        stage_benchmark("attack-local")
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        **stage_resources("attack-local"),
    params:
        args=stage_args("attack-local"),
    shell:
        stage_shell("attack-local")


rule attack_global:
    input:
        unpack(stage_inputs("attack-global")),
    output:
        **stage_outputs("attack-global"),
    log:
        stage_log("attack-global"),
    benchmark:
        stage_benchmark("attack-global")
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        **stage_resources("attack-global"),
    params:
        args=stage_args("attack-global"),
    shell:
        stage_shell("attack-global")
