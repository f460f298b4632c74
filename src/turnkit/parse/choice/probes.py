"""Probe messages rendered through a template to learn how its replies are written (never by reading the Jinja).

Each probe is one user turn and one assistant reply; the serving prompt (``add_generation_prompt=True``) and the
full render are taken, and where the full render continues the prompt, the rest is exactly what a model trained on
the template writes for that reply. Names and values are sentinels that no template writes on its own:

* ``content``: text with markup-looking characters;
* ``reasoning``: ``reasoning_content`` and content;
* ``one_call``: a call with a string and an integer argument; ``two_calls``: it and a second call with a boolean;
  ``bare_call``: a call with no arguments (where a name ends when nothing follows it).

A template whose plain render of the reasoning probe writes none is rendered again with its thinking switch on
(:func:`render_switched_reasoning`): some write their reasoning markers only then.

Call ids take the shapes real models write, since some templates write the id and nothing else: first Mistral's nine
letters and digits (Mistral's templates refuse any other id); where a template writes a call but not its name, again
with Kimi K2's ``functions.NAME:INDEX`` (Kimi's templates that write ``tool_call['id']`` alone: the name is in the
id, and the reading takes it from there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from turnkit.errors import TurnkitError
from turnkit.template.chat_template import ChatTemplate
from turnkit.template.switches import thinking_switch

__all__ = [
    "CONTENT",
    "FIRST",
    "PROBES",
    "PROBE_TOOLS",
    "REASONING",
    "SECOND",
    "Probe",
    "Rendered",
    "named_id",
    "render_probes",
    "render_switched_reasoning",
]

FIRST, SECOND = "probe_alpha", "probe_beta"
FIRST_ID, SECOND_ID = "aB3dE5gH7", "Zq9Wx8Vu7"  # nine letters and digits: Mistral's templates check call ids
#: How Kimi K2 writes a call id (``functions.get_weather:0``): the name is in it.
NAMED_ID_PREFIX, NAMED_ID_INDEX = "functions.", ":"
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


def named_id(name: str, index: int) -> str:
    """A call id as Kimi K2 writes it."""
    return f"{NAMED_ID_PREFIX}{name}{NAMED_ID_INDEX}{index}"


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
    def named_ids(self) -> bool:
        """The calls' ids are Kimi's ``functions.NAME:INDEX``."""
        return any(c["id"].startswith(NAMED_ID_PREFIX) for c in self.message.get("tool_calls", []))

    def with_named_ids(self) -> Probe:
        """The same reply with each call's id as Kimi K2 writes it: ``functions.NAME:INDEX``."""
        calls = [
            {**call, "id": named_id(call["function"]["name"], index)}
            for index, call in enumerate(self.message.get("tool_calls", []))
        ]
        return replace(self, message={**self.message, "tool_calls": calls})

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
    def python_literals(self) -> bool:
        """The rest holds a call's arguments as Python's repr (``{'probe_text': 'probe value one', ...}``): a template
        that writes ``{{ arguments }}`` without ``tojson``."""
        rest = self.rest
        return rest is not None and any(args and repr(args) in rest for _, args in self.probe.calls)

    @property
    def written(self) -> bool:
        """The template writes this reply: the rest continues the prompt and holds the probe's marks."""
        return self.rest is not None and all(mark in self.rest for mark in self.probe.marks)


def render_probes(template: ChatTemplate) -> dict[str, Rendered]:
    """Every probe rendered through ``template``, by name: a call whose render shows its id but not its name is
    rendered again with ids that hold the name (Kimi's), and kept so where the template writes it then."""
    out = {}
    for probe in PROBES:
        rendered = _render(template, probe)
        if _id_without_name(rendered):
            named = _render(template, probe.with_named_ids())
            if named.written:
                rendered = named
        out[probe.name] = rendered
    return out


def _id_without_name(rendered: Rendered) -> bool:
    rest = rendered.rest
    calls = rendered.probe.message.get("tool_calls", [])
    return rest is not None and not rendered.written and any(call["id"] in rest for call in calls)


def render_switched_reasoning(template: ChatTemplate) -> Rendered | None:
    """The ``reasoning`` probe rendered with the template's thinking switch on, for a template whose plain render of
    it writes no reasoning: without tools, then with the probe tools (LongCat-Flash-Chat writes ``<longcat_think>``
    only under ``enable_thinking`` and with tools offered). None where neither render writes the reasoning, or the
    template has no switch that turns thinking on."""
    probe = next(p for p in PROBES if p.name == "reasoning")
    for tools in (None, PROBE_TOOLS):
        try:
            switch = thinking_switch(template.source(tools=tools))
        except TurnkitError:
            return None
        if switch.toggle is None:
            continue
        rendered = _render(template, replace(probe, tools=tools), switch.variables(enabled=True))
        if rendered.written:
            return rendered
    return None


def _render(template: ChatTemplate, probe: Probe, variables: Mapping[str, Any] | None = None) -> Rendered:
    messages = [_USER, probe.message]
    try:
        prompt = template.render(
            messages[:1], tools=probe.tools, add_generation_prompt=True, template_kwargs=variables
        ).text
        full = template.render(messages, tools=probe.tools, template_kwargs=variables).text
    except TurnkitError:
        return Rendered(probe, None, None, refused=True)
    if full.startswith(prompt):
        return Rendered(probe, prompt, full[len(prompt) :], prompt)
    # A template whose generation prompt differs from its render of a final reply (a thinking prompt ending
    # "<think>\n" while the reply is rendered "<think></think>..."): the reply is what follows the part both share,
    # as long as that holds the user's turn.
    shared = _shared_prefix(prompt, full)
    if _USER["content"] in full[:shared]:
        return Rendered(probe, prompt[:shared], full[shared:], prompt)
    return Rendered(probe, prompt, None, prompt)


def _shared_prefix(a: str, b: str) -> int:
    """The length both texts share, cut back so that neither rest starts inside a marker or a word."""
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    while n and (a[n - 1].isalnum() or a[n - 1] in "<[{(|_:/\uff5c"):
        n -= 1
    return n
