"""A llama.cpp engine (through llama-cpp-python's low-level API): continuous batching, chunked prefill, prefix reuse.

turnkit keeps the token boundary: prompts arrive as the token ids ``ChatFormat.encode`` made (llama.cpp never
tokenizes text, so a forged ``<|im_start|>`` in user text stays text), and generated ids go back as
:class:`~.base.TokenEvent` objects to turnkit's stream parser and stop ids. Only llama.cpp's kernels
and its key/value cache are used; sampling is :mod:`.sampler` over the logits, as on the torch engine.

How a step works. One worker thread owns the llama.cpp context. The cache has one sequence id per slot
(``max_batch`` slots) in one unified buffer. Every step builds one ``llama_batch``: the last sampled token of every
decoding request (each under its own sequence id, with logits), then prompt tokens of requests still being prefilled,
up to ``prefill_chunk`` tokens in all (128 by default: about a second of one core of this machine kind, which
bounds the running streams' inter-token gap), so a 4,000-token prompt is read in chunks between decoding steps and
the running streams keep flowing. One ``llama_decode`` computes it all. New requests take a free slot between steps;
finished or cancelled ones leave the batch at once.

Prefix reuse. A slot's cache stays after its request leaves (an idle slot), like llama-server's prompt cache: the
next request whose prompt starts with the same tokens (the same system prompt, the conversation so far) reuses that
prefix instead of computing it, from an idle slot in place or copied from a busy one (in the unified cache a copy
only tags the same cells with another sequence id). A request whose prefix another request is still prefilling
waits for it rather than computing it twice. The reused count goes out as ``Generation.cached_tokens``
(``usage.prompt_tokens_details.cached_tokens``). When the cache is full, idle slots are cleared, oldest first; when
only running requests remain, the one holding most cells fails with a clear error instead of stalling the rest.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from turnkit.errors import EngineError
from turnkit.serve.engines.base import Generation, GenerationRequest, Inbox, TokenEvent
from turnkit.serve.engines.sampler import Sampler, log_probability

__all__ = ["LlamaCppBackend"]

log = logging.getLogger("turnkit.serve")

# A request waits for another one's prefill only when that saves at least this many tokens of computing.
_MIN_SHARED_WAIT = 16


@dataclass
class _Request:
    """A running request: what is left to feed (the prompt's rest, or the last sampled token) and how to sample."""

    request: GenerationRequest
    generation: Generation
    sampler: Sampler
    prompt: list[int]
    todo: list[int]
    produced: int = 0
    wait_for: _Slot | None = None  # a slot still prefilling this request's prefix
    wait_shared: int = 0
    scored: list[TokenEvent] | None = None  # with prompt_logprobs: the prompt's tokens scored so far


@dataclass
class _Slot:
    """One llama.cpp sequence id and the token ids whose keys and values it holds (positions 0..len-1)."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    running: _Request | None = None
    last_used: float = 0.0


class LlamaCppBackend:
    """Serves a GGUF file with llama.cpp. ``threads`` sets llama.cpp's threads for decoding and prefill alike."""

    def __init__(
        self,
        path: str | Path,
        *,
        threads: int = 1,
        max_batch: int = 16,
        max_queue: int = 64,
        kv_tokens: int | None = None,
        prefill_chunk: int = 128,
    ) -> None:
        try:
            import llama_cpp
        except ImportError as exc:
            raise EngineError(
                "the llama.cpp engine needs llama-cpp-python: pip install 'turnkit[llama]' (it compiles for minutes "
                "on first install; on CPUs where the native build crashes set CMAKE_ARGS=-DGGML_NATIVE=OFF), or use "
                "--engine torch"
            ) from exc
        self.ll = llama_cpp
        path = Path(path)
        self.name = path.stem
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        if not log.isEnabledFor(logging.DEBUG):
            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            raise EngineError(f"llama.cpp could not load the model {path}")
        self.context_length = int(llama_cpp.llama_model_n_ctx_train(self._model)) or 4096
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model)))
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = kv_tokens or 2 * self.context_length
        params.n_batch = params.n_ubatch = prefill_chunk + max_batch
        params.n_seq_max = max_batch
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = True  # prefix copies share cells; masked cells cost nothing with flash attention
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise EngineError(f"llama.cpp could not create a context of {params.n_ctx} tokens for {path}")
        self.kv_tokens = int(llama_cpp.llama_n_ctx(self._ctx))
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch_size = int(params.n_batch)
        self._batch = llama_cpp.llama_batch_init(self._batch_size, 0, 1)
        self._slots = [_Slot(n) for n in range(max_batch)]
        self._inbox = Inbox(max_batch, max_queue)
        self.prompt_tokens_computed = 0  # prompt tokens run through the model (not reused): for tests and logs
        self._thread = threading.Thread(target=self._run, name="turnkit-llama", daemon=True)
        self._thread.start()

    # -- the server's side --------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        return self._inbox.submit(request, loop, running=self.load_now[0])

    def close(self) -> None:
        if self._inbox.closed:
            return
        self._inbox.close()
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.ll.llama_batch_free(self._batch)
            self.ll.llama_free(self._ctx)
            self.ll.llama_model_free(self._model)

    @property
    def load_now(self) -> tuple[int, int]:
        """(generating, waiting)."""
        return sum(slot.running is not None for slot in self._slots), self._inbox.waiting

    @property
    def cached_cells(self) -> int:
        """Cache positions held by idle slots (reusable prompts, cleared when space is needed)."""
        return sum(len(slot.tokens) for slot in self._slots if slot.running is None)

    # -- the worker thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._inbox.closed:
            try:
                self._admit(block=not self._running())
                if self._running():
                    self._step()
            except Exception as exc:
                log.exception("generation step failed")
                for slot in self._slots:
                    request, slot.running = slot.running, None
                    self._clear(slot)
                    if request is not None:
                        request.generation.close(RuntimeError(f"generation failed: {exc}"))

    def _running(self) -> list[_Slot]:
        return [slot for slot in self._slots if slot.running is not None]

    def _admit(self, *, block: bool) -> None:
        """Give waiting requests a free slot each, reusing the longest cached prefix of their prompt."""
        self._inbox.admit(lambda: any(slot.running is None for slot in self._slots), self._start, block=block)

    def _start(self, request: GenerationRequest, generation: Generation) -> None:
        if generation.cancelled.is_set():
            generation.close()
            return
        prompt = list(request.prompt_ids)
        bad = [t for t in prompt if not 0 <= t < self.n_vocab]
        if not prompt or bad:
            generation.close(EngineError(f"prompt ids must be 1 or more ids below {self.n_vocab}, got {bad[:3]}"))
            return
        req = _Request(request, generation, Sampler(request), prompt, [])
        if request.prompt_logprobs is not None:  # every prompt position is computed (no reuse): each one is scored
            req.scored = [TokenEvent(prompt[0])]
        self._place(req)

    def _place(self, req: _Request) -> None:
        prompt = req.prompt
        # The last prompt token is always computed (its logits give the first token); a prompt to score, all of them.
        limit = 0 if req.scored is not None else len(prompt) - 1
        idle = [slot for slot in self._slots if slot.running is None]
        shared = {slot.seq_id: min(_common(slot.tokens, prompt), limit) for slot in self._slots}
        source = max(self._slots, key=lambda slot: (shared[slot.seq_id], slot.running is None))
        if shared[source.seq_id] and source.running is None:  # an idle slot holds the longest prefix: reuse in place
            slot = source
            if not self.ll.llama_memory_seq_rm(self._memory, slot.seq_id, shared[slot.seq_id], -1):
                self._clear(slot)
            del slot.tokens[shared[slot.seq_id] :]
        else:  # a fresh slot (empty ones first, then the least recently used), with a running one's prefix if any
            slot = min(idle, key=lambda s: (shared[s.seq_id], bool(s.tokens), s.last_used))
            self._clear(slot)
            self._copy(source, slot, shared[source.seq_id])
        req.todo = prompt[len(slot.tokens) :]
        req.generation.cached_tokens = len(slot.tokens)
        # Another request may be computing a longer piece of this prompt right now: wait for it, not compute it twice.
        for other in self._running():
            if other.running is not None and not other.running.produced and other is not slot:
                future = min(_common(other.running.prompt, prompt), limit)
                if future >= len(slot.tokens) + _MIN_SHARED_WAIT and future > req.wait_shared:
                    req.wait_for, req.wait_shared = other, future
        slot.running = req

    def _copy(self, source: _Slot, target: _Slot, count: int) -> None:
        if count:
            self.ll.llama_memory_seq_cp(self._memory, source.seq_id, target.seq_id, 0, count)
            target.tokens = source.tokens[:count]

    def _clear(self, slot: _Slot) -> None:
        self.ll.llama_memory_seq_rm(self._memory, slot.seq_id, -1, -1)
        slot.tokens = []

    def _resolve_wait(self, slot: _Slot) -> bool:
        """For a request waiting on another's prefill: copy the prefix once it is there; True while still waiting."""
        req = slot.running
        assert req is not None
        source = req.wait_for
        if source is None:
            return False
        if _common(source.tokens, req.prompt) >= req.wait_shared:
            self._clear(slot)
            self._copy(source, slot, req.wait_shared)
            req.todo = req.prompt[req.wait_shared :]
            req.generation.cached_tokens = req.wait_shared
        elif source.running is not None and _common(source.running.prompt, req.prompt) >= req.wait_shared:
            return True  # the prefix is still being computed
        req.wait_for = None
        return False

    def _step(self) -> None:
        """One ``llama_decode``: every decoding request's next token, then prompt chunks up to ``prefill_chunk``."""
        decoding, prefilling = [], []
        for slot in self._running():
            req = slot.running
            assert req is not None
            if req.generation.cancelled.is_set():
                self._leave(slot)
            elif req.produced:
                decoding.append(slot)
            elif not self._resolve_wait(slot):
                prefilling.append(slot)
        plan: list[tuple[_Slot, list[int], bool]] = [(slot, slot.running.todo, True) for slot in decoding]  # type: ignore[union-attr]
        budget = self.prefill_chunk
        for slot in prefilling:
            if budget <= 0:
                break
            todo = slot.running.todo  # type: ignore[union-attr]
            chunk = todo[:budget]
            plan.append((slot, chunk, len(chunk) == len(todo)))
            budget -= len(chunk)
        if not plan:
            return
        while (rows := self._decode(plan)) is None:  # the cache is full
            if not self._make_room(plan):
                return
        for (slot, chunk, wants_logits), row in zip(plan, rows, strict=True):
            req = slot.running
            assert req is not None
            if req.scored is not None and not req.produced:
                self._score(req, len(slot.tokens), row - len(chunk) + 1, len(chunk))
                if wants_logits:
                    req.generation.prompt = tuple(req.scored)
            slot.tokens.extend(chunk)
            del req.todo[: len(chunk)]
            if not req.produced:
                self.prompt_tokens_computed += len(chunk)
            if not wants_logits:
                continue
            event = req.sampler(self._logits(row))
            if self._emit(req, event):
                self._leave(slot)
            else:
                req.todo = [event.token_id]

    def _decode(self, plan: list[tuple[_Slot, list[int], bool]]) -> list[int] | None:
        """Run the plan; for each entry, the batch index of its last token (its logits). None: the cache is full."""
        batch = self._batch
        n = 0
        rows = []
        for slot, chunk, wants_logits in plan:
            start = len(slot.tokens)
            scoring = slot.running is not None and slot.running.scored is not None and not slot.running.produced
            for offset, token in enumerate(chunk):
                batch.token[n] = token
                batch.pos[n] = start + offset
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = slot.seq_id
                batch.logits[n] = scoring or (wants_logits and offset == len(chunk) - 1)
                n += 1
            rows.append(n - 1)
        batch.n_tokens = n
        result = int(self.ll.llama_decode(self._ctx, batch))
        if result not in (0, 1):
            raise EngineError(f"llama_decode failed with status {result} on a batch of {n} tokens")
        return rows if result == 0 else None

    def _score(self, req: _Request, start: int, first_row: int, count: int) -> None:
        """Score the prompt tokens that follow positions ``start .. start+count-1`` (``prompt_logprobs``)."""
        assert req.scored is not None
        top = req.request.prompt_logprobs or 0
        for offset in range(count):
            position = start + offset
            if position + 1 >= len(req.prompt):
                break
            req.scored.append(log_probability(self._logits(first_row + offset), req.prompt[position + 1], top))

    def _logits(self, index: int) -> np.ndarray:
        pointer = self.ll.llama_get_logits_ith(self._ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def _make_room(self, plan: list[tuple[_Slot, list[int], bool]]) -> bool:
        """Free cache cells: the oldest idle slot's, else fail the running request that holds most. True: retry."""
        idle = [slot for slot in self._slots if slot.running is None and slot.tokens]
        if idle:
            self._clear(min(idle, key=lambda slot: slot.last_used))
            return True
        victim = max(self._running(), key=lambda slot: len(slot.tokens) + len(slot.running.todo))  # type: ignore[union-attr]
        request, victim.running = victim.running, None
        assert request is not None
        self._clear(victim)
        request.generation.close(
            EngineError(f"the key/value cache ({self.kv_tokens} tokens) is full; retry with fewer concurrent requests")
        )
        plan[:] = [entry for entry in plan if entry[0] is not victim]
        return bool(plan)

    def _emit(self, req: _Request, event: TokenEvent) -> bool:
        """Deliver a token; True when the request is finished (stop id, budget, or cancelled)."""
        req.generation.put(event)
        req.produced += 1
        request = req.request
        return (
            event.token_id in request.stop_ids
            or req.produced >= request.max_tokens
            or req.generation.cancelled.is_set()
        )

    def _leave(self, slot: _Slot) -> None:
        """The request leaves the batch at once; its slot keeps the cache as a reusable prefix."""
        request, slot.running = slot.running, None  # free before the client hears of it
        assert request is not None
        slot.last_used = time.monotonic()
        request.generation.close()


def _common(a: list[int], b: list[int]) -> int:
    """The length of the common prefix of two id lists."""
    n = min(len(a), len(b))
    if n == 0 or a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low
