"""JSON arguments: one JSON object, streamed as it is written (a string that holds a serialized object is that
object, :func:`~turnkit.parse.encodings.calls.arguments_text`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from turnkit.parse.encodings.calls import arguments_text
from turnkit.parse.encodings.jsonscan import WS, ValueReader
from turnkit.parse.reply import CallStatus

if TYPE_CHECKING:
    from turnkit.parse.encodings import ArgumentScan
    from turnkit.parse.formats import Arguments
    from turnkit.parse.reading.callstate import CallState
    from turnkit.parse.reading.state import ReadingState


def scanner(spec: Arguments) -> ValueReader:
    return ValueReader()


def progress(state: ReadingState, call: CallState, spec: Arguments, scan: ArgumentScan, plain: str) -> None:
    """An object streams as written (its leading whitespace dropped); a string is sent once read."""
    assert isinstance(scan, ValueReader)
    if not scan.is_string:
        state.send(call, plain.lstrip(WS) if not call.sent and not call.pending else plain)


def done(state: ReadingState, call: CallState, spec: Arguments, scan: ArgumentScan) -> bool:
    """The value is complete: a string's object sent, the JSON checked; a bare call is a call now."""
    assert isinstance(scan, ValueReader)
    if scan.is_string:
        final, error = arguments_text(state.plain(scan.text.strip(WS)))
        if error is None:
            state.send(call, final)
    try:
        json.loads(scan.text)
    except ValueError as exc:
        if not call.confirmed:
            return False
        call.status = CallStatus.INVALID_JSON
        call.error = f"the arguments are not valid JSON ({exc})"
    if not call.confirmed:
        call.confirmed = True
        state.announce(call, call.name or "")
    return True
