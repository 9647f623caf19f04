# Stage 3c: LoRe — absolute lower bound of the return by adaptive tree search (Algorithm 3, Theorem 4).


rule lore:
    input:
        unpack(stage_inputs("lore")),
    output:
        **stage_outputs("lore"),
    log:
        stage_log("lore"),
    benchmark:
        stage_benchmark("lore")
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        **stage_resources("lore"),
    params:
        args=stage_args("lore"),
    shell:
        stage_shell("lore")
