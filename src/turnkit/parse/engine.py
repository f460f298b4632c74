"""The one engine that runs every reply format: text in (with markers that are single tokens already turned into
symbols), OpenAI-shaped deltas out, one pass, constant work per piece.

It is a state machine over the format's data (:mod:`.formats`): content, reasoning, a tool call walked element by
element (literals matched, holes read up to the literal that follows them, arguments read by their encoding), the
text between calls of a block, and Harmony-style headers and bodies. In each state the :class:`~.lexer.Lexer` looks
for that state's needles only, so ``>`` ends a function name in ``<function=NAME>`` without ever ending content.

Markers that are single tokens of the vocabulary arrive as symbols (private-use characters the parser substitutes
for their ids), so text that merely spells ``<tool_call>`` never matches; text replies have no ids, and there the
markers count as written.

Streaming: content and reasoning stream as written (whitespace next to markers held until it is known whether it is
dropped); a name is sent once complete, with the call's id; JSON arguments stream as written; a raw parameter whose
schema says string streams as JSON string text as it is written, any other value when complete; Python and Gemma
arguments, whose text is not a prefix of their JSON, are sent whole. Deltas only ever extend what was sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from turnkit.parse.calls import arguments_text
from turnkit.parse.formats import Arguments, Hole, Lit, ReplyFormat, ToolSyntax
from turnkit.parse.jsonscan import BracketReader, ObjectReader, ValueReader
from turnkit.parse.lexer import NEEDLE, Lexer, needles
from turnkit.parse.reply import CallStatus, Delta, EndReason, ParsedToolCall, ToolCallDelta
from turnkit.parse.values import (
    ValueSyntaxError,
    element_arguments,
    gemma_value,
    is_plain_string,
    param_schema,
    python_arguments,
    python_literal,
    schema_types,
    typed_value,
)

__all__ = ["Engine"]

_WS = " \t\r\n"
#: Steps without consuming input after which the engine takes the next character as content (a safety net).
_STALL_LIMIT = 200
#: Keys under which a call written as one JSON object holds its id.
_ID_KEYS = ("id", "tool_call_id", "call_id")
#: Characters the arguments' own syntax uses: an end literal starting with one does not cut a reader short.
_SYNTAX_CHARS = frozenset("]}),:;\"'0123456789")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/@")


# -- the format compiled into symbol space --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Lit:
    cores: tuple[str, ...]
    lead: str
    trail: str
    text: str = ""


@dataclass(frozen=True)
class _Args:
    spec: Arguments
    param: tuple[_Lit | Hole, ...]


_Elem = _Lit | Hole | _Args


@dataclass(frozen=True)
class _Syntax:
    spec: ToolSyntax
    call: tuple[_Elem, ...]
    block_start: _Lit | None
    block_end: _Lit | None
    separator: _Lit
    trigger: str
    trigger_cores: int = 1

    @property
    def end_core(self) -> str | None:
        """The last literal core of a call: where a broken call is closed."""
        last = self.call[-1]
        return last.cores[-1] if isinstance(last, _Lit) and last.cores else None


@dataclass(frozen=True)
class _Compiled:
    syntaxes: tuple[_Syntax, ...]
    reasoning: tuple[str, str] | None
    content_markers: frozenset[str]
    channels: Any
    lead: str = ""


def _symbolize(text: str, symbols: Mapping[str, str]) -> str:
    for marker, symbol in symbols.items():
        if marker in text:
            text = text.replace(marker, symbol)
    return text


def _lit(text: str, symbols: Mapping[str, str]) -> _Lit:
    literal = Lit(_symbolize(text, symbols))
    return _Lit(literal.cores, literal.lead, literal.trail, literal.text)


def _trigger(spec: ToolSyntax, first: _Lit | None, table: dict[str, str], stops: frozenset[str]) -> tuple[str, int]:
    """What starts this syntax's calls in content, and how many literal cores it covers: the first core, or where
    that is also a stop (GigaChat's ``<|message_sep|>`` ends a turn and starts a call), the whole first literal."""
    trigger = _symbolize(spec.trigger, table)
    if trigger in stops and first is not None and len(first.cores) > 1:
        return first.text.strip(), len(first.cores)
    return trigger, 1


@lru_cache(maxsize=256)
def _compile(fmt: ReplyFormat, symbols: tuple[tuple[str, str], ...], stops: frozenset[str]) -> _Compiled:
    table = dict(sorted(symbols, key=lambda item: -len(item[0])))
    syntaxes = []
    for spec in fmt.tools:
        call: list[_Elem] = []
        for element in spec.call:
            if isinstance(element, Lit):
                call.append(_lit(element.text, table))
            elif isinstance(element, Arguments):
                param = tuple(_lit(e.text, table) if isinstance(e, Lit) else e for e in element.param)
                call.append(_Args(element, param))
            else:
                call.append(element)
        block_start = _lit(spec.block[0], table) if spec.block else None
        block_end = _lit(spec.block[1], table) if spec.block and spec.block[1].strip() else None
        first = block_start if block_start is not None and block_start.cores else call[0]
        trigger, covered = _trigger(spec, first if isinstance(first, _Lit) else None, table, stops)
        separator = _lit(spec.separator, table)
        syntaxes.append(_Syntax(spec, tuple(call), block_start, block_end, separator, trigger, covered))
    reasoning = None
    if fmt.reasoning is not None:
        reasoning = (_symbolize(fmt.reasoning.start, table), _symbolize(fmt.reasoning.end, table))
    markers = frozenset(_symbolize(m, table) for m in fmt.content_markers)
    channels = None
    if fmt.channels is not None:
        c = fmt.channels
        channels = _ChannelSymbols(
            start=_symbolize(c.start, table),
            header_end=_symbolize(c.header_end, table),
            message_ends=tuple(_symbolize(m, table) for m in c.message_ends),
            channel=_symbolize(c.channel, table),
            routes=dict(c.routes),
            recipient=c.recipient,
            tool_prefix=c.tool_prefix,
            constrain=_symbolize(c.constrain, table) if c.constrain else "",
        )
    lead = fmt.lead.strip()
    return _Compiled(tuple(syntaxes), reasoning, markers, channels, _symbolize(lead, table) if lead else "")


@dataclass(frozen=True)
class _ChannelSymbols:
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


def _opening(seq: tuple[_Elem, ...]) -> _Elem | None:
    """The first element of a call that writes something (a literal that is only whitespace does not)."""
    return next((e for e in seq if not (isinstance(e, _Lit) and not e.cores)), None)


def _first_cores(seq: tuple[_Elem, ...], index: int, after: frozenset[str]) -> frozenset[str]:
    """The literal cores that can come first from ``seq[index]`` on (``after`` when the sequence may end)."""
    if index >= len(seq):
        return after
    element = seq[index]
    if isinstance(element, _Lit):
        return frozenset({element.cores[0]}) if element.cores else _first_cores(seq, index + 1, after)
    if isinstance(element, _Args):
        if element.spec.encoding == "tagged":
            first = _first_cores(element.param, 0, frozenset())
            return first | _first_cores(seq, index + 1, after)
        if element.spec.encoding == "python":
            return frozenset()
        return frozenset({"{", "["})
    return frozenset()


def _written_id(reader: ObjectReader, name_key: str) -> str | None:
    """An id the model wrote in a call's object before its name (Cohere's ``"tool_call_id": "0"``): the call's id.
    One written after the name comes too late for the stream, which sent the id with the name, so it never counts
    (however much of the object the reader already holds)."""
    before: dict[str, str] = {}
    for key, value in reader.values.items():
        if key == name_key:
            break
        before[key] = value
    for key in _ID_KEYS:
        if key in before:
            try:
                written = json.loads(before[key])
            except ValueError:
                continue
            if isinstance(written, str | int) and not isinstance(written, bool):
                return str(written)
    return None


# -- text channels and calls ------------------------------------------------------------------------------------


class _Channel:
    """Text of one kind (content or reasoning). Whitespace at its end is held until more text follows, because
    whitespace next to a tool call or a reasoning marker is dropped rather than shown."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.held = ""
        self.drop_leading = False

    @property
    def started(self) -> bool:
        return bool(self.parts)

    def add(self, text: str) -> str:
        if self.drop_leading and not self.parts:
            text = text.lstrip(_WS)
            if not text:
                return ""
        combined = self.held + text if self.held else text
        body = combined.rstrip(_WS)
        self.held = combined[len(body) :]
        if body:
            self.parts.append(body)
        return body

    def release_held(self) -> str:
        held, self.held = self.held, ""
        if held:
            self.parts.append(held)
        return held

    def text(self) -> str:
        return "".join(self.parts)


_ELEMENTS = frozenset({"tagged", "xml"})
_CDATA = ("<![CDATA[", "]]>")  # arguments as elements, not one self-delimited value


class _Call:
    """A tool call being read."""

    def __init__(self, index: int, call_id: str, candidates: list[_Syntax], seq: tuple[_Elem, ...]) -> None:
        self.index = index
        self.id = call_id
        self.candidates = candidates
        self.seq = seq
        self.pos = 0
        self.core = 0
        self.name: str | None = None
        self.written_id: str | None = None
        self.announced = False
        self.confirmed = not candidates[0].spec.bare
        self.sent: list[str] = []
        self.pending: list[str] = []
        self.raw: list[str] = []
        self.status: CallStatus | None = None
        self.error: str | None = None
        self.hole: list[str] = []
        self.reader: Any = None
        self.arguments: Any = None  # python / gemma: the value once read
        # tagged arguments
        self.param_pos: int | None = None
        self.param_core = 0
        self.key: str | None = None
        self.raw_string: bool | None = None  # from a type attribute
        self.value_streams = False
        self.value_parts: list[str] = []
        self.opening = ""  # '{"key": ' or ', "key": ', sent with a value that is not streamed
        self.value_started = False
        self.cdata = False  # inside a value's <![CDATA[ section
        self.params = 0
        self.closing = False  # a broken call skipping to its end
        self.peek = False  # several syntaxes still possible: the next character decides
        self.fresh = False  # only a block's opening read so far: its end here means an empty block
        #: Syntaxes that share the trigger but continue differently: (syntax, elements, element, core) each.
        self.alternatives: list[tuple[_Syntax, tuple[_Elem, ...], int, int]] | None = None

    @property
    def syntax(self) -> _Syntax:
        return self.candidates[0]

    @property
    def element(self) -> _Elem | None:
        return self.seq[self.pos] if self.pos < len(self.seq) else None


# -- the engine ---------------------------------------------------------------------------------------------------


class Engine:
    """Runs one reply format over one reply. :meth:`feed` text (markers already symbols), :meth:`finish` at the end;
    the deltas each step produced are in ``out`` (the caller swaps in a fresh list per step)."""

    def __init__(
        self,
        fmt: ReplyFormat,
        *,
        symbols: Mapping[str, str],
        stops: Mapping[str, EndReason],
        tools: Mapping[str, Any] | None,
        call_id: Callable[[int], str],
        in_reasoning: bool,
        continues: bool = False,
        open_message: str | None = None,
    ) -> None:
        self.format = fmt
        self._compiled = _compile(fmt, tuple(sorted(symbols.items())), frozenset(stops))
        self._unsymbols = {ord(symbol): marker for marker, symbol in symbols.items()}
        self._stops = dict(stops)
        self._tools = tools
        self._call_id = call_id
        self._lexer = Lexer()
        self.content = _Channel()
        self.reasoning = _Channel()
        self.calls: list[ParsedToolCall] = []
        #: What the reply holds that does not read as its format says, and what was done with it.
        self.problems: list[str] = []
        self.out: list[Delta] = []
        self.end: EndReason | None = None
        self.stop: str | None = None
        self._call: _Call | None = None
        self._block: _Syntax | None = None  # a block of calls is open
        self._expect: list[str] = []
        self._memo: dict[tuple[Any, ...], Any] = {}
        self._calls_allowed = True  # False in a headed message routed to content or reasoning
        self._label, self._label_held = "", ""  # a reasoning label not yet seen (Gemma's "thought")
        compiled = self._compiled
        self._header: list[str] = []
        self._mode: str = "content"
        if compiled.channels is not None and open_message is not None:
            self._open_body(open_message)  # the prompt left this message's body open: the reply continues it
            target = self.reasoning if self._mode == "reasoning" else self.content
            target.drop_leading = not continues
        elif compiled.channels is not None:
            self._mode = "header"
        elif in_reasoning and compiled.reasoning is not None:
            self._mode = "reasoning"
            self.reasoning.drop_leading = not continues
        else:
            self._mode = "content"

    def reasoning_end_starts_with(self, stop: str) -> bool:
        """The reasoning's end starts with ``stop``, text that also ends the reply (a role switch's ``<|im_end|>``)."""
        reasoning = self._compiled.reasoning
        return reasoning is not None and stop in self._stops and reasoning[1].startswith(stop) and reasoning[1] != stop

    @property
    def in_reasoning(self) -> bool:
        return self.end is None and self._mode == "reasoning"

    # -- input -----------------------------------------------------------------------------------------------------

    def feed(self, text: str) -> None:
        if self.end is not None or not text:
            return
        self._lexer.push(text)
        self._pump()

    def finish_text(self) -> None:
        """No more text will come (an end id arrived): release what was held back."""
        self._lexer.final = True
        self._pump()

    def finish(self) -> None:
        """The reply is over: release what was held, close what is open."""
        if self.end is None:
            self.finish_text()
        self._close_open()

    def _pump(self) -> None:
        lexer = self._lexer
        stalled, left = 0, len(lexer.buffer)
        while self.end is None:
            if len(lexer.buffer) < left:
                stalled, left = 0, len(lexer.buffer)
            else:
                stalled += 1
                if stalled > _STALL_LIMIT:
                    self._unstick()
                    stalled, left = 0, len(lexer.buffer)
                    continue
            if self._mode == "call" and self._call is not None and self._call.peek:
                if not self._peek():
                    return
                continue
            if not lexer.buffer:
                return
            key = self._state_key()
            found = self._memo.get(key)
            if found is None:
                found = self._memo[key] = needles(self._needles())
            event = lexer.next(found)
            if event is None:
                return
            kind, value = event
            if kind == NEEDLE and value in self._stops:
                self.end, self.stop = self._stops[value], self._plain(value)
                return
            if kind == NEEDLE:
                self._needle(value)
            else:
                self._text(value)

    def _unstick(self) -> None:
        """A safety net: the state machine went round without consuming input (a format whose data contradicts
        itself). The call in progress fails, the next character is content, and the reply says so; a reply never
        hangs the parser."""
        call = self._call
        if call is not None:
            if call.status is None:
                call.status, call.error = CallStatus.INVALID_JSON, "the call's syntax could not be followed"
            call.confirmed = True
            self._finish_call(call, cut=False)
            self._call = None
        self._block = None
        self._mode = "content"
        text = self._lexer.buffer[:1]
        self._lexer.buffer = self._lexer.buffer[1:]
        self.problems.append("the parser could not follow the format here and read a character as content")
        self._show(text)

    def _plain(self, text: str) -> str:
        """Symbols back to the marker text they stand for."""
        return text.translate(self._unsymbols) if self._unsymbols else text

    # -- needles per state -----------------------------------------------------------------------------------------

    def _state_key(self) -> tuple[Any, ...]:
        """What the needle set depends on, so that it is built once per state rather than once per piece."""
        mode = self._mode
        if mode == "content":
            fresh = not self.content.started and not self.calls and self._call is None
            return (mode, self._calls_allowed, fresh)
        if mode == "reasoning":
            return (mode, self._calls_allowed)
        if mode == "call":
            call = self._call
            assert call is not None
            candidates = call.candidates
            syntax = candidates[0]
            return (
                mode,
                id(syntax),
                len(call.seq) - len(syntax.call),
                tuple(map(id, candidates)) if len(candidates) > 1 else None,
                call.pos,
                call.core,
                call.param_pos,
                call.param_core,
                call.cdata,
                call.closing,
                call.fresh,
                id(self._block),
            )
        if mode == "between":
            return (mode, id(self._block))
        if mode == "expect":
            return (mode, self._expect[0])
        return (mode,)

    def _needles(self) -> list[str]:
        found = list(self._stops)
        mode = self._mode
        compiled = self._compiled
        if mode == "content":
            found += compiled.content_markers
            if compiled.reasoning is not None:
                found.append(compiled.reasoning[0])
                found.append(compiled.reasoning[1])  # a stray end marker is dropped
            found += self._triggers()
            if compiled.lead and not self.content.started and not self.calls:
                found.append(compiled.lead)
            if compiled.channels is not None:
                found += compiled.channels.boundaries
        elif mode == "reasoning":
            found += compiled.content_markers  # stray markers are dropped here too
            if compiled.reasoning is not None:
                found.append(compiled.reasoning[1])
                found.append(compiled.reasoning[0])  # a repeated start (a model that writes the prompt's <think>)
            if self._calls_allowed:
                found += [s.trigger for s in compiled.syntaxes if not s.spec.bare]
            if compiled.channels is not None:
                found += compiled.channels.boundaries
        elif mode == "call":
            found += self._call_needles()
        elif mode == "between":
            found += self._between_needles()
        elif mode == "expect":
            found.append(self._expect[0])
        elif mode == "header":
            channels = compiled.channels
            found += [channels.header_end, *channels.boundaries]
        elif mode == "after_call":
            found += compiled.channels.boundaries
        return found

    def _triggers(self) -> list[str]:
        if not self._calls_allowed:
            return []
        at_start = not self.content.started and not self.calls and self._call is None
        return [s.trigger for s in self._compiled.syntaxes if at_start or not s.spec.bare]

    def _call_needles(self) -> list[str]:
        call = self._call
        assert call is not None
        if call.closing:
            return self._resync_needles(call)
        element = call.element
        if call.fresh and call.pos >= 1 and self._block is not None and self._block.block_end is not None:
            return [*self._fresh_needles(call), self._block.block_end.cores[0]]
        if call.param_pos is not None:
            assert isinstance(element, _Args)
            return list(self._param_needles(call, element))
        if isinstance(element, _Lit):
            cores = {element.cores[call.core]}
            for candidate in call.candidates[1:]:
                other = self._candidate_seq(call, candidate)
                there = other[call.pos] if call.pos < len(other) else None
                if isinstance(there, _Lit) and there.cores:
                    cores.add(there.cores[min(call.core, len(there.cores) - 1)])
            if self._closing_only(call):  # a call whose end marker the model left out: the next call ends it
                cores.update(s.trigger for s in self._compiled.syntaxes if not s.spec.bare)
                first = _opening(call.syntax.call)
                if isinstance(first, _Lit):
                    cores.add(first.cores[0])
            return list(cores)
        if isinstance(element, Hole):
            found: set[str] = set()
            for candidate in call.candidates:
                seq = self._candidate_seq(call, candidate)
                found |= _first_cores(seq, call.pos + 1, frozenset())
            return list(found)
        if isinstance(element, _Args) and element.spec.encoding == "tagged":
            return list(_first_cores(element.param, 0, frozenset()) | _first_cores(call.seq, call.pos + 1, frozenset()))
        if isinstance(element, _Args) and element.spec.encoding == "xml":  # read up to what follows the arguments
            return list(_first_cores(call.seq, call.pos + 1, frozenset()))
        if isinstance(element, _Args):  # a reader: the call's end marker cuts it short (outside a string)
            return [n for n in self._resync_needles(call) if n[0] not in _SYNTAX_CHARS]
        return []

    def _fresh_needles(self, call: _Call) -> list[str]:
        call.fresh = False
        try:
            return self._call_needles()
        finally:
            call.fresh = True

    def _empty_block(self, call: _Call) -> None:
        """The block ended before any call: there was none."""
        self._call = None
        block = self._block
        assert block is not None and block.block_end is not None
        if len(block.block_end.cores) > 1:
            self._expect = list(block.block_end.cores[1:])
            self._mode = "expect"
        else:
            self._end_block()

    def _closing_only(self, call: _Call) -> bool:
        """Only the call's end literals are left to read (its name and arguments are complete)."""
        return call.pos > 0 and all(isinstance(e, _Lit) for e in call.seq[call.pos :])

    def _candidate_seq(self, call: _Call, candidate: _Syntax) -> tuple[_Elem, ...]:
        prefix = len(call.seq) - len(call.syntax.call)
        return call.seq[:prefix] + candidate.call

    def _param_needles(self, call: _Call, args: _Args) -> set[str]:
        assert call.param_pos is not None
        element = args.param[call.param_pos]
        if isinstance(element, _Lit):
            return {element.cores[call.param_core]}
        if call.cdata:  # only the section's end ends a CDATA section
            return {_CDATA[1]}
        follow = _first_cores(args.param, 0, frozenset()) | _first_cores(call.seq, call.pos + 1, frozenset())
        own = set(_first_cores(args.param, call.param_pos + 1, follow))
        if isinstance(element, Hole) and element.kind == "value":  # a value left unclosed ends where the next begins
            return own | follow | ({_CDATA[0]} if args.spec.cdata else set())
        return own

    def _resync_needles(self, call: _Call) -> list[str]:
        found = []
        if call.closing:  # a broken call also ends where another call starts
            found += [s.trigger for s in self._compiled.syntaxes if not s.spec.bare]
        if self._compiled.channels is not None:
            found += self._compiled.channels.message_ends
        if call.syntax.end_core:
            found.append(call.syntax.end_core)
        if self._block is not None and self._block.block_end is not None:
            found.append(self._block.block_end.cores[-1])
        return found

    def _between_needles(self) -> list[str]:
        block = self._block
        assert block is not None
        found = list(block.separator.cores)
        if block.block_end is not None:
            found.append(block.block_end.cores[0])
        first = _opening(block.call)
        if isinstance(first, _Lit):
            found.append(first.cores[0])
        elif isinstance(first, _Args) and first.spec.encoding in ("json", "json_call", "gemma"):
            found.append("{")
        return found

    # -- events ----------------------------------------------------------------------------------------------------

    def _needle(self, needle: str) -> None:
        mode = self._mode
        compiled = self._compiled
        channels = compiled.channels
        if channels is not None and mode in ("content", "reasoning", "after_call") and needle in channels.boundaries:
            self._end_message()
            return
        if mode == "content" and needle == compiled.lead:
            self.content.drop_leading = True
            return
        if mode == "content":
            if needle in compiled.content_markers:
                self.content.held = ""
                self.content.drop_leading = not self.content.started
                return
            if compiled.reasoning is not None and needle == compiled.reasoning[0]:
                self._mode = "reasoning"
                self.reasoning.drop_leading = True
                self._label = self.format.reasoning.label if self.format.reasoning else ""
                return
            if compiled.reasoning is not None and needle == compiled.reasoning[1]:
                self.content.held = ""
                self.content.drop_leading = not self.content.started
                return
            self._start_calls(needle)
        elif mode == "reasoning":
            if needle in compiled.content_markers or (compiled.reasoning and needle == compiled.reasoning[0]):
                self.reasoning.held = "" if not self.reasoning.started else self.reasoning.held
                return  # dropped
            if compiled.reasoning is not None and needle == compiled.reasoning[1]:
                self.reasoning.held = ""
                self._mode = "content"
                self.content.drop_leading = not self.content.started
            else:
                self.reasoning.held = ""
                self._mode = "content"
                self._start_calls(needle)
        elif mode == "call":
            self._call_needle(needle)
        elif mode == "between":
            self._between_needle(needle)
        elif mode == "expect":
            self._expect.pop(0)
            if not self._expect:
                self._end_block()
        elif mode == "header":
            self._header_needle(needle)

    def _text(self, text: str) -> None:
        mode = self._mode
        if mode == "content":
            self._show(text)
        elif mode == "reasoning":
            if self._label:
                text = self._strip_label(text)
                if not text:
                    return
            if (shown := self.reasoning.add(self._plain(text))) != "":
                self._emit(Delta(reasoning_content=shown))
        elif mode == "call":
            self._call_text(text)
        elif mode == "between":
            self._between_text(text)
        elif mode == "after_call":
            pass  # after a call's JSON, up to the end of its message
        elif mode == "expect":
            stripped = text.lstrip(_WS)
            if stripped:
                self._expect = []
                self._end_block()
                self._lexer.unread(stripped)
        elif mode == "header":
            self._header.append(text)

    def _strip_label(self, text: str) -> str:
        """The reasoning's label (Gemma's ``thought``) right after its start is dropped; text that is not the label is
        reasoning. Text that could still become the label is held."""
        pending = self._label_held + text
        label = self._label
        if label.startswith(pending) and len(pending) < len(label) and not self._lexer.final:
            self._label_held = pending
            return ""
        self._label, self._label_held = "", ""
        return pending[len(label) :] if pending.startswith(label) else pending

    def _show(self, text: str) -> None:
        if (shown := self.content.add(self._plain(text))) != "":
            self._emit(Delta(content=shown))

    def _emit(self, delta: Delta) -> None:
        self.out.append(delta)

    # -- tool calls: starting --------------------------------------------------------------------------------------

    def _start_calls(self, trigger: str) -> None:
        candidates = [s for s in self._compiled.syntaxes if s.trigger == trigger]
        if not candidates:
            self._show(trigger)
            return
        self.content.held = ""
        starts = [self._after_trigger(s) for s in candidates]
        first, seq, pos, core = starts[0]
        aligned = [st for st in starts if st[2:] == (pos, core) and st[1][:pos] == seq[:pos]]
        spec = first.spec
        self._block = first if spec.block is not None or (spec.bare and spec.separator.strip()) else None
        self._new_call([st[0] for st in aligned], seq)
        call = self._call
        assert call is not None
        if spec.bare:
            if isinstance(call.element, _Args):  # the trigger is the arguments' own first character
                self._lexer.unread(trigger)
                self._enter()
                return
            call.raw.append(self._plain(trigger))
        call.fresh = first.block_start is not None and bool(first.block_start.cores)
        if len(aligned) < len(starts):  # what follows the shared trigger decides (Mistral's list or name[ARGS])
            call.alternatives = starts
            call.peek = True
            return
        for _ in range(first.trigger_cores):
            self._lit_matched()

    def _after_trigger(self, syntax: _Syntax) -> tuple[_Syntax, tuple[_Elem, ...], int, int]:
        """A syntax's elements, and where its trigger leaves them (element, literal core)."""
        opening = syntax.block_start if syntax.block_start is not None and syntax.block_start.cores else None
        seq = (opening, *syntax.call) if opening is not None else syntax.call
        first = seq[0]
        if isinstance(first, _Lit) and syntax.trigger_cores < len(first.cores):
            return syntax, seq, 0, syntax.trigger_cores
        return syntax, seq, 1, 0

    def _new_call(self, candidates: list[_Syntax], seq: tuple[_Elem, ...]) -> None:
        index = len(self.calls)
        call = self._call = _Call(index, self._call_id(index), candidates, seq)
        if self._calls_confirmed():
            call.confirmed = True
        self._mode = "call"

    def _calls_confirmed(self) -> bool:
        """A bare syntax's later calls are calls: the first one was."""
        return bool(self.calls) and self._block is not None

    # -- tool calls: walking the elements --------------------------------------------------------------------------

    def _lit_matched(self) -> None:
        """The current literal core matched: on to the next core or element."""
        call = self._call
        assert call is not None
        element = call.element
        assert isinstance(element, _Lit)
        if call.pos >= 1:
            call.fresh = False
        call.core += 1
        if call.core >= len(element.cores):
            call.pos += 1
            call.core = 0
            self._enter()

    def _enter(self) -> None:
        """Set up the element the call is now at."""
        call = self._call
        assert call is not None
        if len(call.candidates) > 1 and self._kinds_differ(call):
            call.peek = True
            return
        element = call.element
        if element is None:
            self._end_call()
            return
        if isinstance(element, _Lit) and not element.cores:
            call.pos += 1
            self._enter()
            return
        if isinstance(element, Hole):
            call.hole = []
        elif isinstance(element, _Args):
            spec = element.spec
            if call.confirmed and spec.encoding != "json_call":
                self._announce(call, call.name or "")
            if spec.python_literals:  # a Python literal where JSON would be: read whole by its brackets
                call.reader = BracketReader(quotes=('"', "'"), escapes=True, until_close=False)
            elif spec.encoding == "tagged":
                call.param_pos = None
                call.params = 0
            elif spec.encoding == "xml":
                call.hole = []
            elif spec.encoding == "json":
                call.reader = ValueReader()
            elif spec.encoding == "json_call":
                call.reader = ObjectReader((*spec.keys, spec.name_key), stream_first=spec.name_as_key)
            elif spec.encoding == "python":
                call.reader = BracketReader(quotes=('"""', "'''", '"', "'"), escapes=True, until_close=True)
            else:
                call.reader = BracketReader(quotes=(spec.quote,), escapes=False, until_close=False)

    def _kinds_differ(self, call: _Call) -> bool:
        kinds = set()
        for candidate in call.candidates:
            seq = self._candidate_seq(call, candidate)
            element = seq[call.pos] if call.pos < len(seq) else None
            kinds.add(type(element).__name__ + (element.spec.encoding if isinstance(element, _Args) else ""))
        return len(kinds) > 1

    def _peek(self) -> bool:
        """Several syntaxes are still possible and write different things next: decide by the next character."""
        call = self._call
        assert call is not None
        lexer = self._lexer
        text = lexer.buffer
        stripped = text.lstrip(_WS)
        if not stripped:
            if lexer.final:
                call.peek = False
                self._enter_resolved()
            return False
        if len(stripped) < len(text):
            call.raw.append(self._plain(text[: len(text) - len(stripped)]))
            lexer.buffer = stripped
        char = stripped[0]
        block = self._block
        if call.fresh and block is not None and block.block_end is not None:
            end = block.block_end.cores[0]
            if stripped.startswith(end):
                lexer.buffer = stripped[len(end) :]
                self._empty_block(call)
                return True
            if end.startswith(stripped) and not lexer.final:
                return False
        if call.alternatives is not None:
            self._choose(call, char)
            return True
        kept = []
        for candidate in call.candidates:
            seq = self._candidate_seq(call, candidate)
            element = seq[call.pos] if call.pos < len(seq) else None
            if isinstance(element, _Args) and element.spec.encoding in ("json", "json_call", "gemma"):
                fits = char in "{["
            elif isinstance(element, _Lit):
                fits = bool(element.cores) and element.cores[0].startswith(char)
            else:
                fits = char not in "{["
            if fits:
                kept.append(candidate)
        self._switch(call, kept or call.candidates[:1])
        call.peek = False
        self._enter_resolved()
        return True

    def _choose(self, call: _Call, char: str) -> None:
        """Pick, among syntaxes that share the trigger, those whose next element can start with ``char``."""
        assert call.alternatives is not None
        fitting = []
        for syntax, seq, pos, core in call.alternatives:
            element = seq[pos] if pos < len(seq) else None
            if isinstance(element, _Lit):
                fits = bool(element.cores) and element.cores[core].startswith(char)
            elif isinstance(element, _Args):
                fits = char in "{[" if element.spec.encoding in ("json", "json_call", "gemma") else True
            else:
                fits = char not in "{["
            if fits:
                fitting.append((syntax, seq, pos, core))
        syntax, seq, pos, core = (fitting or call.alternatives)[0]
        call.candidates = [st[0] for st in fitting if st[2:] == (pos, core) and st[1][:pos] == seq[:pos]] or [syntax]
        call.seq, call.pos, call.core = seq, pos, core
        call.alternatives = None
        call.peek = False
        spec = syntax.spec
        self._block = syntax if spec.block is not None or (spec.bare and spec.separator.strip()) else None
        self._enter()

    def _enter_resolved(self) -> None:
        call = self._call
        assert call is not None
        candidates = call.candidates
        call.candidates = candidates[:1]
        self._enter()
        call.candidates = candidates

    def _announce(self, call: _Call, name: str) -> None:
        call.name = name
        if call.announced or not call.confirmed:
            return
        call.announced = True
        pending = "".join(call.pending)
        call.pending = []
        if pending:
            call.sent.append(pending)
        self._emit(Delta(tool_calls=[ToolCallDelta(call.index, call.written_id or call.id, name, pending)]))

    def _send(self, call: _Call, text: str) -> None:
        if not text:
            return
        if not call.announced:
            call.pending.append(text)
            return
        call.sent.append(text)
        self._emit(Delta(tool_calls=[ToolCallDelta(call.index, arguments=text)]))

    def _call_needle(self, needle: str) -> None:
        call = self._call
        assert call is not None
        if call.closing:
            self._resynced(call, needle)
            return
        block = self._block
        if call.fresh and block is not None and block.block_end is not None and needle == block.block_end.cores[0]:
            self._empty_block(call)
            return
        element = call.element
        if call.param_pos is not None or (isinstance(element, _Args) and element.spec.encoding == "tagged"):
            assert isinstance(element, _Args)
            self._param_needle(call, element, needle)
            return
        if isinstance(element, _Lit) and needle != element.cores[call.core] and self._closing_only(call):
            expected = [c.seq[call.pos] for c in [call]]
            if not any(isinstance(e, _Lit) and needle in e.cores for e in expected):
                self._end_call()  # the next call starts where this one's end marker should be
                self._lexer.unread(needle)
                return
        if isinstance(element, _Lit):
            self._pick(call, needle)
            opening = self._block is not None and call.pos == 0 and element is self._block.block_start
            if (call.pos < len(call.seq) - 1 or not call.confirmed) and not (opening and call.confirmed):
                call.raw.append(self._plain(needle))  # a call's text, without its block's opening and its end
            self._lit_matched()
        elif isinstance(element, Hole):
            self._pick_after_hole(call, needle)
            self._hole_done(call, element)
            self._lexer.unread(needle)
        elif isinstance(element, _Args) and element.spec.encoding == "xml":
            self._elements_done(call, element)
            self._lexer.unread(needle)
        elif isinstance(element, _Args):
            if call.reader is not None and call.reader.in_string:  # a marker inside a string is the string's text
                self._read_arguments(needle)
                return
            self._cut_reader(call, element.spec)
            if call.closing:
                self._resynced(call, needle)
            else:
                self._lexer.unread(needle)

    def _pick(self, call: _Call, needle: str) -> None:
        """Keep the candidate syntaxes whose literal here is ``needle``."""
        if len(call.candidates) == 1:
            return
        kept = []
        for candidate in call.candidates:
            seq = self._candidate_seq(call, candidate)
            element = seq[call.pos] if call.pos < len(seq) else None
            if isinstance(element, _Lit) and needle in element.cores:
                kept.append(candidate)
        if kept:
            self._switch(call, kept)

    def _pick_after_hole(self, call: _Call, needle: str) -> None:
        if len(call.candidates) == 1:
            return
        kept = []
        for candidate in call.candidates:
            seq = self._candidate_seq(call, candidate)
            if needle in _first_cores(seq, call.pos + 1, frozenset()):
                kept.append(candidate)
        if kept:
            self._switch(call, kept)

    def _switch(self, call: _Call, kept: list[_Syntax]) -> None:
        if self._block is call.syntax:
            self._block = kept[0]
        call.seq = self._candidate_seq(call, kept[0])
        call.candidates = kept

    def _call_text(self, text: str) -> None:
        call = self._call
        assert call is not None
        if call.closing:
            call.raw.append(self._plain(text))
            return
        element = call.element
        if call.param_pos is None and isinstance(element, _Args) and element.spec.encoding not in _ELEMENTS:
            self._read_arguments(text)  # the common case: self-delimited arguments
            return
        if call.param_pos is not None or (isinstance(element, _Args) and element.spec.encoding == "tagged"):
            assert isinstance(element, _Args)
            self._param_text(call, element, text)
            return
        if isinstance(element, _Lit):
            stripped = text.lstrip(_WS)
            if len(stripped) < len(text):
                call.raw.append(self._plain(text[: len(text) - len(stripped)]))
            if not stripped:
                return
            expected = self._plain(element.cores[call.core])
            self._mismatch(call, f"expected {expected!r}, got {self._plain(stripped[:1])!r}", stripped)
        elif isinstance(element, Hole):
            self._hole_text(call, element, text)
        elif isinstance(element, _Args) and element.spec.encoding == "xml":
            call.raw.append(self._plain(text))
            call.hole.append(text)
        elif isinstance(element, _Args):
            self._read_arguments(text)

    def _hole_text(self, call: _Call, hole: Hole, text: str) -> None:
        """Text of a name, id, key or type: it ends at whitespace once it has begun (values end at their literal)."""
        if hole.kind == "value":
            call.hole.append(text)
            return
        if not call.hole:
            stripped = text.lstrip(_WS)
            if len(stripped) < len(text):
                call.raw.append(self._plain(text[: len(text) - len(stripped)]))
            text = stripped
            if not text:
                return
        call.fresh = False
        for n, char in enumerate(text):
            if char in _WS:
                call.hole.append(text[:n])
                self._hole_done(call, hole)
                self._lexer.unread(text[n:])
                return
        call.hole.append(text)

    def _hole_done(self, call: _Call, hole: Hole) -> None:
        written = self._plain("".join(call.hole))
        call.raw.append(written)
        text = written.strip(_WS)
        call.hole = []
        if hole.kind == "name":
            if not text or not set(text) <= _NAME_CHARS:
                self._mismatch(call, f"{text!r} is not a function name", "")
                return
            call.name = text
        elif hole.kind == "id":
            call.written_id = text or None
        elif hole.kind == "named_id":
            name = text.rpartition(":")[0].rpartition(".")[2]
            if not name or not set(name) <= _NAME_CHARS:
                self._mismatch(call, f"{text!r} holds no function name", "")
                return
            call.written_id, call.name = text, name
        call.pos += 1
        call.core = 0
        self._enter()

    def _mismatch(self, call: _Call, error: str, rest: str) -> None:
        """Text the syntax does not allow here: a bare syntax's text was content after all; else the call is broken."""
        if not call.confirmed:
            self._fall_back(rest)
            return
        self._broken(call, error, CallStatus.INVALID_JSON)
        self._lexer.unread(rest)

    def _fall_back(self, rest: str) -> None:
        """A bare call that is not one: its text is content."""
        call = self._call
        assert call is not None
        text = "".join(call.raw) + self._plain("".join(call.hole))
        self._call = None
        self._block = None
        self._mode = "content"
        self._show(text)
        self._lexer.unread(rest)

    def _broken(self, call: _Call, error: str, status: CallStatus) -> None:
        if call.status is None:
            call.status, call.error = status, error
        call.closing = True
        call.reader = None
        call.param_pos = None
        if not self._resync_needles(call):  # nothing closes it: the rest of the reply is the call's
            return

    def _resynced(self, call: _Call, needle: str) -> None:
        """A broken call reached its end literal, or its block's end, or the start of another call."""
        if needle != call.syntax.end_core and any(needle == s.trigger for s in self._compiled.syntaxes):
            self._end_call()
            if self._mode == "between":  # a new start: a new block
                self._end_block()
            self._lexer.unread(needle)
            return
        block = self._block
        if block is not None and block.block_end is not None and needle == block.block_end.cores[-1]:
            self._end_call()
            self._end_block()
            return
        self._end_call()

    # -- tool calls: self-delimited arguments ------------------------------------------------------------------------

    def _read_arguments(self, text: str) -> None:
        call = self._call
        assert call is not None
        element = call.element
        assert isinstance(element, _Args)
        reader = call.reader
        spec = element.spec
        used = reader.feed(text)
        consumed = text[:used] if used < len(text) else text
        plain = consumed.translate(self._unsymbols) if self._unsymbols else consumed
        call.raw.append(plain)
        if call.fresh and consumed.strip(_WS):
            call.fresh = False
        if spec.python_literals:
            pass  # sent whole once read: the literal's text is not the JSON a client receives
        elif spec.encoding == "json_call":
            self._json_call_progress(call, reader, spec)
        elif spec.encoding == "json" and not reader.is_string:
            self._send(call, plain.lstrip(_WS) if not call.sent and not call.pending else plain)
        if used < len(text):
            self._lexer.unread(text[used:])
        if reader.failed:
            self._reader_failed(call, reader.failed, text[used:])
        elif reader.done:
            self._reader_done(call, spec)

    def _elements_done(self, call: _Call, args: _Args) -> None:
        """MiniMax M3's elements, read when the text after them starts: sent whole."""
        text = self._plain("".join(call.hole))
        call.hole = []
        tools = self._tools
        parameters = tools.get(call.name) if tools and call.name else None
        try:
            value = element_arguments(text, self._plain(args.spec.quote), parameters)
        except ValueSyntaxError as exc:
            call.status, call.error = CallStatus.INVALID_JSON, str(exc)
        else:
            self._send(call, json.dumps(value, ensure_ascii=False))
        call.pos += 1
        call.core = 0
        self._enter()

    def _cut_reader(self, call: _Call, spec: Arguments) -> None:
        """The call's end literal came before its arguments were complete."""
        reader = call.reader
        if not call.confirmed:
            self._fall_back("")
            return
        if spec.encoding == "json_call" and not reader.done and reader.failed is None:
            self._broken(call, "the tool call's JSON is not complete where the call ends", CallStatus.INVALID_JSON)
        else:
            self._broken(call, "the arguments are not complete where the call ends", CallStatus.INVALID_JSON)

    def _json_call_progress(self, call: _Call, reader: ObjectReader, spec: Arguments) -> None:
        """The arguments' new text (what the reader streamed), and the name once it is read."""
        fragment = reader.streamed
        reader.streamed = ""
        if call.name is not None:  # the common case: the arguments' text, streamed
            if fragment:
                self._send(call, fragment.translate(self._unsymbols) if self._unsymbols else fragment)
            return
        if call.name is None:
            name: Any = None
            if spec.name_as_key:
                if reader.values or reader.streaming:
                    name = reader.first_key
            elif spec.name_key in reader.values:
                try:
                    name = reader.value(spec.name_key)
                except ValueError:
                    name = None
            if isinstance(name, str) and name:
                name = self._plain(name)
                call.written_id = None if spec.name_as_key else _written_id(reader, spec.name_key)
                call.confirmed = True
                call.name = name
                call.pending.append(self._plain(fragment))
                fragment = ""
                self._announce(call, name)
        if fragment:
            self._send(call, self._plain(fragment))

    def _reader_failed(self, call: _Call, error: str, rest: str) -> None:
        if not call.confirmed:
            self._fall_back("")
            return
        self._broken(call, error, CallStatus.INVALID_JSON)

    def _reader_done(self, call: _Call, spec: Arguments) -> None:
        reader = call.reader
        call.reader = None
        if spec.python_literals:
            if not self._literal_done(call, spec, self._plain(reader.text)):
                return
        elif spec.encoding == "json_call":
            self._json_call_done(call, reader)
        elif spec.encoding == "json":
            if reader.is_string:
                final, error = arguments_text(self._plain(reader.text.strip(_WS)))
                if error is None:
                    self._send(call, final)
            try:
                json.loads(reader.text)
            except ValueError as exc:
                if not call.confirmed:
                    self._fall_back("")
                    return
                call.status = CallStatus.INVALID_JSON
                call.error = f"the arguments are not valid JSON ({exc})"
            if not call.confirmed:
                call.confirmed = True
                self._announce(call, call.name or "")
        else:
            try:
                if spec.encoding == "python":
                    value = python_arguments(reader.text)
                else:
                    value = gemma_value(reader.text, self._plain(spec.quote))
                    if not isinstance(value, dict):
                        raise ValueSyntaxError("the arguments are not an object")
            except ValueSyntaxError as exc:
                if not call.confirmed:
                    self._fall_back("")
                    return
                call.status, call.error = CallStatus.INVALID_JSON, str(exc)
                value = None
            if not call.confirmed:
                call.confirmed = True
                self._announce(call, call.name or "")
            if value is not None:
                self._send(call, json.dumps(value, ensure_ascii=False))
        call.pos += 1
        call.core = 0
        self._enter()

    def _literal_done(self, call: _Call, spec: Arguments, text: str) -> bool:
        """Arguments written as a Python literal where JSON would be, read whole: for ``json_call`` the object also
        holds the name. False where the text was no call after all (it fell back to content)."""
        error, value = None, None
        try:
            written = python_literal(text)
        except ValueSyntaxError as exc:
            error, written = str(exc), None
        if spec.encoding == "json_call" and error is None:
            name = None
            if not isinstance(written, dict):
                error = "the tool call is not an object"
            elif spec.name_as_key:
                name, value = next(iter(written.items()), (None, None))
            else:
                name = written.get(spec.name_key)
                value = next((written[k] for k in spec.keys if k in written), {})
            if error is None and not (isinstance(name, str) and name and set(name) <= _NAME_CHARS):
                error = f"the tool call has no string {spec.name_key!r}"
            elif error is None:
                call.name = name
        elif error is None:
            value = written
        if error is not None and not call.confirmed:
            self._fall_back("")
            return False
        call.confirmed = True
        self._announce(call, call.name or "")
        if error is not None:
            call.status, call.error = CallStatus.INVALID_JSON, error
        else:  # a string that holds a serialized object is that object, as for JSON arguments
            self._send(call, arguments_text(json.dumps(value, ensure_ascii=False))[0])
        return True

    def _json_call_done(self, call: _Call, reader: ObjectReader) -> None:
        spec = call.syntax.spec.arguments
        if call.name is None:
            if not call.confirmed:
                self._fall_back("")
                return
            call.status = CallStatus.INVALID_JSON
            call.error = f"the tool call has no string {spec.name_key!r}"
            return
        if spec.name_as_key:
            value = reader.values.get(call.name)
        else:
            value = next((reader.values[k] for k in spec.keys if k in reader.values), None)
        sent = "".join(call.sent) + "".join(call.pending)
        final, error = arguments_text(value) if value is not None else ("{}", None)
        if error:
            call.status, call.error = CallStatus.INVALID_JSON, error
        if final != sent and final.startswith(sent):
            self._send(call, final[len(sent) :])

    # -- tool calls: tagged parameters -------------------------------------------------------------------------------

    def _param_needle(self, call: _Call, args: _Args, needle: str) -> None:
        if call.param_pos is None:  # between parameters: a new one, or what follows the arguments
            first = args.param[0]
            if isinstance(first, _Lit) and first.cores and needle == first.cores[0]:
                call.param_pos, call.param_core = 0, 0
                call.raw.append(self._plain(needle))
                self._param_lit_matched(call, args)
                return
            self._params_done(call)
            self._lexer.unread(needle)
            return
        element = args.param[call.param_pos]
        if isinstance(element, _Lit):
            call.raw.append(self._plain(needle))
            self._param_lit_matched(call, args)
            return
        assert isinstance(element, Hole)
        if element.kind == "value" and needle in _CDATA and args.spec.cdata:  # a section opens or closes: not text
            call.raw.append(needle)
            call.cdata = needle == _CDATA[0]
            return
        own = _first_cores(args.param, call.param_pos + 1, frozenset())
        if element.kind == "value" and own and needle not in own:  # the model left the value's end out
            self._value_done(call, args)
            call.hole = []
            call.param_pos = None
            self._lexer.unread(needle)
            return
        self._param_hole_done(call, args, element)
        self._lexer.unread(needle)

    def _param_text(self, call: _Call, args: _Args, text: str) -> None:
        stripped = text.lstrip(_WS)
        if len(stripped) < len(text) and (call.param_pos is None or isinstance(args.param[call.param_pos], _Lit)):
            call.raw.append(self._plain(text[: len(text) - len(stripped)]))
        if call.param_pos is None:
            if stripped:
                self._mismatch(call, f"unexpected text between arguments: {self._plain(stripped[:1])!r}", stripped)
            return
        element = args.param[call.param_pos]
        if isinstance(element, _Lit):
            if stripped:
                expected = self._plain(element.cores[call.param_core])
                self._mismatch(call, f"expected {expected!r}, got {self._plain(stripped[:1])!r}", stripped)
            return
        assert isinstance(element, Hole)
        if element.kind == "value":
            self._value_text(call, args, text)
            return
        if not call.hole:
            text = text.lstrip(_WS)
        call.hole.append(text)

    def _param_lit_matched(self, call: _Call, args: _Args) -> None:
        assert call.param_pos is not None
        element = args.param[call.param_pos]
        assert isinstance(element, _Lit)
        call.param_core += 1
        if call.param_core >= len(element.cores):
            call.param_core = 0
            call.param_pos += 1
            self._param_enter(call, args)

    def _param_enter(self, call: _Call, args: _Args) -> None:
        assert call.param_pos is not None
        while call.param_pos < len(args.param):
            element = args.param[call.param_pos]
            if isinstance(element, _Lit) and not element.cores:
                call.param_pos += 1
                continue
            if isinstance(element, Hole):
                call.hole = []
                if element.kind == "value":
                    self._value_start(call, args)
            return
        call.param_pos = None  # the parameter is complete

    def _param_hole_done(self, call: _Call, args: _Args, hole: Hole) -> None:
        assert call.param_pos is not None
        if hole.kind == "value":
            self._value_done(call, args)
        else:
            text = self._plain("".join(call.hole)).strip(_WS)
            call.raw.append(text)
            if hole.kind == "key":
                call.key = text
                call.raw_string = None
            elif hole.kind == "type":
                call.raw_string = text in args.spec.raw_types
        call.hole = []
        call.param_pos += 1
        call.param_core = 0
        self._param_enter(call, args)

    def _value_start(self, call: _Call, args: _Args) -> None:
        key = call.key or ""
        schema = self._param_schema(call, key)
        # the tool's schema decides where it says something; a type attribute where it does not
        typed = bool(schema_types(schema))
        call.value_streams = is_plain_string(schema) if typed or call.raw_string is None else call.raw_string
        call.value_parts = []
        call.value_started = False
        call.cdata = False
        opening = ("{" if call.params == 0 else ", ") + json.dumps(key, ensure_ascii=False) + ": "
        call.params += 1
        if call.value_streams:
            self._send(call, opening + '"')
        else:
            call.opening = opening

    def _param_schema(self, call: _Call, key: str) -> Any:
        tools = self._tools
        if not tools or call.name is None or call.name not in tools:
            return None
        return param_schema(tools[call.name], key)

    def _value_bounds(self, args: _Args, call: _Call) -> tuple[str, str]:
        """The whitespace the template writes just inside a value (before and after it)."""
        assert call.param_pos is not None
        before = args.param[call.param_pos - 1] if call.param_pos > 0 else None
        after = args.param[call.param_pos + 1] if call.param_pos + 1 < len(args.param) else None
        lead = before.trail if isinstance(before, _Lit) else ""
        trail = after.lead if isinstance(after, _Lit) else ""
        return lead, trail

    def _value_text(self, call: _Call, args: _Args, text: str) -> None:
        call.raw.append(self._plain(text))
        call.value_parts.append(text)
        if not call.value_streams:
            return
        lead, _trail = self._value_bounds(args, call)
        so_far = "".join(call.value_parts)
        if not call.value_started:
            if len(so_far) < len(lead) and lead.startswith(so_far):
                return
            call.value_started = True
            call.value_parts = [so_far[len(lead) :] if so_far.startswith(lead) else so_far]
            so_far = call.value_parts[0]
        body = so_far.rstrip(_WS)
        if body:
            self._send(call, json.dumps(self._plain(body), ensure_ascii=False)[1:-1])
            call.value_parts = [so_far[len(body) :]]

    def _value_done(self, call: _Call, args: _Args) -> None:
        lead, trail = self._value_bounds(args, call)
        text = "".join(call.value_parts)
        if not call.value_started and text.startswith(lead):
            text = text[len(lead) :]
        if trail and text.endswith(trail):
            text = text[: len(text) - len(trail)]
        text = self._plain(text)
        call.value_parts = []
        if call.value_streams:
            if text:
                self._send(call, json.dumps(text, ensure_ascii=False)[1:-1])
            self._send(call, '"')
            return
        schema = self._param_schema(call, call.key or "")
        if call.raw_string is False and not schema_types(schema):
            try:
                value = json.loads(text)
            except ValueError:
                value = text
        else:
            value = typed_value(text, schema)
        self._send(call, call.opening + json.dumps(value, ensure_ascii=False))

    def _params_done(self, call: _Call) -> None:
        """The text after the arguments started: close the arguments object."""
        self._send(call, "{}" if call.params == 0 else "}")
        call.param_pos = None
        call.pos += 1
        call.core = 0
        self._enter()

    # -- tool calls: ending ------------------------------------------------------------------------------------------

    def _end_call(self) -> None:
        """The call's last element is done (or a broken call reached its end): keep it, move on."""
        call = self._call
        assert call is not None
        self._finish_call(call, cut=False)
        block = self._block
        self._call = None
        if self._compiled.channels is not None and call.syntax is _HARMONY_SYNTAX:
            self._mode = "after_call"
        elif block is not None:
            self._mode = "between"
        else:
            self._mode = "content"
            self.content.drop_leading = not self.content.started

    def _finish_call(self, call: _Call, *, cut: bool) -> None:
        if not call.confirmed:
            return
        if not call.announced:
            self._announce(call, call.name or "")
        if call.pending:
            pending = "".join(call.pending)
            call.pending = []
            self._send(call, pending)
        sent = "".join(call.sent)
        status, error = call.status, call.error
        if status is None and cut:
            status, error = CallStatus.UNTERMINATED, "the reply ended inside the tool call"
        if status is None and not call.name:
            status, error = CallStatus.INVALID_JSON, "the tool call has no name"
        if status is None:
            try:
                json.loads(sent)
            except ValueError as exc:
                status, error = CallStatus.INVALID_JSON, f"the arguments are not valid JSON ({exc})"
        if status is None and self._tools is not None and call.name not in self._tools:
            status, error = CallStatus.UNKNOWN_TOOL, f"the model called {call.name!r}, which is not among the tools"
        raw = "".join(call.raw)
        self.calls.append(
            ParsedToolCall(call.written_id or call.id, call.name or "", sent, status or CallStatus.OK, error, raw)
        )

    def _between_needle(self, needle: str) -> None:
        block = self._block
        assert block is not None
        if needle in block.separator.cores:
            return
        if block.block_end is not None and needle == block.block_end.cores[0]:
            if len(block.block_end.cores) > 1:
                self._expect = list(block.block_end.cores[1:])
                self._mode = "expect"
                return
            self._end_block()
            return
        if needle == "{" or needle == "[":
            self._lexer.unread(needle)
            self._new_call([s for s in self._compiled.syntaxes if s is block] or [block], block.call)
            self._enter()
            return
        self._new_call([block], block.call)
        call = self._call
        assert call is not None
        call.raw.append(self._plain(needle))
        self._lit_matched()

    def _between_text(self, text: str) -> None:
        stripped = text.lstrip(_WS)
        if not stripped:
            return
        block = self._block
        assert block is not None
        first = _opening(block.call)
        if isinstance(first, _Lit):  # not a call: the block ended without its end marker
            self._end_block()
            self._lexer.unread(stripped)
            return
        self._new_call([block], block.call)
        self._lexer.unread(stripped)
        self._enter()

    def _end_block(self) -> None:
        self._block = None
        self._mode = "content"
        self.content.drop_leading = not self.content.started

    # -- headed messages (Harmony, Functionary v3.2) --------------------------------------------------------------

    def _header_needle(self, needle: str) -> None:
        channels = self._compiled.channels
        header = self._plain("".join(self._header))
        self._header = []
        if needle == channels.header_end:
            self._open_body(header)
        elif header.strip():  # a message ended (or another began) before its header did
            self._malformed_header(header)

    def _malformed_header(self, header: str) -> None:
        """A header with no end: what follows its channel name is the message's text (as openai-harmony's lenient
        parser reads it), routed by that channel, else content; never dropped, and the reply says so."""
        channels = self._compiled.channels
        marker = self._plain(channels.channel)
        words = header.split()
        if words and words[0] == "assistant":
            header = header.split("assistant", 1)[1]
        route, text = "content", header.strip()
        if marker and marker in header:
            after = header.split(marker, 1)[1].strip()
            name, _, rest = after.partition(" ")
            route = channels.routes.get(name, "content")
            text = rest.strip()
        self.problems.append(f"a message header has no {self._plain(channels.header_end)!r}: {header.strip()!r}")
        if not text:
            return
        target = self.reasoning if route == "reasoning" else self.content
        target.held = ""
        target.drop_leading = not target.started
        if (shown := target.add(text)) != "":
            self._emit(Delta(reasoning_content=shown) if route == "reasoning" else Delta(content=shown))

    def _open_body(self, header: str) -> None:
        """Route the body by its header: a channel or recipient that a route names, a tool call, or content."""
        channels = self._compiled.channels
        marker = self._plain(channels.channel)
        if marker:
            header = header.replace(marker, " " + marker + " ")
        if channels.constrain:  # <|constrain|>json: the body's type, read and dropped
            header = header.replace(self._plain(channels.constrain), " " + self._plain(channels.constrain))
        words = header.split()
        words = [w for w in words if not (channels.constrain and w.startswith(self._plain(channels.constrain)))]
        if words and words[0] == "assistant":  # the role after a message's start
            words = words[1:]
        channel = None
        if marker and marker in words:
            at = len(words) - 1 - words[::-1].index(marker)  # the last channel named wins
            channel = words[at + 1] if at + 1 < len(words) else None
        if channels.recipient:
            recipient = next((w[len(channels.recipient) :] for w in words if w.startswith(channels.recipient)), None)
        else:
            recipient = words[0] if words else None
        if recipient == "assistant":  # addressed to the assistant itself: no recipient
            recipient = None
        prefix = channels.tool_prefix
        routed = channels.routes.get(recipient or "")
        if recipient is not None and prefix is not None and routed is None:
            self._new_call([_HARMONY_SYNTAX], _HARMONY_SYNTAX.call)
            call = self._call
            assert call is not None
            call.name = recipient.removeprefix(prefix) if prefix else recipient
            self._enter()
            return
        route = routed or channels.routes.get(channel or "") or "content"
        # a routed message is text; calls come in messages to a recipient no route names
        self._calls_allowed = recipient is not None and routed is None
        self._mode = route
        target = self.reasoning if route == "reasoning" else self.content
        target.held = ""
        target.drop_leading = not target.started

    def _end_message(self) -> None:
        self._mode = "header"
        self._header = []

    # -- the end ----------------------------------------------------------------------------------------------------

    def _close_open(self) -> None:
        mode = self._mode
        self._lexer.take()  # what follows a stop string
        call = self._call
        if mode == "call" and call is not None:
            if not call.confirmed:
                self._fall_back("")
            else:
                if call.reader is not None and not call.closing:
                    self._finish_reader_at_end(call)
                elif call.param_pos is not None or isinstance(call.element, _Args):
                    if call.param_pos is not None and call.hole is not None:
                        pass
                    if call.params:
                        self._send(call, '"}' if call.value_streams and call.param_pos is not None else "}")
                only_literals = all(isinstance(e, _Lit) for e in call.seq[call.pos :])
                self._finish_call(call, cut=not only_literals or call.closing)
                self._call = None
        if mode == "header" and "".join(self._header).strip():
            self._malformed_header(self._plain("".join(self._header)))
        if not self.calls and (held := self.content.release_held()):
            self._emit(Delta(content=held))

    def _finish_reader_at_end(self, call: _Call) -> None:
        reader = call.reader
        if isinstance(reader, ObjectReader) and call.name is None:
            spec = call.syntax.spec.arguments
            if spec.name_key in reader.values:
                try:
                    name = reader.value(spec.name_key)
                except ValueError:
                    name = None
                if isinstance(name, str):
                    call.name = name
        call.reader = None


_HARMONY_SYNTAX = _Syntax(
    ToolSyntax((Arguments("json"),)),
    (_Args(Arguments("json"), ()),),
    None,
    None,
    _Lit((), "", ""),
    "",
)
