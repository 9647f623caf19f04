# Stage 6: audit — integrity of every result file, soundness (no attack below a certified bound, no
# bound rising with ε), provenance (config hash, checkpoint, commits, seeds, runtimes), and the comparison
# with a reference table when the config names one (audit.reference).


rule audit:
    input:
        runs=all_run_files(),
        records=checkpoint_records(),
        tables=table_outputs(),
        extra=audit_extra_inputs(),
    output:
        md=report(f"{R}/audit/audit.md", caption="../report/audit.rst", category="Audit"),
        json=f"{R}/audit/audit.json",
    log:
        f"{R}/logs/audit.log",
    conda:
        "../envs/crop.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        out_dir=lambda w, output: os.path.dirname(output.json),
        options=audit_options(),
        config_hash=CONFIG_HASH,
        # read by the caption (report/audit.rst)
        audit=CFG["audit"],
    shell:
        "crop audit --inputs {input.runs} --out-dir {params.out_dir} --config-hash {params.config_hash} "
        "{params.options} > {log} 2>&1"
