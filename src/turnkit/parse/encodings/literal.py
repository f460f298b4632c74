"""JSON arguments (or a JSON call object) written as a Python literal where JSON would be (``{'city': 'São Paulo',
'metric': True}``: what a template that writes ``{{ arguments }}`` without ``tojson`` prints, and so what its model
learns to write). Read whole by its brackets, JSON's own syntax accepted too, and sent as JSON once complete: the
literal's text is not the JSON a client receives."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from turnkit.errors import ValueSyntaxError
from turnkit.parse.encodings.calls import NAME_CHARS, arguments_text
from turnkit.parse.encodings.jsonscan import BracketReader
from turnkit.parse.encodings.literals import python_literal
from turnkit.parse.reply import CallStatus

if TYPE_CHECKING:
    from turnkit.parse.encodings import ArgumentScan
    from turnkit.parse.formats import Arguments
    from turnkit.parse.reading.callstate import CallState
    from turnkit.parse.reading.state import ReadingState


def scanner(spec: Arguments) -> BracketReader:
    return BracketReader(quotes=('"', "'"), escapes=True, until_close=False)


def done(state: ReadingState, call: CallState, spec: Arguments, scan: ArgumentScan, *, holds_name: bool) -> bool:
    """The literal is complete: read whole (``holds_name``: the object also holds the call's name). False where the
    text was no call after all (it is content)."""
    error: str | None = None
    value: Any = None
    try:
        written = python_literal(state.plain(scan.text))
    except ValueSyntaxError as exc:
        error, written = str(exc), None
    if holds_name and error is None:
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
        return False
    call.confirmed = True
    state.announce(call, call.name or "")
    if error is not None:
        call.status, call.error = CallStatus.INVALID_JSON, error
    else:  # a string that holds a serialized object is that object, as for JSON arguments
        state.send(call, arguments_text(json.dumps(value, ensure_ascii=False))[0])
    return True
