"""The reply format compiled for the machine: its literals, triggers and markers in symbol space.

A :class:`~turnkit.parse.formats.ReplyFormat` is written in marker text; the machine reads a stream in which every
marker that is a single token of the vocabulary has become one symbol (a private-use character), so that text which
merely spells ``<tool_call>`` never matches. Compiling puts the format's literals into that space once per (format,
symbols, stops), split into their cores (what must be matched) and the whitespace around them (what the template writes
but a model may leave out), and works out what starts each syntax's calls in content (its trigger).

Everything here is frozen data and pure functions of it: the machine and its collaborators only read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from turnkit.parse.encodings import ArgumentEncoding, Reading, encoding_of
from turnkit.parse.formats import Arguments, Hole, Lit, ReplyFormat, ToolSyntax

__all__ = [
    "HARMONY_SYNTAX",
    "ChannelSymbols",
    "SymArgs",
    "SymElem",
    "SymFormat",
    "SymLit",
    "SymSyntax",
    "compile_format",
    "first_cores",
    "opening",
    "symbolize",
]


@dataclass(frozen=True)
class SymLit:
    """A literal of the format: ``cores``, its text split at whitespace (each matched in turn), the whitespace the
    template writes before and after it (``lead``, ``trail``), and its whole ``text``."""

    cores: tuple[str, ...]
    lead: str
    trail: str
    text: str = ""


@dataclass(frozen=True)
class SymArgs:
    """The arguments element, with the literals of its per-parameter pattern compiled (tagged encodings) and its
    encoding's row (:func:`~turnkit.parse.encodings.encoding_of`)."""

    spec: Arguments
    param: tuple[SymLit | Hole, ...]
    encoding: ArgumentEncoding = field(init=False, compare=False, repr=False)
    #: The arguments are one self-delimited value (the common case, asked at every piece of their text).
    reads_value: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        encoding = encoding_of(self.spec)
        object.__setattr__(self, "encoding", encoding)
        object.__setattr__(self, "reads_value", encoding.reading is Reading.VALUE)


SymElem = SymLit | Hole | SymArgs


@dataclass(frozen=True)
class SymSyntax:
    """One tool syntax compiled: its call's elements, its block's literals, and what starts its calls in content
    (``trigger``, covering ``trigger_cores`` cores of the first literal)."""

    spec: ToolSyntax
    call: tuple[SymElem, ...]
    block_start: SymLit | None
    block_end: SymLit | None
    separator: SymLit
    trigger: str
    trigger_cores: int = 1

    @property
    def end_core(self) -> str | None:
        """The last literal core of a call: where a broken call is closed."""
        last = self.call[-1]
        return last.cores[-1] if isinstance(last, SymLit) and last.cores else None

    @property
    def in_block(self) -> bool:
        """Its calls come in a block: one written around them, or a bare syntax's list with a separator."""
        spec = self.spec
        return spec.block is not None or bool(spec.bare and spec.separator.strip())


@dataclass(frozen=True)
class SymFormat:
    """A whole reply format compiled: its syntaxes, reasoning markers, markers dropped from content, headed-message
    symbols (Harmony), and the literal a reply may open with (``lead``)."""

    syntaxes: tuple[SymSyntax, ...]
    reasoning: tuple[str, str] | None
    content_markers: frozenset[str]
    channels: Any
    lead: str = ""


def symbolize(text: str, symbols: Mapping[str, str]) -> str:
    for marker, symbol in symbols.items():
        if marker in text:
            text = text.replace(marker, symbol)
    return text


def _lit(text: str, symbols: Mapping[str, str]) -> SymLit:
    literal = Lit(symbolize(text, symbols))
    return SymLit(literal.cores, literal.lead, literal.trail, literal.text)


def _trigger(spec: ToolSyntax, first: SymLit | None, table: dict[str, str], stops: frozenset[str]) -> tuple[str, int]:
    """What starts this syntax's calls in content, and how many literal cores it covers: the first core, or where
    that is also a stop (GigaChat's ``<|message_sep|>`` ends a turn and starts a call), the whole first literal."""
    trigger = symbolize(spec.trigger, table)
    if trigger in stops and first is not None and len(first.cores) > 1:
        return first.text.strip(), len(first.cores)
    return trigger, 1


@lru_cache(maxsize=256)
def compile_format(fmt: ReplyFormat, symbols: tuple[tuple[str, str], ...], stops: frozenset[str]) -> SymFormat:
    table = dict(sorted(symbols, key=lambda item: -len(item[0])))
    syntaxes = []
    for spec in fmt.tools:
        call: list[SymElem] = []
        for element in spec.call:
            if isinstance(element, Lit):
                call.append(_lit(element.text, table))
            elif isinstance(element, Arguments):
                param = tuple(_lit(e.text, table) if isinstance(e, Lit) else e for e in element.param)
                call.append(SymArgs(element, param))
            else:
                call.append(element)
        block_start = _lit(spec.block[0], table) if spec.block else None
        block_end = _lit(spec.block[1], table) if spec.block and spec.block[1].strip() else None
        first = block_start if block_start is not None and block_start.cores else call[0]
        trigger, covered = _trigger(spec, first if isinstance(first, SymLit) else None, table, stops)
        separator = _lit(spec.separator, table)
        syntaxes.append(SymSyntax(spec, tuple(call), block_start, block_end, separator, trigger, covered))
    reasoning = None
    if fmt.reasoning is not None:
        reasoning = (symbolize(fmt.reasoning.start, table), symbolize(fmt.reasoning.end, table))
    markers = frozenset(symbolize(m, table) for m in fmt.content_markers)
    channels = None
    if fmt.channels is not None:
        c = fmt.channels
        channels = ChannelSymbols(
            start=symbolize(c.start, table),
            header_end=symbolize(c.header_end, table),
            message_ends=tuple(symbolize(m, table) for m in c.message_ends),
            channel=symbolize(c.channel, table),
            routes=dict(c.routes),
            recipient=c.recipient,
            tool_prefix=c.tool_prefix,
            constrain=symbolize(c.constrain, table) if c.constrain else "",
        )
    lead = fmt.lead.strip()
    return SymFormat(tuple(syntaxes), reasoning, markers, channels, symbolize(lead, table) if lead else "")


@dataclass(frozen=True)
class ChannelSymbols:
    """A headed-message format's markers (Harmony, Functionary v3.2) in symbol space, and how headers route bodies."""

    start: str
    header_end: str
    message_ends: tuple[str, ...]
    channel: str
    routes: dict[str, str]
    recipient: str
    tool_prefix: str | None
    constrain: str

    @property
    def boundaries(self) -> list[str]:
        """What ends a body: its end markers, and the start of another message."""
        return [*self.message_ends, self.start]


def opening(seq: tuple[SymElem, ...]) -> SymElem | None:
    """The first element of a call that writes something (a literal that is only whitespace does not)."""
    return next((e for e in seq if not (isinstance(e, SymLit) and not e.cores)), None)


def first_cores(seq: tuple[SymElem, ...], index: int, after: frozenset[str]) -> frozenset[str]:
    """The literal cores that can come first from ``seq[index]`` on (``after`` when the sequence may end)."""
    if index >= len(seq):
        return after
    element = seq[index]
    if isinstance(element, SymLit):
        return frozenset({element.cores[0]}) if element.cores else first_cores(seq, index + 1, after)
    if isinstance(element, SymArgs):
        if element.encoding.reading is Reading.PARAMS:
            first = first_cores(element.param, 0, frozenset())
            return first | first_cores(seq, index + 1, after)
        return element.encoding.opening_cores
    return frozenset()


#: The call a headed message addressed to a tool holds: its body is the JSON arguments (the name is the recipient).
HARMONY_SYNTAX = SymSyntax(
    ToolSyntax((Arguments("json"),)),
    (SymArgs(Arguments("json"), ()),),
    None,
    None,
    SymLit((), "", ""),
    "",
)
