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
    params:
        common=common_args,
        stage=lambda w: (
            f"--m {env_cfg(w)['qrange']['m']} --episodes {env_cfg(w)['qrange']['episodes']} "
            f"--horizon {env_cfg(w)['qrange']['horizon']} --method {env_cfg(w)['qrange']['method']} "
            f"--quantile {env_cfg(w)['qrange']['quantile']!r}"
        ),
    threads: CFG["threads"]
    resources:
        gpu=GPUS,
        mem_mb=1000,
        runtime=10,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop qrange {params.common} --threads {threads} --checkpoint {input.model} {params.stage} "
        "--out {output} > {log} 2>&1"
