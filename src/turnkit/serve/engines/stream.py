"""The token stream of one request (:class:`Generation`): filled by an engine's thread, read with ``async for`` on
the server's event loop; tokens of several streams handed over with one wake-up (:func:`put_all`), and the loop a
server runs on (:func:`serving_on`), for an engine whose client binds to one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from turnkit.serve.engines.request import TokenEvent

__all__ = ["Generation", "put_all", "serving_loop", "serving_on"]


class Generation:
    """The token stream of one request. Iterate it with ``async for``; ``cancel()`` stops it and frees its slot.

    Its life: waiting in the engine's queue, then admitted (:meth:`started` returns), then tokens, then closed (the
    iteration ends, or raises the engine's error). A request refused while it waited (its deadline, a shutdown) is
    closed with that error before it was admitted, so :meth:`started` raises it: the server answers with an error
    status before any byte of a reply.

    ``cached_tokens``: how many prompt tokens the engine reused from its cache instead of computing them (set before
    the first token; the server reports it as ``usage.prompt_tokens_details.cached_tokens``).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[TokenEvent | BaseException | None] = asyncio.Queue()
        self._admitted: asyncio.Future[None] = loop.create_future()
        self.cancelled = threading.Event()
        #: With ``prompt_logprobs``: one event per prompt token (the first without a log-probability), set by the
        #: backend before its first token is put, so it is there when the first token arrives.
        self.prompt: tuple[TokenEvent, ...] | None = None
        self.cached_tokens = 0
        #: Called once, in the engine's thread, when the engine closes the stream (the :class:`Inbox`'s accounting).
        self.on_close: Callable[[], None] | None = None

    # called from the backend's thread
    def admit(self) -> None:
        """The engine took the request into a slot."""
        self._send(self._settle, None)

    def put(self, event: TokenEvent) -> None:
        """A token (which also says the request was admitted, for an engine that does not say so first)."""
        self._send(self._deliver, event)

    def close(self, error: BaseException | None = None) -> None:
        """The engine is done with the request: the stream ends (with ``error``, if one is given), after the
        request's place is freed, so a client that reads the end never sees its request still counted."""
        if self.on_close is not None:
            self.on_close()
        self._end(error)

    # called from anywhere
    def fail(self, error: BaseException) -> None:
        """End the stream now with ``error`` (a deadline, a shutdown); the engine drops the request at its next step."""
        self.cancelled.set()
        self._end(error)

    def cancel(self) -> None:
        self.cancelled.set()

    def _end(self, error: BaseException | None) -> None:
        self._send(self._settle, error)
        self._send(self._queue.put_nowait, error)

    def _send(self, call: Callable[[Any], None], item: Any) -> None:
        """``call(item)`` on the reader's event loop, from any thread; nothing when that loop is already closed
        (``turnkit generate`` has printed its reply and closed it, or the server stopped): nobody is left to tell."""
        try:
            self._loop.call_soon_threadsafe(call, item)
        except RuntimeError:
            if not self._loop.is_closed():
                raise

    def _deliver(self, event: TokenEvent) -> None:
        self._settle(None)
        self._queue.put_nowait(event)

    def _settle(self, error: BaseException | None) -> None:
        if not self._admitted.done():
            if error is None:
                self._admitted.set_result(None)
            else:
                self._admitted.set_exception(error)

    # the server's side
    async def started(self) -> None:
        """Wait until the engine admitted the request; raises the error it was refused with while it waited."""
        await asyncio.shield(self._admitted)

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def put_all(events: Sequence[tuple[Generation, TokenEvent]]) -> None:
    """Tokens of several generations (an engine step's), in order, with one wake-up of each reader's event loop
    instead of one a token: a thread-safe call writes to the loop's wake-up pipe and makes it run once more, which on a
    busy machine costs more than handing over the token itself."""
    batches: dict[asyncio.AbstractEventLoop, list[tuple[Generation, TokenEvent]]] = {}
    for item in events:
        batches.setdefault(item[0]._loop, []).append(item)
    for loop, batch in batches.items():
        try:
            loop.call_soon_threadsafe(_deliver_all, batch)
        except RuntimeError:
            if not loop.is_closed():
                raise


def _deliver_all(batch: list[tuple[Generation, TokenEvent]]) -> None:
    for generation, event in batch:
        generation._deliver(event)


#: The event loops servers run on in this process, latest last (:func:`serving_on`).
_serving: list[asyncio.AbstractEventLoop] = []


@contextlib.contextmanager
def serving_on(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Say that ``loop`` runs a server for as long as this block lasts (the app's lifespan): an engine whose client
    library binds to one event loop (vLLM's ``AsyncLLM``) can run on it and hand tokens to replies without waking a
    thread of its own; elsewhere (``turnkit generate`` runs and closes loops of its own) it keeps a loop of its own."""
    _serving.append(loop)
    try:
        yield
    finally:
        _serving.remove(loop)


def serving_loop() -> asyncio.AbstractEventLoop | None:
    """The loop the latest server started in this process runs on, while it runs; None where no server runs."""
    return next((loop for loop in reversed(_serving) if loop.is_running()), None)
