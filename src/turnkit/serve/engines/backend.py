"""What the server needs from a model: the :class:`Backend` interface, small, so that engines can be swapped.

A backend takes a :class:`~.request.GenerationRequest` and returns a :class:`~.stream.Generation`: an async stream of
:class:`~.request.TokenEvent` objects that ends when the backend stops (a stop id, the token budget) or when the
server cancels it (a stop string matched, the client went away).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar, Protocol

from turnkit.errors import BackendBusyError
from turnkit.serve.engines.inbox import Load
from turnkit.serve.engines.request import GenerationRequest
from turnkit.serve.engines.stream import Generation
from turnkit.serve.request_fields import EngineKind

__all__ = ["Backend"]


class Backend(Protocol):
    """A model that generates token ids. An engine built on :class:`~.inbox.InboxFront` has ``submit``, ``load_now``,
    ``stop_admitting``, ``abort``, ``engine_info`` and ``describe`` from it; it says its ``kind`` and
    ``context_length`` and closes itself."""

    name: str
    #: Which engine it is: the request fields it honours are declared by that name in
    #: :mod:`turnkit.serve.request_fields`, and the server answers requests that set others with a 400 naming them.
    kind: ClassVar[EngineKind]
    #: The longest sequence (prompt and reply) one request may have.
    context_length: int

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        """Queue the request; raises :class:`BackendBusyError` when no slot or queue place is free. The generation's
        :meth:`~Generation.admit` (or its first token) says when the engine took it."""
        ...

    def load_now(self) -> Load:
        """What the engine is doing now (``/health``, ``/metrics``, unloading only when idle)."""
        ...

    def engine_info(self) -> dict[str, object] | None:
        """What the engine was given, as JSON, for ``/health`` (vLLM's release and engine options); None: nothing to
        show."""
        ...

    def describe(self) -> str | None:
        """One line on what the engine made of its options, for ``turnkit serve``'s start; None: nothing to say."""
        ...

    def stop_admitting(self, refusal: BackendBusyError) -> None:
        """A shutdown's drain begins: refuse new requests with ``refusal``."""
        ...

    def abort(self, error: BackendBusyError) -> None:
        """The drain's deadline: end every queued and running request with ``error``."""
        ...

    def close(self) -> None: ...
