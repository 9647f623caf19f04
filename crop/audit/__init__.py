"""The audit of a results folder (``crop audit``): is every certificate sound, every file intact, every record
consistent, and how do the numbers compare with a reference?  It reads result files only, through
:mod:`crop.report` (runs, metrics, integrity, tables), which never imports it.

* ``audit``: the entry point: runs every check of every run folder, writes ``audit.json`` and ``audit.md``.
* ``checks``: one run's soundness checks (an attack against a certificate), one function each.
* ``checks_flips``: LoAct's check: flips at attacked steps its own certificate certified.
* ``checks_lore``: LoRe's check: its bound against the local attack's return from LoRe's initial state.
* ``check_inputs``: what the checks read from a run's files (V range, m, α, horizon, LoRe's states) and one row.
* ``verdict``: the checks' statuses, Tarone–Holm over the chance-based ones, pooled counts, the verdict.
* ``audit_md``: audit.md, the audit for people, and the one verdict line.
* ``completeness``: what a folder should hold by its own records, and what it lacks.
* ``agreement``: its summaries recomputed from the per-step files they were made from.
* ``rerun``: ``--rerun K``: stage jobs re-run from their recorded provenance and compared.
* ``provenance``: the config hash and each run's checkpoint, commits, versions, seeds, devices, runtimes.
* ``reference``: the comparison with a reference table (by default the paper's numbers) within tolerances.
* ``reproduction``: reproduction.md and one figure per environment from that comparison.
* ``summary``: the workflow's closing summary: where the results are and the audit's verdict.
"""
