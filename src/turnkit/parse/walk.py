"""The walk over one tool call's elements: literals matched core by core, holes (name, id) read up to what follows
them, the arguments element handed to its reader, and the calls of a block with the text between them.

A call is a sequence of elements (:class:`~.formats.ToolSyntax`' ``call``, compiled in :mod:`.compiled`). The walk
keeps the call's place in it (:class:`~.callstate.CallState`), narrows the syntaxes it may still be where several
share a trigger (:mod:`.candidates`), hands arguments to :class:`~.arguments.ArgumentReader` or
:class:`~.params.ParamReader` and is told by them when they are done (it is their :class:`~.callstate.CallSteps`).
A call the model broke fails and is skipped to its end; a bare call (no marker before it) whose text turns out not
to be a call is content after all.
"""

from __future__ import annotations

from turnkit.parse.arguments import ArgumentReader
from turnkit.parse.calls import NAME_CHARS
from turnkit.parse.callstate import CallState
from turnkit.parse.candidates import (
    after_trigger,
    aligned,
    choose,
    fits_next,
    kept_after_hole,
    kept_at_literal,
    kinds_differ,
)
from turnkit.parse.compiled import HARMONY_SYNTAX, SymArgs, SymElem, SymLit, SymSyntax, opening
from turnkit.parse.encodings import Reading
from turnkit.parse.formats import Hole
from turnkit.parse.params import ParamReader
from turnkit.parse.reply import CallStatus
from turnkit.parse.state import WS, ReadingState

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

    def start_calls(self, trigger: str) -> None:
        """A trigger in content: a call starts, with every syntax this trigger starts as a candidate."""
        candidates = [syntax for syntax in self.s.compiled.syntaxes if syntax.trigger == trigger]
        if not candidates:
            self.s.show(trigger)
            return
        self.s.content.held = ""
        starts = [after_trigger(syntax) for syntax in candidates]
        first, seq, pos, core = starts[0]
        together = aligned(starts, pos, core, seq)
        spec = first.spec
        self.s.block = first if first.in_block else None
        self.new_call(together, seq)
        call = self.s.call
        assert call is not None
        if spec.bare:
            if isinstance(call.element, SymArgs):  # the trigger is the arguments' own first character
                self.lexer.unread(trigger)
                self.enter()
                return
            call.raw.append(self.s.plain(trigger))
        call.fresh = first.block_start is not None and bool(first.block_start.cores)
        if len(together) < len(starts):  # what follows the shared trigger decides (Mistral's list or name[ARGS])
            call.alternatives = starts
            call.peek = True
            return
        for _ in range(first.trigger_cores):
            self.lit_matched()

    def new_call(self, candidates: list[SymSyntax], seq: tuple[SymElem, ...]) -> None:
        """A call opens (its first element still to be entered)."""
        s = self.s
        index = len(s.calls)
        call = s.call = CallState(index, s.call_id(index), candidates, seq)
        if s.calls and s.block is not None:  # a bare syntax's later calls are calls: the first one was
            call.confirmed = True
        s.mode = "call"

    def lit_matched(self) -> None:
        """The current literal core matched: on to the next core or element."""
        call = self.s.call
        assert call is not None
        element = call.element
        assert isinstance(element, SymLit)
        if call.pos >= 1:
            call.fresh = False
        call.core += 1
        if call.core >= len(element.cores):
            call.pos += 1
            call.core = 0
            self.enter()

    def enter(self) -> None:
        """Set up the element the call is now at."""
        call = self.s.call
        assert call is not None
        if len(call.candidates) > 1 and kinds_differ(call):
            call.peek = True
            return
        element = call.element
        if element is None:
            self.end_call()
            return
        if isinstance(element, SymLit) and not element.cores:
            call.pos += 1
            self.enter()
            return
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

    def peek(self) -> bool:
        """Several syntaxes are still possible and write different things next: decide by the next character."""
        call = self.s.call
        assert call is not None
        lexer = self.lexer
        text = lexer.buffer
        stripped = text.lstrip(WS)
        if not stripped:
            if lexer.final:
                call.peek = False
                self._enter_resolved()
            return False
        if len(stripped) < len(text):
            call.raw.append(self.s.plain(text[: len(text) - len(stripped)]))
            lexer.buffer = stripped
        char = stripped[0]
        block = self.s.block
        if call.fresh and block is not None and block.block_end is not None:
            end = block.block_end.cores[0]
            if stripped.startswith(end):
                lexer.buffer = stripped[len(end) :]
                self._empty_block(call)
                return True
            if end.startswith(stripped) and not lexer.final:
                return False
        if call.alternatives is not None:
            syntax = choose(call, char)
            self.s.block = syntax if syntax.in_block else None
            self.enter()
            return True
        self._switch(call, fits_next(call, char) or call.candidates[:1])
        call.peek = False
        self._enter_resolved()
        return True

    def _enter_resolved(self) -> None:
        """Enter the element as the first candidate has it (the others are kept)."""
        call = self.s.call
        assert call is not None
        candidates = call.candidates
        call.candidates = candidates[:1]
        self.enter()
        call.candidates = candidates

    def needle(self, needle: str) -> None:
        """A needle inside the call: the literal expected, the end of a hole, or what cuts the arguments short."""
        call = self.s.call
        assert call is not None
        if call.closing:
            self._resynced(call, needle)
            return
        block = self.s.block
        if call.fresh and block is not None and block.block_end is not None and needle == block.block_end.cores[0]:
            self._empty_block(call)
            return
        element = call.element
        reading = element.encoding.reading if isinstance(element, SymArgs) else None
        if call.param_pos is not None or reading is Reading.PARAMS:
            assert isinstance(element, SymArgs)
            self.params.needle(call, element, needle)
            return
        if isinstance(element, SymLit) and needle != element.cores[call.core] and call.closing_only:
            expected = [c.seq[call.pos] for c in [call]]
            if not any(isinstance(e, SymLit) and needle in e.cores for e in expected):
                self.end_call()  # the next call starts where this one's end marker should be
                self.lexer.unread(needle)
                return
        if isinstance(element, SymLit):
            if len(call.candidates) > 1:  # keep the syntaxes whose literal here is this one
                self._switch(call, kept_at_literal(call, needle) or call.candidates)
            opening = self.s.block is not None and call.pos == 0 and element is self.s.block.block_start
            if (call.pos < len(call.seq) - 1 or not call.confirmed) and not (opening and call.confirmed):
                call.raw.append(self.s.plain(needle))  # a call's text, without its block's opening and its end
            self.lit_matched()
        elif isinstance(element, Hole):
            if len(call.candidates) > 1:  # keep the syntaxes in which this can follow the hole
                self._switch(call, kept_after_hole(call, needle) or call.candidates)
            self._hole_done(call, element)
            self.lexer.unread(needle)
        elif isinstance(element, SymArgs) and reading is Reading.ELEMENTS:
            self.arguments.elements_done(call, element)
            self.lexer.unread(needle)
        elif isinstance(element, SymArgs):
            if call.reader is not None and call.reader.in_string:  # a marker inside a string is the string's text
                self.arguments.read(call, element, needle)
                return
            self.arguments.cut(call, element)
            if call.closing:
                self._resynced(call, needle)
            else:
                self.lexer.unread(needle)

    def _switch(self, call: CallState, kept: list[SymSyntax]) -> None:
        """The call may now only be one of ``kept``: it walks the first one's elements."""
        if self.s.block is call.syntax:
            self.s.block = kept[0]
        call.seq = call.seq_of(kept[0])
        call.candidates = kept

    def text(self, text: str) -> None:
        """Text inside the call: the arguments' (most of it), a hole's, or text the syntax does not allow."""
        call = self.s.call
        assert call is not None
        if call.closing:
            call.raw.append(self.s.plain(text))
            return
        element = call.element
        reading = element.encoding.reading if isinstance(element, SymArgs) else None
        if call.param_pos is None and reading is Reading.VALUE:
            assert isinstance(element, SymArgs)
            self.arguments.read(call, element, text)  # the common case: self-delimited arguments
            return
        if call.param_pos is not None or reading is Reading.PARAMS:
            assert isinstance(element, SymArgs)
            self.params.text(call, element, text)
            return
        if isinstance(element, SymLit):
            stripped = text.lstrip(WS)
            if len(stripped) < len(text):
                call.raw.append(self.s.plain(text[: len(text) - len(stripped)]))
            if not stripped:
                return
            expected = self.s.plain(element.cores[call.core])
            self.mismatch(call, f"expected {expected!r}, got {self.s.plain(stripped[:1])!r}", stripped)
        elif isinstance(element, Hole):
            self._hole_text(call, element, text)
        elif isinstance(element, SymArgs) and reading is Reading.ELEMENTS:
            call.raw.append(self.s.plain(text))
            call.hole.append(text)
        elif isinstance(element, SymArgs):
            self.arguments.read(call, element, text)

    def _hole_text(self, call: CallState, hole: Hole, text: str) -> None:
        """Text of a name, id, key or type: it ends at whitespace once it has begun (values end at their literal)."""
        if hole.kind == "value":
            call.hole.append(text)
            return
        if not call.hole:
            stripped = text.lstrip(WS)
            if len(stripped) < len(text):
                call.raw.append(self.s.plain(text[: len(text) - len(stripped)]))
            text = stripped
            if not text:
                return
        call.fresh = False
        for n, char in enumerate(text):
            if char in WS:
                call.hole.append(text[:n])
                self._hole_done(call, hole)
                self.lexer.unread(text[n:])
                return
        call.hole.append(text)

    def _hole_done(self, call: CallState, hole: Hole) -> None:
        """A name, id or named id is read: checked and kept (a name that holds other characters is no name)."""
        written = self.s.plain("".join(call.hole))
        call.raw.append(written)
        text = written.strip(WS)
        call.hole = []
        if hole.kind == "name":
            if not text or not set(text) <= NAME_CHARS:
                self.mismatch(call, f"{text!r} is not a function name", "")
                return
            call.name = text
        elif hole.kind == "id":
            call.written_id = text or None
        elif hole.kind == "named_id":
            name = text.rpartition(":")[0].rpartition(".")[2]
            if not name or not set(name) <= NAME_CHARS:
                self.mismatch(call, f"{text!r} holds no function name", "")
                return
            call.written_id, call.name = text, name
        call.pos += 1
        call.core = 0
        self.enter()

    def mismatch(self, call: CallState, error: str, rest: str) -> None:
        """Text the syntax does not allow here: a bare syntax's text was content after all; else the call is broken."""
        if not call.confirmed:
            self.fall_back(rest)
            return
        self.broken(call, error, CallStatus.INVALID_JSON)
        self.lexer.unread(rest)

    def fall_back(self, rest: str) -> None:
        """A bare call that is not one: its text is content."""
        call = self.s.call
        assert call is not None
        text = "".join(call.raw) + self.s.plain("".join(call.hole))
        self.s.call = None
        self.s.block = None
        self.s.mode = "content"
        self.s.show(text)
        self.lexer.unread(rest)

    def broken(self, call: CallState, error: str, status: CallStatus) -> None:
        """The call fails with ``error`` (its first error stands) and is skipped to where it ends (where nothing
        would end it, the rest of the reply is the call's)."""
        if call.status is None:
            call.status, call.error = status, error
        call.closing = True
        call.reader = None
        call.param_pos = None

    def _resynced(self, call: CallState, needle: str) -> None:
        """A broken call reached its end literal, or its block's end, or the start of another call."""
        if needle != call.syntax.end_core and any(needle == syn.trigger for syn in self.s.compiled.syntaxes):
            self.end_call()
            if self.s.mode == "between":  # a new start: a new block
                self.end_block()
            self.lexer.unread(needle)
            return
        block = self.s.block
        if block is not None and block.block_end is not None and needle == block.block_end.cores[-1]:
            self.end_call()
            self.end_block()
            return
        self.end_call()

    def end_call(self) -> None:
        """The call's last element is done (or a broken call reached its end): keep it, move on."""
        call = self.s.call
        assert call is not None
        self.s.finish_call(call, cut=False)
        block = self.s.block
        self.s.call = None
        if self.s.compiled.channels is not None and call.syntax is HARMONY_SYNTAX:
            self.s.mode = "after_call"
        elif block is not None:
            self.s.mode = "between"
        else:
            self.s.mode = "content"
            self.s.content.drop_leading = not self.s.content.started

    def _empty_block(self, call: CallState) -> None:
        """The block ended before any call: there was none."""
        self.s.call = None
        block = self.s.block
        assert block is not None and block.block_end is not None
        self._block_end_met(block.block_end)

    def _block_end_met(self, end: SymLit) -> None:
        """The block end's first core matched: the block is over, or its other cores are expected next."""
        if len(end.cores) > 1:
            self.s.expect = list(end.cores[1:])
            self.s.mode = "expect"
        else:
            self.end_block()

    def between_needle(self, needle: str) -> None:
        """A needle between the calls of a block: a separator, the block's end, or the next call's start."""
        block = self.s.block
        assert block is not None
        if needle in block.separator.cores:
            return
        if block.block_end is not None and needle == block.block_end.cores[0]:
            self._block_end_met(block.block_end)
            return
        if needle == "{" or needle == "[":
            self.lexer.unread(needle)
            self.new_call([syn for syn in self.s.compiled.syntaxes if syn is block] or [block], block.call)
            self.enter()
            return
        self.new_call([block], block.call)
        call = self.s.call
        assert call is not None
        call.raw.append(self.s.plain(needle))
        self.lit_matched()

    def between_text(self, text: str) -> None:
        """Text between the calls of a block: whitespace, the next call's arguments, or the block ended unclosed."""
        stripped = text.lstrip(WS)
        if not stripped:
            return
        block = self.s.block
        assert block is not None
        first = opening(block.call)
        if isinstance(first, SymLit):  # not a call: the block ended without its end marker
            self.end_block()
            self.lexer.unread(stripped)
            return
        self.new_call([block], block.call)
        self.lexer.unread(stripped)
        self.enter()

    def end_block(self) -> None:
        """The block of calls is over: back to content."""
        self.s.block = None
        self.s.mode = "content"
        self.s.content.drop_leading = not self.s.content.started
