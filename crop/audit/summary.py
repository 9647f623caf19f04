"""The closing summary of a workflow run (the Snakefile's ``onsuccess:``): where the results are, the audit's
verdict when the run has one (``RESULTS/audit/audit.json``), the figures and tables, and the command that
writes the HTML report.  It only reads; a results folder without an audit, figures or tables is described as
it is, never as a failure."""
from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path

#: Result files whose modification after the audit makes its verdict out of date (the audit reads them).
_AUDITED_SUFFIXES = (".csv", ".json", ".pt", ".npz")


def _shown(path: Path | str) -> str:
    """A path as a reader would type it: relative to the working directory when inside it."""
    p = Path(path)
    try:
        return str(p.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def _audit_line(results: Path) -> list[str]:
    audit_json = results / "audit" / "audit.json"
    if not audit_json.is_file():
        return [f"audit:   none in {_shown(results)} yet (the default target runs it; "
                f"or: crop audit {shlex.quote(_shown(results))})"]
    from crop.audit.audit_md import verdict_line

    try:
        rep = json.loads(audit_json.read_text())
        line = verdict_line(rep)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"audit:   {_shown(audit_json)} is unreadable ({type(exc).__name__}): rerun the audit"]
    lines = [f"audit:   {line} ({_shown(results / 'audit' / 'audit.md')})"]
    if rep.get("incomplete_runs"):
        lines.append(f"         {len(rep['incomplete_runs'])} incomplete run(s) not audited (listed in audit.md)")
    audited_at = audit_json.stat().st_mtime
    newer = [p for p in results.rglob("*") if p.suffix in _AUDITED_SUFFIXES and p.is_file()
             and p.parent.name not in ("audit", "tables") and p.stat().st_mtime > audited_at]
    if newer:
        lines.append(f"         older than {len(newer)} result file(s) (e.g. {_shown(newer[0])}): "
                     "this verdict is out of date until the audit runs again")
    return lines


def _count(folder: Path, suffix: str) -> int:
    return sum(1 for _ in folder.glob(f"*{suffix}")) if folder.is_dir() else 0


def run_summary(results: Path | str, configfiles: Iterable[Path | str] = ()) -> str:
    """The summary as text: audit verdict (PASS/FAIL with its counts, or that there is none yet), figures,
    tables, and the ``snakemake --report`` command for this config (``configfiles``: the run's
    ``--configfile`` arguments; none for the default config.yaml)."""
    results = Path(results)
    figures, tables = results / "figures", results / "tables"
    lines = [f"Summary: results in {_shown(results)}/", *_audit_line(results)]
    n_png, n_pdf = _count(figures, ".png"), _count(figures, ".pdf")
    lines.append(f"figures: {n_png} PNG, {n_pdf} PDF in {_shown(figures)}/" if n_png or n_pdf
                 else "figures: none yet (written by the aggregate rule, part of the default target)")
    n_csv = _count(tables, ".csv")
    lines.append(f"tables:  {n_csv} tables (CSV, Markdown, LaTeX) in {_shown(tables)}/" if n_csv
                 else "tables:  none yet")
    cfg_args = "".join(f" --configfile {shlex.quote(_shown(c))}" for c in configfiles)
    lines.append(f"report:  snakemake --report report.html{cfg_args}   (one HTML file: figures, tables, audit)")
    return "\n".join(lines)


def print_summary(results: Path | str, configfiles: Iterable[Path | str] = (), file=None) -> None:
    """Print :func:`run_summary` (to stderr, where Snakemake writes its own messages)."""
    print(run_summary(results, configfiles), file=file or sys.stderr, flush=True)

