# Stages 2-3 of every run folder results/{env}/{algo}/sigma-{sigma}: the V range, then the three certificates
# (LoAct, GRe, LoRe).  A run of another smoothing target than q is {algo} = ALGO@TARGET; every stage reads its
# algorithm's checkpoint (run_checkpoint), and LoAct and LoRe the run's qrange.json for the targets q and auto
# (qrange_input; none for probs and vote, which need no V range).  qrange and LoAct also run in each replicate
# folder rep-{rep} (config `replicates`), with the replicate's own derived seed.  The command line is
# `crop COMMAND` with its flags from the stage table (stage_args: the run, its settings, each output after its
# flag); threads, memory, minutes and GPU are priced by the cost model (rules/common.smk).  Every rule's shell
# string is the same `crop {params.command} …`, so that results Snakemake recorded stay current.  The file
# names are the stage table's (crop/workflow/stage_table.py); tests/test_rules.py checks that they agree.


rule qrange:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
    output:
        qrange=f"{R}/{RUN}/qrange.json",
    log:
        f"{R}/logs/{RUN}/qrange.log",
    benchmark:
        f"{R}/benchmarks/{RUN}/qrange.tsv"
    priority: gpu_first(stage_job_gpus("qrange"))
    conda:
        "../envs/crop.yaml"
    threads: stage_job_threads("qrange")
    resources:
        **stage_resources("qrange"),
    params:
        command="qrange",
        args=stage_args("qrange"),
    shell:
        "crop {params.command} {params.args} > {log:q} 2>&1"


use rule qrange as qrange_replicate with:
    output:
        qrange=f"{R}/{REP}/qrange.json",
    log:
        f"{R}/logs/{REP}/qrange.log",
    benchmark:
        f"{R}/benchmarks/{REP}/qrange.tsv"
    params:
        command="qrange",
        args=stage_args("qrange", replicate=True),


rule loact:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
        qrange=qrange_input,
    output:
        loact=f"{R}/{RUN}/loact.csv",
        loact_meta=f"{R}/{RUN}/loact.meta.json",
        loact_episodes=f"{R}/{RUN}/loact_episodes.csv",
        loact_episodes_meta=f"{R}/{RUN}/loact_episodes.meta.json",
        certified_ratio=f"{R}/{RUN}/certified_ratio.csv",
        certified_ratio_meta=f"{R}/{RUN}/certified_ratio.meta.json",
        frames=f"{R}/{RUN}/frames.npz",
        frames_meta=f"{R}/{RUN}/frames.meta.json",
    log:
        f"{R}/logs/{RUN}/loact.log",
    benchmark:
        f"{R}/benchmarks/{RUN}/loact.tsv"
    priority: gpu_first(stage_job_gpus("loact"))
    conda:
        "../envs/crop.yaml"
    threads: stage_job_threads("loact")
    resources:
        **stage_resources("loact"),
    params:
        command="loact",
        args=stage_args("loact"),
    shell:
        "crop {params.command} {params.args} > {log:q} 2>&1"


use rule loact as loact_replicate with:
    output:
        loact=f"{R}/{REP}/loact.csv",
        loact_meta=f"{R}/{REP}/loact.meta.json",
        loact_episodes=f"{R}/{REP}/loact_episodes.csv",
        loact_episodes_meta=f"{R}/{REP}/loact_episodes.meta.json",
        certified_ratio=f"{R}/{REP}/certified_ratio.csv",
        certified_ratio_meta=f"{R}/{REP}/certified_ratio.meta.json",
        frames=f"{R}/{REP}/frames.npz",
        frames_meta=f"{R}/{REP}/frames.meta.json",
    log:
        f"{R}/logs/{REP}/loact.log",
    benchmark:
        f"{R}/benchmarks/{REP}/loact.tsv"
    params:
        command="loact",
        args=stage_args("loact", replicate=True),


rule gre:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
    output:
        gre=f"{R}/{RUN}/gre.csv",
        gre_meta=f"{R}/{RUN}/gre.meta.json",
        gre_returns=f"{R}/{RUN}/gre_returns.csv",
        gre_returns_meta=f"{R}/{RUN}/gre_returns.meta.json",
    log:
        f"{R}/logs/{RUN}/gre.log",
    benchmark:
        f"{R}/benchmarks/{RUN}/gre.tsv"
    priority: gpu_first(stage_job_gpus("gre"))
    conda:
        "../envs/crop.yaml"
    threads: stage_job_threads("gre")
    resources:
        **stage_resources("gre"),
    params:
        command="gre",
        args=stage_args("gre"),
    shell:
        "crop {params.command} {params.args} > {log:q} 2>&1"


rule lore:
    input:
        model=run_checkpoint,
        record=run_checkpoint_record,
        qrange=qrange_input,
    output:
        lore=f"{R}/{RUN}/lore.csv",
        lore_meta=f"{R}/{RUN}/lore.meta.json",
        lore_states=f"{R}/{RUN}/lore_states.csv",
        lore_states_meta=f"{R}/{RUN}/lore_states.meta.json",
    log:
        f"{R}/logs/{RUN}/lore.log",
    benchmark:
        f"{R}/benchmarks/{RUN}/lore.tsv"
    priority: gpu_first(stage_job_gpus("lore"))
    conda:
        "../envs/crop.yaml"
    threads: stage_job_threads("lore")
    resources:
        **stage_resources("lore"),
    params:
        command="lore",
        args=stage_args("lore"),
    shell:
        "crop {params.command} {params.args} > {log:q} 2>&1"
