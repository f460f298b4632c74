"""What a render holds of each assistant turn: data that a template leaves out is never trained silently.

Marking tags each field of a message with its own source (:func:`~turnkit.encode.marking.field_source`), so the
sources in a render's data spans say which fields of which message the template wrote. That is known from the render
itself, for any template: no family is special-cased. Two outcomes matter:

* A trained assistant turn whose tool calls, or whose whole content, the template does not write (SmolLM2's template
  writes no tool calls): the row would train what is left, often an empty reply that stops at once after the user's
  question. That raises :class:`~turnkit.errors.DroppedDataError` naming the message and the field, unless
  ``allow_dropped=True``.
* Reasoning a template leaves out (Qwen3 drops it from the turns before the last user message, by design): allowed,
  and listed in ``Encoding.unrendered`` so that a pipeline can count it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from typing import Any

from turnkit.encode.marking import FIELD_GROUPS, field_source
from turnkit.errors import DroppedDataError

__all__ = ["REASONING", "check_trained", "unrendered"]

#: The field name reasoning is reported under (whichever alias the message used).
REASONING = "reasoning_content"


def _has_text(value: Any) -> bool:
    """Whether a field holds text a template could write (whitespace alone may be trimmed away)."""
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, dict):
        return any(_has_text(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_text(v) for v in value)
    return False


def _telltales(field: str, value: Any) -> list[str]:
    """Strings that show a field in a render: each call's function name, else each non-blank line of the text."""
    if field == "tool_calls":
        calls = [c.get("function", c) for c in value if isinstance(c, dict)]
        return [c["name"] for c in calls if isinstance(c, dict) and isinstance(c.get("name"), str)]
    if isinstance(value, list):
        value = "\n".join(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return [line.strip() for line in str(value).splitlines() if line.strip()]


class _TemplateText:
    """The render's text outside every data span, built when first needed."""

    def __init__(self, text: str, spans: Sequence[tuple[int, int, int]]) -> None:
        self.text, self.spans = text, spans
        self._value: str | None = None

    def __contains__(self, needle: str) -> bool:
        if self._value is None:
            pieces, last = [], 0
            for start, end, _ in sorted(self.spans):
                if start > last:
                    pieces.append(self.text[last:start])
                last = max(last, end)
            pieces.append(self.text[last:])
            self._value = "\x00".join(pieces)
        return needle in self._value


def unrendered(
    chat: list[dict[str, Any]], sources: Set[int], text: str, spans: Sequence[tuple[int, int, int]]
) -> tuple[tuple[int, str], ...]:
    """``(message index, field)`` of each assistant field with text that the render does not hold.

    ``sources`` are the sources of the render's non-empty data spans (``spans``, over ``text``). A field none of them
    came from is still counted as written when one of its telltales (a call's name, a line of its text) appears in the
    render outside the data spans: provenance lost in an exotic template (``'x' + (y|tojson|safe)`` builds a
    ``Markup``, which carries no spans) must not turn into a false refusal.
    """
    out = []
    outside: _TemplateText | None = None
    for index, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        for field, aliases in FIELD_GROUPS.items():
            present = [name for name in aliases if name in message]
            if not present:
                continue
            value = message[present[0]]
            holds = bool(value) if field == "tool_calls" else _has_text(value)
            if not holds or field_source(index, present[0]) in sources:
                continue
            outside = outside or _TemplateText(text, spans)
            if not any(telltale in outside for telltale in _telltales(field, value)):
                out.append((index, field))
    return tuple(out)


def check_trained(dropped: Iterable[tuple[int, str]], sources: Set[int], selected: Set[int], *, allow: bool) -> None:
    """Refuse a trained turn whose tool calls or content the template left out (reasoning is only counted)."""
    if allow:
        return
    fields: dict[int, list[str]] = {}
    for index, field in dropped:
        if index in selected and field != REASONING:
            fields.setdefault(index, []).append(field)
    if not fields:
        return
    index = min(fields)
    field = fields[index][0]
    what = "tool calls" if field == "tool_calls" else "content"
    written = any(field_source(index, name) in sources for group in FIELD_GROUPS.values() for name in group)
    left = "what is left of the turn" if written else "an empty reply, one that stops at once"
    raise DroppedDataError(
        f"the template does not write this trained turn's {what}, so the example would teach {left}; use a "
        'template that renders them, leave the turn out of training ("train": false), or pass allow_dropped=True '
        "to train it anyway",
        index=index,
        field=field,
    )
