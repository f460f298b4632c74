"""Admission, between the event loop and an engine's thread: the :class:`Inbox` takes requests (a 429 when every
slot and queue place is taken), keeps the queue and its deadline, admits while there is a slot and cache room, reads
the :class:`Load`, and refuses and ends requests in a shutdown's drain; :class:`InboxFront` is the side of it an
engine's server face inherits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from turnkit.errors import BackendBusyError, QueueTimeoutError
from turnkit.serve.engines.request import GenerationRequest
from turnkit.serve.engines.stream import Generation

__all__ = ["Inbox", "InboxFront", "Load"]

log = logging.getLogger("turnkit.serve")


@dataclass(frozen=True)
class Load:
    """What an engine is doing, read at one moment (``/health`` and ``/metrics`` both show this one reading).

    ``kv_capacity`` is the key/value cache in tokens (None: the engine has no shared cache budget); ``kv_reserved``
    what it has promised to admitted requests (prompt plus ``max_tokens`` each, at most the context); ``kv_cached``
    what finished requests' prefixes hold for reuse (freed whenever space is needed). ``drafted`` and ``accepted``
    count speculative decoding's tokens since the engine started: drafted, and of them accepted.
    """

    running: int
    waiting: int
    kv_capacity: int | None = None
    kv_reserved: int = 0
    kv_cached: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def kv_free(self) -> int | None:
        """What admission can still promise."""
        return None if self.kv_capacity is None else max(0, self.kv_capacity - self.kv_reserved)


Start = Callable[[GenerationRequest, Generation], None]


@dataclass
class _Waiting:
    request: GenerationRequest
    generation: Generation
    cost: int
    since: float = field(default_factory=time.monotonic)


class Inbox:
    """The admission desk between the server's event loop and an engine's own thread: who waits, who runs, what is
    promised.

    Both engines (llama.cpp, torch) take requests the same way. :meth:`submit` (event loop) queues a request, or
    refuses it at once with :class:`BackendBusyError` when every slot and queue place is taken (the server's 429).
    :meth:`admit` (engine thread) starts waiting requests first come, first served, while the engine has a free slot
    and the request's ``cost`` (its key/value cache need) fits in what is left of ``capacity``; a request that waits
    past ``queue_timeout`` seconds is closed with :class:`QueueTimeoutError` (503), and one whose client left is
    dropped, so a queue place never stays taken by nobody. Admitted requests stay counted, with their reservation,
    until the engine closes them. :meth:`load` reads all of it under one lock, so the counts always add up.

    :meth:`stop_admitting` (shutdown) refuses new requests with the given error; :meth:`abort` ends every waiting and
    running request with it.
    """

    def __init__(
        self,
        max_batch: int,
        max_queue: int,
        *,
        capacity: int | None = None,
        cost: Callable[[GenerationRequest], int] | None = None,
        queue_timeout: float | None = None,
    ) -> None:
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.capacity = capacity
        self.queue_timeout = queue_timeout
        self.closed = False
        self._cost = cost or (lambda request: 0)
        self._refusal: BackendBusyError | None = None
        self._waiting: deque[_Waiting] = deque()
        self._running: dict[Generation, int] = {}  # admitted, not yet closed: their reservation
        self._lock = threading.Condition()
        self._service = 0.0  # seconds an admitted request runs, averaged: how long a retry should wait

    # -- the event loop's side --------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        """Queue ``request``; :class:`BackendBusyError` (or the shutdown's error) when it cannot be."""
        cost = self._cost(request)
        with self._lock:
            if self._refusal is not None:
                raise self._refusal
            if self.capacity is not None and cost > self.capacity:
                raise ValueError(f"a request that needs {cost} cache tokens can never fit in {self.capacity}")
            waiting = self._live_waiting()
            if waiting + len(self._running) >= self.max_batch + self.max_queue:
                raise BackendBusyError(
                    f"the server is busy: {len(self._running)} requests are generating and {waiting} are waiting",
                    retry_after=self._retry_after(waiting),
                )
            generation = Generation(loop)
            self._waiting.append(_Waiting(request, generation, cost))
            self._lock.notify_all()
        return generation

    def load_now(self) -> Load:
        with self._lock:
            reserved = sum(self._running.values())
            return Load(len(self._running), self._live_waiting(), self.capacity, reserved)

    def stop_admitting(self, refusal: BackendBusyError) -> None:
        """Refuse every new request with ``refusal`` (the server is draining); queued and running ones go on."""
        with self._lock:
            self._refusal = refusal

    def abort(self, error: BackendBusyError) -> None:
        """End every waiting and running request with ``error`` now, and refuse new ones with it."""
        with self._lock:
            self._refusal = error
            waiting, self._waiting = list(self._waiting), deque()
            running = list(self._running)
        for entry in waiting:
            entry.generation.close(error)
        for generation in running:
            generation.fail(error)

    def close(self) -> None:
        """Stop taking requests and wake the engine's thread."""
        with self._lock:
            self.closed = True
            self._lock.notify_all()

    # -- the engine thread's side -----------------------------------------------------------------------------------

    def admit(self, has_slot: Callable[[], bool], start: Start, *, block: bool) -> None:
        """Start waiting requests, in order, while ``has_slot()`` and each one's cost fits (waiting for the first one
        when ``block``). A request that fails to start is closed with the error: that request's failure, not the
        batch's."""
        while True:
            with self._lock:
                self._expire()
                while block and not self._waiting and not self.closed:
                    self._lock.wait()
                    self._expire()
                if self.closed or not self._waiting or not has_slot():
                    return
                head = self._waiting[0]
                if self.capacity is not None and sum(self._running.values()) + head.cost > self.capacity:
                    return  # first come, first served: the head waits for room, and the rest behind it
                self._waiting.popleft()
                self._running[head.generation] = head.cost
            block = False
            self._begin(head, start)

    def _begin(self, entry: _Waiting, start: Start) -> None:
        generation, admitted = entry.generation, time.monotonic()

        def closed() -> None:
            with self._lock:
                if self._running.pop(generation, None) is not None:
                    self._service = 0.8 * self._service + 0.2 * (time.monotonic() - admitted)

        generation.on_close = closed
        generation.admit()
        try:
            start(entry.request, generation)
        except Exception as exc:  # reported on the request's own stream
            log.exception("a request could not start")
            generation.close(RuntimeError(f"generation failed: {exc}"))

    def _expire(self) -> None:
        """Drop waiting requests whose client left; close those past the queue's deadline (under the lock)."""
        now = time.monotonic()
        kept: deque[_Waiting] = deque()
        for entry in self._waiting:
            if entry.generation.cancelled.is_set():
                entry.generation.close()
            elif self.queue_timeout is not None and now - entry.since > self.queue_timeout:
                entry.generation.close(
                    QueueTimeoutError(
                        f"the server is full: the request waited {now - entry.since:.0f} s without a free slot and "
                        "cache room; retry later",
                        retry_after=self._retry_after(len(self._waiting)),
                    )
                )
            else:
                kept.append(entry)
        self._waiting = kept

    def _live_waiting(self) -> int:
        return sum(not entry.generation.cancelled.is_set() for entry in self._waiting)

    def _retry_after(self, waiting: int) -> float:
        """Seconds until a retry is likely to find room: the requests ahead, at the rate requests recently ran."""
        return min(60.0, max(1.0, self._service * (1 + waiting / max(1, self.max_batch))))


class InboxFront:
    """The server's side of an engine that takes requests through an :class:`Inbox`: :meth:`submit`, :meth:`load_now`,
    :meth:`stop_admitting` and :meth:`abort` are the inbox's own, written once here rather than as the same four
    delegations in every engine. An engine builds its inbox (its slots, cache budget and deadline) and passes it in;
    it overrides :meth:`load_now` to add what only it knows (its cache, speculation's counts), and calls
    :meth:`_shut_down` from its ``close``."""

    def __init__(self, inbox: Inbox) -> None:
        self._inbox = inbox

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        """Queue the request (:meth:`Inbox.submit`): :class:`BackendBusyError` when no slot or queue place is free."""
        return self._inbox.submit(request, loop)

    def load_now(self) -> Load:
        return self._inbox.load_now()

    def stop_admitting(self, refusal: BackendBusyError) -> None:
        self._inbox.stop_admitting(refusal)

    def abort(self, error: BackendBusyError) -> None:
        self._inbox.abort(error)

    def engine_info(self) -> dict[str, object] | None:
        """What the engine was given, for ``/health``: nothing to show unless the engine says (vLLM's options)."""
        return None

    def describe(self) -> str | None:
        """The start line of ``turnkit serve`` about the engine: none unless the engine says (llama.cpp's cache, vLLM's
        options)."""
        return None

    def _shut_down(self, worker: threading.Thread, timeout: float) -> bool:
        """Stop taking requests, wake the engine's ``worker`` thread and wait up to ``timeout`` seconds for it to end.
        True when it ended now, so what it owned (a llama.cpp context) can be freed; False when the engine was closed
        already (one engine may be closed by each name it is served under) or its thread still runs."""
        if self._inbox.closed:
            return False
        self._inbox.close()
        worker.join(timeout=timeout)
        return not worker.is_alive()
