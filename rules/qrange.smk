# Stage 2: estimate V_min, V_max of the network under σ-noise (Appendix B.1).


rule qrange:
    input:
        unpack(stage_inputs("qrange")),
    output:
        **stage_outputs("qrange"),
    log:
        stage_log("qrange"),
    benchmark:
        stage_benchmark("qrange")
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        **stage_resources("qrange"),
    params:
        args=stage_args("qrange"),
    shell:
        stage_shell("qrange")


# Replicate k >= 1 (config `replicates`): the same stage with the replicate's own derived seed (other initial
# states and noise), in its rep-{k} folder.
use rule qrange as qrange_replicate with:
    output:
        **stage_outputs("qrange", replicate=True),
    log:
        stage_log("qrange", replicate=True),
    benchmark:
        stage_benchmark("qrange", replicate=True)
    params:
        args=stage_args("qrange", replicate=True),
