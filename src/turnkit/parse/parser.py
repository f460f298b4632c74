"""The streaming reply parser: token ids in, OpenAI-shaped deltas out, one pass over the reply.

A :class:`StreamParser` reads a reply token by token:

* an id in the stop set (the template's end-of-turn marker, the checkpoint's EOS ids) ends the reply;
* an id that is a marker of the reply format (``<tool_call>``, ``<think>``, ``[TOOL_CALLS]`` ...) switches state;
  where a marker is a single token of the vocabulary only that token counts: the same characters written as ordinary
  text are content;
* any other id becomes text (:mod:`.detokenize`), which a :class:`~.scanner.TextScanner` searches for stop strings
  (the request's, and the format's own, such as the ``plain`` family's ``"\nuser:"``) and for the markers that are
  not single tokens, holding back text that could still start one;
* text goes to the channel of the current state: content, reasoning, or the tool call being read
  (:mod:`.jsonscan`). A marker that arrives while the call's JSON is inside a string is part of that string: the
  reader knows, so ``{"s": "</tool_call> inside"}`` is read whole.

A reply that exists only as text (``feed_text``) has no ids to go by, so every marker counts as written, and the
text that ends a turn (``<|im_end|>``, ``</s>``) is passed in as ``end_texts``.

Every delta is also kept for the final :class:`~.reply.Reply`, so the concatenated deltas always equal it, and
however the ids are chunked, the result is the same. Nothing is removed from the text after the fact.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from turnkit.errors import ReplyParseError
from turnkit.parse.calls import WrittenCall, checked_call, llama_calls, mistral_calls
from turnkit.parse.detokenize import TextDecoder
from turnkit.parse.formats import ReplyFormat
from turnkit.parse.jsonscan import ObjectReader
from turnkit.parse.reply import CallStatus, Delta, EndReason, ParsedToolCall, Reply, ToolCallDelta
from turnkit.parse.scanner import MARKER, STOP, TEXT, TextScanner
from turnkit.tokenizer.bytetable import ByteTable

__all__ = ["StreamParser"]

_WS = " \t\r\n"


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


class _Call:
    """A tool call being read from ``<tool_call>`` ... ``</tool_call>``."""

    def __init__(self, index: int, call_id: str, keys: tuple[str, ...]) -> None:
        self.index = index
        self.id = call_id
        self.keys = keys
        self.reader = ObjectReader(keys)
        self.name: str | None = None
        self.sent_arguments: list[str] = []
        self.pending: list[str] = []
        self.written: list[str] = []  # the call's own text, kept for a call that fails to parse

    def feed(self, text: str) -> list[ToolCallDelta]:
        self.written.append(text)
        fragment = self.reader.feed(text)
        out: list[ToolCallDelta] = []
        if self.name is None and "name" in self.reader.values:
            try:
                name = self.reader.value("name")
            except ValueError:
                name = None
            if isinstance(name, str):
                self.name = name
                out.append(ToolCallDelta(self.index, self.id, name))
        if fragment:
            self.pending.append(fragment)
        if self.name is not None and self.pending:
            arguments = "".join(self.pending)
            self.pending = []
            self.sent_arguments.append(arguments)
            out.append(ToolCallDelta(self.index, arguments=arguments))
        return out


class StreamParser:
    """Parses one reply incrementally. Build it with ``ChatFormat.stream_parser`` (or ``parse`` for a whole reply).

    ``feed(token_ids)`` returns the deltas the new ids complete; ``feed_text(text)`` does the same for replies that
    exist only as text (markers are then matched as text). ``finish()`` returns the :class:`~.reply.Reply`.

    ``stops`` are the request's stop strings (end reason ``stop_string``); ``end_texts`` is text that ends the reply
    in the format's own terms, with its reason: a family's stop strings, always, and for text replies the markers
    that end a turn. ``strict=True`` makes ``finish()`` raise :class:`~turnkit.errors.ReplyParseError` for a reply
    that did not end cleanly (see :attr:`~.reply.Reply.ended_cleanly`); lenient parsing, the default, returns it
    with its failed calls and end reason.
    """

    def __init__(
        self,
        reply_format: ReplyFormat,
        *,
        added_tokens: Mapping[str, int] | None = None,
        stop_ids: Mapping[int, tuple[EndReason, str]] | None = None,
        stops: Sequence[str] = (),
        end_texts: Mapping[str, EndReason] | None = None,
        tools: Iterable[str] | None = None,
        byte_table: ByteTable | None = None,
        backend: Any = None,
        in_reasoning: bool = False,
        call_id: Callable[[int], str] | None = None,
        strict: bool = False,
    ) -> None:
        self.format = reply_format
        self.strict = strict
        added = added_tokens or {}
        self._marker_ids = {added[m]: m for m in reply_format.markers if m in added}
        text_markers = [m for m in reply_format.markers if m not in added]
        self._stop_ids = dict(stop_ids or {})
        self._end_texts = {**(end_texts or {}), **dict.fromkeys(stops, EndReason.STOP_STRING)}
        self._scanner = TextScanner(list(self._end_texts), text_markers)
        self._decoder = TextDecoder(byte_table, backend) if (byte_table is not None or backend is not None) else None
        self._tools = frozenset(tools) if tools is not None else None
        prefix = secrets.token_hex(6)
        self._call_id = call_id or (lambda index: f"call_{prefix}{index}")
        self._content = _Channel()
        self._reasoning = _Channel()
        self._state = "reasoning" if in_reasoning and reply_format.reasoning else "content"
        self._calls: list[ParsedToolCall] = []
        self._call: _Call | None = None
        self._buffer: list[str] = []  # llama3 / mistral tool-call text, parsed at the end
        self._probe = ""  # llama3: the start of the reply, until it is known whether it is a JSON call
        self._end: EndReason | None = None
        self._stop: str | None = None
        self._out: list[Delta] = []

    @property
    def ended(self) -> bool:
        """True once the reply has ended (a stop id or stop string); later input is ignored."""
        return self._end is not None

    # -- input ---------------------------------------------------------------------------------------------------

    def feed(self, token_ids: Iterable[int]) -> list[Delta]:
        """Feed generated token ids; returns the deltas they complete (possibly none)."""
        if self._decoder is None:
            raise TypeError("this parser has no tokenizer; feed it text with feed_text")
        out = self._out = []
        decoder, markers, stops, scanner = self._decoder, self._marker_ids, self._stop_ids, self._scanner
        for token_id in token_ids:
            if self._end is not None:
                break
            stop = stops.get(token_id)
            if stop is not None:
                self._text_events(scanner.feed(decoder.flush()))
                self._text_events(scanner.flush())
                if self._end is None:
                    self._end, self._stop = stop
                break
            marker = markers.get(token_id)
            if marker is not None:
                self._text_events(scanner.feed(decoder.flush()))
                self._text_events(scanner.flush())
                if self._end is None:
                    self._marker(marker)
                continue
            text = decoder.feed(token_id)
            if text:
                self._text_events(scanner.feed(text))
        return out

    def feed_text(self, text: str) -> list[Delta]:
        """Feed generated text (for replies that only exist as text: every marker is matched as text)."""
        if self._decoder is not None:  # its single-token markers are ids: they would not be seen in text
            raise TypeError("this parser reads token ids; parse text with a parser built without a tokenizer")
        out = self._out = []
        if self._end is None:
            self._text_events(self._scanner.feed(text))
        return out

    def finish(self, *, length: bool = False) -> Reply:
        """End the stream (``length=True`` when the token budget ran out) and return the reply.

        Any text held back is released first (but an incomplete character that a reply cut by ``length`` ends in is
        dropped, never shown as U+FFFD); the deltas returned by that last step are in ``final_deltas``.

        Raises:
            ReplyParseError: The parser is strict and the reply did not end cleanly.
        """
        out = self._out = []
        if self._end is None and self._decoder is not None:
            self._text_events(self._scanner.feed(self._decoder.flush(cut=length)))
        if self._end is None:
            self._text_events(self._scanner.flush())
        if self._end is None:
            self._end = EndReason.LENGTH if length else EndReason.NONE
        self._close()
        self.final_deltas = out
        reasoning = self._reasoning.text() or None  # "<think></think>" is no reasoning
        reply = Reply(self._content.text(), reasoning, self._calls, self._end, self._stop)
        if self.strict and not reply.ended_cleanly:
            _raise_unclean(reply)
        return reply

    # -- routing --------------------------------------------------------------------------------------------------

    def _emit(self, delta: Delta) -> None:
        self._out.append(delta)

    def _text_events(self, events: list[tuple[str, str]]) -> None:
        for kind, value in events:
            if kind == TEXT:
                self._text(value)
            elif kind == MARKER:
                self._marker(value)
            elif kind == STOP:
                self._end, self._stop = self._end_texts[value], value

    def _text(self, text: str) -> None:
        state = self._state
        if state == "content":
            if self.format.tool_syntax == "llama_json" and not self._content.started and not self._calls:
                self._probe_llama(text)
                return
            if (shown := self._content.add(text)) != "":
                self._emit(Delta(content=shown))
        elif state == "reasoning":
            if (shown := self._reasoning.add(text)) != "":
                self._emit(Delta(reasoning_content=shown))
        elif state == "tool":
            assert self._call is not None
            deltas = self._call.feed(text)
            if deltas:
                self._emit(Delta(tool_calls=deltas))
        else:  # llama3 / mistral calls: parsed when complete
            self._buffer.append(text)

    def _probe_llama(self, text: str) -> None:
        self._probe += text
        stripped = self._probe.lstrip(_WS)
        if not stripped:
            return
        if stripped[0] == "{":
            self._state = "buffer"
            self._buffer.append(stripped)
        else:
            probe, self._probe = self._probe, ""
            if (shown := self._content.add(probe)) != "":
                self._emit(Delta(content=shown))
        self._probe = ""

    def _marker(self, marker: str) -> None:
        fmt, state = self.format, self._state
        if state == "tool" and self._call is not None and self._call.reader.in_string:
            self._text(marker)  # inside a JSON string, a marker is the string's text
        elif fmt.reasoning and marker == fmt.reasoning[0] and state == "content":
            self._state = "reasoning"
            self._reasoning.drop_leading = True
        elif fmt.reasoning and marker == fmt.reasoning[1] and state == "reasoning":
            self._reasoning.held = ""
            self._state = "content"
            self._content.drop_leading = not self._content.started
        elif marker == fmt.tool_start and state in ("content", "tool", "buffer"):
            self._close_call(cut=False)
            self._content.held = ""
            if fmt.tool_syntax == "tagged_json":
                index = len(self._calls)
                self._call = _Call(index, self._call_id(index), fmt.arguments_keys)
                self._state = "tool"
            else:
                self._state = "buffer"
                self._buffer.append(marker)
        elif marker == fmt.tool_end and state == "tool":
            self._close_call(cut=False)
            self._state = "content"
        elif marker == "[ARGS]" and state == "buffer":
            self._buffer.append(marker)
        else:
            self._text(marker)  # a marker out of place is text

    # -- finishing tool calls -------------------------------------------------------------------------------------

    def _close_call(self, *, cut: bool) -> None:
        """Finish the call being read: ``cut`` when the reply ended inside it, else the model closed it (with its end
        marker, or by starting the next call)."""
        call = self._call
        if call is None:
            return
        self._call = None
        reader = call.reader
        name = call.name
        sent = "".join(call.sent_arguments)
        value = next((reader.values[k] for k in call.keys if k in reader.values), None)
        written = "".join(call.written)
        if reader.failed:
            result = WrittenCall(name or "", sent, CallStatus.INVALID_JSON, reader.failed, written)
        elif not reader.done and cut:
            error = "the reply ended before the tool call's JSON was complete"
            result = WrittenCall(name or "", sent, CallStatus.UNTERMINATED, error, written)
        elif not reader.done:
            error = "the tool call's JSON is not complete where the call ends"
            result = WrittenCall(name or "", sent, CallStatus.INVALID_JSON, error, written)
        elif name is None:
            result = WrittenCall("", sent, CallStatus.INVALID_JSON, "the tool call has no string 'name'", written)
        else:  # an object or array was streamed as it came; a string or scalar is only known now
            result = checked_call(name, value or "{}", written)
        arguments = result.arguments
        late: list[ToolCallDelta] = []
        if call.name is None:
            late.append(ToolCallDelta(call.index, call.id, name or ""))
        if arguments != sent and arguments.startswith(sent):
            late.append(ToolCallDelta(call.index, arguments=arguments[len(sent) :]))
        elif arguments != sent:  # what was streamed stands: the deltas always add up to the reply
            arguments = sent
        if late:
            self._emit(Delta(tool_calls=late))
        self._add_call(result._replace(arguments=arguments), call.id)

    def _add_call(self, written: WrittenCall, call_id: str | None = None) -> ParsedToolCall:
        """Keep a finished call (checking its name against the tools offered) under the id it was streamed with."""
        name, arguments, status, error, raw = written
        if status == CallStatus.OK and self._tools is not None and name not in self._tools:
            status, error = CallStatus.UNKNOWN_TOOL, f"the model called {name!r}, which is not among the tools"
        call = ParsedToolCall(call_id or self._call_id(len(self._calls)), name, arguments, status, error, raw)
        self._calls.append(call)
        return call

    def _close(self) -> None:
        if self._state == "tool":
            self._close_call(cut=True)
        elif self._state == "buffer":
            self._close_buffer()
        elif self._probe:
            probe, self._probe = self._probe, ""
            if (shown := self._content.add(probe)) != "":
                self._emit(Delta(content=shown))
        if not self._calls and (held := self._content.release_held()):
            self._emit(Delta(content=held))

    def _close_buffer(self) -> None:
        text = "".join(self._buffer)
        self._buffer = []
        calls: list[WrittenCall] | None
        if self.format.tool_syntax == "mistral":
            calls = mistral_calls(text, self.format.tool_start or "[TOOL_CALLS]")
        else:
            calls = llama_calls(text, self.format.arguments_keys)
        if calls is None:  # not a tool call after all: it is content
            if (shown := self._content.add(text)) != "":
                self._emit(Delta(content=shown))
            return
        deltas = []
        for written in calls:
            call = self._add_call(written)
            deltas.append(ToolCallDelta(len(self._calls) - 1, call.id, call.name, call.arguments))
        if deltas:
            self._emit(Delta(tool_calls=deltas))


_CUT = {EndReason.LENGTH: "the token budget ran out", EndReason.NONE: "it has no end-of-turn marker, EOS or stop"}


def _raise_unclean(reply: Reply) -> None:
    """Strict parsing: say why ``reply`` did not end cleanly, the end first (a cut-off reply explains its calls)."""
    if reply.end in _CUT:
        open_call = next((i for i, c in enumerate(reply.tool_calls) if c.status == CallStatus.UNTERMINATED), None)
        inside = f", inside tool call {open_call}" if open_call is not None else ""
        raise ReplyParseError(f"the reply did not end: {_CUT[reply.end]}{inside}", reply=reply)
    for index, call in enumerate(reply.tool_calls):
        if call.status != CallStatus.OK:
            what = f"{call.name!r} " if call.name else ""
            raise ReplyParseError(f"{what}did not parse ({call.status}): {call.error}", reply=reply, call_index=index)
