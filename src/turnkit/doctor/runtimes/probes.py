"""The probe conversations every runtime renders, and the exact context the reference render gives the template.

Each probe is one shape real traffic has: a lone user message with the generation prompt off and on, a system
message, a multi-turn exchange ending in a reply and ending in a question, tools offered, a tool call with its result,
a reply with reasoning, and (for a template with a thinking switch) thinking turned off and on. Contents are doctor's
probe sentences (:mod:`turnkit.doctor.probe`), so any marker in a render is the template's.

Every runtime gets what turnkit's reference render gives the template, built the same way (``normalize_conversation``
for the template's content format, the tool schemas as plain data, the special tokens and the probe's variables, then
``messages``, ``tools``, ``documents`` and ``add_generation_prompt``), as JSON: a difference is the runtime's, never
a difference of input. A probe the reference itself refuses (a template that takes no system message, or no tools)
is not compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnkit.doctor.probe import ASSISTANT_1, ASSISTANT_2, PROBE_TOOL, SYSTEM, USER_1, USER_2
from turnkit.errors import TurnkitError
from turnkit.format import ChatFormat
from turnkit.messages import normalize_conversation, plain_data
from turnkit.template.content import content_format
from turnkit.template.switches import thinking_switch
from turnkit.template.tools import tool_schemas

__all__ = ["PROBE_TEXTS", "Probe", "ProbeRender", "probes", "reference_renders"]

REASONING = "The probe asks for a sentence; answer with one."
#: The probes' message texts (a render that shows one the other leaves out differs in what it shows, not in form).
PROBE_TEXTS = (SYSTEM, USER_1, ASSISTANT_1, USER_2, ASSISTANT_2, REASONING)

_CALL = {"id": "call_1", "type": "function", "function": {"name": "probe_lookup", "arguments": {"word": "probe"}}}


@dataclass(frozen=True)
class Probe:
    """One conversation and the flags it is rendered with."""

    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = False
    variables: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeRender:
    """A probe as the reference renders it: the template text it selects, the context, the text (or its refusal)."""

    probe: Probe
    template: str
    context: dict[str, Any]
    text: str | None
    refused: str | None = None


def probes(source: str) -> list[Probe]:
    """The probe conversations for a template (the thinking switch probes only where it reads a switch)."""
    user = {"role": "user", "content": USER_1}
    exchange = [user, {"role": "assistant", "content": ASSISTANT_1}, {"role": "user", "content": USER_2}]
    out = [
        Probe("plain", [user]),
        Probe("plain, generation prompt", [user], add_generation_prompt=True),
        Probe("system", [{"role": "system", "content": SYSTEM}, user], add_generation_prompt=True),
        Probe("multi-turn", [*exchange, {"role": "assistant", "content": ASSISTANT_2}]),
        Probe("multi-turn, generation prompt", exchange, add_generation_prompt=True),
        Probe("tools offered", [user], [PROBE_TOOL], add_generation_prompt=True),
        Probe(
            "tool call and result",
            [
                user,
                {"role": "assistant", "content": "", "tool_calls": [_CALL]},
                {"role": "tool", "tool_call_id": "call_1", "name": "probe_lookup", "content": "found"},
                {"role": "assistant", "content": ASSISTANT_1},
            ],
            [PROBE_TOOL],
        ),
        Probe(
            "reasoning",
            [
                user,
                {"role": "assistant", "content": ASSISTANT_1, "reasoning_content": REASONING},
                {"role": "user", "content": USER_2},
            ],
            add_generation_prompt=True,
        ),
    ]
    try:
        switch = thinking_switch(source)
    except TurnkitError:
        return out
    if switch.toggle is not None:
        for enabled in (False, True):
            variables = switch.variables(enabled=enabled)
            out.append(Probe(f"thinking {'on' if enabled else 'off'}", [user], None, True, variables))
    return out


def _context(fmt: ChatFormat, template: str, probe: Probe) -> dict[str, Any]:
    """What the reference render gives the template for ``probe`` (as ``render_template`` builds it)."""
    chat = normalize_conversation(probe.messages, content_format=content_format(template), media=True)
    return {
        "messages": chat,
        "tools": plain_data(tool_schemas(probe.tools)),
        "documents": None,
        "add_generation_prompt": probe.add_generation_prompt,
        **plain_data({**fmt.chat_template.special_tokens, **probe.variables}),
    }


def reference_renders(fmt: ChatFormat) -> list[ProbeRender]:
    """Every probe rendered by turnkit (transformers' render, byte for byte), with the context each runtime gets."""
    out = []
    for probe in probes(fmt.chat_template.source(None)):
        template = fmt.chat_template.source(None, tools=probe.tools)
        try:
            text = fmt.chat_template.render(
                probe.messages,
                tools=probe.tools,
                add_generation_prompt=probe.add_generation_prompt,
                template_kwargs=probe.variables,
            ).text
        except TurnkitError as exc:
            out.append(ProbeRender(probe, template, {}, None, f"{type(exc).__name__}: {exc}"))
            continue
        out.append(ProbeRender(probe, template, _context(fmt, template, probe), text))
    return out
