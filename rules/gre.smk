# Stage 3b: GRe — expectation and percentile bounds from m σ-randomized trajectories (Algorithm 2).


rule gre:
    input:
        unpack(stage_inputs("gre")),
    output:
        **stage_outputs("gre"),
    log:
        stage_log("gre"),
    benchmark:
        stage_benchmark("gre")
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        **stage_resources("gre"),
    params:
        args=stage_args("gre"),
    shell:
        stage_shell("gre")
