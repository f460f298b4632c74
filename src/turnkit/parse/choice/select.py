"""Choosing the reply format of a template by what it writes, not by what its text mentions.

At load, the probe replies (:mod:`.probes`) are rendered through the template. A reading *fits* a probe the template
writes when parsing the rendered reply (with its prompt and tools) gives the probe's message back: content and
reasoning exact up to surrounding whitespace, calls as names and arguments compared as JSON values. The choice, in
order:

1. the format a built-in family declares;
2. the first catalog format (:mod:`turnkit.parse.formats.catalog`) that fits every probe the template writes (reading
   Python literals where JSON would be when the renders show the probe's arguments as Python's repr);
3. the format derived from the renders themselves (:mod:`.derive`), when it fits them all;
4. otherwise the reading that fits the most probes, with the ones it cannot read named in the reason; when those
   include tool calls, :attr:`Choice.tools_unreadable` is set (the server refuses requests with ``tools`` rather
   than return calls as content, and ``turnkit doctor`` reports it).

Whatever is chosen also ends replies at the template's own end-of-turn text, found in the same renders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from turnkit.parse.choice.derive import derive, end_texts, reasoning_markers
from turnkit.parse.choice.markers import first_marker, is_marker, marker_pieces
from turnkit.parse.choice.probes import PROBE_TOOLS, Rendered, render_probes, render_switched_reasoning
from turnkit.parse.encodings import encoding_of
from turnkit.parse.formats import Arguments, Element, Reasoning, ReplyFormat, ToolSyntax, catalog
from turnkit.parse.reading.parser import StreamParser
from turnkit.template.chat_template import ChatTemplate

__all__ = ["Choice", "choose", "fits", "for_template"]

_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in PROBE_TOOLS}


def _read_back_id(index: int) -> str:
    """The id a probe call read back gets where its render wrote none. It is never rendered and never compared (a
    probe is read back by names and arguments), so it needs no shape the template takes back; that shape is found
    apart, by rendering a call and its result (:mod:`.call_ids`). The ids the probes render are chosen to pass every
    template's checks already: Mistral's nine letters and digits (``probes.FIRST_ID``), and Kimi's
    ``functions.NAME:INDEX`` where a template writes the id alone."""
    return f"call_{index}"


@dataclass(frozen=True)
class Choice:
    """A reply format chosen for a template, with what the probes showed."""

    format: ReplyFormat
    #: The probes the template writes, and whether the chosen format reads each back.
    read: dict[str, bool]
    #: The template writes tool calls that the chosen format does not read back.
    tools_unreadable: bool = False


def _in_reasoning(fmt: ReplyFormat, prompt: str | None) -> bool:
    if fmt.reasoning is None:
        return False
    if prompt is None:
        return fmt.reasoning.prefilled
    return prompt.rfind(fmt.reasoning.start) > prompt.rfind(fmt.reasoning.end)


def reads_back(fmt: ReplyFormat, rendered: Rendered, eos: str | None = None) -> bool:
    """Whether ``fmt`` parses the rendered probe reply back into the probe's message: after the prompt it was
    rendered after, or, where the generation prompt pre-writes more than the reply's render shows (Apriel's "Here are
    my reasoning steps:"), after the generation prompt."""
    if rendered.rest is None:
        return False
    if _reads_back(fmt, rendered, rendered.prompt, eos):
        return True
    return rendered.serving != rendered.prompt and _reads_back(fmt, rendered, rendered.serving, eos)


def _reads_back(fmt: ReplyFormat, rendered: Rendered, prompt: str | None, eos: str | None) -> bool:
    probe = rendered.probe
    assert rendered.rest is not None
    ends = {eos: "end_of_turn"} if eos else {}
    parser = StreamParser(
        fmt,
        tools=_SCHEMAS if probe.tools else None,
        in_reasoning=_in_reasoning(fmt, prompt),
        call_id=_read_back_id,
        end_texts=ends,  # type: ignore[arg-type]
    )
    try:
        parser.feed_text(rendered.rest)
        reply = parser.finish()
    except (ValueError, KeyError, IndexError, TypeError, AssertionError):
        return False
    message = probe.message
    if reply.content.strip() != (message.get("content") or "").strip():
        return False
    if (reply.reasoning_content or "").strip() != (message.get("reasoning_content") or "").strip():
        return False
    got: list[tuple[str, Any]] = []
    for call in reply.tool_calls:
        try:
            got.append((call.name, json.loads(call.arguments)))
        except ValueError:
            return False
    return got == probe.calls


def fits(fmt: ReplyFormat, rendered: dict[str, Rendered], eos: str | None = None) -> dict[str, bool]:
    """For each probe the template writes, whether ``fmt`` reads it back."""
    return {name: reads_back(fmt, r, eos) for name, r in rendered.items() if r.written}


def _with_tool_ends(fmt: ReplyFormat, rendered: dict[str, Rendered]) -> ReplyFormat:
    """``fmt`` also ending replies at the marker a template writes after its tool calls (Gemma 4's
    ``<|tool_response>``, a turn's end that differs after calls): what is left as content after the calls."""
    found = []
    for name in _TOOL_PROBES:
        probe = rendered[name]
        if not probe.written or probe.rest is None:
            continue
        parser = StreamParser(fmt, tools=_SCHEMAS, call_id=_read_back_id)
        parser.feed_text(probe.rest)
        reply = parser.finish()
        if reply.tool_calls and reply.content.strip():
            marker = first_marker(reply.content)
            if marker is not None and marker not in fmt.markers:
                found.append(marker)
    return fmt.ending_with(tuple(found)) if found else fmt


_TOOL_PROBES = ("one_call", "two_calls", "bare_call")


def choose(template: ChatTemplate, *, known: bool = True) -> Choice:
    """The reply format of ``template`` and what the probes showed (see the module docstring). ``known=False``
    skips the catalog: the reading derived from the renders alone (how well derivation does on templates it has
    never seen)."""
    if template.reply_format is not None:
        fmt = catalog.get(template.reply_format)
        return Choice(fmt.because(f"{fmt.name}: declared by the family"), {})
    rendered = render_probes(template)
    choice = _chosen(template, rendered, known)
    return _completed(choice, template, rendered) if known else choice


def _chosen(template: ChatTemplate, rendered: dict[str, Rendered], known: bool) -> Choice:
    written = [name for name, r in rendered.items() if r.written]
    ends = end_texts(rendered)
    eos = template.eos_token
    if not written:
        fmt = catalog.get("plain").ending_with(ends)
        return Choice(fmt.because("plain: the template writes none of the probe replies"), {})
    texts = "".join(r.rest or "" for r in rendered.values() if r.written)
    # a template that writes {{ arguments }} without tojson: its JSON slots hold Python literals
    python = any(r.python_literals for r in rendered.values() if r.written)
    literals = "; its arguments are Python literals where JSON would be" if python else ""
    best: tuple[int, ReplyFormat, dict[str, bool]] | None = None
    for entry in catalog.REPLY_FORMATS.values() if known else ():
        if any(marker not in texts for marker in _required_markers(entry)):
            continue
        reading = entry.with_python_literals() if python else entry
        candidate = _with_tool_ends(reading.ending_with(ends), rendered)
        read = fits(candidate, rendered, eos)
        if all(read.values()):
            reason = f"{entry.name}: reads back every probe reply the template writes{literals}"
            return Choice(candidate.because(reason), read)
        score = sum(read.values())
        if best is None or score > best[0]:
            best = (score, candidate, read)
    derived = _with_tool_ends(derive(rendered), rendered)
    read = fits(derived, rendered, eos)
    if all(read.values()):
        return Choice(derived.because(f"derived from the template's renders: {derived.describe()}"), read)
    score = sum(read.values())
    if best is None or score > best[0]:
        best = (score, derived, read)
    assert best is not None
    _, fmt, read = best
    missed = sorted(name for name, ok in read.items() if not ok)
    tools_unreadable = any(not read.get(name, True) for name in _TOOL_PROBES)
    reason = f"{fmt.name}: reads back {sum(read.values())} of {len(read)} probe replies; not {', '.join(missed)}"
    if tools_unreadable:
        fmt = fmt.without_tools() if not any(read.get(n, False) for n in _TOOL_PROBES) else fmt
    return Choice(fmt.because(reason), read, tools_unreadable)


def _completed(choice: Choice, template: ChatTemplate, rendered: dict[str, Rendered]) -> Choice:
    """What the renders could not show, completed from the template.

    * Reasoning the template never renders for a final reply (QwQ, DeepSeek-R1 and Granite 3.3 drop it; Ministral
      writes ``[THINK]`` only in its instructions): the first catalog reasoning whose markers the template's text
      writes, pre-written by the generation prompt when that prompt ends with its start; else the markers its render
      shows with its thinking switch on (LongCat-Flash-Chat's ``<longcat_think>``, written only under
      ``enable_thinking`` and with tools), where the reply after the start marker reads back.
    * Tool calls the template cannot render at all (it raises on them, as Kimi K2 Thinking's does in a sandbox):
      the first catalog syntax whose markers the template's text writes.
    * Values the template wraps in ``<![CDATA[...]]>`` when they hold ``<``, ``&`` or a newline (MiniCPM5), which
      the probes' plain values never show: tagged arguments unwrap such sections.

    A completion that would stop a written probe from reading back is not made.
    """
    fmt, notes = choice.format, []
    text = template.all_text
    serving = next((r.serving for r in rendered.values() if r.serving is not None), None) or ""
    reasoning = fmt.reasoning
    if reasoning is None and not rendered["reasoning"].written:
        for entry in catalog.REPLY_FORMATS.values():
            found = entry.reasoning
            if found is not None and found.start in text and found.end in text:
                reasoning = found
                notes.append(f"reasoning {found.start!r}...{found.end!r} from the template's text")
                break
        if reasoning is None and (reasoning := _switched_reasoning(template, fmt, end_texts(rendered))) is not None:
            notes.append(f"reasoning {reasoning.start!r}...{reasoning.end!r} from its render with thinking on")
    if reasoning is not None and serving.rstrip().endswith(reasoning.start) and not reasoning.prefilled:
        reasoning = replace(reasoning, prefilled=True)
        notes.append(f"its generation prompt opens {reasoning.start!r}")
    tools = fmt.tools
    refused = [rendered[name].refused for name in _TOOL_PROBES]
    if not tools and fmt.channels is None and all(refused):
        for entry in catalog.REPLY_FORMATS.values():
            if entry.tools and _writes_markers(text, entry.tools[0]):
                tools = entry.tools
                notes.append(f"tool calls as {entry.name} from the template's text (it raises on rendering one)")
                break
    if _CDATA in text and any(encoding_of(s.arguments).takes_cdata and not s.arguments.cdata for s in tools):
        tools = tuple(replace(s, call=tuple(_with_cdata(e) for e in s.call)) for s in tools)
        notes.append(f"values in {_CDATA}...]]> from the template's text")
    if not notes:
        return choice
    completed = replace(fmt, reasoning=reasoning, tools=tools)
    if fits(completed, rendered, template.eos_token) != choice.read:
        return choice  # what the renders do show wins over the template's text
    reason = f"{choice.format.reason}; {'; '.join(notes)}"
    return Choice(completed.because(reason), choice.read, choice.tools_unreadable)


def _switched_reasoning(template: ChatTemplate, fmt: ReplyFormat, ends: tuple[str, ...]) -> Reasoning | None:
    """The reasoning markers the template's render shows with its thinking switch on, where what follows the start
    marker reads back as the probe's reasoning and answer: what a model writes after a generation prompt that opens
    the reasoning (LongCat-Flash-Chat's ``/think_on ASSISTANT:<longcat_think>``, whose render of a reply writes the
    user turn otherwise, so the reply as rendered does not continue that prompt)."""
    probe = render_switched_reasoning(template)
    found = None if probe is None else reasoning_markers(probe, ends)
    if probe is None or probe.rest is None or found is None or found.start not in probe.rest:
        return None
    cut = probe.rest.index(found.start) + len(found.start)
    opened = replace(probe, prompt=(probe.prompt or "") + probe.rest[:cut], rest=probe.rest[cut:])
    return found if _reads_back(replace(fmt, reasoning=found), opened, opened.prompt, template.eos_token) else None


_CDATA = "<![CDATA["


def _with_cdata(element: Element) -> Element:
    if isinstance(element, Arguments) and encoding_of(element).takes_cdata:
        return replace(element, cdata=True)
    return element


def _writes_markers(text: str, syntax: ToolSyntax) -> bool:
    """The template's text holds every distinctive marker of ``syntax`` (a bare or punctuation-only syntax has none
    to go by)."""
    distinctive = [piece for core in syntax.markers for piece in marker_pieces(core) if is_marker(piece)]
    return not syntax.bare and bool(distinctive) and all(m in text for m in distinctive)


def _required_markers(fmt: ReplyFormat) -> tuple[str, ...]:
    """Markers a catalog format needs to see in a template's renders before it is worth trying."""
    found = []
    if fmt.tools:
        found.append(fmt.tools[0].trigger)
    if fmt.channels is not None:
        found.append(fmt.channels.header_end)
    if not fmt.tools and fmt.reasoning is not None:
        found.append(fmt.reasoning.end)
    return tuple(m for m in found if m)


def for_template(template: ChatTemplate) -> ReplyFormat:
    """The reply format chosen for ``template`` (its reason in ``.reason``)."""
    return choose(template).format
