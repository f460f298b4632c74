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
  ``name(key=value)``; ``name{key:...}``; else one tagged element per argument), then, from one and two calls: the
  text every call starts with (the common end of "before the first name" and "between the calls"), what is left
  before the first call (the block's start), the call's end and the block's end (the common start of "after the
  first call" and "after the last"); from two arguments: each argument's literals (a type attribute where a string
  and an integer argument differ); from a call without arguments: where the name ends. Text that differs between
  the two calls where nothing varies becomes a hole that is read and dropped; the call's id, where the template
  writes it, becomes the call id; an id that holds the name (Kimi's ``functions.NAME:INDEX``, where the probes had
  to be given such ids for the template to show a name at all) is one hole that gives both.

The result is checked like any other reading, by parsing the probes back (:mod:`.select`); a derivation that does
not fit is simply not chosen.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, replace

from turnkit.parse import probes as p
from turnkit.parse.formats import Arguments, Element, Hole, Lit, Reasoning, ReplyFormat, ToolSyntax
from turnkit.parse.probes import Rendered
from turnkit.parse.values import ValueSyntaxError, python_literal_at

__all__ = ["derive", "end_texts", "first_marker", "is_marker", "marker_pieces"]

_WS = " \t\r\n"

#: Shapes of marker pieces (a run such as ``<|open|>think<|sep|>`` is split into pieces and words).
_PIECE = re.compile(
    r"<\|[^\s<>|]{0,48}\|>"  # <|im_end|>
    r"|<｜[^｜\s]{1,48}｜>"  # DeepSeek's full-width bars
    r"|<\|[^\s<>|]{1,30}>|<[^\s<>|]{1,30}\|>"  # Gemma 4's <|turn> and <turn|>
    r"|</?[^\s<>]{1,60}>"  # <think>, </s>, <seed:think>, <｜DSML｜tool_calls>
    r"|\[/?[A-Za-z_][\w:.\-]{0,30}\]|\[\|[\w]+\|\]"  # [THINK], [|endofturn|]
)
#: Tokens of text being compared: marker pieces, words, whitespace runs, single characters. Literals learned from
#: renders begin and end at token boundaries, so a literal never splits a marker or a word.
_TOKEN = re.compile(_PIECE.pattern + r"|\w+|\s+|.", re.DOTALL)


def marker_pieces(run: str) -> list[str]:
    """A whitespace-free run split into marker pieces and the text between them."""
    out: list[str] = []
    pos = 0
    for match in _PIECE.finditer(run):
        if match.start() > pos:
            out.append(run[pos : match.start()])
        out.append(match.group(0))
        pos = match.end()
    if pos < len(run):
        out.append(run[pos:])
    return out


def is_marker(piece: str) -> bool:
    return bool(_PIECE.fullmatch(piece))


def first_marker(text: str) -> str | None:
    """The marker a text starts with (after whitespace): a marker piece, or a run of symbols (MiniMax's ``[e~[``)."""
    runs = text.split()
    if not runs:
        return None
    pieces = marker_pieces(runs[0])
    if is_marker(pieces[0]):
        return pieces[0]
    run = runs[0]
    if (
        len(run) <= 40
        and not run.isalnum()
        and not re.fullmatch(r"[\w'\-]+[:.,!?]?", run)
        and not set(run) & set("{}\"'")
    ):
        return run
    return None


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _common_prefix(a: str, b: str) -> str:
    """The tokens both texts start with."""
    out = []
    for x, y in zip(_tokens(a), _tokens(b), strict=False):
        if x != y:
            break
        out.append(x)
    return "".join(out)


def _common_suffix(a: str, b: str) -> str:
    """The tokens both texts end with."""
    out = []
    for x, y in zip(reversed(_tokens(a)), reversed(_tokens(b)), strict=False):
        if x != y:
            break
        out.append(x)
    return "".join(reversed(out))


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


def _reasoning(rendered: dict[str, Rendered], ends: tuple[str, ...]) -> _ReasoningFound | None:
    probe = rendered["reasoning"]
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


# -- tool calls -----------------------------------------------------------------------------------------------------

_ID = "\x00"  # stands for a call id in text being compared


@dataclass
class _Call:
    """Where one call's parts are in a rest."""

    name_start: int
    name_end: int
    args_start: int  # the encoding's own text starts here (a JSON object, the inside of parentheses, a key literal)
    args_end: int  # ... and ends here
    unit_start: int  # for a call written as one JSON object holding its name: the object
    unit_end: int
    encoding: str
    arguments: Arguments | None = None


def _json_at(text: str, start: int, python: bool = False) -> tuple[object, int] | None:
    """The JSON value at ``start`` and where it ends; ``python``: a Python literal there reads too."""
    try:
        value, end = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        if not python:
            return None
        try:
            return python_literal_at(text, start)
        except ValueSyntaxError:
            return None
    return value, end


def _enclosing_object(text: str, inside: int, want: object, python: bool) -> tuple[int, int, object] | None:
    """The nearest JSON value (``python``: or Python literal) starting before ``inside`` that spans it and satisfies
    ``want(value)``."""
    start = inside
    while True:
        start = max(text.rfind("{", 0, start), text.rfind("[", 0, start))
        if start < 0:
            return None
        decoded = _json_at(text, start, python)
        if decoded is not None and decoded[1] > inside and want(decoded[0]):  # type: ignore[operator]
            return start, decoded[1], decoded[0]


def _locate(
    rest: str, name: str, keys: tuple[str, ...], after: int, like: _Call | None = None, *, python: bool = False
) -> _Call | None:
    """Find a probe call by its sentinels, and its encoding (``like``: a call already found, whose quote a Gemma
    call without a string argument reuses; ``python``: the template writes Python literals where JSON would be)."""
    name_at = rest.find(name, after)
    if name_at < 0:
        return None
    name_end = name_at + len(name)
    if not keys:
        return _Call(name_at, name_end, name_end, name_end, name_at, name_end, "")
    key_at = rest.find(keys[0], name_end) if rest.find(keys[0], name_end) >= 0 else rest.find(keys[0], after)
    if key_at < 0:
        return None

    def holds_keys(value: object) -> bool:
        return isinstance(value, dict) and all(k in value for k in keys)

    args = _enclosing_object(rest, key_at, holds_keys, python)
    if args is not None:
        args_start, args_end, _ = args

        def holds_call(value: object) -> bool:
            if not isinstance(value, dict):
                return False
            return name in value or any(v == name for v in value.values())

        unit = _enclosing_object(rest, min(args_start, name_at) + 0, holds_call, python)
        if unit is not None and unit[0] <= name_at and unit[1] >= args_end:
            obj = unit[2]
            assert isinstance(obj, dict)
            if name in obj:
                spec = Arguments("json_call", name_as_key=True, python_literals=python)
            else:
                name_key = next(k for k, v in obj.items() if v == name)
                args_key = next(k for k, v in obj.items() if isinstance(v, dict) and holds_keys(v))
                spec = Arguments("json_call", name_key=name_key, keys=(args_key,), python_literals=python)
            return _Call(name_at, name_end, unit[0], unit[1], unit[0], unit[1], "json_call", spec)
        json_args = Arguments("json", python_literals=python)
        return _Call(name_at, name_end, args_start, args_end, name_at, args_end, "json", json_args)
    if re.match(r"\s*\(", rest[name_end:]):
        open_at = rest.index("(", name_end)
        close = _python_close(rest, open_at + 1)
        if close is not None and keys[0] in rest[open_at:close]:
            return _Call(name_at, name_end, open_at + 1, close, name_at, close + 1, "python", Arguments("python"))
    if re.match(r"\s*\{", rest[name_end:]):
        open_at = rest.index("{", name_end)
        between = rest[key_at + len(keys[0]) : rest.find(p.TEXT_VALUE, key_at)]
        quote = between.lstrip(":").strip() if between.startswith(":") else ""
        if like is not None and like.arguments is not None and like.encoding == "gemma":
            quote = like.arguments.quote
        close = _gemma_close(rest, open_at, quote)
        if close is not None and quote:
            return _Call(name_at, name_end, open_at, close, name_at, close, "gemma", Arguments("gemma", quote=quote))
    return _Call(name_at, name_end, key_at, key_at, name_at, key_at, "tagged")


def _python_close(text: str, start: int) -> int | None:
    depth, quote, pos = 0, "", start
    while pos < len(text):
        char = text[pos]
        if quote:
            if char == "\\":
                pos += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return pos if char == ")" else None
            depth -= 1
        pos += 1
    return None


def _gemma_close(text: str, start: int, quote: str) -> int | None:
    depth, pos = 0, start
    while pos < len(text):
        if text.startswith(quote, pos):
            end = text.find(quote, pos + len(quote))
            if end < 0:
                return None
            pos = end + len(quote)
            continue
        if text[pos] in "{[":
            depth += 1
        elif text[pos] in "}]":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return None


def _split_around(first: str, second: str, hole: Hole) -> tuple[Element, ...]:
    """Two texts that should be one literal but differ (``:0`` and ``:1``): common start, a hole, common end."""
    if first == second:
        return (Lit(first),) if first else ()
    prefix = _common_prefix(first, second)
    suffix = _common_suffix(first[len(prefix) :], second[len(prefix) :])
    out: list[Element] = []
    if prefix:
        out.append(Lit(prefix))
    out.append(hole)
    if suffix:
        out.append(Lit(suffix))
    return tuple(out)


def _with_ids(text: str) -> tuple[Element, ...]:
    """Literal text in which a call id (marked ``_ID``) becomes an ``id`` hole."""
    out: list[Element] = []
    for n, part in enumerate(text.split(_ID)):
        if n:
            out.append(Hole("id"))
        if part:
            out.append(Lit(part))
    return tuple(out)


def _mark_ids(text: str) -> str:
    return text.replace(p.FIRST_ID, _ID).replace(p.SECOND_ID, _ID)


def _tool_syntax(rendered: dict[str, Rendered], lead: str, ends: tuple[str, ...]) -> ToolSyntax | None:
    python = any(r.python_literals for r in rendered.values() if r.written)
    syntax = _calls(rendered, lead, ends, python)
    if syntax is not None and any(rendered[n].probe.named_ids for n in ("one_call", "two_calls")):
        syntax = replace(syntax, call=_named_id(syntax.call))
    return syntax


_INDEX = re.compile(re.escape(p.NAMED_ID_INDEX) + r"\d+")


def _named_id(call: tuple[Element, ...]) -> tuple[Element, ...]:
    """Where the probes' ids were Kimi's ``functions.NAME:INDEX`` and the name was found inside one (a template that
    writes ``tool_call['id']`` alone), the whole id is one ``named_id`` hole: it is the call's id, and the name is
    read from it. The index is a ``skip`` hole after ``:`` where two calls' indexes differ, or ``:0`` in a literal
    where only one call is written."""
    at = next((n for n, e in enumerate(call) if e == Hole("name")), None)
    if at is None or at == 0:
        return call
    before, after = call[at - 1], list(call[at + 1 :])
    if not isinstance(before, Lit) or not before.text.endswith(p.NAMED_ID_PREFIX):
        return call
    if after[:2] == [Lit(p.NAMED_ID_INDEX), Hole("skip")]:
        after = after[2:]
    elif after and isinstance(after[0], Lit) and (index := _INDEX.match(after[0].text)):
        left = after[0].text[index.end() :]
        after = [*([Lit(left)] if left else []), *after[1:]]
    else:
        return call
    head = before.text[: -len(p.NAMED_ID_PREFIX)]
    return (*call[: at - 1], *([Lit(head)] if head else []), Hole("named_id"), *after)


def _calls(rendered: dict[str, Rendered], lead: str, ends: tuple[str, ...], python: bool) -> ToolSyntax | None:
    one, two = rendered["one_call"], rendered["two_calls"]
    if not two.written or two.rest is None:
        return _single_call(one, lead, ends, python) if one.written else None
    rest = two.rest
    first = _locate(rest, p.FIRST, (p.TEXT_KEY, p.COUNT_KEY), 0, python=python)
    if first is None:
        return None
    second = _locate(rest, p.SECOND, (p.FLAG_KEY,), first.unit_end, first, python=python)
    if second is None or first.encoding != second.encoding:
        return None
    encoding = first.encoding
    if encoding == "tagged":
        return _tagged(rest, first, second, rendered, lead, ends)
    assert first.arguments is not None
    # what comes before each call's unit (its head), and between the name and the arguments
    before_first = rest[: first.unit_start]
    between = rest[first.unit_end : second.unit_start]
    after_last = rest[second.unit_end :]
    call_end_first = rest[first.args_end : first.unit_end] if encoding in ("json", "python") else ""
    call_end_last = rest[second.args_end : second.unit_end] if encoding in ("json", "python") else ""
    middle: tuple[Element, ...] = ()
    if encoding != "json_call":
        name_to_args_1 = _mark_ids(rest[first.name_end : first.args_start])
        name_to_args_2 = _mark_ids(rest[second.name_end : second.args_start])
        middle = _join(_split_around(name_to_args_1, name_to_args_2, Hole("skip")))
        middle = _expand_ids(middle)
    return _assemble(
        before_first,
        between,
        after_last,
        call_end_first + "",
        call_end_last,
        first.arguments,
        middle,
        name_in_head=encoding != "json_call",
        lead=lead,
        ends=ends,
    )


def _expand_ids(elements: tuple[Element, ...]) -> tuple[Element, ...]:
    out: list[Element] = []
    for element in elements:
        if isinstance(element, Lit) and _ID in element.text:
            out.extend(_with_ids(element.text))
        else:
            out.append(element)
    return tuple(out)


def _join(elements: tuple[Element, ...]) -> tuple[Element, ...]:
    return tuple(e for e in elements if not (isinstance(e, Lit) and not e.text))


def _assemble(
    before_first: str,
    between: str,
    after_last: str,
    call_end_first: str,
    call_end_last: str,
    arguments: Arguments,
    middle: tuple[Element, ...],
    *,
    name_in_head: bool,
    lead: str,
    ends: tuple[str, ...],
) -> ToolSyntax | None:
    """A syntax from the texts around two calls' units (a unit: from the name, or the JSON object, to the end of
    the arguments)."""
    before_first = _strip_lead(before_first, lead)
    before_ids, between_ids = _mark_ids(before_first), _mark_ids(between)
    head = _common_suffix(before_ids, between_ids) if between_ids.strip() else ""
    if not head and between_ids.strip() and before_ids.endswith(between_ids):
        head = between_ids
    block_start = before_ids[: len(before_ids) - len(head)]
    gap = call_end_first + between_ids[: len(between_ids) - len(head)]
    tail = call_end_last + after_last
    call_end = _common_prefix(gap, tail)
    separator = gap[len(call_end) :]
    block_end = _before_end(tail[len(call_end) :], ends, block_start)
    call: list[Element] = [*_with_ids(head)]
    if name_in_head:
        call.append(Hole("name"))
        call.extend(middle)
    call.append(arguments)
    if call_end:
        call.append(Lit(call_end))
    call = [e for e in call if not (isinstance(e, Lit) and not e.text)]
    if not any(isinstance(e, Lit) and e.text.strip() for e in call) and not block_start.strip():
        return None  # nothing marks where calls start
    block = (_loosen(block_start), _loosen(block_end)) if block_start.strip() or block_end.strip() else None
    if block is not None and _ID in block[0] + block[1]:
        return None
    return ToolSyntax(tuple(call), block, separator if block is not None or separator.strip() else "")


def _loosen(text: str) -> str:
    """A block literal with a space between a marker and a bracket glued to it (``<|tool_call_start|>[`` becomes
    ``<|tool_call_start|> [``): literals match any whitespace there, or none, and the bracket is a literal of its own,
    so a block whose end marker the model leaves out still ends at its bracket."""
    out = []
    for run in re.split(r"(\s+)", text):
        if not run or run.isspace():
            out.append(run)
            continue
        pieces = marker_pieces(run)
        joined = pieces[0]
        for before, after in itertools.pairwise(pieces):
            glue = " " if (is_marker(before) and after in "[]{}") or (before in "[]{}" and is_marker(after)) else ""
            joined += glue + after
        out.append(joined)
    return "".join(out)


def _strip_lead(text: str, lead: str) -> str:
    """What the template writes before any reply (an empty thinking block, a header) is not the block's start."""
    if lead and text.startswith(lead):
        return text[len(lead) :]
    if lead.strip() and text.lstrip().startswith(lead.strip()):
        return text.lstrip()[len(lead.strip()) :]
    return text


def _before_end(text: str, ends: tuple[str, ...], opening: str) -> str:
    """The block's end: the text after the last call up to the end of the turn; where no end of turn is known, as
    many marker pieces as the block's start has (``<|START_ACTION|>[`` closes with ``]<|END_ACTION|>``)."""
    cut = len(text)
    for end in ends:
        at = text.find(end)
        if 0 <= at < cut:
            cut = at
    if cut < len(text):
        return text[:cut].rstrip()
    runs = text.split()
    if not runs:
        return ""
    size = max(1, len(marker_pieces(opening.split()[-1])) if opening.split() else 1)
    lead = text[: len(text) - len(text.lstrip())]
    return lead + "".join(marker_pieces(runs[0])[:size])


def tool_end(rest: str, syntax: ToolSyntax) -> str | None:
    """The marker a rest holds after its calls' block (Cohere's ``<|END_OF_TURN_TOKEN|>`` after ``<|END_ACTION|>``):
    the turn's end after tool calls."""
    if syntax.block is None or not syntax.block[1].strip():
        return None
    closing = syntax.block[1].strip()
    at = rest.rfind(closing)
    return first_marker(rest[at + len(closing) :]) if at >= 0 else None


def _single_call(one: Rendered, lead: str, ends: tuple[str, ...], python: bool) -> ToolSyntax | None:
    """Only one call is written (the template keeps the first): its head and end are all there is."""
    rest = one.rest
    if rest is None:
        return None
    call = _locate(rest, p.FIRST, (p.TEXT_KEY, p.COUNT_KEY), 0, python=python)
    if call is None or call.encoding == "tagged" or call.arguments is None:
        return None
    before = _mark_ids(_strip_lead(rest[: call.unit_start], lead))
    after = rest[call.unit_end :]
    end = _before_end(after, ends, before)
    elements: list[Element] = [*_with_ids(before)]
    if call.encoding != "json_call":
        elements.append(Hole("name"))
        elements.extend(_expand_ids(_join((Lit(_mark_ids(rest[call.name_end : call.args_start])),))))
    elements.append(call.arguments)
    if end:
        elements.append(Lit(end))
    elements = [e for e in elements if not (isinstance(e, Lit) and not e.text)]
    if isinstance(elements[0], Arguments) and call.encoding == "json_call":  # the reply is the call (Llama 3)
        return ToolSyntax(tuple(elements), bare=True)
    if not isinstance(elements[0], Lit) or not elements[0].text.strip():
        return None
    return ToolSyntax(tuple(elements))


def _tagged(
    rest: str, first: _Call, second: _Call, rendered: dict[str, Rendered], lead: str, ends: tuple[str, ...]
) -> ToolSyntax | None:
    """One element per argument: ``<parameter=KEY>VALUE</parameter>``, ``<arg_key>K</arg_key><arg_value>V...``."""
    text_key = rest.find(p.TEXT_KEY, first.name_end)
    count_key = rest.find(p.COUNT_KEY, first.name_end)
    flag_key = rest.find(p.FLAG_KEY, second.name_end)
    if min(text_key, count_key, flag_key) < 0:
        return None
    (k1, key1), (k2, key2) = sorted([(text_key, p.TEXT_KEY), (count_key, p.COUNT_KEY)])
    value1 = p.TEXT_VALUE if key1 == p.TEXT_KEY else str(p.COUNT_VALUE)
    value2 = p.TEXT_VALUE if key2 == p.TEXT_KEY else str(p.COUNT_VALUE)
    v1 = rest.find(value1, k1 + len(key1))
    v2 = rest.find(value2, k2 + len(key2))
    if v1 < 0 or v2 < 0 or not k1 < v1 < k2 < v2 < second.name_start:
        return None
    name_to_key = rest[first.name_end : k1]  # name suffix + arguments start + key prefix
    value_to_key = rest[v1 + len(value1) : k2]  # value suffix + separator + key prefix
    if key1 in value_to_key or key2 in value_to_key:
        return None  # the key is written again after the value (MiniMax M3): not a tagged syntax this reads
    key_prefix = _common_suffix(name_to_key, value_to_key)
    if not key_prefix.strip():
        return None
    name_suffix = name_to_key[: len(name_to_key) - len(key_prefix)]
    bare = rendered["bare_call"]
    if bare.written and bare.rest is not None:
        at = bare.rest.find(p.SECOND)
        after_bare = bare.rest[at + len(p.SECOND) :] if at >= 0 else ""
        shared = _common_prefix(name_to_key, after_bare)
        if len(shared) < len(name_suffix):
            name_suffix = shared
            key_prefix = name_to_key[len(name_suffix) :]
    value_suffix = value_to_key[: len(value_to_key) - len(_common_suffix(value_to_key, key_prefix))]
    mid1 = rest[k1 + len(key1) : v1]
    mid2 = rest[k2 + len(key2) : v2]
    string_first = key1 == p.TEXT_KEY
    param: list[Lit | Hole] = [Lit(key_prefix), Hole("key")]
    raw_types: tuple[str, ...] = ()
    if mid1 == mid2:
        param.append(Lit(mid1))
    else:
        parts = _split_around(mid1, mid2, Hole("type"))
        prefix = parts[0].text if isinstance(parts[0], Lit) else ""
        suffix = parts[-1].text if isinstance(parts[-1], Lit) else ""
        string_mid = mid1 if string_first else mid2
        raw_types = (string_mid[len(prefix) : len(string_mid) - len(suffix)],)
        param.extend(e for e in parts if isinstance(e, Lit | Hole))
    param.extend([Hole("value"), Lit(value_suffix)])
    arguments = Arguments("tagged", param=tuple(param), raw_types=raw_types)
    # the calls: head, name, the name's suffix, arguments, the call's end
    flag_value = rest.find(p.FLAG_KEY, second.name_end)
    flag_v = _value_end(rest, flag_value + len(p.FLAG_KEY), value_suffix)
    if flag_v is None:
        return None
    name_to_key_2 = rest[second.name_end : flag_key]
    if not name_to_key_2.endswith(key_prefix):
        return None
    suffix_2 = name_to_key_2[: len(name_to_key_2) - len(key_prefix)]
    middle = _expand_ids(_join(_split_around(_mark_ids(name_suffix), _mark_ids(suffix_2), Hole("skip"))))
    first_args_end = v2 + len(value2) + len(value_suffix)
    if rest[v2 + len(value2) : first_args_end] != value_suffix:
        return None
    return _assemble(
        rest[: first.name_start],
        rest[first_args_end : second.name_start],
        rest[flag_v:],
        "",
        "",
        arguments,
        middle,
        name_in_head=True,
        lead=lead,
        ends=ends,
    )


def _value_end(rest: str, start: int, value_suffix: str) -> int | None:
    """The end of a value's suffix after ``start`` (the first occurrence of the suffix's core)."""
    core = value_suffix.strip()
    at = rest.find(core, start)
    if at < 0:
        return None
    end = at + len(core)
    trail = value_suffix[len(value_suffix.rstrip()) :]
    if rest.startswith(trail, end):
        end += len(trail)
    return end


# -- the whole format ------------------------------------------------------------------------------------------------


def derive(rendered: dict[str, Rendered]) -> ReplyFormat:
    """The format the renders show (parts the renders do not show are left out: a template that writes no tool
    calls gets no tool syntax)."""
    ends = end_texts(rendered)
    reasoning = _reasoning(rendered, ends)
    markers = reasoning.content_markers if reasoning else ()
    syntax_reasoning = reasoning.reasoning if reasoning else None
    markers = tuple(dict.fromkeys((*markers, *_content_markers(rendered, syntax_reasoning))))
    content = rendered["content"]
    lead = ""
    if content.written and content.rest is not None:
        lead = content.rest[: content.rest.find(p.CONTENT)]
    syntax = _tool_syntax(rendered, lead, ends)
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
