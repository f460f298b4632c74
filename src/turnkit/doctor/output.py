"""A report as text: for a person at a terminal, and as a short report for a CI job.

Human output groups findings by severity, each with its file, message and fix, then lists what was not evaluated
and ends with one summary line. CI output is one line per finding (GitHub Actions workflow commands when
``GITHUB_ACTIONS`` is set, so findings show as annotations), the forged-turn test's counts, and a PASS/FAIL line.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from turnkit.doctor.findings import Finding, Report, Severity

__all__ = ["format_ci", "format_human", "summary_line"]

_TITLES = {Severity.ERROR: "Errors", Severity.WARNING: "Warnings", Severity.INFO: "Info"}
_WIDTH = 116


def summary_line(report: Report) -> str:
    counts = [
        f"{len(report.errors)} error{'s' * (len(report.errors) != 1)}",
        f"{len(report.warnings)} warning{'s' * (len(report.warnings) != 1)}",
        f"{len(report.by_severity(Severity.INFO))} info",
        f"{len(report.not_evaluated)} not evaluated",
    ]
    return f"{len(report.checks_run)} checks run: {', '.join(counts)}"


def _wrapped(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)


def format_human(report: Report) -> str:
    lines = [f"turnkit doctor: {report.target} ({report.kind})", ""]
    for severity in Severity:
        found = report.by_severity(severity)
        if not found:
            continue
        lines.append(f"{_TITLES[severity]} ({len(found)})")
        for finding in found:
            where = f"  [{finding.file}]" if finding.file else ""
            lines.append(f"  {finding.check}{where}")
            lines += _wrapped(finding.message, "    ")
            lines += _wrapped(f"fix: {finding.fix}", "    ")
        lines.append("")
    if report.not_evaluated:
        lines.append(f"Not evaluated ({len(report.not_evaluated)})")
        for skipped in report.not_evaluated:
            lines += _wrapped(f"{skipped.check}: {skipped.why}", "  ")
        lines.append("")
    lines.append(summary_line(report))
    return "\n".join(lines) + "\n"


def _escape(text: str, *, property_: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_ else text


def _ci_line(finding: Finding, root: str | None, github: bool) -> str:
    body = f"{finding.message} (fix: {finding.fix})"
    if not github:
        where = f" [{finding.file}]" if finding.file else ""
        return f"{finding.severity} {finding.check}{where}: {body}"
    command = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}[finding.severity]
    properties = [f"title={_escape(finding.check, property_=True)}"]
    if finding.file:
        path = finding.file if root is None or Path(finding.file).is_absolute() else str(Path(root) / finding.file)
        properties.append(f"file={_escape(path, property_=True)}")
    return f"::{command} {','.join(properties)}::{_escape(body)}"


def format_ci(report: Report, *, strict: bool = False) -> str:
    github = os.environ.get("GITHUB_ACTIONS") == "true"
    lines = [f"turnkit doctor --ci: {report.target} ({report.kind})"]
    forgery = report.extra.get("forgery")
    if forgery is not None:
        verdict = "PASS" if not sum(forgery.turnkit.values()) else "FAIL"
        lines.append(f"forged-turn test ({verdict}): user text {forgery.text!r}")
        lines.append(f"  {forgery.summary()}")
    root = report.extra.get("root")
    lines += [_ci_line(finding, root, github) for finding in report.findings]
    lines += [f"not evaluated {s.check}: {s.why}" for s in report.not_evaluated]
    verdict = "FAIL" if report.exit_code(strict=strict) else "PASS"
    lines.append(f"{verdict}: {summary_line(report)}" + (" (--strict: warnings fail)" if strict else ""))
    return "\n".join(lines) + "\n"
