# Stage 4: 10-step ℓ2 PGD at every step — (a) local, against the smoothed policy (LoAct/LoRe tightness);
# (b) global, against the σ-randomized policy (GRe tightness).


rule attack_local:
    input:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
        qrange=run_file("qrange"),
    output:
        table=run_file("attack_local"),
        meta=meta_file("attack_local"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/attack_local.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/attack_local.tsv"
    params:
        common=common_args,
        stage=lambda w: (
            f"--m {env_cfg(w)['loact']['m']} --alpha {CFG['alpha']} --bound {CFG['bound']} "
            f"--alpha-mode {CFG['alpha_mode']} "
            f"--episodes {env_cfg(w)['attack']['local_episodes']} "
            f"--horizon {env_cfg(w)['lore']['horizon']} --gamma {env_cfg(w)['lore']['gamma']} "
            f"--m-grad {env_cfg(w)['attack']['local_m_grad']} --pgd-steps {env_cfg(w)['attack']['pgd_steps']} "
            f"--eps-factors {floats(env_cfg(w)['attack']['local_eps_factors'])}"
        ),
    threads: CFG["threads"]
    resources:
        gpu=GPUS,
        mem_mb=1000,
        runtime=15,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop attack-local {params.common} --threads {threads} --checkpoint {input.model} "
        "--qrange {input.qrange} {params.stage} --out {output.table} > {log} 2>&1"


rule attack_global:
    input:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
    output:
        table=run_file("attack_global"),
        meta=meta_file("attack_global"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/attack_global.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/attack_global.tsv"
    params:
        common=common_args,
        stage=lambda w: (
            f"--episodes {env_cfg(w)['attack']['global_episodes']} --horizon {env_cfg(w)['gre']['horizon']} "
            f"--gamma {env_cfg(w)['gre']['gamma']} --n-eot {env_cfg(w)['attack']['global_n_eot']} "
            f"--pgd-steps {env_cfg(w)['attack']['pgd_steps']} "
            f"--eps-factors {floats(env_cfg(w)['attack']['global_eps_factors'])}"
        ),
    threads: CFG["threads"]
    resources:
        gpu=GPUS,
        mem_mb=1000,
        runtime=20,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop attack-global {params.common} --threads {threads} --checkpoint {input.model} {params.stage} "
        "--out {output.table} > {log} 2>&1"
