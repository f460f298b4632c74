"""Listening, running the server until it is told to stop, and stopping with a deadline.

:func:`bind` takes the port before anything else happens: ``turnkit serve`` binds it before it reads a model, so a port
in use or out of range is one line at once (not a uvicorn log line after a minute of loading, with exit status 3),
and the address it announces is the one it holds (``--port 0`` announces the port the system chose).

:func:`run` serves the app with uvicorn and owns SIGTERM and SIGINT. The first signal starts the drain
(:meth:`~.routes.Server.drain`):

1. admission stops: every new generating request is answered 503 with ``Retry-After`` (before any byte of a reply,
   in the request's own API shape, since the refusal comes from the engines), a model is no longer loaded, and
   ``/health`` answers 503 ``draining`` so that a load balancer stops sending;
2. running replies go on until they end, or until ``drain_seconds`` have passed;
3. at the deadline every request still queued or running ends with an error naming the shutdown: an error event then
   ``[DONE]`` in a stream, a 503 for a whole reply. No reply is cut without one;
4. uvicorn stops (idle connections closed; anything still running a few seconds later cancelled), the registry closes
   every engine, and the process exits 0.

A second signal skips the wait. uvicorn alone would wait for running replies without a deadline (SIGTERM with the
slots held never exited), and re-raise the signal at the end, so the exit code was -15 and the registry never closed.

The dependency points one way: this module runs a :class:`~.routes.Server` (its ``app()``, and ``drain()`` with the
grace passed in) and the routes import nothing of it, so :func:`bind` runs before the app's modules are imported.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import signal
import socket
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from turnkit.errors import ServeConfigError

if TYPE_CHECKING:
    from turnkit.serve.app.routes import Server

__all__ = ["bind", "run"]

log = logging.getLogger("turnkit.serve")

#: Seconds uvicorn gives connections to finish after the drain (the error events of step 3 going out).
GRACE_SECONDS = 3.0


def bind(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to ``host:port`` (not yet listening: a client is refused until :func:`run` starts), one per
    address ``host`` resolves to, as asyncio's ``create_server`` would bind them; ``port`` 0 takes a free one (the same
    on every address). :class:`~turnkit.errors.ServeConfigError` names the flag and the cause: a port out of range,
    one in use, one that needs privileges, a host that is not this machine's or does not resolve."""
    if not 0 <= port <= 65535:
        raise ServeConfigError(f"--port must be between 1 and 65535 (or 0: a free port), not {port}")
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServeConfigError(f"--host {host}: no such address or name ({exc.strerror})") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port at once
            if family == socket.AF_INET6:  # "::" would take IPv4 too, and the IPv4 address after it would collide
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ServeConfigError(_bind_failure(host, port, exc)) from None
    return sockets


def _bind_failure(host: str, port: int, exc: OSError) -> str:
    where = f"cannot listen on {host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"{where}: the port is in use (another server, or a turnkit serve still running); pick another --port"
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need privileges); pick another --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this machine (127.0.0.1: this machine only; 0.0.0.0: every one)"
    return f"{where}: {exc.strerror or exc}"


class _Uvicorn(uvicorn.Server):
    """uvicorn, with the signals starting the drain instead of an unbounded wait."""

    def __init__(self, config: uvicorn.Config, server: Server, drain_seconds: float) -> None:
        super().__init__(config)
        self.server = server
        self.drain_seconds = drain_seconds
        self._draining: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Called (in the main thread, where the event loop runs) by the signal handlers uvicorn installs."""
        if self._draining is not None:  # a second signal: stop now
            log.warning("%s again: stopping without waiting", signal.Signals(sig).name)
            self.should_exit = self.force_exit = True
            return
        loop = asyncio.get_running_loop()
        log.warning("%s: draining (at most %g s)", signal.Signals(sig).name, self.drain_seconds)
        self._draining = loop.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self.server.drain(self.drain_seconds, grace=GRACE_SECONDS)
        finally:
            self.should_exit = True


def run(
    server: Server,
    *,
    host: str,
    port: int,
    drain_seconds: float = 30.0,
    log_level: str = "warning",
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve ``server`` on ``host:port`` (or on ``sockets`` from :func:`bind`, which uvicorn then closes) until SIGTERM
    or SIGINT, then drain (see the module) and return.

    What was built at start (modules, the models' tokenizers and templates) is frozen out of the garbage collector's
    full passes first: a full pass over it stopped every thread, the event loop included, for about 100 ms at a time
    while a 10,000-message request was being built (``/health`` stalled); frozen, those passes take a few ms."""
    app: Any = server.app()
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=int(GRACE_SECONDS)
    )
    _Uvicorn(config, server, drain_seconds).run(sockets=sockets)
