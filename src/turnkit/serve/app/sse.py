"""Server-sent events: an answer's chunks or events on the wire as they are made, with keep-alives in the silences.

Keep-alives. A stream's status line goes out once the engine admitted the request, but its first token may come much
later: an oversubscribed server prefills the requests in arrival order, and a long prompt behind others waits its
turn; a tool call's arguments are held back until they parse. Clients with a read timeout (httpx's, the agents')
would give up on a request the server is about to answer. So whenever :data:`KEEP_ALIVE_SECONDS` pass without a byte,
the stream sends one: an SSE comment line (``: keep-alive``) on the OpenAI APIs, which the official clients skip, and
a ``ping`` event on Anthropic's Messages API, as Anthropic's own API sends them (its clients skip those too).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, suppress
from typing import Any, TypeVar

from turnkit.serve.protocol import APIError

__all__ = ["COMMENT", "KEEP_ALIVE_SECONDS", "event_stream", "paced", "typed_event_stream"]

log = logging.getLogger("turnkit.serve")

#: Seconds of silence after which a stream sends a keep-alive (an internal setting; tests shorten it).
KEEP_ALIVE_SECONDS = 15.0
#: The keep-alive of the OpenAI APIs: an SSE comment line.
COMMENT = ": keep-alive\n\n"

T = TypeVar("T")


async def paced(source: AsyncGenerator[T, None], interval: float) -> AsyncIterator[T | None]:
    """The items of ``source``, and ``None`` whenever ``interval`` seconds pass without one. The next item is awaited
    in a task of its own, so waiting for it can be interrupted without cancelling it; that task is cancelled and
    awaited before ``source`` is closed (a generator cannot be closed while it runs)."""
    pending: asyncio.Task[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(source.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with suppress(BaseException):
                await pending


async def event_stream(chunks: AsyncGenerator[dict[str, Any], None], *, include_usage: bool) -> AsyncIterator[str]:
    """The chunks as server-sent events, then ``[DONE]``; the usage chunk only when the client asked for it.

    The status line has gone out before the first chunk, so a failure while generating cannot become an HTTP error:
    it is sent as an OpenAI error object in the stream (as vLLM does), and the stream still ends with ``[DONE]``.
    """
    try:
        async with aclosing(chunks):
            async for chunk in paced(chunks, KEEP_ALIVE_SECONDS):
                if chunk is None:
                    yield COMMENT
                elif chunk["choices"] or include_usage:
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except Exception as exc:
        error = exc if isinstance(exc, APIError) else APIError(500, "the server failed while generating; see its log")
        if not isinstance(exc, APIError):
            log.exception("unexpected error while streaming")
        yield f"data: {json.dumps(error.body(), ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"


async def typed_event_stream(
    events: AsyncGenerator[dict[str, Any], None],
    *,
    on_error: Callable[[APIError], dict[str, Any]],
    keep_alive: dict[str, Any] | None = None,
) -> AsyncIterator[str]:
    """Events that name their own ``type`` (Anthropic's Messages, OpenAI's Responses) as server-sent events with an
    ``event:`` line each. A failure after the status line went out is sent as the error event ``on_error`` makes of
    it (its API's shape), and the stream ends there. ``keep_alive``: the event sent in a silence (Messages: ``ping``);
    None: an SSE comment."""
    try:
        async with aclosing(events):
            async for event in paced(events, KEEP_ALIVE_SECONDS):
                if event is None:
                    yield COMMENT if keep_alive is None else _typed(keep_alive)
                else:
                    yield _typed(event)
    except Exception as exc:
        error = exc if isinstance(exc, APIError) else APIError(500, "the server failed while generating; see its log")
        if not isinstance(exc, APIError):
            log.exception("unexpected error while streaming")
        yield _typed(on_error(error))


def _typed(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
