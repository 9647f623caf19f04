# Stage 3a: LoAct — certified radius of every step of clean episodes (Algorithm 1, Theorem 1).


rule loact:
    input:
        unpack(stage_inputs("loact")),
    output:
        **stage_outputs("loact"),
    log:
        stage_log("loact"),
    benchmark:
        stage_benchmark("loact")
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        **stage_resources("loact"),
    params:
        args=stage_args("loact"),
    shell:
        stage_shell("loact")


# Replicate k >= 1 (config `replicates`): the same stage with the replicate's own derived seed (other initial
# states and noise), in its rep-{k} folder, on its own V range.
use rule loact as loact_replicate with:
    output:
        **stage_outputs("loact", replicate=True),
    log:
        stage_log("loact", replicate=True),
    benchmark:
        stage_benchmark("loact", replicate=True)
    params:
        args=stage_args("loact", replicate=True),
