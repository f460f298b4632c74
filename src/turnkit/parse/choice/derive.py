"""A reply format read off a template's own renders of the probe messages (:mod:`.probes`), for syntaxes no catalog
format knows.

The probes' names and values are sentinels, so where each one lands in the rendered reply is found by searching;
the text around them is the syntax:

* **end of turn**: the first marker after the reply's content (``<|im_end|>``, ``<|role_end|>``, ``</assistant>``);
* **reasoning**: the run before the reasoning text (or, when the generation prompt pre-writes it, the prompt's last
  marker that the end marker does not contain) and the run after it; markers left between the reasoning's end and
  the content (``<|START_TEXT|>``) are content markers, dropped; where the run after it starts with the end of a
  turn (a template that closes the thinking with a role switch, ``<|im_end|>\n<|im_start|>assistant\n``), the
  whole switch ends the reasoning;
* **tool calls**: the arguments' encoding first (a JSON object holding the arguments, which may also hold the name;
  ``name(key=value)``; ``name{key:...}``; else one tagged element per argument), found where the probe calls landed
  (:mod:`.locate`, the probing), then the syntax built from the text around one and two calls
  (:mod:`.toolsyntax`, the building): the block's start and end, each call's head and end, holes where the calls
  differ, the call's id; an id that holds the name (Kimi's ``functions.NAME:INDEX``, where the probes had to be
  given such ids for the template to show a name at all) is one hole that gives both.

Marker shapes and the units renders are compared in are :mod:`.markers`'.

The result is checked like any other reading, by parsing the probes back (:mod:`.select`); a derivation that does
not fit is simply not chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnkit.parse.choice import probes as p
from turnkit.parse.choice.markers import first_marker, is_marker, marker_pieces
from turnkit.parse.choice.probes import Rendered
from turnkit.parse.choice.toolsyntax import tool_end, tool_syntax
from turnkit.parse.formats import Reasoning, ReplyFormat

__all__ = ["derive", "end_texts", "reasoning_markers"]

# -- end of turn, reasoning, content markers ---------------------------------------------------------------------


def end_texts(rendered: dict[str, Rendered]) -> tuple[str, ...]:
    """The markers that follow a reply's content in the probes: what ends a reply in the template's own terms."""
    found = []
    content = rendered["content"]
    if content.written and content.rest is not None:
        after = content.rest[content.rest.find(p.CONTENT) + len(p.CONTENT) :]
        if (marker := first_marker(after)) is not None:
            found.append(marker)
    reasoning = rendered["reasoning"]
    if reasoning.written and reasoning.rest is not None and p.ANSWER in reasoning.rest:
        after = reasoning.rest[reasoning.rest.rfind(p.ANSWER) + len(p.ANSWER) :]
        if (marker := first_marker(after)) is not None:
            found.append(marker)
    return tuple(dict.fromkeys(found))


def _prompt_start(prompt: str, end: str) -> str | None:
    """The reasoning start a generation prompt ends with: its shortest ending marker run the end marker does not
    contain (``<think>``; Kimi K3's ``<|open|>think<|sep|>``, not ``<|sep|>``)."""
    runs = prompt.split()
    if not runs:
        return None
    pieces = marker_pieces(runs[-1])
    for size in range(1, len(pieces) + 1):
        candidate = "".join(pieces[-size:])
        if is_marker(pieces[-size]) and candidate not in end:
            return candidate
    return None


@dataclass(frozen=True)
class _ReasoningFound:
    reasoning: Reasoning
    content_markers: tuple[str, ...]


def reasoning_markers(probe: Rendered, ends: tuple[str, ...]) -> Reasoning | None:
    """The reasoning markers a render of the ``reasoning`` probe shows (as :func:`derive` finds them), or None."""
    found = _reasoning(probe, ends)
    return found.reasoning if found is not None else None


def _reasoning(probe: Rendered, ends: tuple[str, ...]) -> _ReasoningFound | None:
    rest, prompt = probe.rest, probe.prompt
    if not probe.written or rest is None or prompt is None:
        return None
    at = rest.find(p.REASONING)
    answer = rest.find(p.ANSWER, at + len(p.REASONING))
    if at < 0 or answer < 0:
        return None
    before, between = rest[:at], rest[at + len(p.REASONING) : answer]
    runs = between.split()
    if not runs:
        return None  # written without any delimiter: not readable
    start_runs = before.split()
    end_pieces = marker_pieces(runs[0])
    if not any(is_marker(piece) for piece in end_pieces):  # a text marker ("[BEGIN FINAL RESPONSE]"): its line
        end_pieces = [between.strip().split("\n")[0].strip()]
        runs = [end_pieces[0], *between.strip().split("\n", 1)[1:]]
    serving = probe.serving or prompt
    if start_runs:
        start, prefilled = start_runs[-1], False
    elif serving != prompt and serving.startswith(prompt) and serving[len(prompt) :].strip():
        # the generation prompt pre-writes text the reply's render does not (Apriel's "Here are my reasoning
        # steps:"): that text opens the reasoning
        start, prefilled = serving[len(prompt) :].strip(), True
    else:
        found = _prompt_start(prompt, runs[0])
        if found is None:
            return None
        start, prefilled = found, True
    size = min(len(marker_pieces(start)), len(end_pieces))
    end = "".join(end_pieces[:size])
    if end in ends:  # closed by a role switch (<|im_end|> <|im_start|>assistant): the whole switch ends it
        return _ReasoningFound(Reasoning(start, between.strip(), prefilled), ())
    left = ["".join(end_pieces[size:]), *runs[1:]]
    markers = tuple(run for run in left if run and any(is_marker(x) for x in marker_pieces(run)))
    return _ReasoningFound(Reasoning(start, end, prefilled), markers)


def _content_markers(rendered: dict[str, Rendered], reasoning: Reasoning | None) -> tuple[str, ...]:
    probe = rendered["content"]
    if not probe.written or probe.rest is None:
        return ()
    before = probe.rest[: probe.rest.find(p.CONTENT)]
    known = {reasoning.start, reasoning.end} if reasoning else set()
    out = []
    for run in before.split():
        for marker in known:
            run = run.replace(marker, " ")
        for part in run.split():
            if any(is_marker(x) for x in marker_pieces(part)):
                out.append(part)
    return tuple(out)


# -- the whole format ------------------------------------------------------------------------------------------------


def derive(rendered: dict[str, Rendered]) -> ReplyFormat:
    """The format the renders show (parts the renders do not show are left out: a template that writes no tool
    calls gets no tool syntax)."""
    ends = end_texts(rendered)
    reasoning = _reasoning(rendered["reasoning"], ends)
    markers = reasoning.content_markers if reasoning else ()
    syntax_reasoning = reasoning.reasoning if reasoning else None
    markers = tuple(dict.fromkeys((*markers, *_content_markers(rendered, syntax_reasoning))))
    content = rendered["content"]
    lead = ""
    if content.written and content.rest is not None:
        lead = content.rest[: content.rest.find(p.CONTENT)]
    syntax = tool_syntax(rendered, lead, ends)
    if syntax is not None:
        for probe in ("one_call", "two_calls"):
            rest = rendered[probe].rest
            if rendered[probe].written and rest is not None and (marker := tool_end(rest, syntax)) is not None:
                ends = tuple(dict.fromkeys((*ends, marker)))
    return ReplyFormat(
        "derived",
        reasoning=syntax_reasoning,
        tools=(syntax,) if syntax is not None else (),
        content_markers=markers,
        end_texts=ends,
        lead=_reply_lead(rendered, lead),
    )


def _reply_lead(rendered: dict[str, Rendered], before_content: str) -> str:
    """Plain text every written reply starts with (``Assistant: ``), where the prompt does not end with it."""
    words = before_content.strip()
    if not words or any(is_marker(x) for run in words.split() for x in marker_pieces(run)):
        return ""
    rests = [r.rest for r in rendered.values() if r.written and r.rest is not None]
    return words if all(rest.lstrip().startswith(words) for rest in rests) else ""
