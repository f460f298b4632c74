"""Tagged parameters: arguments written as one element per parameter (Qwen3-Coder's ``<parameter=KEY>VALUE
</parameter>``, GLM's ``<arg_key>``/``<arg_value>``, MiniMax M2's ``<parameter name="KEY">``), read into one JSON
object.

The per-parameter pattern (:class:`~turnkit.parse.formats.Arguments`' ``param``: literals, a key hole, a value hole, a
type hole) is walked like a call's own elements, one level down. A value's JSON type comes from the tool's schema where
it says one, else from a type attribute the template writes, else from the text itself: a string value streams as JSON
string text as it is written, any other value is sent whole once complete. A value whose end tag the model left out
ends where the next parameter or the call's end begins; a CDATA section is the value's text whatever it holds.
"""

from __future__ import annotations

import json
from typing import Any

from turnkit.parse.encodings.jsonscan import WS
from turnkit.parse.encodings.values import is_plain_string, param_schema, schema_types, typed_value
from turnkit.parse.formats import Hole
from turnkit.parse.reading.callstate import CallState, CallSteps
from turnkit.parse.reading.compiled import SymArgs, SymLit, first_cores
from turnkit.parse.reading.modes import InCall, Mode
from turnkit.parse.reading.needles import CDATA
from turnkit.parse.reading.state import ReadingState

__all__ = ["ParamReader"]


class ParamReader:
    """Reads a call's tagged parameters: :meth:`start` at the arguments, then :meth:`needle` and :meth:`text` for
    what the lexer finds, until the text after the arguments begins (the object is closed then, or at the reply's
    end by :meth:`close`)."""

    def __init__(self, state: ReadingState, walk: CallSteps) -> None:
        self.s = state
        self.walk = walk
        self.lexer = state.lexer

    def start(self, call: CallState) -> None:
        """The call is at its arguments: no parameter read yet."""
        call.param_pos = None
        call.params = 0

    def close(self, call: CallState) -> None:
        """The reply ended inside the arguments: the object (and a streamed string value) closed as far as read."""
        if call.params:
            self.s.send(call, '"}' if call.value_streams and call.param_pos is not None else "}")

    def needle(self, mode: InCall, args: SymArgs, needle: str) -> Mode:
        """A needle in the arguments: a parameter's literal, the end of a key, type or value, or what follows the
        arguments (the object is closed and the walk moves on)."""
        call = mode.call
        if call.param_pos is None:  # between parameters: a new one, or what follows the arguments
            first = args.param[0]
            if isinstance(first, SymLit) and first.cores and needle == first.cores[0]:
                call.param_pos, call.param_core = 0, 0
                call.raw.append(self.s.plain(needle))
                self._lit_matched(call, args)
                return mode
            after = self._done(mode)
            self.lexer.unread(needle)
            return after
        element = args.param[call.param_pos]
        if isinstance(element, SymLit):
            call.raw.append(self.s.plain(needle))
            self._lit_matched(call, args)
            return mode
        assert isinstance(element, Hole)
        if element.kind == "value" and needle in CDATA and args.spec.cdata:  # a section opens or closes: not text
            call.raw.append(needle)
            call.cdata = needle == CDATA[0]
            return mode
        own = first_cores(args.param, call.param_pos + 1, frozenset())
        if element.kind == "value" and own and needle not in own:  # the model left the value's end out
            self._value_done(call, args)
            call.hole = []
            call.param_pos = None
            self.lexer.unread(needle)
            return mode
        self._hole_done(call, args, element)
        self.lexer.unread(needle)
        return mode

    def text(self, mode: InCall, args: SymArgs, text: str) -> Mode:
        """Text in the arguments: a key's, a type's or a value's, or text the pattern does not allow there."""
        call = mode.call
        stripped = text.lstrip(WS)
        if len(stripped) < len(text) and (call.param_pos is None or isinstance(args.param[call.param_pos], SymLit)):
            call.raw.append(self.s.plain(text[: len(text) - len(stripped)]))
        if call.param_pos is None:
            if stripped:
                error = f"unexpected text between arguments: {self.s.plain(stripped[:1])!r}"
                return self.walk.mismatch(mode, error, stripped)
            return mode
        element = args.param[call.param_pos]
        if isinstance(element, SymLit):
            if stripped:
                expected = self.s.plain(element.cores[call.param_core])
                return self.walk.mismatch(mode, f"expected {expected!r}, got {self.s.plain(stripped[:1])!r}", stripped)
            return mode
        assert isinstance(element, Hole)
        if element.kind == "value":
            self._value_text(call, args, text)
            return mode
        if not call.hole:
            text = text.lstrip(WS)
        call.hole.append(text)
        return mode

    def _lit_matched(self, call: CallState, args: SymArgs) -> None:
        assert call.param_pos is not None
        element = args.param[call.param_pos]
        assert isinstance(element, SymLit)
        call.param_core += 1
        if call.param_core >= len(element.cores):
            call.param_core = 0
            call.param_pos += 1
            self._enter(call, args)

    def _enter(self, call: CallState, args: SymArgs) -> None:
        assert call.param_pos is not None
        while call.param_pos < len(args.param):
            element = args.param[call.param_pos]
            if isinstance(element, SymLit) and not element.cores:
                call.param_pos += 1
                continue
            if isinstance(element, Hole):
                call.hole = []
                if element.kind == "value":
                    self._value_start(call, args)
            return
        call.param_pos = None  # the parameter is complete

    def _hole_done(self, call: CallState, args: SymArgs, hole: Hole) -> None:
        assert call.param_pos is not None
        if hole.kind == "value":
            self._value_done(call, args)
        else:
            text = self.s.plain("".join(call.hole)).strip(WS)
            call.raw.append(text)
            if hole.kind == "key":
                call.key = text
                call.raw_string = None
            elif hole.kind == "type":
                call.raw_string = text in args.spec.raw_types
        call.hole = []
        call.param_pos += 1
        call.param_core = 0
        self._enter(call, args)

    def _value_start(self, call: CallState, args: SymArgs) -> None:
        key = call.key or ""
        schema = self._schema(call, key)
        # the tool's schema decides where it says something; a type attribute where it does not
        typed = bool(schema_types(schema))
        call.value_streams = is_plain_string(schema) if typed or call.raw_string is None else call.raw_string
        call.value_parts = []
        call.value_started = False
        call.cdata = False
        opening = ("{" if call.params == 0 else ", ") + json.dumps(key, ensure_ascii=False) + ": "
        call.params += 1
        if call.value_streams:
            self.s.send(call, opening + '"')
        else:
            call.opening = opening

    def _schema(self, call: CallState, key: str) -> Any:
        tools = self.s.tools
        if not tools or call.name is None or call.name not in tools:
            return None
        return param_schema(tools[call.name], key)

    def _value_bounds(self, args: SymArgs, call: CallState) -> tuple[str, str]:
        """The whitespace the template writes just inside a value (before and after it)."""
        assert call.param_pos is not None
        before = args.param[call.param_pos - 1] if call.param_pos > 0 else None
        after = args.param[call.param_pos + 1] if call.param_pos + 1 < len(args.param) else None
        lead = before.trail if isinstance(before, SymLit) else ""
        trail = after.lead if isinstance(after, SymLit) else ""
        return lead, trail

    def _value_text(self, call: CallState, args: SymArgs, text: str) -> None:
        call.raw.append(self.s.plain(text))
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
        body = so_far.rstrip(WS)
        if body:
            self.s.send(call, json.dumps(self.s.plain(body), ensure_ascii=False)[1:-1])
            call.value_parts = [so_far[len(body) :]]

    def _value_done(self, call: CallState, args: SymArgs) -> None:
        lead, trail = self._value_bounds(args, call)
        text = "".join(call.value_parts)
        if not call.value_started and text.startswith(lead):
            text = text[len(lead) :]
        if trail and text.endswith(trail):
            text = text[: len(text) - len(trail)]
        text = self.s.plain(text)
        call.value_parts = []
        if call.value_streams:
            if text:
                self.s.send(call, json.dumps(text, ensure_ascii=False)[1:-1])
            self.s.send(call, '"')
            return
        schema = self._schema(call, call.key or "")
        if call.raw_string is False and not schema_types(schema):
            try:
                value = json.loads(text)
            except ValueError:
                value = text
        else:
            value = typed_value(text, schema)
        self.s.send(call, call.opening + json.dumps(value, ensure_ascii=False))

    def _done(self, mode: InCall) -> Mode:
        """The text after the arguments started: close the arguments object."""
        call = mode.call
        self.s.send(call, "{}" if call.params == 0 else "}")
        call.param_pos = None
        call.pos += 1
        call.core = 0
        return self.walk.enter(mode)
