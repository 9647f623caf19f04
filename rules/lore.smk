# Stage 3c: LoRe — absolute lower bound of the return by adaptive tree search (Algorithm 3, Theorem 4).


rule lore:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
        qrange=qrange_input,
    output:
        bounds=run_file("lore"),
        meta=meta_file("lore"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/lore.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/lore.tsv"
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
        settings=stage_settings_arg("lore"),
    shell:
        "crop lore {params.common} --threads {threads} --checkpoint {input.model:q} {params.target} "
        "--settings {params.settings} --out {output.bounds:q} > {log:q} 2>&1"
