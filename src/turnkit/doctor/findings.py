"""What a doctor run found: findings with a stable check id, a severity, a message and a fix; and the report.

A finding is written for the person who has to act on it: the message names the file, the token and the id
involved, and the fix says what to change. The JSON form (:meth:`Report.to_dict`) is the stable interface for
machines::

    {"target": ..., "checks_run": [...],
     "findings": [{"check", "severity", "message", "fix", "file"}],
     "not_evaluated": [{"check", "why"}]}

and, with ``--runtimes``, ``"runtimes": [{"runtime", "version", "served_by", "status", "why", "probes", "ids_changed",
"differences", "failures"}]`` (one entry per runtime, ``status`` identical, differs, fails or not checked).

A check that cannot run on a target (no template to render, no ``config.json`` to compare with) is listed in
``not_evaluated`` with the reason, never dropped silently: an empty findings list must mean "checked, and fine".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from turnkit.errors import DoctorInputError, NotEvaluated

__all__ = ["DoctorInputError", "Finding", "NotEvaluated", "Problem", "Report", "Severity", "Skipped"]


class Severity(StrEnum):
    """``error``: the model will misbehave; ``warning``: it may; ``info``: worth knowing."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Problem:
    """What a check function returns: the runner adds the check id and (unless given here) its severity."""

    message: str
    fix: str
    file: str | None = None
    severity: Severity | None = None


@dataclass(frozen=True)
class Finding:
    """One problem found by one check."""

    check: str
    severity: Severity
    message: str
    fix: str
    file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": str(self.severity),
            "message": self.message,
            "fix": self.fix,
            "file": self.file,
        }


@dataclass(frozen=True)
class Skipped:
    """A check that did not run, and why."""

    check: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "why": self.why}


@dataclass
class Report:
    """The result of a doctor run on one target (a checkpoint or a prepared dataset).

    ``extra`` holds what a run measured beyond findings (the forged-turn counts for ``--ci``); it is not part of the
    JSON shape.
    """

    target: str
    kind: str
    checks_run: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    not_evaluated: list[Skipped] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def by_severity(self, severity: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def errors(self) -> list[Finding]:
        return self.by_severity(Severity.ERROR)

    @property
    def warnings(self) -> list[Finding]:
        return self.by_severity(Severity.WARNING)

    def fired(self) -> set[str]:
        """The ids of the checks that produced at least one finding."""
        return {f.check for f in self.findings}

    def exit_code(self, *, strict: bool = False) -> int:
        """1 when any error was found (with ``strict``, any warning too), else 0."""
        return 1 if self.errors or (strict and self.warnings) else 0

    def to_dict(self) -> dict[str, Any]:
        out = {
            "target": self.target,
            "checks_run": list(self.checks_run),
            "findings": [f.to_dict() for f in self.findings],
            "not_evaluated": [s.to_dict() for s in self.not_evaluated],
        }
        if "runtimes" in self.extra:  # --runtimes: each runtime's result (turnkit.doctor.runtimes.compare)
            out["runtimes"] = self.extra["runtimes"]
        return out
