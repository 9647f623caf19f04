# Stage 6: audit — integrity of every result file, soundness (no attack below a certified bound, no
# bound rising with ε), provenance.


rule audit:
    input:
        runs=all_run_files(),
        tables=table_outputs(),
    output:
        md=report(f"{R}/audit/audit.md", caption="../report/audit.rst", category="Audit"),
        json=f"{R}/audit/audit.json",
    log:
        f"{R}/logs/audit.log",
    params:
        out_dir=lambda w, output: os.path.dirname(output.json),
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        "../envs/crop.yaml"
    shell:
        "crop audit --inputs {input.runs} --out-dir {params.out_dir} > {log} 2>&1"
