"""Probe messages rendered through a template to learn how its replies are written (never by reading the Jinja).

Each probe is one user turn and one assistant reply; the serving prompt (``add_generation_prompt=True``) and the
full render are taken, and where the full render continues the prompt, the rest is exactly what a model trained on
the template writes for that reply. Names and values are sentinels that no template writes on its own:

* ``content``: text with markup-looking characters;
* ``reasoning``: ``reasoning_content`` and content;
* ``one_call``: a call with a string and an integer argument; ``two_calls``: it and a second call with a boolean;
  ``bare_call``: a call with no arguments (where a name ends when nothing follows it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from turnkit.errors import TurnkitError
from turnkit.template.chat_template import ChatTemplate

__all__ = [
    "CONTENT",
    "FIRST",
    "PROBES",
    "PROBE_TOOLS",
    "REASONING",
    "SECOND",
    "Probe",
    "Rendered",
    "render_probes",
]

FIRST, SECOND = "probe_alpha", "probe_beta"
FIRST_ID, SECOND_ID = "aB3dE5gH7", "Zq9Wx8Vu7"  # nine letters and digits: Mistral's templates check call ids
TEXT_KEY, COUNT_KEY, FLAG_KEY = "probe_text", "probe_count", "probe_flag"
TEXT_VALUE, COUNT_VALUE = "probe value one", 42
CONTENT = 'Probe answer: {"k": 1} <i>x</i>.'
REASONING = "Probe reasoning text."
ANSWER = "Probe answer text."

PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": FIRST,
            "description": "A probe tool.",
            "parameters": {
                "type": "object",
                "properties": {TEXT_KEY: {"type": "string"}, COUNT_KEY: {"type": "integer"}},
                "required": [TEXT_KEY],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": SECOND,
            "description": "Another probe tool.",
            "parameters": {"type": "object", "properties": {FLAG_KEY: {"type": "boolean"}}},
        },
    },
]

_FIRST_CALL = {"name": FIRST, "arguments": {TEXT_KEY: TEXT_VALUE, COUNT_KEY: COUNT_VALUE}}


def _call(call_id: str, function: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": dict(function)}


@dataclass(frozen=True)
class Probe:
    """One probe reply."""

    name: str
    message: dict[str, Any]
    tools: list[dict[str, Any]] | None = None

    @property
    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        return [(c["function"]["name"], c["function"]["arguments"]) for c in self.message.get("tool_calls", [])]

    @property
    def marks(self) -> tuple[str, ...]:
        """Text the rest must hold for the template to count as writing this reply."""
        if self.calls:
            return tuple(name for name, _ in self.calls)
        if self.message.get("reasoning_content"):
            return (REASONING,)
        return (self.message["content"],)


PROBES: tuple[Probe, ...] = (
    Probe("content", {"role": "assistant", "content": CONTENT}),
    Probe("reasoning", {"role": "assistant", "reasoning_content": REASONING, "content": ANSWER}),
    Probe("one_call", {"role": "assistant", "content": "", "tool_calls": [_call(FIRST_ID, _FIRST_CALL)]}, PROBE_TOOLS),
    Probe(
        "two_calls",
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                _call(FIRST_ID, _FIRST_CALL),
                _call(SECOND_ID, {"name": SECOND, "arguments": {FLAG_KEY: True}}),
            ],
        },
        PROBE_TOOLS,
    ),
    Probe(
        "bare_call",
        {"role": "assistant", "content": "", "tool_calls": [_call(SECOND_ID, {"name": SECOND, "arguments": {}})]},
        PROBE_TOOLS,
    ),
)

_USER = {"role": "user", "content": "Probe question?"}


@dataclass(frozen=True)
class Rendered:
    """A probe through a template: the serving prompt and the rest the reply adds (None where the template refused
    the probe). Where the full render does not continue the serving prompt, ``prompt`` is the part both share and
    ``rest`` what the render writes after it."""

    probe: Probe
    prompt: str | None
    rest: str | None
    #: The serving prompt as rendered (``prompt`` is shorter where the reply's render does not continue it).
    serving: str | None = None
    #: The template raised on this probe (it cannot render such a reply at all).
    refused: bool = False

    @property
    def written(self) -> bool:
        """The template writes this reply: the rest continues the prompt and holds the probe's marks."""
        return self.rest is not None and all(mark in self.rest for mark in self.probe.marks)


def render_probes(template: ChatTemplate) -> dict[str, Rendered]:
    """Every probe rendered through ``template``, by name."""
    out = {}
    for probe in PROBES:
        messages = [_USER, probe.message]
        try:
            prompt = template.render(messages[:1], tools=probe.tools, add_generation_prompt=True).text
            full = template.render(messages, tools=probe.tools).text
        except TurnkitError:
            out[probe.name] = Rendered(probe, None, None, refused=True)
            continue
        if full.startswith(prompt):
            out[probe.name] = Rendered(probe, prompt, full[len(prompt) :], prompt)
            continue
        # A template whose generation prompt differs from its render of a final reply (a thinking prompt ending
        # "<think>\n" while the reply is rendered "<think></think>..."): the reply is what follows the part both
        # share, as long as that holds the user's turn.
        shared = _shared_prefix(prompt, full)
        if _USER["content"] in full[:shared]:
            out[probe.name] = Rendered(probe, prompt[:shared], full[shared:], prompt)
        else:
            out[probe.name] = Rendered(probe, prompt, None, prompt)
    return out


def _shared_prefix(a: str, b: str) -> int:
    """The length both texts share, cut back so that neither rest starts inside a marker or a word."""
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    while n and (a[n - 1].isalnum() or a[n - 1] in "<[{(|_:/\uff5c"):
        n -= 1
    return n
