"""JSON arguments: one JSON object, streamed as it is written (a string that holds a serialized object is that
object, :func:`~turnkit.parse.calls.arguments_text`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from turnkit.parse.calls import arguments_text
from turnkit.parse.jsonscan import ValueReader
from turnkit.parse.lexer import WS
from turnkit.parse.reply import CallStatus

if TYPE_CHECKING:
    from turnkit.parse.arguments import ArgumentReader
    from turnkit.parse.callstate import CallState
    from turnkit.parse.encodings import ArgumentScan
    from turnkit.parse.formats import Arguments


def scanner(spec: Arguments) -> ValueReader:
    return ValueReader()


def progress(reading: ArgumentReader, call: CallState, spec: Arguments, scan: ArgumentScan, plain: str) -> None:
    """An object streams as written (its leading whitespace dropped); a string is sent once read."""
    assert isinstance(scan, ValueReader)
    if not scan.is_string:
        reading.s.send(call, plain.lstrip(WS) if not call.sent and not call.pending else plain)


def done(reading: ArgumentReader, call: CallState, spec: Arguments, scan: ArgumentScan) -> bool:
    """The value is complete: a string's object sent, the JSON checked; a bare call is a call now."""
    assert isinstance(scan, ValueReader)
    if scan.is_string:
        final, error = arguments_text(reading.s.plain(scan.text.strip(WS)))
        if error is None:
            reading.s.send(call, final)
    try:
        json.loads(scan.text)
    except ValueError as exc:
        if not call.confirmed:
            reading.walk.fall_back("")
            return False
        call.status = CallStatus.INVALID_JSON
        call.error = f"the arguments are not valid JSON ({exc})"
    if not call.confirmed:
        call.confirmed = True
        reading.s.announce(call, call.name or "")
    return True
