# Stage 3a: LoAct — certified radius of every step of clean episodes (Algorithm 1, Theorem 1).


rule loact:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
        qrange=qrange_input,
    output:
        steps=run_file("loact"),
        episodes=run_file("loact_episodes"),
        ratio=run_file("certified_ratio"),
        frames=run_file("frames"),
        meta=meta_file("loact"),
        episodes_meta=meta_file("loact_episodes"),
        ratio_meta=meta_file("certified_ratio"),
        frames_meta=meta_file("frames"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/loact.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/loact.tsv"
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
        settings=stage_settings_arg("loact"),
    shell:
        "crop loact {params.common} --threads {threads} --checkpoint {input.model:q} {params.target} "
        "--settings {params.settings} --out {output.steps:q} --out-episodes {output.episodes:q} "
        "--out-ratio {output.ratio:q} --out-frames {output.frames:q} > {log:q} 2>&1"


# Replicate k >= 1 (config `replicates`): LoAct on the replicate's own V range, with its own seed (other
# initial states and noise), in its rep-{k} folder.
use rule loact as loact_replicate with:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
        qrange=qrange_input,
    output:
        steps=replicate_file("loact"),
        episodes=replicate_file("loact_episodes"),
        ratio=replicate_file("certified_ratio"),
        frames=replicate_file("frames"),
        meta=replicate_meta("loact"),
        episodes_meta=replicate_meta("loact_episodes"),
        ratio_meta=replicate_meta("certified_ratio"),
        frames_meta=replicate_meta("frames"),
    log:
        f"{R}/logs/{{env}}/{{algo}}/sigma-{{sigma}}/rep-{{rep}}/loact.log",
    benchmark:
        f"{R}/benchmarks/{{env}}/{{algo}}/sigma-{{sigma}}/rep-{{rep}}/loact.tsv"
    params:
        common=replicate_args,
        target=target_args,
        settings=stage_settings_arg("loact"),
