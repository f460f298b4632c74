"""What the server needs from a model: a small interface, so that backends can be swapped.

A backend takes a :class:`GenerationRequest` (prompt token ids and sampling settings) and returns a
:class:`Generation`: an async stream of :class:`TokenEvent` objects that ends when the backend stops (a stop id, the
token budget) or when the server cancels it (a stop string matched, the client went away).

:class:`ReplayBackend` plays scripted token ids; the tests use it for tool calls, which a 135M model does not make
reliably. The real engines are :class:`turnkit.serve.engines.llama_cpp.LlamaCppBackend` (llama.cpp, for GGUF files) and
:class:`turnkit.serve.engines.torch.TorchBackend` (transformers on torch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from turnkit.errors import BackendBusyError, QueueTimeoutError
from turnkit.serve.request_fields import EngineKind, SamplerValues

__all__ = [
    "Backend",
    "Generation",
    "GenerationRequest",
    "Inbox",
    "InboxFront",
    "Load",
    "ReplayBackend",
    "TokenEvent",
    "load_of",
    "put_all",
    "serving_loop",
    "serving_on",
]


log = logging.getLogger("turnkit.serve")


@dataclass(frozen=True)
class GenerationRequest(SamplerValues):
    """Prompt ids and how to sample: the samplers (:class:`~turnkit.serve.request_fields.SamplerValues`, keyword
    arguments; ``temperature == 0`` is greedy decoding) and the fields below. Every default changes nothing, and the
    server refuses a request that sets a field its engine does not honour (declared in
    :mod:`turnkit.serve.request_fields`), so an engine reads only what it honours.

    * ``top_k`` (0: off), ``min_p`` (0: off): keep the ``top_k`` likeliest tokens / those at least ``min_p`` times
      as likely as the likeliest;
    * ``repetition_penalty`` (1: off): transformers' penalty on every token of the prompt and the reply so far;
    * ``presence_penalty``, ``frequency_penalty`` (0: off): OpenAI's, on the reply's tokens so far;
    * ``logit_bias``: added to the logits of those token ids (-100 bans, 100 forces);
    * ``constraint``: a grammar matcher (:mod:`.structured`) that masks tokens the grammar does not allow;
    * ``prompt_logprobs``: set :attr:`Generation.prompt` (``/v1/completions`` with ``echo`` and ``logprobs``).
    """

    prompt_ids: Sequence[int]
    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    seed: int | None = None
    top_logprobs: int | None = None  # None: no log-probabilities; 0: the chosen token's only
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    constraint: Any = None
    prompt_logprobs: int | None = None  # None: none; k: each prompt token's log-probability and k alternatives


@dataclass(frozen=True)
class TokenEvent:
    """One generated token, with its log-probability and the most likely alternatives when asked for."""

    token_id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


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

    def _shut_down(self, worker: threading.Thread, timeout: float) -> bool:
        """Stop taking requests, wake the engine's ``worker`` thread and wait up to ``timeout`` seconds for it to end.
        True when it ended now, so what it owned (a llama.cpp context) can be freed; False when the engine was closed
        already (one engine may be closed by each name it is served under) or its thread still runs."""
        if self._inbox.closed:
            return False
        self._inbox.close()
        worker.join(timeout=timeout)
        return not worker.is_alive()


class Backend(Protocol):
    """A model that generates token ids.

    An engine may also have (the registry asks for them with ``getattr``):

    * ``kind``: which engine it is (``llama.cpp`` ...): the request fields it honours are declared by that name in
      :mod:`turnkit.serve.request_fields`, and the server answers requests that set others with a 400 naming them;
    * ``load_now()``: a :class:`Load` reading (``/health``, ``/metrics``, unloading only when idle; without it the
      engine reads as idle);
    * ``engine_info()``: what the engine was given, as JSON (``/health`` shows it with the model; vLLM's release and
      engine options);
    * ``stop_admitting(refusal)`` and ``abort(error)``: the drain of a shutdown (refuse new requests; end every
      queued and running one). An engine built on :class:`InboxFront` gets all three from it.
    """

    name: str
    #: The longest sequence (prompt and reply) one request may have.
    context_length: int

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        """Queue the request; raises :class:`BackendBusyError` when no slot or queue place is free. The generation's
        :meth:`~Generation.admit` (or its first token) says when the engine took it."""
        ...

    def close(self) -> None: ...


def load_of(backend: Backend) -> Load:
    """The engine's :class:`Load` reading; an engine that cannot tell reads as idle."""
    load_now = getattr(backend, "load_now", None)
    return load_now() if load_now is not None else Load(0, 0)


@dataclass
class ReplayBackend:
    """Plays scripted replies: ``script(prompt_ids)`` returns the token ids to emit, one every ``delay`` seconds."""

    script: Callable[[Sequence[int]], Sequence[int]]
    name: str = "replay"
    context_length: int = 8192
    #: A script ignores sampling: the samplers it does not honour are refused rather than answered as if honoured.
    kind: ClassVar[EngineKind] = "replay"
    delay: float = 0.0
    max_active: int = 64
    _live: set[Generation] = field(default_factory=set, init=False)
    _refusal: BackendBusyError | None = field(default=None, init=False)

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        if self._refusal is not None:
            raise self._refusal
        if len(self._live) >= self.max_active:
            raise BackendBusyError("all generation slots are busy")
        generation = Generation(loop)
        generation.admit()
        self._live.add(generation)
        ids = list(self.script(request.prompt_ids))
        if request.prompt_logprobs is not None:
            top = request.prompt_logprobs
            generation.prompt = tuple(
                TokenEvent(t, None if n == 0 else 0.0, () if n == 0 else ((t, 0.0),) * top)
                for n, t in enumerate(request.prompt_ids)
            )

        async def play() -> None:
            try:
                for count, token_id in enumerate(ids):
                    if generation.cancelled.is_set() or count >= request.max_tokens:
                        break
                    top = ((token_id, 0.0),) * (request.top_logprobs or 0)
                    generation.put(TokenEvent(token_id, 0.0 if request.top_logprobs is not None else None, top))
                    if token_id in request.stop_ids:
                        break
                    await asyncio.sleep(self.delay)
            finally:
                self._live.discard(generation)
                generation.close()

        loop.create_task(play())
        return generation

    def load_now(self) -> Load:
        return Load(len(self._live), 0)

    def stop_admitting(self, refusal: BackendBusyError) -> None:
        self._refusal = refusal

    def abort(self, error: BackendBusyError) -> None:
        self._refusal = error
        for generation in list(self._live):
            generation.fail(error)

    def close(self) -> None:
        pass
