# Stage 1: obtain the policy's checkpoint (trained locally, seeded and acceptance-tested).


rule checkpoint:
    output:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
    log:
        f"{R}/logs/{{env}}/{{algo}}/checkpoint.log",
    params:
        train=lambda w: (
            f"--hidden {' '.join(map(str, env_cfg(w)['train']['hidden']))} "
            f"--total-steps {env_cfg(w)['train']['total_steps']} "
            f"--min-steps {env_cfg(w)['train']['min_steps']} "
            f"--eval-episodes {env_cfg(w)['train']['eval_episodes']} "
            f"--target-return {env_cfg(w)['train']['target_return']}"
        ),
        seed=CFG["seed"],
    threads: 1
    resources:
        mem_mb=1500,
        runtime=60,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop train --env {wildcards.env} --algo {wildcards.algo} --seed {params.seed} "
        "--threads {threads} {params.train} --out {output.model} > {log} 2>&1"
