"""Where the reading of one reply stands, and what it has said so far: the state the machine's collaborators share.

The machine (:mod:`.machine`) is a :class:`ReadingState` with a driver on top; the needles (:mod:`.needles`), the walk
over a call (:mod:`.walk`) and the argument readers (:mod:`.arguments`, :mod:`.params`) are handed this state rather
than the machine, so none of them imports the driver and each sees only the fields it names.

What the reply says goes out through the few methods here: text to content or reasoning (whitespace next to markers
held until it is known whether it is dropped), a call announced once (its id and name, with the argument text that
came before the name), argument text after that, and the finished call checked and kept. Deltas only ever extend
what was sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from turnkit.parse.encodings.jsonscan import WS
from turnkit.parse.reading.callstate import CallState
from turnkit.parse.reading.compiled import SymFormat, SymSyntax
from turnkit.parse.reading.lexer import Lexer
from turnkit.parse.reading.modes import BetweenCalls, InCall, InContent, Mode
from turnkit.parse.reply import CallStatus, Delta, EndReason, ParsedToolCall, ToolCallDelta

__all__ = ["ReadingState", "TextChannel"]


class TextChannel:
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
            text = text.lstrip(WS)
            if not text:
                return ""
        combined = self.held + text if self.held else text
        body = combined.rstrip(WS)
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


class ReadingState:
    """The reading's shared state: the mode it is in (:mod:`.modes`, with the call and block open), the lexer, the
    compiled format; and the reply so far (content, reasoning, calls, problems, this step's deltas). The mode is
    assigned by the machine alone, from what the code that read its text returns."""

    def __init__(self, compiled: SymFormat, symbols: Mapping[str, str], stops: Mapping[str, EndReason],
                 tools: Mapping[str, Any] | None, call_id: Callable[[int], str]) -> None:  # fmt: skip
        self.compiled = compiled
        self.unsymbols = {ord(symbol): marker for marker, symbol in symbols.items()}
        self.stops = dict(stops)
        self.tools = tools
        self.call_id = call_id
        #: The template writes a call's id after its name: a call object is announced once complete (its id known).
        self.ids_after_name = False
        self.lexer = Lexer()
        self.mode: Mode = InContent()
        self.calls_allowed = True  # False in a headed message routed to content or reasoning
        self.content = TextChannel()
        self.reasoning = TextChannel()
        self.calls: list[ParsedToolCall] = []
        #: What the reply holds that does not read as its format says, and what was done with it.
        self.problems: list[str] = []
        self.out: list[Delta] = []

    @property
    def call(self) -> CallState | None:
        """The call being read, in :class:`~.modes.InCall`."""
        mode = self.mode
        return mode.call if isinstance(mode, InCall) else None

    @property
    def block(self) -> SymSyntax | None:
        """The block of calls open: the one the call being read is in, or the one between whose calls it is."""
        mode = self.mode
        return mode.block if isinstance(mode, InCall | BetweenCalls) else None

    def plain(self, text: str) -> str:
        """Symbols back to the marker text they stand for."""
        return text.translate(self.unsymbols) if self.unsymbols else text

    def emit(self, delta: Delta) -> None:
        self.out.append(delta)

    def show(self, text: str) -> None:
        """Text that is content."""
        if (shown := self.content.add(self.plain(text))) != "":
            self.out.append(Delta(content=shown))

    def announce(self, call: CallState, name: str) -> None:
        """The call's first delta (id and name, and what argument text came before the name), once it is a call."""
        call.name = name
        if call.announced or not call.confirmed:
            return
        call.announced = True
        pending = "".join(call.pending)
        call.pending = []
        if pending:
            call.sent.append(pending)
        self.out.append(Delta(tool_calls=[ToolCallDelta(call.index, call.written_id or call.id, name, pending)]))

    def send(self, call: CallState, text: str) -> None:
        """Argument text: streamed once the call is announced, held until then."""
        if not text:
            return
        if not call.announced:
            call.pending.append(text)
            return
        call.sent.append(text)
        self.out.append(Delta(tool_calls=[ToolCallDelta(call.index, arguments=text)]))

    def finish_call(self, call: CallState, *, cut: bool) -> None:
        """The call is over (``cut``: by the reply's end): checked (name, JSON, known tool) and kept."""
        if not call.confirmed:
            return
        if not call.announced:
            self.announce(call, call.name or "")
        if call.pending:
            pending = "".join(call.pending)
            call.pending = []
            self.send(call, pending)
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
        if status is None and self.tools is not None and call.name not in self.tools:
            status, error = CallStatus.UNKNOWN_TOOL, f"the model called {call.name!r}, which is not among the tools"
        raw = "".join(call.raw)
        self.calls.append(
            ParsedToolCall(call.written_id or call.id, call.name or "", sent, status or CallStatus.OK, error, raw)
        )
