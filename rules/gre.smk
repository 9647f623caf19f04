# Stage 3b: GRe — expectation and percentile bounds from m σ-randomized trajectories (Algorithm 2).


rule gre:
    input:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
    output:
        bounds=run_file("gre"),
        returns=run_file("gre_returns"),
        meta=meta_file("gre"),
        returns_meta=meta_file("gre_returns"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/gre.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/gre.tsv"
    params:
        common=common_args,
        stage=lambda w: (
            f"--m {env_cfg(w)['gre']['m']} --horizon {env_cfg(w)['gre']['horizon']} "
            f"--gamma {env_cfg(w)['gre']['gamma']} --alpha {CFG['alpha']} "
            f"--percentiles {floats(env_cfg(w)['gre']['percentiles'])} "
            f"--eps-factors {floats(env_cfg(w)['gre']['eps_factors'])} --batch {gre_batch(w)}"
        ),
    threads: CFG["threads"]
    resources:
        gpu=GPUS,
        mem_mb=gre_mem_mb,
        runtime=10,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop gre {params.common} --threads {threads} --checkpoint {input.model} {params.stage} "
        "--out {output.bounds} --out-returns {output.returns} > {log} 2>&1"
