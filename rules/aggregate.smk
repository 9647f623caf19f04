# Stage 5: tidy tables and the paper's figures from all runs in the config.


rule aggregate:
    input:
        all_run_files(),
    output:
        figures=report(figure_outputs("png"), caption="../report/figures.rst", category="Figures"),
        pdfs=figure_outputs("pdf"),
        tables=report(table_outputs(), caption="../report/tables.rst", category="Tables"),
    log:
        f"{R}/logs/aggregate.log",
    params:
        figures=lambda w, output: os.path.dirname(output.pdfs[0]),
        tables=lambda w, output: os.path.dirname(output.tables[0]),
        eps=floats(CFG["report"]["table_eps_factors"]),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop aggregate --inputs {input} --table-eps-factors {params.eps} "
        "--figures {params.figures} --tables {params.tables} > {log} 2>&1"
