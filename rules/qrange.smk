# Stage 2: estimate V_min, V_max of the network under σ-noise (Appendix B.1).


rule qrange:
    input:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
    output:
        run_file("qrange"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/qrange.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/qrange.tsv"
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        gpu=GPUS,
        mem_mb=1000,
        runtime=10,
    params:
        common=common_args,
        settings=stage_settings_arg("qrange"),
    shell:
        "crop qrange {params.common} --threads {threads} --checkpoint {input.model:q} --settings {params.settings} "
        "--out {output:q} > {log:q} 2>&1"


# Replicate k >= 1 (config `replicates`): the same estimate with the replicate's own seed, in its rep-{k} folder.
use rule qrange as qrange_replicate with:
    output:
        replicate_file("qrange"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/rep-{{rep}}/qrange.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/rep-{{rep}}/qrange.tsv"
    params:
        common=replicate_args,
        settings=stage_settings_arg("qrange"),
