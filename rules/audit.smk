# Stage 6: audit — integrity of every result file, soundness (no attack below a certified bound beyond what
# chance allows, no bound rising with ε), provenance (config hash, checkpoint, commits, seeds, runtimes), and
# the comparison with a reference table when the config names one (audit.reference: a CSV, or `paper` for
# the paper's published numbers) — then also the reproduction report (reproduction.md, one figure per env).
from crop.envs import env_spec
from crop.report.captions import audit_settings
from crop.reference import resolve_reference

AUDIT_REFERENCE = CFG["audit"].get("reference")
# With a reference: reproduction.md and one figure per environment (crop.audit.reproduction).
REPRODUCTION_MD = [f"{R}/audit/reproduction.md"] if AUDIT_REFERENCE else []
REPRODUCTION_FIGURES = [f"{R}/audit/reproduction_{env_spec(e).paper_name}.png" for e in ENVS if AUDIT_REFERENCE]


rule audit:
    input:
        runs=all_run_files(),
        records=checkpoint_records(),
        tables=table_outputs(),
        # the reference (`paper`: the packaged table) and tolerances: the audit reruns when they change
        extra=[str(resolve_reference(p)) if p == AUDIT_REFERENCE else p for p in audit_extra_inputs()],
    output:
        md=report(f"{R}/audit/audit.md", caption="../report/audit.rst", category="Audit"),
        json=f"{R}/audit/audit.json",
        reproduction=REPRODUCTION_MD
        + [report(f, caption="../report/reproduction.rst", category="Audit") for f in REPRODUCTION_FIGURES],
    log:
        f"{R}/logs/audit.log",
    conda:
        "../envs/crop.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=predicted("audit", "runtime", 0),
    params:
        out_dir=lambda w, output: os.path.dirname(output.json),
        options=audit_options(),
        # without audit.strict the job keeps audit.md whatever the verdict (crop.audit.audit.exit_status)
        keep="" if CFG["audit"].get("strict") else "--report-only",
        config_hash=CONFIG_HASH,
        # read by the captions (report/audit.rst, report/reproduction.rst)
        audit=audit_settings(CFG["audit"]),
    shell:
        "crop audit --inputs {input.runs:q} --out-dir {params.out_dir:q} --config-hash {params.config_hash:q} "
        "{params.options} {params.keep} > {log:q} 2>&1"
