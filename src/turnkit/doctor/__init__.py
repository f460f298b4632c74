"""``turnkit doctor``: audit a checkpoint, or prepared training data, for every chat-format mistake.

The checkpoint's own template, tokenizer and configs are rendered and tokenized for real (never its weights), and
each problem becomes a :class:`Finding` with a stable check id, a severity, a message naming the file, token and id,
and a concrete fix. A check that cannot run on a target is listed in ``Report.not_evaluated`` with the reason.

>>> from turnkit import doctor
>>> report = doctor.run("path/to/model")            # a HF folder, a .gguf file, "default", or a PEFT adapter
>>> report.exit_code(), [f.check for f in report.errors]
>>> doctor.run_data("prepared/", model="path/to/model").to_dict()

Modules: :mod:`~turnkit.doctor.target` reads a checkpoint, :mod:`~turnkit.doctor.probe` learns what its template
writes, :mod:`~turnkit.doctor.registry` is the table of checks (``checks_*`` modules hold them),
:mod:`~turnkit.doctor.data` reads prepared rows, :mod:`~turnkit.doctor.output` writes reports as text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from turnkit.doctor.checks_data import DataContext
from turnkit.doctor.context import Context
from turnkit.doctor.data import read_dataset
from turnkit.doctor.findings import DoctorInputError, Finding, Report, Severity, Skipped
from turnkit.doctor.registry import (
    CHECKPOINT_CHECKS,
    CHECKS,
    DATA_CHECKS,
    RUNTIME_CHECK,
    Check,
    run_checks,
    validate_ignore,
)
from turnkit.doctor.runtimes import renderers
from turnkit.doctor.runtimes.check import RuntimeDivergence
from turnkit.doctor.target import Target, load_target

__all__ = [
    "CHECKPOINT_CHECKS",
    "CHECKS",
    "DATA_CHECKS",
    "Check",
    "DoctorInputError",
    "Finding",
    "Report",
    "Severity",
    "Skipped",
    "run",
    "run_data",
]

#: Rows ``run_data`` reads unless told otherwise.
DEFAULT_LIMIT = 2000


def _report(target: Target, label: str) -> Report:
    """An empty report; file names in findings are relative to ``root`` (CI annotations join them)."""
    root = target.path if target.path.is_dir() else target.path.parent
    return Report(label, target.description, extra={"root": str(root)})


def run(
    path: str | Path,
    *,
    ignore: Iterable[str] = (),
    base: str | Path | None = None,
    runtimes: Iterable[str] | None = None,
    tokenizer: str | Path | None = None,
) -> Report:
    """Audit a checkpoint: a Hugging Face folder, a ``.gguf`` file, ``"default"``, or a PEFT adapter folder; or a
    chat template file (``.jinja``) before it is released, with ``tokenizer`` (a model folder or a ``.gguf`` file)
    for the checks that need token ids (without one they are listed as not evaluated, saying so).

    ``base`` is an adapter's base model folder, when its ``base_model_name_or_path`` is a hub name. ``runtimes``
    (runtime names, or ``["all"]``) also runs ``runtime-divergence``: the template in those other Jinja runtimes.

    Raises:
        DoctorInputError: The path cannot be audited (missing, unreadable JSON, no tokenizer, truncated GGUF).
    """
    skip = validate_ignore(ignore)
    chosen = None if runtimes is None else renderers(runtimes)
    target = load_target(path, base=base, tokenizer=tokenizer)
    context = Context(target)
    report = run_checks(context, CHECKPOINT_CHECKS, _report(target, str(path)), skip)
    if context.forgery is not None:
        report.extra["forgery"] = context.forgery
    if chosen is not None:
        divergence = RuntimeDivergence(chosen)
        run_checks(context, [replace(RUNTIME_CHECK, run=divergence)], report, skip)
        report.extra["runtimes"] = divergence.to_list()
    return report


def run_data(
    data: str | Path, *, model: str | Path | None = None, ignore: Iterable[str] = (), limit: int = DEFAULT_LIMIT
) -> Report:
    """Audit prepared training data (``input_ids`` and ``labels`` rows) against the model it trains.

    ``model`` defaults to the one named in a ``turnkit prepare`` manifest. At most ``limit`` rows are read.
    """
    skip = validate_ignore(ignore)
    if limit < 1:
        raise DoctorInputError(f"--limit must be at least 1, not {limit}")
    dataset = read_dataset(data, limit=limit, model=None if model is None else str(model))
    model = model if model is not None else dataset.model
    if model is None:
        raise DoctorInputError(f"{data} has no turnkit manifest naming its model: pass --model PATH")
    target = load_target(model)
    report = Report(str(data), f"training data for {target.given}")
    return run_checks(DataContext(Context(target), dataset), DATA_CHECKS, report, skip)
