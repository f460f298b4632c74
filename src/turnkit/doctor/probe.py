"""What a template writes around turns, learned by rendering probe conversations (never by reading the Jinja).

A template is code; the only faithful way to know its markers is to run it. The probe is a short conversation whose
contents are plain sentences with no marker-like text, so every marker in the render was written by the template:

    system, user, assistant, user, assistant      (without the system turn when the template refuses one)

From the render, :func:`learn_skeleton` takes:

* the markers, in any shape: every added token of the tokenizer, and strings shaped like markers that the tokenizer
  may not know (``<|...|>``, ``<｜...｜>``, ``</s>``; and ``[INST]``, ``<start_of_turn>`` where the template writes
  them between turns, since a default system prompt may hold XML-like tags such as ``<role_description>`` as text);
* the end-of-turn marker: the marker right after an assistant reply (only whitespace between);
* the text between a user message and the reply, and between a reply and the next user message (what a forged turn
  in user text must contain);
* the generation prompt: what ``add_generation_prompt=True`` appends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from turnkit.encode.controls import MARKER_SHAPES
from turnkit.errors import NotEvaluated, TemplateError
from turnkit.format import ChatFormat

__all__ = ["PROBE_TOOL", "Skeleton", "find_markers", "learn_skeleton", "probe_conversation", "tool_markers"]

SYSTEM, USER_1, ASSISTANT_1 = "Probe system text.", "First probe question?", "First probe answer."
USER_2, ASSISTANT_2 = "Second probe question?", "Second probe answer."

#: Marker shapes a tokenizer may fail to hold as one token (an added token is found by the tokenizer's own list).
#: These are markers wherever they appear; encode warns about the same shapes (one table, in encode/controls.py).
STRONG_SHAPES = MARKER_SHAPES
#: Shapes that are also written as plain text (XML-like tags in a default system prompt): markers only where the
#: template writes them between turns.
WEAK_SHAPES = re.compile(
    r"\[/?[A-Z][A-Z_]{1,30}\]"  # [INST], [/INST], [TOOL_CALLS]
    r"|(?<![<\w])</?[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]*>(?!>)"  # <start_of_turn>, <end_of_turn>
)

PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_lookup",
        "description": "Look a probe word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}


def probe_conversation(*, system: bool = True) -> list[dict[str, Any]]:
    """The probe: two user/assistant exchanges, after a system message when ``system``."""
    messages = [{"role": "system", "content": SYSTEM}] if system else []
    return [
        *messages,
        {"role": "user", "content": USER_1},
        {"role": "assistant", "content": ASSISTANT_1},
        {"role": "user", "content": USER_2},
        {"role": "assistant", "content": ASSISTANT_2},
    ]


def _candidates(text: str, tokenizer: Any) -> list[tuple[int, str, bool]]:
    """``(position, marker, weak)`` of every marker-like string in ``text``, added tokens first where they overlap."""
    found: list[tuple[int, str, bool]] = []
    spans: list[tuple[int, int]] = []
    if tokenizer is not None:
        for match in tokenizer.added_pattern.finditer(text):
            found.append((match.start(), match.group(0), False))
            spans.append(match.span())
    for pattern, weak in ((STRONG_SHAPES, False), (WEAK_SHAPES, True)):
        for match in pattern.finditer(text):
            if not any(start <= match.start() < end for start, end in spans):
                found.append((match.start(), match.group(0), weak))
                spans.append(match.span())
    return sorted(found)


def find_markers(text: str, tokenizer: Any, *, between_turns: str = "") -> list[str]:
    """The distinct markers in ``text``, in order: added tokens and strong shapes, and the weak shapes that appear in
    ``between_turns`` (the text the template writes from one message to the next)."""
    candidates = _candidates(text, tokenizer)
    turn_markers = {marker for _, marker, weak in _candidates(between_turns, tokenizer) if weak}
    kept = (marker for _, marker, weak in candidates if not weak or marker in turn_markers)
    return list(dict.fromkeys(kept))


@dataclass(frozen=True)
class Skeleton:
    """What the template writes around the probe's turns."""

    messages: list[dict[str, Any]]
    text: str
    markers: list[str]
    end_marker: str | None
    user_to_assistant: str
    assistant_to_user: str
    #: What ``add_generation_prompt=True`` appends after the probe's user turn ('' when nothing, None when the
    #: prompt is not the render without it plus a suffix).
    generation_prompt: str | None
    #: The serving prompt for the first reply (``add_generation_prompt=True``).
    prompt: str
    #: The render of the conversation through the first reply, up to the reply's text: what the model saw in
    #: training just before it wrote the reply (None when the template dropped the reply).
    reply_lead: str | None

    @property
    def missing_header(self) -> str | None:
        """What training wrote between the user's turn and the reply that the serving prompt lacks, if anything.

        None when the serving prompt is not simply cut short: it ends where a reply starts (Mistral's ``[/INST]``),
        or it writes its own opening (a template that always appends an empty thinking block).
        """
        lead = self.reply_lead
        if lead is None or not lead.startswith(self.prompt):
            return None
        return lead[len(self.prompt) :] if lead[len(self.prompt) :].strip() else None


def render_probe(fmt: ChatFormat) -> tuple[list[dict[str, Any]], str]:
    """The probe's render, retried without the system turn for templates that refuse one."""
    failure: TemplateError | None = None
    for system in (True, False):
        messages = probe_conversation(system=system)
        try:
            return messages, fmt.render(messages)
        except TemplateError as exc:
            failure = exc
    raise NotEvaluated(f"the template refuses the probe conversation: {failure}")


def _between(text: str, before: str, after: str) -> str:
    start = text.find(before)
    end = text.find(after, start + len(before)) if start >= 0 else -1
    return text[start + len(before) : end] if end >= 0 else ""


def learn_skeleton(fmt: ChatFormat, tokenizer: Any) -> Skeleton:
    """Render the probe and read the template's structure off it (``NotEvaluated`` if the template refuses)."""
    messages, text = render_probe(fmt)
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    try:
        prompt = fmt.render(messages[: first_user + 1], add_generation_prompt=True)
        plain = fmt.render(messages[: first_user + 1])
        answered = fmt.render(messages[: first_user + 2])
    except TemplateError as exc:
        raise NotEvaluated(f"the template refuses the probe conversation: {exc}") from None
    header = prompt[len(plain) :] if prompt.startswith(plain) else None
    user_to_assistant, assistant_to_user = _between(text, USER_1, ASSISTANT_1), _between(text, ASSISTANT_1, USER_2)
    between = "\n".join([user_to_assistant, assistant_to_user, header or ""])
    markers = find_markers(text + "\n" + (header or ""), tokenizer, between_turns=between)
    return Skeleton(
        messages=messages,
        text=text,
        markers=markers,
        end_marker=_end_marker(text, markers, tokenizer),
        user_to_assistant=user_to_assistant,
        assistant_to_user=assistant_to_user,
        generation_prompt=header,
        prompt=prompt,
        reply_lead=answered[: answered.find(ASSISTANT_1)] if ASSISTANT_1 in answered else None,
    )


def _end_marker(text: str, markers: list[str], tokenizer: Any) -> str | None:
    """The marker the template writes right after the first reply (only whitespace between), if any."""
    if ASSISTANT_1 not in text:
        return None
    after = text[text.index(ASSISTANT_1) + len(ASSISTANT_1) :]
    for position, marker, _ in _candidates(after, tokenizer):
        if after[:position].strip():
            return None
        if marker in markers:
            return marker
    return None


def tool_markers(fmt: ChatFormat, tokenizer: Any) -> list[str]:
    """Markers the template writes for tools, a tool call and its result ([] when it refuses tools)."""
    call = {"type": "function", "function": {"name": "probe_lookup", "arguments": {"word": "probe"}}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": USER_1},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", **call}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "probe_lookup", "content": "found"},
        {"role": "assistant", "content": ASSISTANT_1},
    ]
    try:
        text = fmt.render(messages, tools=[PROBE_TOOL])
    except TemplateError:
        return []
    return find_markers(text, tokenizer)
