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
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "Backend",
    "BackendBusyError",
    "Generation",
    "GenerationRequest",
    "Inbox",
    "ReplayBackend",
    "TokenEvent",
]


log = logging.getLogger("turnkit.serve")


class BackendBusyError(Exception):
    """Every generation slot and queue place is taken (the server answers 429)."""


@dataclass(frozen=True)
class GenerationRequest:
    """Prompt ids and how to sample. ``temperature == 0`` is greedy decoding. Every other field's default changes
    nothing, so an engine that cannot do one lists it in ``unsupported_fields`` and the server refuses requests
    that set it.

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
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int | None = None  # None: no log-probabilities; 0: the chosen token's only
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
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

    ``cached_tokens``: how many prompt tokens the engine reused from its cache instead of computing them (set before
    the first token; the server reports it as ``usage.prompt_tokens_details.cached_tokens``).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[TokenEvent | BaseException | None] = asyncio.Queue()
        self.cancelled = threading.Event()
        #: With ``prompt_logprobs``: one event per prompt token (the first without a log-probability), set by the
        #: backend before its first token is put, so it is there when the first token arrives.
        self.prompt: tuple[TokenEvent, ...] | None = None
        self.cached_tokens = 0

    # called from the backend's thread
    def put(self, event: TokenEvent) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def close(self, error: BaseException | None = None) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, error)

    def cancel(self) -> None:
        self.cancelled.set()

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class Inbox:
    """Requests on their way from the server's event loop to an engine's own thread, and how many are waiting.

    Both engines (llama.cpp, torch) take requests the same way: :meth:`submit` refuses one past the engine's batch
    and queue (:class:`BackendBusyError`, the server's 429) and counts it as waiting until the engine started it, so
    that it never looks idle in between; :meth:`admit`, in the engine's thread, starts requests while it has room.
    """

    def __init__(self, max_batch: int, max_queue: int) -> None:
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.waiting = 0
        self.closed = False
        self._queue: queue.Queue[tuple[GenerationRequest, Generation] | None] = queue.Queue()
        self._lock = threading.Lock()

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, running: int) -> Generation:
        """Queue ``request`` (``running``: how many the engine generates now)."""
        with self._lock:
            if self.waiting + running >= self.max_batch + self.max_queue:
                raise BackendBusyError(
                    f"the server is busy: {running} requests are generating and {self.waiting} are waiting"
                )
            self.waiting += 1
        generation = Generation(loop)
        self._queue.put((request, generation))
        return generation

    def close(self) -> None:
        """Stop taking requests and wake the engine's thread."""
        self.closed = True
        self._queue.put(None)

    def admit(
        self, has_room: Callable[[], bool], start: Callable[[GenerationRequest, Generation], None], *, block: bool
    ) -> None:
        """In the engine's thread: ``start`` waiting requests while ``has_room()`` (waiting for the first one when
        ``block``). A request already cancelled is closed unstarted; one that fails to start is closed with the
        error, which is that request's failure, not the batch's."""
        while has_room():
            try:
                item = self._queue.get(block=block, timeout=None if block else 0)
            except queue.Empty:
                return
            block = False
            if item is None:
                self.closed = True
                return
            request, generation = item
            try:
                if generation.cancelled.is_set():
                    generation.close()
                else:
                    start(request, generation)
            except Exception as exc:  # reported on the request's own stream
                log.exception("a request could not start")
                generation.close(RuntimeError(f"generation failed: {exc}"))
            finally:
                with self._lock:
                    self.waiting -= 1


class Backend(Protocol):
    """A model that generates token ids.

    An engine may also have ``unsupported_fields`` (a set of :class:`GenerationRequest` field names it cannot honour,
    e.g. ``{"logit_bias", "prompt_logprobs"}``: the server answers requests that set them with a 400 naming the
    field) and ``load_now`` (``(generating, waiting)``, for ``/health`` and for unloading only when idle).
    """

    name: str
    context_length: int

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        """Start generating; raises :class:`BackendBusyError` when no slot or queue place is free."""
        ...

    def close(self) -> None: ...


@dataclass
class ReplayBackend:
    """Plays scripted replies: ``script(prompt_ids)`` returns the token ids to emit, one every ``delay`` seconds."""

    script: Callable[[Sequence[int]], Sequence[int]]
    name: str = "replay"
    context_length: int = 8192
    #: A script ignores sampling: requests that ask for these are refused rather than answered as if honoured.
    unsupported_fields: frozenset[str] = frozenset(
        {
            "top_k",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "response_format",
        }
    )
    delay: float = 0.0
    max_active: int = 64
    _active: int = field(default=0, init=False)

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        if self._active >= self.max_active:
            raise BackendBusyError("all generation slots are busy")
        generation = Generation(loop)
        self._active += 1
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
                self._active -= 1
                generation.close()

        loop.create_task(play())
        return generation

    @property
    def load_now(self) -> tuple[int, int]:
        return self._active, 0

    def close(self) -> None:
        pass
