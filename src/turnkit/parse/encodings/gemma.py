"""Gemma 4's arguments: ``{key:<|"|>text<|"|>,n:1}``, strings between the arguments' own ``quote``, read whole once
the object closes (their text is not a prefix of the JSON sent)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turnkit.errors import ValueSyntaxError
from turnkit.parse.encodings.whole import send_whole
from turnkit.parse.jsonscan import BracketReader
from turnkit.parse.literals import gemma_value

if TYPE_CHECKING:
    from turnkit.parse.arguments import ArgumentReader
    from turnkit.parse.callstate import CallState
    from turnkit.parse.encodings import ArgumentScan
    from turnkit.parse.formats import Arguments


def scanner(spec: Arguments) -> BracketReader:
    return BracketReader(quotes=(spec.quote,), escapes=False, until_close=False)


def _value(reading: ArgumentReader, spec: Arguments, text: str) -> dict[str, Any]:
    value = gemma_value(text, reading.s.plain(spec.quote))
    if not isinstance(value, dict):
        raise ValueSyntaxError("the arguments are not an object")
    return value


def done(reading: ArgumentReader, call: CallState, spec: Arguments, scan: ArgumentScan) -> bool:
    return send_whole(reading, call, lambda: _value(reading, spec, scan.text))
