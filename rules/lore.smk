# Stage 3c: LoRe — absolute lower bound of the return by adaptive tree search (Algorithm 3, Theorem 4).


rule lore:
    input:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
        qrange=run_file("qrange"),
    output:
        bounds=run_file("lore"),
        meta=meta_file("lore"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/lore.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/lore.tsv"
    params:
        common=common_args,
        stage=lambda w: (
            f"--m {env_cfg(w)['lore']['m']} --horizon {env_cfg(w)['lore']['horizon']} "
            f"--gamma {env_cfg(w)['lore']['gamma']} --alpha {CFG['alpha']} --bound {CFG['bound']} "
            f"--alpha-mode {CFG['alpha_mode']}"
            + (
                f" --eps-max-factor {env_cfg(w)['lore']['eps_max_factor']}"
                if env_cfg(w)["lore"]["eps_max_factor"] is not None
                else ""
            )
        ),
    threads: CFG["threads"]
    resources:
        gpu=GPUS,
        mem_mb=1000,
        runtime=15,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop lore {params.common} --threads {threads} --checkpoint {input.model} --qrange {input.qrange} "
        "{params.stage} --out {output.bounds} > {log} 2>&1"
