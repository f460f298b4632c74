"""Arguments that delimit themselves: JSON, a call written as one JSON object, Python and Gemma calls, Python
literals where JSON would be, and MiniMax M3's elements.

The walk (:mod:`.walk`) hands the text of a call's arguments element here. A reader from :mod:`.jsonscan` says how
much of the text is the arguments' own (a marker inside a string is the string's text); JSON arguments stream as they
are written, a call object's arguments as the reader streams them once its name is read, and Python, Gemma and
literal arguments, whose text is not a prefix of their JSON, are sent whole. When the arguments are complete (or
fail, or are cut short by the call's end) the reader tells the walk through its :class:`~.callstate.CallSteps`.
"""

from __future__ import annotations

import json
from typing import Any

from turnkit.errors import UnreadableArguments, ValueSyntaxError
from turnkit.parse.calls import arguments_text
from turnkit.parse.callstate import NAME_CHARS, CallState, CallSteps
from turnkit.parse.compiled import SymArgs
from turnkit.parse.formats import Arguments
from turnkit.parse.jsonscan import BracketReader, ObjectReader, ValueReader
from turnkit.parse.literals import gemma_value, python_arguments, python_literal
from turnkit.parse.reply import CallStatus
from turnkit.parse.state import WS, ReadingState
from turnkit.parse.values import element_arguments, unquoted_arguments

__all__ = ["ArgumentReader"]

#: Keys under which a call written as one JSON object holds its id.
_ID_KEYS = ("id", "tool_call_id", "call_id")


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


class ArgumentReader:
    """Reads a call's self-delimited arguments: :meth:`start` at the element, :meth:`read` its text, :meth:`cut` when
    the call's end comes first, :meth:`elements_done` for MiniMax M3's elements, :meth:`finish_at_end` at the reply's
    end."""

    def __init__(self, state: ReadingState, walk: CallSteps) -> None:
        self.s = state
        self.walk = walk
        self.lexer = state.lexer
        self.unsymbols = state.unsymbols

    def start(self, call: CallState, spec: Arguments) -> None:
        """The call is at its arguments: the reader their encoding needs."""
        if spec.python_literals:  # a Python literal where JSON would be: read whole by its brackets
            call.reader = BracketReader(quotes=('"', "'"), escapes=True, until_close=False)
        elif spec.encoding == "json":
            call.reader = ValueReader()
        elif spec.encoding == "json_call":
            call.reader = ObjectReader((*spec.keys, spec.name_key), stream_first=spec.name_as_key)
        elif spec.encoding == "python":
            call.reader = BracketReader(quotes=('"""', "'''", '"', "'"), escapes=True, until_close=True)
        else:
            call.reader = BracketReader(quotes=(spec.quote,), escapes=False, until_close=False)

    def read(self, call: CallState, spec: Arguments, text: str) -> None:
        """Text of the arguments: as much as is theirs goes to the reader, the rest is read again."""
        reader = call.reader
        used = reader.feed(text)
        consumed = text[:used] if used < len(text) else text
        plain = consumed.translate(self.unsymbols) if self.unsymbols else consumed
        call.raw.append(plain)
        if call.fresh and consumed.strip(WS):
            call.fresh = False
        if spec.python_literals:
            pass  # sent whole once read: the literal's text is not the JSON a client receives
        elif spec.encoding == "json_call":
            self._json_call_progress(call, reader, spec)
        elif spec.encoding == "json" and not reader.is_string:
            self.s.send(call, plain.lstrip(WS) if not call.sent and not call.pending else plain)
        if used < len(text):
            self.lexer.unread(text[used:])
        if reader.failed:
            self._failed(call, reader.failed, text[used:])
        elif reader.done:
            self._done(call, spec)

    def elements_done(self, call: CallState, args: SymArgs) -> None:
        """MiniMax M3's elements, read when the text after them starts: sent whole."""
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
        self.walk.enter()

    def cut(self, call: CallState, spec: Arguments) -> None:
        """The call's end literal came before its arguments were complete."""
        reader = call.reader
        if not call.confirmed:
            self.walk.fall_back("")
            return
        if spec.encoding == "json_call" and not reader.done and reader.failed is None:
            self.walk.broken(call, "the tool call's JSON is not complete where the call ends", CallStatus.INVALID_JSON)
        else:
            self.walk.broken(call, "the arguments are not complete where the call ends", CallStatus.INVALID_JSON)

    def _json_call_progress(self, call: CallState, reader: ObjectReader, spec: Arguments) -> None:
        """The arguments' new text (what the reader streamed), and the name once it is read."""
        fragment = reader.streamed
        reader.streamed = ""
        if call.name is not None:  # the common case: the arguments' text, streamed
            if fragment:
                self.s.send(call, fragment.translate(self.unsymbols) if self.unsymbols else fragment)
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
                name = self.s.plain(name)
                call.written_id = None if spec.name_as_key else _written_id(reader, spec.name_key)
                call.confirmed = True
                call.name = name
                call.pending.append(self.s.plain(fragment))
                fragment = ""
                self.s.announce(call, name)
        if fragment:
            self.s.send(call, self.s.plain(fragment))

    def _failed(self, call: CallState, error: str, rest: str) -> None:
        if not call.confirmed:
            self.walk.fall_back("")
            return
        self.walk.broken(call, error, CallStatus.INVALID_JSON)

    def _done(self, call: CallState, spec: Arguments) -> None:
        reader = call.reader
        call.reader = None
        if spec.python_literals:
            if not self._literal_done(call, spec, self.s.plain(reader.text)):
                return
        elif spec.encoding == "json_call":
            self._json_call_done(call, reader)
        elif spec.encoding == "json":
            if reader.is_string:
                final, error = arguments_text(self.s.plain(reader.text.strip(WS)))
                if error is None:
                    self.s.send(call, final)
            try:
                json.loads(reader.text)
            except ValueError as exc:
                if not call.confirmed:
                    self.walk.fall_back("")
                    return
                call.status = CallStatus.INVALID_JSON
                call.error = f"the arguments are not valid JSON ({exc})"
            if not call.confirmed:
                call.confirmed = True
                self.s.announce(call, call.name or "")
        else:
            try:
                if spec.encoding == "python":
                    value = self._python(call, reader.text)
                else:
                    value = gemma_value(reader.text, self.s.plain(spec.quote))
                    if not isinstance(value, dict):
                        raise ValueSyntaxError("the arguments are not an object")
            except ValueSyntaxError as exc:
                if not call.confirmed and not isinstance(exc, UnreadableArguments):
                    self.walk.fall_back("")
                    return
                call.status, call.error = CallStatus.INVALID_JSON, str(exc)
                value = None
            if not call.confirmed:
                call.confirmed = True
                self.s.announce(call, call.name or "")
            if value is not None:
                self.s.send(call, json.dumps(value, ensure_ascii=False))
        call.pos += 1
        call.core = 0
        self.walk.enter()

    def _python(self, call: CallState, text: str) -> dict[str, Any]:
        """A Python call's arguments: Python literals, else, for a tool the request offers, values a template wrote
        without quotes read by the tool's schema (:func:`~.values.unquoted_arguments`; where the text allows no one
        reading, the call fails with the reason, :class:`~.values.UnreadableArguments`, rather than being content).
        Read whole, so a stream and a whole reply read them alike."""
        try:
            return python_arguments(text)
        except ValueSyntaxError:
            tools, name = self.s.tools, call.name
            if not tools or name is None or name not in tools or "=" not in text:
                raise
            return unquoted_arguments(self.s.plain(text), tools[name], name)

    def _literal_done(self, call: CallState, spec: Arguments, text: str) -> bool:
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
            if error is None and not (isinstance(name, str) and name and set(name) <= NAME_CHARS):
                error = f"the tool call has no string {spec.name_key!r}"
            elif error is None:
                call.name = name
        elif error is None:
            value = written
        if error is not None and not call.confirmed:
            self.walk.fall_back("")
            return False
        call.confirmed = True
        self.s.announce(call, call.name or "")
        if error is not None:
            call.status, call.error = CallStatus.INVALID_JSON, error
        else:  # a string that holds a serialized object is that object, as for JSON arguments
            self.s.send(call, arguments_text(json.dumps(value, ensure_ascii=False))[0])
        return True

    def _json_call_done(self, call: CallState, reader: ObjectReader) -> None:
        spec = call.syntax.spec.arguments
        if call.name is None:
            if not call.confirmed:
                self.walk.fall_back("")
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
            self.s.send(call, final[len(sent) :])

    def finish_at_end(self, call: CallState) -> None:
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
