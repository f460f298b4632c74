"""Python call syntax: ``key=value`` pairs inside a call's parentheses (``f(a=1, b="x")``, JSON's ``true``/``null``
accepted too), read whole once the parentheses close (their text is not a prefix of the JSON sent)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turnkit.errors import ValueSyntaxError
from turnkit.parse.encodings.jsonscan import BracketReader
from turnkit.parse.encodings.literals import python_arguments
from turnkit.parse.encodings.values import unquoted_arguments
from turnkit.parse.encodings.whole import send_whole

if TYPE_CHECKING:
    from turnkit.parse.encodings import ArgumentScan
    from turnkit.parse.formats import Arguments
    from turnkit.parse.reading.callstate import CallState
    from turnkit.parse.reading.state import ReadingState


def scanner(spec: Arguments) -> BracketReader:
    return BracketReader(quotes=('"""', "'''", '"', "'"), escapes=True, until_close=True)


def _value(state: ReadingState, call: CallState, spec: Arguments, text: str) -> dict[str, Any]:
    """Python literals, else, for a tool the request offers, values a template wrote without quotes read by the
    tool's schema (:func:`~turnkit.parse.encodings.values.unquoted_arguments`; where the text allows no one reading,
    the call fails with the reason, :class:`~turnkit.errors.UnreadableArguments`, rather than being content). Read
    whole, so a stream and a whole reply read them alike."""
    try:
        return python_arguments(text)
    except ValueSyntaxError:
        tools, name = state.tools, call.name
        if not tools or name is None or name not in tools or "=" not in text:
            raise
        return unquoted_arguments(state.plain(text), tools[name], name)


def done(state: ReadingState, call: CallState, spec: Arguments, scan: ArgumentScan) -> bool:
    return send_whole(state, call, lambda: _value(state, call, spec, scan.text))
