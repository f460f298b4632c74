"""Every HTTP request while it is being answered: a client that leaves is noticed at once, and the server knows what
is in flight.

:class:`InFlight` is a plain ASGI middleware around the whole app, so every route gets it without writing anything:
the OpenAI routes, the playground's, and any wire API added later. For each request it

* **watches the connection**: it alone reads the client's side of the ASGI channel (the body goes on to the route
  unchanged) and sees ``http.disconnect`` the moment the client closes. A client that leaves before the last byte of
  its answer has its request's task cancelled, whether the answer is streamed or whole, still waiting in the engine's
  queue, being prefilled, or being rendered. Cancelling unwinds the route: the session's generations are cancelled on
  the way out (:class:`~turnkit.serve.session.Session` logs one ``aborted`` line with the request id, the API and the
  tokens generated) and the engine frees the slot at its next step. Without this a whole (non-streamed) reply kept
  its slot until ``max_tokens``: nothing read the connection while the reply was collected;
* **counts requests in flight**, so a shutdown can wait for them (:meth:`InFlight.wait_idle`);
* hands the request's :class:`~turnkit.serve.session.Ledger` (the sessions it started) and its status to ``on_done``
  when it is over: the metrics' one source of per-request figures (:mod:`.metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from turnkit.serve.session import Ledger, recording

__all__ = ["InFlight"]

log = logging.getLogger("turnkit.serve")

#: The status recorded for a request whose client left before its answer ended (nginx's "client closed request").
CLIENT_LEFT = 499

Done = Callable[[dict[str, Any], int, Ledger], None]


class InFlight:
    """The ASGI middleware of :mod:`this module <.inflight>`. ``on_done(scope, status, ledger)`` is called once per
    HTTP request when it is over (``status`` 499 when the client left first)."""

    def __init__(self, app: Any, *, on_done: Done | None = None) -> None:
        self.app = app
        self.on_done = on_done
        self.count = 0
        self._idle: asyncio.Event | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self._enter()
        status = 500
        finished = False  # the answer's last byte has gone out: a disconnect after it is the normal end
        to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def watched_send(message: dict[str, Any]) -> None:
            nonlocal status, finished
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        async def listen() -> None:
            """Forward the client's messages to the route until the client is gone."""
            while True:
                message = await receive()
                to_app.put_nowait(message)
                if message["type"] == "http.disconnect":
                    return

        with recording() as ledger:  # the route's task copies this context, with the ledger in it
            answer = asyncio.ensure_future(self.app(scope, to_app.get, watched_send))
        listener = asyncio.ensure_future(listen())
        try:
            await asyncio.wait({answer, listener}, return_when=asyncio.FIRST_COMPLETED)
            if not answer.done() and not finished:
                status = CLIENT_LEFT
                log.debug("the client of %s %s left; stopping its answer", scope["method"], scope["path"])
                answer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await answer
        finally:
            for task in (answer, listener):
                task.cancel()
            self._leave()
            if self.on_done is not None:
                self.on_done(scope, status, ledger)

    # -- what is in flight ----------------------------------------------------------------------------------------

    def _enter(self) -> None:
        self.count += 1
        if self._idle is not None:
            self._idle.clear()

    def _leave(self) -> None:
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no request is in flight (at once when none is)."""
        if self._idle is None:
            self._idle = asyncio.Event()
        if self.count == 0:
            return
        self._idle.clear()
        await self._idle.wait()
