"""Server-sent events: an answer's chunks or events on the wire as they are made."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from turnkit.serve.protocol import APIError

__all__ = ["event_stream", "typed_event_stream"]

log = logging.getLogger("turnkit.serve")


async def event_stream(chunks: AsyncGenerator[dict[str, Any], None], *, include_usage: bool) -> AsyncIterator[str]:
    """The chunks as server-sent events, then ``[DONE]``; the usage chunk only when the client asked for it.

    The status line has gone out before the first chunk, so a failure while generating cannot become an HTTP error:
    it is sent as an OpenAI error object in the stream (as vLLM does), and the stream still ends with ``[DONE]``.
    """
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                if chunk["choices"] or include_usage:
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except Exception as exc:
        error = exc if isinstance(exc, APIError) else APIError(500, "the server failed while generating; see its log")
        if not isinstance(exc, APIError):
            log.exception("unexpected error while streaming")
        yield f"data: {json.dumps(error.body(), ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"


async def typed_event_stream(
    events: AsyncGenerator[dict[str, Any], None], *, on_error: Callable[[APIError], dict[str, Any]]
) -> AsyncIterator[str]:
    """Events that name their own ``type`` (Anthropic's Messages, OpenAI's Responses) as server-sent events with an
    ``event:`` line each. A failure after the status line went out is sent as the error event ``on_error`` makes of
    it (its API's shape), and the stream ends there."""
    try:
        async with aclosing(events):
            async for event in events:
                yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
    except Exception as exc:
        error = exc if isinstance(exc, APIError) else APIError(500, "the server failed while generating; see its log")
        if not isinstance(exc, APIError):
            log.exception("unexpected error while streaming")
        body = on_error(error)
        yield f"event: {body['type']}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"
