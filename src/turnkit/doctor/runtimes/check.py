"""The doctor check ``runtime-divergence``: does the checkpoint's template render the same in the other runtimes?

Run only when asked (``turnkit doctor --runtimes``): it starts node and llama.cpp's program. Every runtime gets one
finding, so the report names each: a **warning** when the runtime fails a probe conversation the reference renders, or
renders one to other text whose token ids differ (the model would see another prompt there); **info** when it renders
every probe identically, when the only differences leave the ids unchanged, or when the runtime is not checked here
(not installed, not built: never counted as identical). The JSON report carries every runtime's result under
``runtimes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnkit.doctor.context import Context
from turnkit.doctor.findings import Problem, Severity
from turnkit.doctor.runtimes.base import Renderer
from turnkit.doctor.runtimes.compare import DIFFERS, FAILS, IDENTICAL, RuntimeResult, compare
from turnkit.doctor.runtimes.probes import reference_renders
from turnkit.errors import NotEvaluated

__all__ = ["RuntimeDivergence"]


class RuntimeDivergence:
    """The check, for a chosen set of runtimes; :attr:`results` holds what each did, for the JSON report."""

    def __init__(self, runtimes: Sequence[Renderer]) -> None:
        self.runtimes = list(runtimes)
        self.results: list[RuntimeResult] = []

    def __call__(self, ctx: Context) -> list[Problem]:
        fmt = ctx.fmt
        renders = reference_renders(fmt)
        if all(render.text is None for render in renders):
            raise NotEvaluated(f"the template refuses every probe conversation ({renders[0].refused})")
        tokenizer = ctx.target.tokenizer
        ids = None if tokenizer is None else (lambda text: list(tokenizer.encode(text).ids))
        problems = []
        for runtime in self.runtimes:
            with runtime:
                result = compare(renders, runtime, ids)
            self.results.append(result)
            problems.append(_problem(result, len(renders)))
        return problems

    def to_list(self) -> list[dict[str, Any]]:
        return [result.to_dict() for result in self.results]


def _problem(result: RuntimeResult, probes: int) -> Problem:
    who = f"{result.version} ({result.served_by})"
    skipped = probes - result.compared
    refused = f"; {skipped} probe(s) the reference refuses were not compared" if skipped else ""
    if result.status == IDENTICAL:
        return Problem(
            f"{who}: renders all {result.compared} probe conversations byte-identically{refused}",
            "nothing to do",
            severity=Severity.INFO,
        )
    if result.status == FAILS:
        failure = result.failures[0]
        also = f" and {len(result.differences)} render differently" if result.differences else ""
        return Problem(
            f"{who}: fails {len(result.failures)} of {result.compared} probe conversations{also}; first "
            f"{failure.probe!r}: {failure.message.strip()}",
            f"rewrite what {result.runtime} refuses in a form every runtime runs (docs/guides/other-runtimes.md lists "
            "the common causes), or tell users of those servers to pass a fixed template",
            severity=Severity.WARNING,
        )
    if result.status == DIFFERS:
        first = result.differences[0]
        changed = result.ids_changed
        ids = {True: "the token ids change", False: "the token ids stay the same", None: "no tokenizer to compare ids"}
        return Problem(
            f"{who}: {len(result.differences)} of {result.compared} probe conversations render differently "
            f"({ids[changed]}); first {first.describe()}",
            "make the template's output not depend on runtime details (whitespace control, tojson's spacing, "
            "Python-only methods); docs/guides/other-runtimes.md lists the common causes",
            severity=Severity.INFO if changed is False else Severity.WARNING,
        )
    return Problem(
        f"{who}: not checked: {result.why}", "python -m turnkit.doctor.runtimes setup", severity=Severity.INFO
    )
