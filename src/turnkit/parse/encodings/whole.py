"""What the encodings whose text is not a prefix of their JSON share: the value is read whole, then sent as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from turnkit.errors import UnreadableArguments, ValueSyntaxError
from turnkit.parse.reply import CallStatus

if TYPE_CHECKING:
    from turnkit.parse.reading.callstate import CallState
    from turnkit.parse.reading.state import ReadingState


def send_whole(state: ReadingState, call: CallState, value_of: Callable[[], dict[str, Any]]) -> bool:
    """Read the value (``value_of``) and send it as JSON. Text that does not read is content where the call was not
    yet one (False), else the call fails with the reason (and one the reader could tell was a call,
    :class:`~turnkit.errors.UnreadableArguments`, fails rather than falling back)."""
    value: dict[str, Any] | None
    try:
        value = value_of()
    except ValueSyntaxError as exc:
        if not call.confirmed and not isinstance(exc, UnreadableArguments):
            return False
        call.status, call.error = CallStatus.INVALID_JSON, str(exc)
        value = None
    if not call.confirmed:
        call.confirmed = True
        state.announce(call, call.name or "")
    if value is not None:
        state.send(call, json.dumps(value, ensure_ascii=False))
    return True
