# Stage 3b: GRe — expectation and percentile bounds from m σ-randomized trajectories (Algorithm 2).


rule gre:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
    output:
        bounds=run_file("gre"),
        returns=run_file("gre_returns"),
        meta=meta_file("gre"),
        returns_meta=meta_file("gre_returns"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/gre.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/gre.tsv"
    conda:
        "../envs/crop.yaml"
    threads: CFG["threads"]
    resources:
        gpu=GPUS,
        mem_mb=gre_mem_mb,
        runtime=10,
    params:
        common=common_args,
        settings=stage_settings_arg("gre"),
    shell:
        "crop gre {params.common} --threads {threads} --checkpoint {input.model:q} --settings {params.settings} "
        "--out {output.bounds:q} --out-returns {output.returns:q} > {log:q} 2>&1"
