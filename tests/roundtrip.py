"""The corpus round trip: does turnkit read back every reply a template can write?

For each template of ``../shared/conformance`` and each probe message: render the prompt (``add_generation_prompt=
True``) and the same conversation with the assistant message appended (``add_generation_prompt=False``); where the
second starts with the first, the rest is exactly what the model was trained to write. ``fmt.parse(rest, prompt=
prompt, tools=tools)`` must give the message back: calls as name + arguments compared as JSON values, content and
reasoning exact up to surrounding whitespace.

A template *writes* a probe when the rest holds it (the function names, the content, the reasoning text) and the
rest is a continuation of the prompt. The probes are this file's own, not the ones :mod:`turnkit.parse.choice.select`
renders to choose a format, so the check is not circular.

Run it as a script for the scoreboard: ``.venv/bin/python tests/roundtrip.py [-v] [--derived] [NAME_SUBSTRING]``
(``--derived``: every template read with the format derived from its own renders, never a catalog format).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import CorpusTemplate, all_templates

from turnkit import ChatFormat, TurnkitError
from turnkit.parse.choice import select

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city."},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "options": {
                        "type": "object",
                        "properties": {
                            "detail": {"type": "string"},
                            "hours": {"type": "array", "items": {"type": "integer"}},
                        },
                    },
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the time in a zone.",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
        },
    },
]
USER = {"role": "user", "content": "What is the weather in Zürich?"}
WEATHER = {"city": "Zürich ☀", "days": 3, "metric": True, "options": {"detail": "high", "hours": [9, 12]}}
CALL_1 = {"id": "aB3dE5gH7", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER}}
CALL_2 = {
    "id": "Zq9Wx8Vu7",
    "type": "function",
    "function": {"name": "get_time", "arguments": {"zone": "Europe/Zurich"}},
}
CONTENT = 'Use {"a": 1} or <b>bold</b>, "quoted"\nnew line.'
REASONING = "Let me think about Zürich."


@dataclass(frozen=True)
class Probe:
    name: str
    message: dict[str, Any]
    tools: list[dict[str, Any]] | None
    #: Text that must appear in the rest for the template to count as writing the message.
    marks: tuple[str, ...]


PROBES = (
    Probe("one_call", {"role": "assistant", "content": "", "tool_calls": [CALL_1]}, TOOLS, ("get_weather",)),
    Probe(
        "two_calls",
        {"role": "assistant", "content": "", "tool_calls": [CALL_1, CALL_2]},
        TOOLS,
        ("get_weather", "get_time"),
    ),
    Probe("content", {"role": "assistant", "content": CONTENT}, None, ("<b>bold</b>",)),
    Probe(
        "reasoning",
        {"role": "assistant", "reasoning_content": REASONING, "content": "It is sunny."},
        None,
        (REASONING,),
    ),
)


@dataclass
class Outcome:
    template: str
    probe: str
    written: bool
    read_back: bool
    detail: str = ""
    rest: str = ""


def with_named_ids(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its calls' ids as Kimi K2 writes them (``functions.get_weather:0``)."""
    calls = [
        {**call, "id": f"functions.{call['function']['name']}:{index}"}
        for index, call in enumerate(message.get("tool_calls", []))
    ]
    return {**message, "tool_calls": calls}


def render_rest(fmt: ChatFormat, probe: Probe) -> tuple[str, str] | None:
    """``(prompt, rest)``, or None when the template refuses the probe or the full render does not continue the
    prompt. Calls take Mistral's nine-character ids; a template that writes a call's id but not its name (Kimi's
    ``tool_call['id']`` alone) is given the ids Kimi's models write, which hold the name."""
    rendered = _render_rest(fmt, probe.message, probe.tools)
    calls = probe.message.get("tool_calls", [])
    if (
        rendered is not None
        and calls
        and not all(mark in rendered[1] for mark in probe.marks)
        and any(call["id"] in rendered[1] for call in calls)
    ):
        return _render_rest(fmt, with_named_ids(probe.message), probe.tools) or rendered
    return rendered


def _render_rest(fmt: ChatFormat, message: dict[str, Any], tools: Any) -> tuple[str, str] | None:
    messages = [USER, message]
    try:
        prompt = fmt.render(messages[:1], tools=tools, add_generation_prompt=True)
        full = fmt.render(messages, tools=tools)
    except TurnkitError:
        return None
    if not full.startswith(prompt):
        return None
    return prompt, full[len(prompt) :]


def expected(probe: Probe) -> dict[str, Any]:
    message = probe.message
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    return {"content": message.get("content") or "", "reasoning": message.get("reasoning_content"), "calls": calls}


def got(reply: Any) -> dict[str, Any]:
    calls = []
    for call in reply.tool_calls:
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = call.arguments
        calls.append((call.name, arguments))
    return {
        "content": reply.content.strip(),
        "reasoning": (reply.reasoning_content or "").strip() or None,
        "calls": calls,
    }


def check(template: CorpusTemplate, probe: Probe, fmt: ChatFormat | None = None, reply_format: Any = None) -> Outcome:
    fmt = fmt or ChatFormat.from_template(template.source, **template.special_tokens)
    rendered = render_rest(fmt, probe)
    if rendered is None:
        return Outcome(template.name, probe.name, False, False, "no continuation")
    prompt, rest = rendered
    if not all(mark in rest for mark in probe.marks):
        return Outcome(template.name, probe.name, False, False, "not written", rest)
    try:
        reply = fmt.parse(rest, prompt=prompt, tools=probe.tools, reply_format=reply_format)
    except TurnkitError as exc:
        return Outcome(template.name, probe.name, True, False, f"error: {exc}", rest)
    want, have = expected(probe), got(reply)
    if want == have:
        return Outcome(template.name, probe.name, True, True, "", rest)
    return Outcome(template.name, probe.name, True, False, f"got {have}", rest)


def run(selected: list[CorpusTemplate], *, derived_only: bool = False) -> list[Outcome]:
    """The round trip over ``selected``; ``derived_only``: with the reading derived from each template's renders,
    never a catalog format (the check that derivation is not a hand list)."""
    outcomes = []
    for template in selected:
        try:
            fmt = ChatFormat.from_template(template.source, **template.special_tokens)
        except TurnkitError:
            continue
        reply_format = select.choose(fmt.chat_template, known=False).format if derived_only else None
        for probe in PROBES:
            outcomes.append(check(template, probe, fmt, reply_format))
    return outcomes


def main(argv: list[str]) -> None:
    verbose = "-v" in argv
    wanted = [a for a in argv if not a.startswith("-")]
    selected = [t for t in all_templates() if not wanted or any(w in t.name for w in wanted)]
    outcomes = run(selected, derived_only="--derived" in argv)
    for probe in PROBES:
        rows = [o for o in outcomes if o.probe == probe.name]
        written = [o for o in rows if o.written]
        back = [o for o in written if o.read_back]
        print(f"{probe.name:10s} written by {len(written):4d}  read back {len(back):4d}")
    failures = [o for o in outcomes if o.written and not o.read_back]
    for outcome in failures:
        print(f"FAIL {outcome.template} [{outcome.probe}] {outcome.detail[:300]}")
        if verbose:
            print(f"     rest: {outcome.rest!r}"[:1200])


if __name__ == "__main__":
    main(sys.argv[1:])
