# Stage 5: tidy tables and the paper's figures from all runs in the config (names: crop/workflow/layout.py).
# Every PNG is in the report, one caption per figure family (report/{family}.rst); the PDFs are the same
# figures for papers.
from crop.report.captions import caption_settings

# Where each figure family sits in the report: (category, subcategory).
LOACT, REWARDS = "Certified actions (LoAct)", "Certified rewards (GRe, LoRe)"
REPORT_PLACES = {
    "stepwise": (LOACT, "Certified radius per step"),
    "certified_ratio": (LOACT, "Certified ratio"),
    "loact_clean": (LOACT, "Benign return"),
    "periodic": (LOACT, "Pong periodic patterns"),
    "global_mean": (REWARDS, "Expectation bound"),
    "global_median": (REWARDS, "Percentile bound"),
    "adasearch": (REWARDS, "Absolute bound (LoRe)"),
    "all_bounds": (REWARDS, "All bounds"),
    "large_sigma": (LOACT, "Freeway, large sigma"),
    "legend": ("Legends", None),
}


rule aggregate:
    input:
        all_run_files(),
    output:
        **{family: report_figures(family) for family in REPORT_PLACES},
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
        runtime=predicted("aggregate", "runtime", 0),
    params:
        figures=lambda w, output: os.path.dirname(output.pdfs[0]),
        tables=lambda w, output: os.path.dirname(output.tables_tex[0]),
        eps=floats(CFG["report"]["table_eps_factors"]),
        # read by the captions (report/*.rst)
        settings=caption_settings(CFG),
        alpha=CFG["alpha"],
        table_eps_factors=CFG["report"]["table_eps_factors"],
    shell:
        "crop aggregate --inputs {input:q} --table-eps-factors {params.eps} "
        "--figures {params.figures:q} --tables {params.tables:q} > {log:q} 2>&1"
