"""The one machine that runs every reply format: text in (with markers that are single tokens already turned into
symbols), OpenAI-shaped deltas out, one pass, constant work per piece.

It is a state machine over the format's data (:mod:`turnkit.parse.formats`): content, reasoning, a tool call walked
element by element (literals matched, holes read up to the literal that follows them, arguments read by their
encoding), the text between calls of a block, and Harmony-style headers and bodies. In each state the
:class:`~.lexer.Lexer` looks for that state's needles only, so ``>`` ends a function name in ``<function=NAME>``
without ever ending content.

Markers that are single tokens of the vocabulary arrive as symbols (private-use characters the parser substitutes
for their ids), so text that merely spells ``<tool_call>`` never matches; text replies have no ids, and there the
markers count as written.

Streaming: content and reasoning stream as written (whitespace next to markers held until it is known whether it is
dropped); a name is sent once complete, with the call's id; JSON arguments stream as written; a raw parameter whose
schema says string streams as JSON string text as it is written, any other value when complete; Python and Gemma
arguments, whose text is not a prefix of their JSON, are sent whole. Deltas only ever extend what was sent.

The machine here is the driver; each concept is a collaborator of its own: the modes it can be in, each a type with
its own data (:mod:`.modes`; whoever reads a mode's text returns the next one, and only the driver assigns it), the
format compiled into symbol space (:mod:`.compiled`), the needles each state looks for (:mod:`.needles`), the state
they share and the deltas out (:mod:`.state`), the walk over a call's elements (:mod:`.walk`, with :mod:`.candidates`
for syntaxes that share a trigger), the argument readers (:mod:`.arguments` for self-delimited arguments,
:mod:`.params` for tagged parameters, :mod:`turnkit.parse.encodings` for what differs by encoding), and the header
machine of headed messages (:mod:`.headers`).

Modes are told apart by ``type(mode) is ...`` on the paths every piece takes (an ``isinstance`` chain there cost 5 to
15% of the parse in ``benchmarks/parse.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from turnkit.parse.encodings.jsonscan import WS
from turnkit.parse.formats import ReplyFormat
from turnkit.parse.reading.compiled import HARMONY_SYNTAX, SymArgs, SymLit, compile_format
from turnkit.parse.reading.headers import headless_text, route_body
from turnkit.parse.reading.lexer import NEEDLE, Needles, needles
from turnkit.parse.reading.modes import (
    AfterCall,
    BetweenCalls,
    EndingBlock,
    InCall,
    InContent,
    InHeader,
    InReasoning,
    Mode,
)
from turnkit.parse.reading.needles import needles_for, state_key
from turnkit.parse.reading.state import ReadingState, TextChannel
from turnkit.parse.reading.walk import CallWalk
from turnkit.parse.reply import CallStatus, Delta, EndReason

__all__ = ["ReplyMachine"]

#: Steps without consuming input after which the machine takes the next character as content (a safety net).
_STALL_LIMIT = 200


class ReplyMachine(ReadingState):
    """Runs one reply format over one reply. :meth:`feed` text (markers already symbols), :meth:`finish` at the end;
    the deltas each step produced are in ``out`` (the caller swaps in a fresh list per step).

    The machine is the driver: it asks the lexer for the next needle or text of the state it is in, and hands it to
    whoever reads that state (content and reasoning here, a call to its walk, a header to :mod:`.headers`)."""

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
        ids_after_name: bool = False,
    ) -> None:
        compiled = compile_format(fmt, tuple(sorted(symbols.items())), frozenset(stops))
        super().__init__(compiled, symbols, stops, tools, call_id)
        self.ids_after_name = ids_after_name
        self.format = fmt
        self.end: EndReason | None = None
        self.stop: str | None = None
        self.walk = CallWalk(self)
        self._memo: dict[tuple[Any, ...], Needles] = {}
        if compiled.channels is not None and open_message is not None:
            self.mode = self._open_body(open_message)  # the prompt left this message's body open: the reply goes on
            target = self.reasoning if isinstance(self.mode, InReasoning) else self.content
            target.drop_leading = not continues
        elif compiled.channels is not None:
            self.mode = InHeader()
        elif in_reasoning and compiled.reasoning is not None:
            self.mode = InReasoning()
            self.reasoning.drop_leading = not continues
        else:
            self.mode = InContent()

    def reasoning_end_starts_with(self, stop: str) -> bool:
        """The reasoning's end starts with ``stop``, text that also ends the reply (a role switch's ``<|im_end|>``)."""
        reasoning = self.compiled.reasoning
        return reasoning is not None and stop in self.stops and reasoning[1].startswith(stop) and reasoning[1] != stop

    @property
    def in_reasoning(self) -> bool:
        return self.end is None and isinstance(self.mode, InReasoning)

    # -- input -----------------------------------------------------------------------------------------------------

    def feed(self, text: str) -> None:
        if self.end is not None or not text:
            return
        self.lexer.push(text)
        self._pump()

    def finish_text(self) -> None:
        """No more text will come (an end id arrived): release what was held back."""
        self.lexer.final = True
        self._pump()

    def finish(self) -> None:
        """The reply is over: release what was held, close what is open."""
        if self.end is None:
            self.finish_text()
        self._close_open()

    def _pump(self) -> None:
        """Read events until the text runs out or could still become a needle: the one loop of the machine."""
        lexer = self.lexer
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
            mode = self.mode
            if type(mode) is InCall and mode.call.peek:
                self.mode, moved = self.walk.peek(mode)
                if not moved:
                    return
                continue
            if not lexer.buffer:
                return
            key = state_key(self)
            found = self._memo.get(key)
            if found is None:
                found = self._memo[key] = needles(needles_for(self))
            event = lexer.next(found)
            if event is None:
                return
            kind, value = event
            if kind == NEEDLE and value in self.stops:
                self.end, self.stop = self.stops[value], self.plain(value)
                return
            if kind == NEEDLE:
                self.mode = self._needle(mode, value)
            else:
                self.mode = self._text(mode, value)

    def _unstick(self) -> None:
        """A safety net: the state machine went round without consuming input (a format whose data contradicts
        itself). The call in progress fails, the next character is content, and the reply says so; a reply never
        hangs the parser."""
        call = self.call
        if call is not None:
            if call.status is None:
                call.status, call.error = CallStatus.INVALID_JSON, "the call's syntax could not be followed"
            call.confirmed = True
            self.finish_call(call, cut=False)
        self.mode = InContent()
        text = self.lexer.buffer[:1]
        self.lexer.buffer = self.lexer.buffer[1:]
        self.problems.append("the parser could not follow the format here and read a character as content")
        self.show(text)

    # -- events: each returns the mode the reading is in after it -------------------------------------------------

    def _needle(self, mode: Mode, needle: str) -> Mode:
        """A needle found in the current mode: what it does there."""
        compiled = self.compiled
        channels = compiled.channels
        if (
            channels is not None
            and isinstance(mode, InContent | InReasoning | AfterCall)
            and needle in channels.boundaries
        ):
            return InHeader()  # a message ended (or another began): a header comes next
        if type(mode) is InContent:
            return self._content_needle(mode, needle)
        if type(mode) is InReasoning:
            return self._reasoning_needle(mode, needle)
        if type(mode) is InCall:
            return self.walk.needle(mode, needle)
        if type(mode) is BetweenCalls:
            return self.walk.between_needle(mode, needle)
        if type(mode) is EndingBlock:
            mode.cores.pop(0)
            return mode if mode.cores else self.walk.end_block()
        if type(mode) is InHeader:
            return self._header_needle(mode, needle)
        return mode  # after a headed call: only a message's end is looked for

    def _content_needle(self, mode: InContent, needle: str) -> Mode:
        """In content: a lead or content marker dropped, reasoning starting, a stray reasoning end dropped, or a
        trigger that starts a call."""
        compiled = self.compiled
        if needle == compiled.lead:
            self.content.drop_leading = True
            return mode
        if needle in compiled.content_markers:
            self.content.held = ""
            self.content.drop_leading = not self.content.started
            return mode
        if compiled.reasoning is not None and needle == compiled.reasoning[0]:
            self.reasoning.drop_leading = True
            return InReasoning(label=self.format.reasoning.label if self.format.reasoning else "")
        if compiled.reasoning is not None and needle == compiled.reasoning[1]:
            self.content.held = ""
            self.content.drop_leading = not self.content.started
            return mode
        started = self.walk.start_calls(needle)
        return mode if started is None else started

    def _reasoning_needle(self, mode: InReasoning, needle: str) -> Mode:
        """In reasoning: stray markers dropped, its end (back to content), or a call's trigger (the reasoning ended
        without its end marker)."""
        compiled = self.compiled
        if needle in compiled.content_markers or (compiled.reasoning and needle == compiled.reasoning[0]):
            self.reasoning.held = "" if not self.reasoning.started else self.reasoning.held
            return mode  # dropped
        self.reasoning.held = ""
        if compiled.reasoning is not None and needle == compiled.reasoning[1]:
            self.content.drop_leading = not self.content.started
            return InContent()
        started = self.walk.start_calls(needle)
        return InContent() if started is None else started

    def _text(self, mode: Mode, text: str) -> Mode:
        """Text up to the next needle in the current mode: content, reasoning, a call's, a header's."""
        if type(mode) is InContent:
            self.show(text)
        elif type(mode) is InReasoning:
            if mode.label:
                text = self._strip_label(mode, text)
                if not text:
                    return mode
            if (shown := self.reasoning.add(self.plain(text))) != "":
                self.emit(Delta(reasoning_content=shown))
        elif type(mode) is InCall:
            return self.walk.text(mode, text)
        elif type(mode) is BetweenCalls:
            return self.walk.between_text(mode, text)
        elif type(mode) is EndingBlock:
            stripped = text.lstrip(WS)
            if stripped:  # the block ended without the rest of its end marker
                self.lexer.unread(stripped)
                return self.walk.end_block()
        elif type(mode) is InHeader:
            mode.parts.append(text)
        return mode  # after a headed call's JSON, up to the end of its message, nothing is read

    def _strip_label(self, mode: InReasoning, text: str) -> str:
        """The reasoning's label (Gemma's ``thought``) right after its start is dropped; text that is not the label is
        reasoning. Text that could still become the label is held."""
        pending = mode.label_held + text
        label = mode.label
        if label.startswith(pending) and len(pending) < len(label) and not self.lexer.final:
            mode.label_held = pending
            return ""
        mode.label, mode.label_held = "", ""
        return pending[len(label) :] if pending.startswith(label) else pending

    # -- headed messages (Harmony, Functionary v3.2) --------------------------------------------------------------

    def _header_needle(self, mode: InHeader, needle: str) -> Mode:
        """A needle in a header: its end opens the body; a message's end or start instead means it had none."""
        channels = self.compiled.channels
        assert channels is not None
        header = self.plain("".join(mode.parts))
        if needle == channels.header_end:
            return self._open_body(header)
        if header.strip():  # a message ended (or another began) before its header did
            self._malformed_header(header)
        return InHeader()

    def _malformed_header(self, header: str) -> None:
        """A message ended before its header did: its text is kept (:func:`.headers.headless_text`)."""
        assert self.compiled.channels is not None
        route, text, problem = headless_text(self.compiled.channels, header, self.plain)
        self.problems.append(problem)
        if not text:
            return
        target = self._enter_text(route)
        if (shown := target.add(text)) != "":
            self.emit(Delta(reasoning_content=shown) if route == "reasoning" else Delta(content=shown))

    def _open_body(self, header: str) -> Mode:
        """The header ended: the body is a tool call's arguments, or text routed as the header says."""
        assert self.compiled.channels is not None
        body = route_body(self.compiled.channels, header, self.plain)
        if body.tool is not None:
            mode = self.walk.new_call([HARMONY_SYNTAX], HARMONY_SYNTAX.call, None)
            mode.call.name = body.tool
            return self.walk.enter(mode)
        self.calls_allowed = body.calls_allowed
        self._enter_text(body.route)
        return InReasoning() if body.route == "reasoning" else InContent()

    def _enter_text(self, route: str) -> TextChannel:
        """A message's text begins: whitespace held from before is dropped, and so is its own leading whitespace."""
        target = self.reasoning if route == "reasoning" else self.content
        target.held = ""
        target.drop_leading = not target.started
        return target

    # -- the end ----------------------------------------------------------------------------------------------------

    def _close_open(self) -> None:
        """The reply is over: a call left open is closed as far as it was read (cut, unless only its end literals
        were missing), a header left open is kept as text, and content's held whitespace is released."""
        mode = self.mode
        self.lexer.take()  # what follows a stop string
        if type(mode) is InCall:
            call = mode.call
            if not call.confirmed:
                self.mode = self.walk.fall_back(mode, "")
            else:
                if call.reader is not None and not call.closing:
                    self.walk.arguments.finish_at_end(call)
                elif call.param_pos is not None or isinstance(call.element, SymArgs):
                    self.walk.params.close(call)
                only_literals = all(isinstance(e, SymLit) for e in call.seq[call.pos :])
                self.finish_call(call, cut=not only_literals or call.closing)
                self.mode = InContent()
        if type(mode) is InHeader and "".join(mode.parts).strip():
            self._malformed_header(self.plain("".join(mode.parts)))
        if not self.calls and (held := self.content.release_held()):
            self.emit(Delta(content=held))
