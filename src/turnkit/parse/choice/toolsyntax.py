"""Building a tool syntax from where the probe calls landed: the texts before, between and after two calls become
the block's start and end, each call's head and end, the separator; the text between name and arguments, holes.

From one and two calls (located by :mod:`.locate`): the text every call starts with is the common end of "before the
first name" and "between the calls", what is left before the first call is the block's start, the call's end and
the block's end are the common start of "after the first call" and "after the last". From two arguments: each
argument's literals (a type attribute where a string and an integer argument differ). Text that differs between the
two calls where nothing varies becomes a hole that is read and dropped; the call's id, where the template writes it,
becomes the call id; an id that holds the name (Kimi's ``functions.NAME:INDEX``) is one hole that gives both.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

from turnkit.parse.choice import probes as p
from turnkit.parse.choice.locate import FoundCall, locate
from turnkit.parse.choice.markers import common_prefix, common_suffix, first_marker, is_marker, marker_pieces
from turnkit.parse.choice.probes import Rendered
from turnkit.parse.encodings import encoding_of
from turnkit.parse.formats import Arguments, Element, Hole, Lit, ToolSyntax

__all__ = ["tool_end", "tool_syntax"]

_ID = "\x00"  # stands for a call id in text being compared


def _split_around(first: str, second: str, hole: Hole) -> tuple[Element, ...]:
    """Two texts that should be one literal but differ (``:0`` and ``:1``): common start, a hole, common end."""
    if first == second:
        return (Lit(first),) if first else ()
    prefix = common_prefix(first, second)
    suffix = common_suffix(first[len(prefix) :], second[len(prefix) :])
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


def tool_syntax(rendered: dict[str, Rendered], lead: str, ends: tuple[str, ...]) -> ToolSyntax | None:
    """The tool syntax the call probes show (``lead``: what every reply starts with; ``ends``: the turn's end
    markers), or None where they show none that reads."""
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
    first = locate(rest, p.FIRST, (p.TEXT_KEY, p.COUNT_KEY), 0, python=python)
    if first is None:
        return None
    second = locate(rest, p.SECOND, (p.FLAG_KEY,), first.unit_end, first, python=python)
    if second is None or first.encoding != second.encoding:
        return None
    if first.arguments is None:  # no value found: one element per parameter
        return _tagged(rest, first, second, rendered, lead, ends)
    holds_name = encoding_of(first.arguments).holds_name
    # what comes before each call's unit (its head), and between the name and the arguments
    before_first = rest[: first.unit_start]
    between = rest[first.unit_end : second.unit_start]
    after_last = rest[second.unit_end :]
    call_end_first = rest[first.args_end : first.unit_end]  # a Python call's ")"; empty where the value is the unit
    call_end_last = rest[second.args_end : second.unit_end]
    middle: tuple[Element, ...] = ()
    if not holds_name:
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
        name_in_head=not holds_name,
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
    head = common_suffix(before_ids, between_ids) if between_ids.strip() else ""
    if not head and between_ids.strip() and before_ids.endswith(between_ids):
        head = between_ids
    block_start = before_ids[: len(before_ids) - len(head)]
    gap = call_end_first + between_ids[: len(between_ids) - len(head)]
    tail = call_end_last + after_last
    call_end = common_prefix(gap, tail)
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
    call = locate(rest, p.FIRST, (p.TEXT_KEY, p.COUNT_KEY), 0, python=python)
    if call is None or call.arguments is None:  # no value found (tagged parameters): not from one call
        return None
    holds_name = encoding_of(call.arguments).holds_name
    before = _mark_ids(_strip_lead(rest[: call.unit_start], lead))
    after = rest[call.unit_end :]
    end = _before_end(after, ends, before)
    elements: list[Element] = [*_with_ids(before)]
    if not holds_name:
        elements.append(Hole("name"))
        elements.extend(_expand_ids(_join((Lit(_mark_ids(rest[call.name_end : call.args_start])),))))
    elements.append(call.arguments)
    if end:
        elements.append(Lit(end))
    elements = [e for e in elements if not (isinstance(e, Lit) and not e.text)]
    if isinstance(elements[0], Arguments) and holds_name:  # the reply is the call (Llama 3)
        return ToolSyntax(tuple(elements), bare=True)
    if not isinstance(elements[0], Lit) or not elements[0].text.strip():
        return None
    return ToolSyntax(tuple(elements))


def _tagged(
    rest: str, first: FoundCall, second: FoundCall, rendered: dict[str, Rendered], lead: str, ends: tuple[str, ...]
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
    key_prefix = common_suffix(name_to_key, value_to_key)
    if not key_prefix.strip():
        return None
    name_suffix = name_to_key[: len(name_to_key) - len(key_prefix)]
    bare = rendered["bare_call"]
    if bare.written and bare.rest is not None:
        at = bare.rest.find(p.SECOND)
        after_bare = bare.rest[at + len(p.SECOND) :] if at >= 0 else ""
        shared = common_prefix(name_to_key, after_bare)
        if len(shared) < len(name_suffix):
            name_suffix = shared
            key_prefix = name_to_key[len(name_suffix) :]
    value_suffix = value_to_key[: len(value_to_key) - len(common_suffix(value_to_key, key_prefix))]
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
