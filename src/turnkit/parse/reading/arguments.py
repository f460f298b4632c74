"""Arguments that delimit themselves (one value: JSON, a call written as one JSON object, Python and Gemma calls,
Python literals where JSON would be), and MiniMax M3's elements.

The walk (:mod:`.walk`) hands the text of a call's arguments element here. The encoding's row
(:mod:`turnkit.parse.encodings`) gives the scanner that says how much of the text is the arguments' own (a marker
inside a string is the string's text), what is sent while it is read (JSON streams as written, a call object's
arguments once its name is read; Python, Gemma and literal arguments, whose text is not a prefix of their JSON, are
sent whole) and what is checked when it is complete. When the arguments are complete (or fail, or are cut short by the
call's end) the reader tells the walk through its :class:`~.callstate.CallSteps`, and returns the mode the walk leaves
the reading in.
"""

from __future__ import annotations

import json

from turnkit.errors import ValueSyntaxError
from turnkit.parse.encodings import ARGUMENTS_INCOMPLETE, ArgumentEncoding, encoding_of
from turnkit.parse.encodings.jsonscan import WS
from turnkit.parse.encodings.values import element_arguments
from turnkit.parse.formats import Arguments
from turnkit.parse.reading.callstate import CallState, CallSteps
from turnkit.parse.reading.compiled import SymArgs
from turnkit.parse.reading.modes import InCall, Mode
from turnkit.parse.reading.state import ReadingState
from turnkit.parse.reply import CallStatus

__all__ = ["ArgumentReader"]


class ArgumentReader:
    """Reads a call's self-delimited arguments: :meth:`start` at the element, :meth:`read` its text, :meth:`cut` when
    the call's end comes first, :meth:`elements_done` for MiniMax M3's elements, :meth:`finish_at_end` at the reply's
    end."""

    def __init__(self, state: ReadingState, walk: CallSteps) -> None:
        self.s = state
        self.walk = walk
        self.lexer = state.lexer
        self.unsymbols = state.unsymbols

    def start(self, call: CallState, args: SymArgs) -> None:
        """The call is at its arguments: the scanner their encoding needs."""
        scanner = args.encoding.scanner
        assert scanner is not None, f"{args.spec.encoding} arguments are not one value"
        call.reader = scanner(args.spec)

    def read(self, mode: InCall, args: SymArgs, text: str) -> Mode:
        """Text of the arguments: as much as is theirs goes to the scanner, the rest is read again."""
        call = mode.call
        encoding, spec = args.encoding, args.spec
        reader = call.reader
        assert reader is not None
        used = reader.feed(text)
        consumed = text[:used] if used < len(text) else text
        plain = consumed.translate(self.unsymbols) if self.unsymbols else consumed
        call.raw.append(plain)
        if call.fresh and consumed.strip(WS):
            call.fresh = False
        if encoding.progress is not None:
            encoding.progress(self.s, call, spec, reader, plain)
        if used < len(text):
            self.lexer.unread(text[used:])
        if reader.failed:
            return self._failed(mode)
        if reader.done:
            return self._done(mode, spec, encoding)
        return mode

    def elements_done(self, mode: InCall, args: SymArgs) -> Mode:
        """MiniMax M3's elements, read when the text after them starts: sent whole."""
        call = mode.call
        text = self.s.plain("".join(call.hole))
        call.hole = []
        tools = self.s.tools
        parameters = tools.get(call.name) if tools and call.name else None
        try:
            value = element_arguments(text, self.s.plain(args.spec.quote), parameters)
        except ValueSyntaxError as exc:
            call.status, call.error = CallStatus.INVALID_JSON, str(exc)
        else:
            self.s.send(call, json.dumps(value, ensure_ascii=False))
        call.pos += 1
        call.core = 0
        return self.walk.enter(mode)

    def cut(self, mode: InCall, args: SymArgs) -> Mode:
        """The call's end literal came before its arguments were complete."""
        call = mode.call
        reader = call.reader
        assert reader is not None
        if not call.confirmed:
            return self.walk.fall_back(mode, "")
        unfinished = not reader.done and reader.failed is None
        error = args.encoding.incomplete if unfinished else ARGUMENTS_INCOMPLETE
        return self.walk.broken(mode, error, CallStatus.INVALID_JSON)

    def _failed(self, mode: InCall) -> Mode:
        reader = mode.call.reader
        assert reader is not None and reader.failed is not None
        if not mode.call.confirmed:
            return self.walk.fall_back(mode, "")
        return self.walk.broken(mode, reader.failed, CallStatus.INVALID_JSON)

    def _done(self, mode: InCall, spec: Arguments, encoding: ArgumentEncoding) -> Mode:
        """The arguments are complete: the encoding checks and sends them, and the walk moves on; text that was no
        call after all is content."""
        call = mode.call
        reader = call.reader
        assert reader is not None and encoding.done is not None
        call.reader = None
        if not encoding.done(self.s, call, spec, reader):
            return self.walk.fall_back(mode, "")
        call.pos += 1
        call.core = 0
        return self.walk.enter(mode)

    def finish_at_end(self, call: CallState) -> None:
        """The reply ended inside the arguments: the encoding keeps what it can (a name already read)."""
        spec = call.syntax.spec.arguments
        at_end = encoding_of(spec).at_end
        if at_end is not None and call.reader is not None:
            at_end(call, spec, call.reader)
        call.reader = None
