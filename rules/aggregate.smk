# Stage 5: tidy tables and the paper's figures from all runs in the config (names: crop/layout.py).
# Every PNG is in the report, one caption per figure family; the PDFs are the same figures for papers.


rule aggregate:
    input:
        aggregate_inputs(),
    output:
        stepwise=report(
            figure_outputs("png", "stepwise"),
            caption="../report/stepwise.rst",
            category="Certified actions (LoAct)",
            subcategory="Certified radius per step",
        ),
        certified_ratio=report(
            figure_outputs("png", "certified_ratio"),
            caption="../report/certified_ratio.rst",
            category="Certified actions (LoAct)",
            subcategory="Certified ratio",
        ),
        loact_clean=report(
            figure_outputs("png", "loact_clean"),
            caption="../report/loact_clean.rst",
            category="Certified actions (LoAct)",
            subcategory="Benign return",
        ),
        periodic=report(
            figure_outputs("png", "periodic"),
            caption="../report/periodic.rst",
            category="Certified actions (LoAct)",
            subcategory="Pong periodic patterns",
        ),
        global_mean=report(
            figure_outputs("png", "global_mean"),
            caption="../report/global_mean.rst",
            category="Certified rewards (GRe, LoRe)",
            subcategory="Expectation bound",
        ),
        global_median=report(
            figure_outputs("png", "global_median"),
            caption="../report/global_median.rst",
            category="Certified rewards (GRe, LoRe)",
            subcategory="Percentile bound",
        ),
        adasearch=report(
            figure_outputs("png", "adasearch"),
            caption="../report/adasearch.rst",
            category="Certified rewards (GRe, LoRe)",
            subcategory="Absolute bound (LoRe)",
        ),
        all_bounds=report(
            figure_outputs("png", "all_bounds"),
            caption="../report/all_bounds.rst",
            category="Certified rewards (GRe, LoRe)",
            subcategory="All bounds",
        ),
        large_sigma=report(
            figure_outputs("png", "large_sigma"),
            caption="../report/large_sigma.rst",
            category="Certified actions (LoAct)",
            subcategory="Freeway, large sigma",
        ),
        legend=report(
            figure_outputs("png", "legend"),
            caption="../report/legend.rst",
            category="Legends",
        ),
        pdfs=figure_outputs("pdf"),
        tables=report(table_outputs("csv"), caption="../report/tables.rst", category="Tables"),
        tables_md=table_outputs("md"),
        tables_tex=table_outputs("tex"),
    log:
        f"{R}/logs/aggregate.log",
    conda:
        "../envs/crop.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        figures=lambda w, output: os.path.dirname(output.pdfs[0]),
        tables=lambda w, output: os.path.dirname(output.tables_tex[0]),
        eps=floats(CFG["report"]["table_eps_factors"]),
        # read by the captions (report/*.rst)
        settings=caption_settings(),
        alpha=CFG["alpha"],
        table_eps_factors=CFG["report"]["table_eps_factors"],
    shell:
        "crop aggregate --inputs {input:q} --table-eps-factors {params.eps} "
        "--figures {params.figures:q} --tables {params.tables:q} > {log:q} 2>&1"
