# Stage 1: obtain the policy's checkpoint from the source the config selects (crop/registry.yaml):
# trained here (seeded, acceptance-tested) or downloaded (sha256-pinned, mirror, lock file).


rule checkpoint:
    output:
        model=CHECKPOINT,
        record=CHECKPOINT_RECORD,
    log:
        f"{R}/logs/{{env}}/{{algo}}/checkpoint.log",
    params:
        source=lambda w: env_cfg(w)["source"],
        train=lambda w: (
            f"--hidden {' '.join(map(str, env_cfg(w)['train']['hidden']))} "
            f"--total-steps {env_cfg(w)['train']['total_steps']} "
            f"--min-steps {env_cfg(w)['train']['min_steps']} "
            f"--eval-episodes {env_cfg(w)['train']['eval_episodes']}"
            + (
                f" --target-return {env_cfg(w)['train']['target_return']}"
                if env_cfg(w)["train"]["target_return"] is not None
                else ""
            )
        ),
        fetch=(
            f"--lock {shlex.quote(CFG['checkpoints']['lock'])}"
            + (f" --mirror {shlex.quote(CFG['checkpoints']['mirror'])}" if CFG["checkpoints"]["mirror"] else "")
            + (f" --cache {shlex.quote(CFG['checkpoints']['cache'])}" if CFG["checkpoints"]["cache"] else "")
        ),
        seed=CFG["seed"],
    threads: 1
    resources:
        mem_mb=1000,
        runtime=15,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop checkpoint --env {wildcards.env} --algo {wildcards.algo} --source {params.source} "
        "--seed {params.seed} --threads {threads} {params.train} {params.fetch} --out {output.model} "
        "> {log} 2>&1"
