"""One template rendered by every runtime on every probe, against turnkit's reference: identical, differs or fails.

Per runtime the answer is the worst of its probes: ``fails`` when it refuses a probe the reference renders (its own
error kept), ``differs`` when a render is not byte-identical (the probe named, the first differing line shown as
``template-drift`` shows it), ``identical`` when every probe matches, and ``not checked`` when the runtime is not
installed here, never counted as identical. Causes are reduced to short keys so the corpus table can count them.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnkit.doctor.checks_template import _around, _first_difference
from turnkit.doctor.runtimes.base import Renderer, RenderFailure
from turnkit.doctor.runtimes.probes import PROBE_TEXTS, ProbeRender

__all__ = ["Difference", "ProbeFailure", "RuntimeResult", "compare", "difference_cause", "failure_cause"]

IDENTICAL, DIFFERS, FAILS, NOT_CHECKED = "identical", "differs", "fails", "not checked"


@dataclass(frozen=True)
class Difference:
    """A probe the runtime renders differently: where, and the two lines cut around the first differing character."""

    probe: str
    line: int
    reference: str
    runtime: str
    cause: str
    #: Whether the checkpoint's tokenizer gives the two renders different ids (None: no tokenizer to tell).
    ids_changed: bool | None = None

    def describe(self) -> str:
        return f"{self.probe!r} differs at line {self.line}: turnkit {self.reference} vs {self.runtime}"


@dataclass(frozen=True)
class ProbeFailure:
    """A probe the reference renders and the runtime refuses, with the runtime's own error."""

    probe: str
    message: str

    @property
    def cause(self) -> str:
        return failure_cause(self.message)


@dataclass
class RuntimeResult:
    """What one runtime did with one template's probes."""

    runtime: str
    version: str
    served_by: str
    status: str = NOT_CHECKED
    why: str | None = None
    compared: int = 0
    identical: int = 0
    differences: list[Difference] = field(default_factory=list)
    failures: list[ProbeFailure] = field(default_factory=list)

    @property
    def ids_changed(self) -> bool | None:
        """Whether some differing render tokenizes to other ids (None: no tokenizer, or nothing differs)."""
        known = [d.ids_changed for d in self.differences if d.ids_changed is not None]
        return any(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "version": self.version,
            "served_by": self.served_by,
            "status": self.status,
            "why": self.why,
            "probes": {
                "compared": self.compared,
                "identical": self.identical,
                "differs": len(self.differences),
                "fails": len(self.failures),
            },
            "ids_changed": self.ids_changed,
            "differences": [
                {
                    "probe": d.probe,
                    "line": d.line,
                    "reference": d.reference,
                    "runtime": d.runtime,
                    "ids_changed": d.ids_changed,
                }
                for d in self.differences
            ],
            "failures": [{"probe": f.probe, "error": f.message} for f in self.failures],
        }


_NUMBERS = re.compile(r"\d+")


def failure_cause(message: str) -> str:
    """A runtime error reduced to a countable key: the line that names the error, positions taken out."""
    lines = [line.strip() for line in message.splitlines() if line.strip().strip("-^ ")]
    lines = [line for line in lines if not line.startswith("...")] or ["(no message)"]
    head = next((line for line in lines if "Error" in line or "Exception" in line), lines[0])
    head = re.sub(r"^(Error: )+", "", re.sub(r"\s*\(in [^)]*\)$", "", head))
    return _NUMBERS.sub("N", head)[:100]


def difference_cause(reference: str, runtime: str) -> str:
    """What kind of difference two renders show, as a countable key: JSON spacing or escapes (a ``tojson`` of its
    own), HTML escapes, whitespace only, Python's repr against JSON, a probe message one side shows and the other
    leaves out, or the first differing words themselves."""
    if _JSON_GAPS.sub(r"\1", reference) == _JSON_GAPS.sub(r"\1", runtime):
        return "JSON spacing (tojson's separators)"
    if _UNESCAPED.sub(lambda m: chr(int(m[1], 16)), runtime) == reference:
        return "JSON escapes (\\u003c for <)"
    if html.unescape(reference) == html.unescape(runtime):
        return 'HTML escapes (&#34; for ")'
    if "".join(reference.split()) == "".join(runtime.split()):
        return "whitespace only"
    if reference.replace("'", '"') == runtime.replace("'", '"'):
        return "quotes: ' vs \" (Python's repr vs JSON)"
    shown = [text for text in PROBE_TEXTS if (text in reference) != (text in runtime)]
    if shown:
        side = "the runtime shows" if shown[0] in runtime else "the runtime leaves out"
        return f"{side} message text the reference {'leaves out' if shown[0] in runtime else 'shows'}"
    start = next((i for i, (a, b) in enumerate(zip(reference, runtime, strict=False)) if a != b), None)
    start = min(len(reference), len(runtime)) if start is None else start
    return f"other text: {reference[start : start + 16]!r} vs {runtime[start : start + 16]!r}"


_JSON_GAPS = re.compile(r"([:,])[ \t]+")
_UNESCAPED = re.compile(r"\\u00([0-9a-f]{2})")


def compare(
    renders: Sequence[ProbeRender],
    renderer: Renderer,
    ids: Callable[[str], list[int]] | None = None,
) -> RuntimeResult:
    """``renderer``'s renders of the probes against the reference's (``ids`` tokenizes, to tell changed ids)."""
    result = RuntimeResult(renderer.name, renderer.version(), renderer.served_by)
    why = renderer.missing()
    if why is not None:
        result.why = why
        return result
    for render in renders:
        if render.text is None:
            continue
        result.compared += 1
        got = renderer.render(render.template, render.context)
        if isinstance(got, RenderFailure):
            result.failures.append(ProbeFailure(render.probe.name, got.message))
        elif got == render.text:
            result.identical += 1
        else:
            line, left, right = _first_difference(render.text, got)
            shown = _around(left, right)
            changed = None if ids is None else ids(render.text) != ids(got)
            cause = difference_cause(render.text, got)
            result.differences.append(Difference(render.probe.name, line, shown[0], shown[1], cause, changed))
    result.status = FAILS if result.failures else DIFFERS if result.differences else IDENTICAL
    if result.compared == 0:
        result.status, result.why = NOT_CHECKED, "the reference refuses every probe conversation"
    return result
