"""The walk over one tool call's elements: literals matched core by core, holes (name, id) read up to what follows
them, the arguments element handed to its reader, and the calls of a block with the text between them.

A call is a sequence of elements (:class:`~turnkit.parse.formats.ToolSyntax`' ``call``, compiled in :mod:`.compiled`).
The walk keeps the call's place in it (:class:`~.callstate.CallState`, held by the :class:`~.modes.InCall` mode),
narrows the syntaxes it may still be where several share a trigger (:mod:`.candidates`), hands arguments to
:class:`~.arguments.ArgumentReader` or :class:`~.params.ParamReader` and is told by them when they are done (it is
their :class:`~.callstate.CallSteps`). A call the model broke fails and is skipped to its end; a bare call (no marker
before it) whose text turns out not to be a call is content after all.

Every step takes the mode it reads in and returns the mode the reading is in after it (the same one while the call
goes on); the machine assigns it.
"""

from __future__ import annotations

from turnkit.parse.encodings import Reading
from turnkit.parse.encodings.calls import NAME_CHARS
from turnkit.parse.encodings.jsonscan import WS
from turnkit.parse.formats import Hole
from turnkit.parse.reading.arguments import ArgumentReader
from turnkit.parse.reading.callstate import CallState
from turnkit.parse.reading.candidates import (
    after_trigger,
    aligned,
    choose,
    fits_next,
    kept_after_hole,
    kept_at_literal,
    kinds_differ,
)
from turnkit.parse.reading.compiled import HARMONY_SYNTAX, SymArgs, SymElem, SymLit, SymSyntax, opening
from turnkit.parse.reading.modes import AfterCall, BetweenCalls, EndingBlock, InCall, InContent, Mode
from turnkit.parse.reading.params import ParamReader
from turnkit.parse.reading.state import ReadingState
from turnkit.parse.reply import CallStatus

__all__ = ["CallWalk"]


class CallWalk:
    """Walks the open call (and the block it is in) over what the lexer finds: :meth:`start_calls` at a trigger,
    :meth:`needle` and :meth:`text` inside the call, :meth:`peek` while syntaxes that share a trigger are undecided,
    :meth:`between_needle` and :meth:`between_text` between a block's calls."""

    def __init__(self, state: ReadingState) -> None:
        self.s = state
        self.lexer = state.lexer
        self.arguments = ArgumentReader(state, self)
        self.params = ParamReader(state, self)

    def start_calls(self, trigger: str) -> Mode | None:
        """A trigger in content: a call starts, with every syntax this trigger starts as a candidate (``None``: no
        syntax starts with it, and it was content)."""
        candidates = [syntax for syntax in self.s.compiled.syntaxes if syntax.trigger == trigger]
        if not candidates:
            self.s.show(trigger)
            return None
        self.s.content.held = ""
        starts = [after_trigger(syntax) for syntax in candidates]
        first, seq, pos, core = starts[0]
        together = aligned(starts, pos, core, seq)
        spec = first.spec
        mode = self.new_call(together, seq, first if first.in_block else None)
        call = mode.call
        if spec.bare:
            if isinstance(call.element, SymArgs):  # the trigger is the arguments' own first character
                self.lexer.unread(trigger)
                return self.enter(mode)
            call.raw.append(self.s.plain(trigger))
        call.fresh = first.block_start is not None and bool(first.block_start.cores)
        if len(together) < len(starts):  # what follows the shared trigger decides (Mistral's list or name[ARGS])
            call.alternatives = starts
            call.peek = True
            return mode
        after: Mode = mode
        for _ in range(first.trigger_cores):
            after = self.lit_matched(mode)
        return after

    def new_call(self, candidates: list[SymSyntax], seq: tuple[SymElem, ...], block: SymSyntax | None) -> InCall:
        """A call opens (its first element still to be entered), in ``block`` if it is one's."""
        s = self.s
        index = len(s.calls)
        call = CallState(index, s.call_id(index), candidates, seq)
        if s.calls and block is not None:  # a bare syntax's later calls are calls: the first one was
            call.confirmed = True
        return InCall(call, block)

    def lit_matched(self, mode: InCall) -> Mode:
        """The current literal core matched: on to the next core or element."""
        call = mode.call
        element = call.element
        assert isinstance(element, SymLit)
        if call.pos >= 1:
            call.fresh = False
        call.core += 1
        if call.core >= len(element.cores):
            call.pos += 1
            call.core = 0
            return self.enter(mode)
        return mode

    def enter(self, mode: InCall) -> Mode:
        """Set up the element the call is now at."""
        call = mode.call
        if len(call.candidates) > 1 and kinds_differ(call):
            call.peek = True
            return mode
        element = call.element
        if element is None:
            return self.end_call(mode)
        if isinstance(element, SymLit) and not element.cores:
            call.pos += 1
            return self.enter(mode)
        if isinstance(element, Hole):
            call.hole = []
        elif isinstance(element, SymArgs):
            encoding = element.encoding
            if call.confirmed and not encoding.holds_name:
                self.s.announce(call, call.name or "")
            if encoding.reading is Reading.PARAMS:
                self.params.start(call)
            elif encoding.reading is Reading.ELEMENTS:
                call.hole = []
            else:
                self.arguments.start(call, element)
        return mode

    def peek(self, mode: InCall) -> tuple[Mode, bool]:
        """Several syntaxes are still possible and write different things next: decide by the next character. Returns
        the mode after it and whether it moved on (False: it waits for more text)."""
        call = mode.call
        lexer = self.lexer
        text = lexer.buffer
        stripped = text.lstrip(WS)
        if not stripped:
            if lexer.final:
                call.peek = False
                return self._enter_resolved(mode), False
            return mode, False
        if len(stripped) < len(text):
            call.raw.append(self.s.plain(text[: len(text) - len(stripped)]))
            lexer.buffer = stripped
        char = stripped[0]
        block = mode.block
        if call.fresh and block is not None and block.block_end is not None:
            end = block.block_end.cores[0]
            if stripped.startswith(end):
                lexer.buffer = stripped[len(end) :]
                return self._block_end_met(block.block_end), True
            if end.startswith(stripped) and not lexer.final:
                return mode, False
        if call.alternatives is not None:
            syntax = choose(call, char)
            mode.block = syntax if syntax.in_block else None
            return self.enter(mode), True
        self._switch(mode, fits_next(call, char) or call.candidates[:1])
        call.peek = False
        return self._enter_resolved(mode), True

    def _enter_resolved(self, mode: InCall) -> Mode:
        """Enter the element as the first candidate has it (the others are kept)."""
        call = mode.call
        candidates = call.candidates
        call.candidates = candidates[:1]
        after = self.enter(mode)
        call.candidates = candidates
        return after

    def needle(self, mode: InCall, needle: str) -> Mode:
        """A needle inside the call: the literal expected, the end of a hole, or what cuts the arguments short."""
        call = mode.call
        if call.closing:
            return self._resynced(mode, needle)
        block = mode.block
        if call.fresh and block is not None and block.block_end is not None and needle == block.block_end.cores[0]:
            return self._block_end_met(block.block_end)  # the block ended before any call: there was none
        element = call.element
        reading = element.encoding.reading if isinstance(element, SymArgs) else None
        if call.param_pos is not None or reading is Reading.PARAMS:
            assert isinstance(element, SymArgs)
            return self.params.needle(mode, element, needle)
        if isinstance(element, SymLit) and call.closing_only and needle not in element.cores:
            self.lexer.unread(needle)
            return self.end_call(mode)  # the next call starts where this one's end marker should be
        if isinstance(element, SymLit):
            if len(call.candidates) > 1:  # keep the syntaxes whose literal here is this one
                self._switch(mode, kept_at_literal(call, needle) or call.candidates)
            opens = mode.block is not None and call.pos == 0 and element is mode.block.block_start
            if (call.pos < len(call.seq) - 1 or not call.confirmed) and not (opens and call.confirmed):
                call.raw.append(self.s.plain(needle))  # a call's text, without its block's opening and its end
            return self.lit_matched(mode)
        if isinstance(element, Hole):
            if len(call.candidates) > 1:  # keep the syntaxes in which this can follow the hole
                self._switch(mode, kept_after_hole(call, needle) or call.candidates)
            self.lexer.unread(needle)
            return self._hole_done(mode, element)
        if isinstance(element, SymArgs) and reading is Reading.ELEMENTS:
            self.lexer.unread(needle)
            return self.arguments.elements_done(mode, element)
        if isinstance(element, SymArgs):
            if call.reader is not None and call.reader.in_string:  # a marker inside a string is the string's text
                return self.arguments.read(mode, element, needle)
            after = self.arguments.cut(mode, element)
            if call.closing:
                return self._resynced(mode, needle)
            self.lexer.unread(needle)
            return after
        return mode

    def _switch(self, mode: InCall, kept: list[SymSyntax]) -> None:
        """The call may now only be one of ``kept``: it walks the first one's elements."""
        call = mode.call
        if mode.block is call.syntax:
            mode.block = kept[0]
        call.seq = call.seq_of(kept[0])
        call.candidates = kept

    def text(self, mode: InCall, text: str) -> Mode:
        """Text inside the call: the arguments' (most of it), a hole's, or text the syntax does not allow."""
        call = mode.call
        if call.closing:
            call.raw.append(self.s.plain(text))
            return mode
        element = call.element
        if isinstance(element, SymArgs):
            if call.param_pos is None and element.reads_value:
                return self.arguments.read(mode, element, text)  # the common case: self-delimited arguments
            if call.param_pos is not None or element.encoding.reading is Reading.PARAMS:
                return self.params.text(mode, element, text)
            call.raw.append(self.s.plain(text))  # elements, read whole when what follows them starts
            call.hole.append(text)
            return mode
        if isinstance(element, SymLit):
            stripped = text.lstrip(WS)
            if len(stripped) < len(text):
                call.raw.append(self.s.plain(text[: len(text) - len(stripped)]))
            if not stripped:
                return mode
            expected = self.s.plain(element.cores[call.core])
            return self.mismatch(mode, f"expected {expected!r}, got {self.s.plain(stripped[:1])!r}", stripped)
        if isinstance(element, Hole):
            return self._hole_text(mode, element, text)
        return mode

    def _hole_text(self, mode: InCall, hole: Hole, text: str) -> Mode:
        """Text of a name, id, key or type: it ends at whitespace once it has begun (values end at their literal)."""
        call = mode.call
        if hole.kind == "value":
            call.hole.append(text)
            return mode
        if not call.hole:
            stripped = text.lstrip(WS)
            if len(stripped) < len(text):
                call.raw.append(self.s.plain(text[: len(text) - len(stripped)]))
            text = stripped
            if not text:
                return mode
        call.fresh = False
        for n, char in enumerate(text):
            if char in WS:
                call.hole.append(text[:n])
                self.lexer.unread(text[n:])
                return self._hole_done(mode, hole)
        call.hole.append(text)
        return mode

    def _hole_done(self, mode: InCall, hole: Hole) -> Mode:
        """A name, id or named id is read: checked and kept (a name that holds other characters is no name)."""
        call = mode.call
        written = self.s.plain("".join(call.hole))
        call.raw.append(written)
        text = written.strip(WS)
        call.hole = []
        if hole.kind == "name":
            if not text or not set(text) <= NAME_CHARS:
                return self.mismatch(mode, f"{text!r} is not a function name", "")
            call.name = text
        elif hole.kind == "id":
            call.written_id = text or None
        elif hole.kind == "named_id":
            name = text.rpartition(":")[0].rpartition(".")[2]
            if not name or not set(name) <= NAME_CHARS:
                return self.mismatch(mode, f"{text!r} holds no function name", "")
            call.written_id, call.name = text, name
        call.pos += 1
        call.core = 0
        return self.enter(mode)

    def mismatch(self, mode: InCall, error: str, rest: str) -> Mode:
        """Text the syntax does not allow here: a bare syntax's text was content after all; else the call is broken."""
        if not mode.call.confirmed:
            return self.fall_back(mode, rest)
        after = self.broken(mode, error, CallStatus.INVALID_JSON)
        self.lexer.unread(rest)
        return after

    def fall_back(self, mode: InCall, rest: str) -> Mode:
        """A bare call that is not one: its text is content."""
        call = mode.call
        self.s.show("".join(call.raw) + self.s.plain("".join(call.hole)))
        self.lexer.unread(rest)
        return InContent()

    def broken(self, mode: InCall, error: str, status: CallStatus) -> Mode:
        """The call fails with ``error`` (its first error stands) and is skipped to where it ends (where nothing
        would end it, the rest of the reply is the call's)."""
        call = mode.call
        if call.status is None:
            call.status, call.error = status, error
        call.closing = True
        call.reader = None
        call.param_pos = None
        return mode

    def _resynced(self, mode: InCall, needle: str) -> Mode:
        """A broken call reached its end literal, or its block's end, or the start of another call."""
        call = mode.call
        if needle != call.syntax.end_core and any(needle == syn.trigger for syn in self.s.compiled.syntaxes):
            after = self.end_call(mode)
            self.lexer.unread(needle)
            return self.end_block() if isinstance(after, BetweenCalls) else after  # a new start: a new block
        block = mode.block
        if block is not None and block.block_end is not None and needle == block.block_end.cores[-1]:
            self.end_call(mode)
            return self.end_block()
        return self.end_call(mode)

    def end_call(self, mode: InCall) -> Mode:
        """The call's last element is done (or a broken call reached its end): keep it, move on."""
        call = mode.call
        self.s.finish_call(call, cut=False)
        if self.s.compiled.channels is not None and call.syntax is HARMONY_SYNTAX:
            return AfterCall()
        if mode.block is not None:
            return BetweenCalls(mode.block)
        self.s.content.drop_leading = not self.s.content.started
        return InContent()

    def _block_end_met(self, end: SymLit) -> Mode:
        """The block end's first core matched: the block is over, or its other cores are expected next."""
        if len(end.cores) > 1:
            return EndingBlock(list(end.cores[1:]))
        return self.end_block()

    def between_needle(self, mode: BetweenCalls, needle: str) -> Mode:
        """A needle between the calls of a block: a separator, the block's end, or the next call's start."""
        block = mode.block
        if needle in block.separator.cores:
            return mode
        if block.block_end is not None and needle == block.block_end.cores[0]:
            return self._block_end_met(block.block_end)
        if needle == "{" or needle == "[":
            self.lexer.unread(needle)
            candidates = [syn for syn in self.s.compiled.syntaxes if syn is block] or [block]
            return self.enter(self.new_call(candidates, block.call, block))
        opened = self.new_call([block], block.call, block)
        opened.call.raw.append(self.s.plain(needle))
        return self.lit_matched(opened)

    def between_text(self, mode: BetweenCalls, text: str) -> Mode:
        """Text between the calls of a block: whitespace, the next call's arguments, or the block ended unclosed."""
        stripped = text.lstrip(WS)
        if not stripped:
            return mode
        block = mode.block
        first = opening(block.call)
        if isinstance(first, SymLit):  # not a call: the block ended without its end marker
            self.lexer.unread(stripped)
            return self.end_block()
        opened = self.new_call([block], block.call, block)
        self.lexer.unread(stripped)
        return self.enter(opened)

    def end_block(self) -> Mode:
        """The block of calls is over: back to content."""
        self.s.content.drop_leading = not self.s.content.started
        return InContent()
