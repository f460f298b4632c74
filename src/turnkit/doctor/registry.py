"""The table of checks, and the runner that turns their results into a report.

Every check is one row: a stable id (what ``--ignore`` and the JSON name), a severity, and a small function. Adding
a check is adding a row; the runner and the output follow, and ``docs/guides/doctor.md``'s table gets a row (a test
checks it). Ids never change meaning: scripts and CI configurations key on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from turnkit.doctor import checks_adapter, checks_data, checks_template, checks_tokens
from turnkit.doctor.findings import DoctorInputError, Finding, Problem, Report, Severity, Skipped
from turnkit.errors import NotEvaluated, TurnkitError

__all__ = ["CHECKPOINT_CHECKS", "CHECKS", "DATA_CHECKS", "RUNTIME_CHECK", "Check", "run_checks", "validate_ignore"]

E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO  # noqa: E741 - the severities, by initial


@dataclass(frozen=True)
class Check:
    """One check: its id, its severity, and the function that runs it on a context."""

    id: str
    severity: Severity
    run: Callable[[Any], list[Problem]]


#: Every check a default run makes, in report order: a checkpoint's, then prepared data's. One table: a row's function
#: says which run it belongs to (:mod:`.checks_data`'s read a ``DataContext``, the others a checkpoint's context).
_TABLE: tuple[Check, ...] = (
    Check("template-missing", E, checks_template.check_template_missing),
    Check("template-invalid", E, checks_template.check_template_invalid),
    Check("template-drift", W, checks_template.check_template_drift),
    Check("no-generation-prompt", E, checks_template.check_generation_prompt),
    Check("marker-not-single-token", E, checks_tokens.check_markers_single),
    Check("no-end-marker", E, checks_tokens.check_end_marker_exists),
    Check("eos-not-end-marker", E, checks_tokens.check_eos),
    Check("generation-config-eos", E, checks_tokens.check_generation_config_eos),
    Check("double-bos", W, checks_tokens.check_double_bos),
    Check("vocab-exceeds-model", E, checks_tokens.check_vocab),
    Check("non-special-marker", W, checks_tokens.check_non_special),
    Check("pad-is-end-marker", W, checks_tokens.check_pad),
    Check("adapter-missing-modules-to-save", E, checks_adapter.check_adapter_modules),
    Check("adapter-base-unavailable", W, checks_adapter.check_adapter_base),
    Check("prefix-unstable", I, checks_template.check_prefix_stable),
    Check("history-rewrite", I, checks_template.check_history_rewrite),
    Check("tools-unreadable", W, checks_template.check_tools_unreadable),
    Check("tools-ignored", I, checks_template.check_tools_ignored),
    Check("forgeable-tokenizer", I, checks_tokens.check_forgery),
    Check("data-tokenizer-mismatch", W, checks_data.check_tokenizer_fingerprint),
    Check("labels-not-input-ids", E, checks_data.check_labels_input_ids),
    Check("labels-missing-end-marker", E, checks_data.check_labels_end_marker),
    Check("labels-train-prompt", E, checks_data.check_labels_prompt),
    Check("labels-empty-reply", E, checks_data.check_labels_empty_reply),
    Check("data-summary", I, checks_data.check_data_summary),
)


def _reads_data(check: Check) -> bool:
    return check.run.__module__ == checks_data.__name__


#: What ``doctor`` runs on a checkpoint (a folder, a .gguf file, an adapter).
CHECKPOINT_CHECKS: tuple[Check, ...] = tuple(check for check in _TABLE if not _reads_data(check))
#: What ``doctor --data`` runs on prepared training data.
DATA_CHECKS: tuple[Check, ...] = tuple(check for check in _TABLE if _reads_data(check))


def _asked_only(ctx: Any) -> list[Problem]:
    raise NotEvaluated("runs with --runtimes (it starts the other runtimes)")


#: Run only with ``--runtimes``, so in no default run: ``doctor.run(runtimes=...)`` runs this row with the runtimes
#: asked for (:mod:`turnkit.doctor.runtimes.check`); the row gives ``--ignore`` and the docs' table its id.
RUNTIME_CHECK = Check("runtime-divergence", W, _asked_only)

#: Every check by id.
CHECKS: dict[str, Check] = {check.id: check for check in (*_TABLE, RUNTIME_CHECK)}


def validate_ignore(ignore: Iterable[str]) -> set[str]:
    """The check ids to skip; an unknown id is a usage error (a typo must not silently skip nothing)."""
    ids = {part.strip() for item in ignore for part in item.split(",") if part.strip()}
    unknown = sorted(ids - set(CHECKS))
    if unknown:
        raise DoctorInputError(f"unknown check id {', '.join(unknown)} for --ignore; the ids are: {', '.join(CHECKS)}")
    return ids


def run_checks(context: Any, checks: Sequence[Check], report: Report, ignore: set[str]) -> Report:
    """Run ``checks`` in order on ``context``, filling ``report``; a check that cannot run is listed, with why."""
    for check in checks:
        if check.id in ignore:
            report.not_evaluated.append(Skipped(check.id, "ignored (--ignore)"))
            continue
        try:
            problems = check.run(context)
        except NotEvaluated as exc:
            report.not_evaluated.append(Skipped(check.id, exc.why))
            continue
        except TurnkitError as exc:  # the template failed on a probe: that is the answer for this check
            report.not_evaluated.append(Skipped(check.id, f"{type(exc).__name__}: {exc}"))
            continue
        report.checks_run.append(check.id)
        report.findings.extend(
            Finding(check.id, p.severity or check.severity, p.message, p.fix, p.file) for p in problems
        )
    return report
