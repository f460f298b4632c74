"""Gemma 4's arguments: ``{key:<|"|>text<|"|>,n:1}``, strings between the arguments' own ``quote``, read whole once
the object closes (their text is not a prefix of the JSON sent)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turnkit.errors import ValueSyntaxError
from turnkit.parse.encodings.jsonscan import BracketReader
from turnkit.parse.encodings.literals import gemma_value
from turnkit.parse.encodings.whole import send_whole

if TYPE_CHECKING:
    from turnkit.parse.encodings import ArgumentScan
    from turnkit.parse.formats import Arguments
    from turnkit.parse.reading.callstate import CallState
    from turnkit.parse.reading.state import ReadingState


def scanner(spec: Arguments) -> BracketReader:
    return BracketReader(quotes=(spec.quote,), escapes=False, until_close=False)


def _value(state: ReadingState, spec: Arguments, text: str) -> dict[str, Any]:
    value = gemma_value(text, state.plain(spec.quote))
    if not isinstance(value, dict):
        raise ValueSyntaxError("the arguments are not an object")
    return value


def done(state: ReadingState, call: CallState, spec: Arguments, scan: ArgumentScan) -> bool:
    return send_whole(state, call, lambda: _value(state, spec, scan.text))
