"""A call written as one JSON object that holds the name and the arguments (Hermes' ``{"name": ..., "arguments":
{...}}``, or ``{"NAME": {...}}`` with ``name_as_key``): the call is announced once its name is read, and the
arguments' own text streams as the scanner reads it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from turnkit.parse.encodings.calls import arguments_text
from turnkit.parse.encodings.jsonscan import ObjectReader
from turnkit.parse.reply import CallStatus

if TYPE_CHECKING:
    from turnkit.parse.encodings import ArgumentScan
    from turnkit.parse.formats import Arguments
    from turnkit.parse.reading.callstate import CallState
    from turnkit.parse.reading.state import ReadingState

#: A call whose end came before its object was complete.
INCOMPLETE = "the tool call's JSON is not complete where the call ends"

#: Keys under which a call written as one JSON object holds its id.
_ID_KEYS = ("id", "tool_call_id", "call_id")


def scanner(spec: Arguments) -> ObjectReader:
    return ObjectReader((*spec.keys, spec.name_key), stream_first=spec.name_as_key)


def _id_may_follow(state: ReadingState, spec: Arguments) -> bool:
    """The template writes a call's id after its name (Mistral Nemo's ``{"name": ..., "arguments": ..., "id":
    ...}``): the call is announced once its object is complete, so that the stream sends the id the model wrote."""
    return state.ids_after_name and not spec.name_as_key


def _written_id(scan: ObjectReader, name_key: str | None) -> str | None:
    """An id the model wrote in a call's object before its name (Cohere's ``"tool_call_id": "0"``), or anywhere in it
    with ``name_key`` None (a call announced once complete): the call's id. Else one written after the name comes
    too late for the stream, which sent the id with the name, so it never counts (however much of the object the
    scanner already holds)."""
    before: dict[str, str] = {}
    for key, value in scan.values.items():
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


def progress(state: ReadingState, call: CallState, spec: Arguments, scan: ArgumentScan, plain: str) -> None:
    """The arguments' new text (what the scanner streamed), and the name once it is read."""
    assert isinstance(scan, ObjectReader)
    fragment = scan.streamed
    scan.streamed = ""
    if call.name is not None:  # the common case: the arguments' text, streamed
        if fragment:
            state.send(call, state.plain(fragment))
        return
    name: Any = None
    if spec.name_as_key:
        if scan.values or scan.streaming:
            name = scan.first_key
    elif spec.name_key in scan.values:
        try:
            name = scan.value(spec.name_key)
        except ValueError:
            name = None
    if isinstance(name, str) and name:
        name = state.plain(name)
        call.written_id = None if spec.name_as_key else _written_id(scan, spec.name_key)
        call.confirmed = True
        call.name = name
        call.pending.append(state.plain(fragment))
        fragment = ""
        if not _id_may_follow(state, spec):
            state.announce(call, name)
    if fragment:
        state.send(call, state.plain(fragment))


def done(state: ReadingState, call: CallState, spec: Arguments, scan: ArgumentScan) -> bool:
    """The object is complete: the arguments' final text (a string that holds an object is that object), or the
    call fails for want of a name; an object without one that was not yet a call is content."""
    assert isinstance(scan, ObjectReader)
    if call.name is None:
        if not call.confirmed:
            return False
        call.status = CallStatus.INVALID_JSON
        call.error = f"the tool call has no string {spec.name_key!r}"
        return True
    if spec.name_as_key:
        value = scan.values.get(call.name)
    else:
        value = next((scan.values[k] for k in spec.keys if k in scan.values), None)
    if not call.announced and _id_may_follow(state, spec):  # announced at its end, with the id it holds anywhere
        call.written_id = _written_id(scan, None)
    sent = "".join(call.sent) + "".join(call.pending)
    final, error = arguments_text(value) if value is not None else ("{}", None)
    if error:
        call.status, call.error = CallStatus.INVALID_JSON, error
    if final != sent and final.startswith(sent):
        state.send(call, final[len(sent) :])
    return True


def name_at_end(call: CallState, spec: Arguments, scan: ArgumentScan) -> None:
    """The reply ended inside the object: a name it holds is the call's."""
    if isinstance(scan, ObjectReader) and call.name is None and spec.name_key in scan.values:
        try:
            name = scan.value(spec.name_key)
        except ValueError:
            name = None
        if isinstance(name, str):
            call.name = name
