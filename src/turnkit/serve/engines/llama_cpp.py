"""A llama.cpp engine (through llama-cpp-python's low-level API): continuous batching, chunked prefill, prefix reuse.

turnkit keeps the token boundary: prompts arrive as the token ids ``ChatFormat.encode`` made (llama.cpp never
tokenizes text, so a forged ``<|im_start|>`` in user text stays text), and generated ids go back as
:class:`~.base.TokenEvent` objects to turnkit's stream parser and stop ids. Only llama.cpp's kernels
and its key/value cache are used; sampling is :mod:`.sampler` over the logits, as on the torch engine.

How a step works. One worker thread owns the llama.cpp context. The cache has one sequence id per slot
(``max_batch`` slots) in one unified buffer. Every step builds one ``llama_batch`` from :func:`.schedule.plan`: the
last sampled token of every decoding request (each under its own sequence id, with logits) and, while few decode,
tokens drafted from its context (:mod:`.speculate`, verified in the same batch), then prompt tokens, the oldest
admitted request's first (first come, first served): ``prefill_chunk`` tokens while streams decode (128 by default,
so they keep their pace), ``prefill_batch`` when a prompt is read alone. One ``llama_decode`` computes it all. New
requests take a free slot between steps; finished or cancelled ones leave the batch at once.

Prefix reuse. A slot's cache stays after its request leaves (an idle slot), like llama-server's prompt cache: the
next request whose prompt starts with the same tokens (the same system prompt, the conversation so far) reuses that
prefix instead of computing it, from an idle slot in place or copied from a busy one (in the unified cache a copy
only tags the same cells with another sequence id). A request whose prefix another request is still prefilling
waits for it rather than computing it twice. The reused count goes out as ``Generation.cached_tokens``
(``usage.prompt_tokens_details.cached_tokens``).

The cache budget. The cache is one pool of ``kv_tokens`` cells shared by the slots (default: every slot a whole
context, within a sixteenth of the machine's memory: :func:`default_kv_tokens`), and each request may use up to
``context`` of them (the model's trained context, or more with YaRN RoPE scaling). The :class:`~.base.Inbox` admits
a request only when its prompt plus ``max_tokens`` fits in what the pool has not yet promised to running requests;
otherwise it waits, first come, first served, and past the queue's deadline it is refused before any token. So a
running reply never finds the cache full: cells held by idle slots (finished requests' prefixes) are cleared when
needed, oldest first. Should a step still find no room (admission that promises more than the pool holds,
``admission_tokens``, as vLLM's optimistic scheduler does), the youngest running request is preempted: its cells are
freed and it is recomputed later from its prompt and the tokens it already generated, its client none the wiser. Only
a request that cannot fit even alone ends, with :class:`~.base.CacheFullError` naming the cache.

Threads: ``threads`` for one-token batches (one stream decoding), ``prefill_threads`` for every bigger batch (prompt
chunks, and several streams decoding together): prefill is compute-bound and wants every core.

The start check (:mod:`.llama_check`) runs before every load: a library this CPU cannot run stops the start with one
line instead of killing the server on its first token.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from turnkit.errors import EngineError
from turnkit.serve.engines.base import (
    BackendBusyError,
    CacheFullError,
    Generation,
    GenerationRequest,
    Inbox,
    Load,
    TokenEvent,
)
from turnkit.serve.engines.sampler import Sampler, log_probability
from turnkit.serve.engines.schedule import Entry, Paused, Request, Slot, common, plan
from turnkit.serve.engines.speculate import Drafter

__all__ = ["LlamaCppBackend", "default_kv_tokens"]

log = logging.getLogger("turnkit.serve")

# A request waits for another one's prefill only when that saves at least this many tokens of computing.
_MIN_SHARED_WAIT = 16
#: The share of the machine's memory the key/value cache takes by default (when every slot's whole context needs more).
MEMORY_SHARE = 1 / 16


def default_kv_tokens(slots: int, context: int, bytes_per_token: int, memory: int | None = None) -> int:
    """Every slot a whole context, or what :data:`MEMORY_SHARE` of the machine's ``memory`` holds if that is less;
    at least one context, in whole multiples of 256 (llama.cpp's cache granule)."""
    if memory is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    fits = int(memory * MEMORY_SHARE) // max(1, bytes_per_token)
    return max(context, min(slots * context, fits)) // 256 * 256 or 256


class LlamaCppBackend:
    """Serves a GGUF file with llama.cpp (built directly, without :func:`check_library`: ``load_backend`` runs both).

    Args:
        threads: llama.cpp's threads for one-token batches (one stream decoding).
        prefill_threads: its threads for bigger batches (prompt chunks, several streams); default ``threads``.
        max_batch: slots (sequences generated together); max_queue: requests waiting before 429 answers.
        context: the longest sequence one request may have (default: the model's trained context; longer is RoPE
            scaled with YaRN).
        kv_tokens: the key/value cache shared by the slots, in tokens (default: :func:`default_kv_tokens`).
        admission_tokens: the cache tokens admission may promise (default ``kv_tokens``: a running reply never runs
            out; more admits optimistically and preempts when the cache runs out).
        queue_timeout: seconds a request may wait for admission before it is refused (None: no limit).
        prefill_chunk: prompt tokens computed per step while streams decode, between their tokens.
        prefill_batch: prompt tokens computed per step while nothing decodes (a lone prompt); the llama batch.
        speculate: draft tokens from the context and verify them in the step (:mod:`.speculate`); draft_max: the
            longest draft; draft_streams: drafts are made only while at most this many streams decode.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        threads: int = 1,
        prefill_threads: int | None = None,
        max_batch: int = 16,
        max_queue: int = 64,
        context: int | None = None,
        kv_tokens: int | None = None,
        admission_tokens: int | None = None,
        queue_timeout: float | None = 60.0,
        prefill_chunk: int = 128,
        prefill_batch: int = 512,
        speculate: bool = True,
        draft_max: int = 16,
        draft_streams: int = 4,
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
        _route_llama_logs(llama_cpp)
        path = Path(path)
        self.name = path.stem
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self.speculate, self.draft_max, self.draft_streams = speculate and draft_max > 0, draft_max, draft_streams
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not self._model:
            raise EngineError(f"llama.cpp could not load the model {path}")
        self.trained_context = int(llama_cpp.llama_model_n_ctx_train(self._model)) or 4096
        context = context or self.trained_context
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model)))
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = kv_tokens or default_kv_tokens(max_batch, context, self._bytes_per_token())
        drafts = draft_max * draft_streams if self.speculate else 0
        params.n_batch = params.n_ubatch = max(prefill_batch, prefill_chunk + max_batch + drafts)
        params.n_seq_max = max_batch
        self.threads, self.prefill_threads = threads, prefill_threads or threads
        params.n_threads, params.n_threads_batch = self.threads, self.prefill_threads
        params.kv_unified = True  # prefix copies share cells; masked cells cost nothing with flash attention
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.no_perf = True
        self.rope_scaling = context / self.trained_context if context > self.trained_context else None
        if self.rope_scaling is not None:  # as llama-server's -c N --rope-scaling yarn --yarn-orig-ctx TRAINED
            params.rope_scaling_type = llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN
            params.rope_freq_scale = self.trained_context / context
            params.yarn_orig_ctx = self.trained_context
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise EngineError(f"llama.cpp could not create a context of {params.n_ctx} tokens for {path}")
        self.kv_tokens = int(llama_cpp.llama_n_ctx(self._ctx))
        #: The longest sequence one request may have: the context, unless the whole cache is smaller.
        self.context_length = min(context, self.kv_tokens)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch_size = int(params.n_batch)
        self._batch = llama_cpp.llama_batch_init(self._batch_size, 0, 1)
        self._slots = [Slot(n) for n in range(max_batch)]
        self._paused: list[Paused] = []
        self._left = 0  # requests that have left the batch, for resuming preempted ones
        self._inbox = Inbox(
            max_batch,
            max_queue,
            capacity=admission_tokens or self.kv_tokens,
            cost=lambda request: min(len(request.prompt_ids) + request.max_tokens, self.context_length),
            queue_timeout=queue_timeout,
        )
        self.prompt_tokens_computed = 0  # prompt tokens run through the model (not reused): for tests and logs
        self.preemptions = 0
        self.drafted = self.accepted = 0  # speculative decoding: tokens drafted, and of them accepted
        self._step_seconds = 0.0  # the last llama_decode's time (drafters compare steps with and without drafts)
        self._thread = threading.Thread(target=self._run, name="turnkit-llama", daemon=True)
        self._thread.start()

    def describe(self) -> str:
        """What was chosen, in one line for the server's start."""
        cache = self.kv_tokens * self._bytes_per_token() / 2**30
        line = (
            f"context {self.context_length} tokens per request, key/value cache {self.kv_tokens} tokens "
            f"({cache:.1f} GiB) shared by {self.max_batch} slots; threads: {self.threads} decoding, "
            f"{self.prefill_threads} prefill"
        )
        if self.rope_scaling is not None:
            line += (
                f"; RoPE scaled with YaRN {self.rope_scaling:g}x past the model's trained {self.trained_context} "
                "tokens (quality may drop on long inputs)"
            )
        return line

    def _bytes_per_token(self) -> int:
        """Key/value cache bytes per token (f16 keys and values of every layer)."""
        ll, model = self.ll, self._model
        head = ll.llama_model_n_embd(model) // max(1, ll.llama_model_n_head(model))
        return int(ll.llama_model_n_layer(model) * 2 * head * ll.llama_model_n_head_kv(model) * 2)

    # -- the server's side --------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        return self._inbox.submit(request, loop)

    def load_now(self) -> Load:
        reading = self._inbox.load_now()
        cached = sum(len(slot.tokens) for slot in self._slots if slot.running is None)
        return Load(
            reading.running, reading.waiting, self.kv_tokens, reading.kv_reserved, cached, self.drafted, self.accepted
        )

    def stop_admitting(self, refusal: BackendBusyError) -> None:
        self._inbox.stop_admitting(refusal)

    def abort(self, error: BackendBusyError) -> None:
        self._inbox.abort(error)

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
    def cached_cells(self) -> int:
        """Cache positions held by idle slots (reusable prompts, cleared when space is needed)."""
        return self.load_now().kv_cached

    # -- the worker thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._inbox.closed:
            try:
                self._resume()
                self._admit(block=not self._running() and not self._paused)
                if self._running():
                    self._step()
            except Exception as exc:
                log.exception("generation step failed")
                for slot in self._slots:
                    request, slot.running = slot.running, None
                    self._clear(slot)
                    if request is not None:
                        request.generation.close(RuntimeError(f"generation failed: {exc}"))
        for paused in self._paused:
            paused.request.generation.close()
        for slot in self._running():
            self._leave(slot)

    def _running(self) -> list[Slot]:
        return [slot for slot in self._slots if slot.running is not None]

    def _free_slot(self) -> bool:
        return any(slot.running is None for slot in self._slots)

    def _admit(self, *, block: bool) -> None:
        """Give waiting requests a free slot each, reusing the longest cached prefix of their prompt."""
        self._inbox.admit(self._free_slot, self._start, block=block)

    def _resume(self) -> None:
        """Put preempted requests back (they come before new ones), once a request has left since their preemption."""
        while self._paused and self._free_slot():
            paused = self._paused[0]
            if paused.request.generation.cancelled.is_set():
                self._paused.pop(0).request.generation.close()
                continue
            if self._running() and self._left <= paused.left:
                return
            self._paused.pop(0)
            self._place(paused.request)

    def _start(self, request: GenerationRequest, generation: Generation) -> None:
        if generation.cancelled.is_set():
            generation.close()
            return
        prompt = list(request.prompt_ids)
        bad = [t for t in prompt if not 0 <= t < self.n_vocab]
        if not prompt or bad:
            generation.close(EngineError(f"prompt ids must be 1 or more ids below {self.n_vocab}, got {bad[:3]}"))
            return
        req = Request(request, generation, Sampler(request), prompt, [])
        if self.speculate:
            req.drafter = Drafter(self.draft_max)
        if request.prompt_logprobs is not None:  # every prompt position is computed (no reuse): each one is scored
            req.scored = [TokenEvent(prompt[0])]
        self._place(req)

    def _place(self, req: Request) -> None:
        """Give ``req`` a slot, with the longest prefix of its sequence that any slot holds."""
        known = req.known
        # The last known token is always computed (its logits give the next token); a prompt to score, all of them.
        limit = 0 if req.scored is not None and not req.produced else len(known) - 1
        idle = [slot for slot in self._slots if slot.running is None]
        shared = {slot.seq_id: min(common(slot.tokens, known), limit) for slot in self._slots}
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
        req.todo = known[len(slot.tokens) :]
        if not req.produced:
            req.generation.cached_tokens = len(slot.tokens)
        # Another request may be computing a longer piece of this prompt right now: wait for it, not compute it twice.
        req.wait_for, req.wait_shared = None, 0
        for other in self._running():
            if other.running is not None and not other.running.produced and other is not slot:
                future = min(common(other.running.prompt, known), limit)
                if future >= len(slot.tokens) + _MIN_SHARED_WAIT and future > req.wait_shared:
                    req.wait_for, req.wait_shared = other, future
        slot.running = req

    def _copy(self, source: Slot, target: Slot, count: int) -> None:
        if count:
            self.ll.llama_memory_seq_cp(self._memory, source.seq_id, target.seq_id, 0, count)
            target.tokens = source.tokens[:count]

    def _clear(self, slot: Slot) -> None:
        self.ll.llama_memory_seq_rm(self._memory, slot.seq_id, -1, -1)
        slot.tokens = []

    def _resolve_wait(self, slot: Slot) -> bool:
        """For a request waiting on another's prefill: copy the prefix once it is there; True while still waiting."""
        req = slot.running
        assert req is not None
        source = req.wait_for
        if source is None:
            return False
        if common(source.tokens, req.known) >= req.wait_shared:
            self._clear(slot)
            self._copy(source, slot, req.wait_shared)
            req.todo = req.known[req.wait_shared :]
            if not req.produced:
                req.generation.cached_tokens = req.wait_shared
        elif source.running is not None and common(source.running.prompt, req.known) >= req.wait_shared:
            return True  # the prefix is still being computed
        req.wait_for = None
        return False

    def _step(self) -> None:
        """One ``llama_decode`` of the step's plan (:func:`.schedule.plan`), then each request's next token."""
        decoding, prefilling = [], []
        for slot in self._running():
            req = slot.running
            assert req is not None
            if req.generation.cancelled.is_set():
                self._leave(slot)
            elif req.produced and len(req.todo) == 1:
                decoding.append(slot)
            elif not self._resolve_wait(slot):
                prefilling.append(slot)
        entries = plan(
            decoding,
            prefilling,
            chunk=self.prefill_chunk,
            batch=self._batch_size,
            draft=_draft if self.speculate else None,
            draft_streams=self.draft_streams,
            context=self.context_length,
        )
        if not entries:
            return
        started = time.perf_counter()
        while (rows := self._decode(entries)) is None:  # the cache is full
            if not self._make_room(entries):
                return
        self._step_seconds = time.perf_counter() - started
        for entry, first in zip(entries, rows, strict=True):
            slot, chunk = entry.slot, entry.tokens
            req = slot.running
            assert req is not None
            if req.scored is not None and not req.produced:
                self._score(req, len(slot.tokens), first, len(chunk))
                if entry.sample:
                    req.generation.prompt = tuple(req.scored)
            if not req.produced:
                self.prompt_tokens_computed += len(chunk)
            if entry.sample:
                kept = self._sample(entry, first)
            else:
                kept = len(chunk)
                del req.todo[:kept]
            slot.tokens.extend(chunk[:kept])
            if kept < len(chunk):  # a draft's rejected tokens: their cells go
                self.ll.llama_memory_seq_rm(self._memory, slot.seq_id, len(slot.tokens), -1)

    def _sample(self, entry: Entry, first: int) -> int:
        """The request's next token from the logits of the entry's last fed token; with a draft, the sampler picks at
        each drafted position in turn while its pick equals the draft (:mod:`.speculate`: the same tokens as without
        one). Returns how many of the entry's tokens stay in the cache."""
        slot, chunk, drafts = entry.slot, entry.tokens, entry.drafts
        req = slot.running
        assert req is not None
        base = len(chunk) - drafts - 1  # the entry's index of the last token before the draft
        accepted = 0
        for offset in range(drafts + 1):
            event = req.sampler(self._logits(first + base + offset))
            if self._emit(req, event):
                self._leave(slot)
                break
            if offset < drafts and event.token_id == chunk[base + offset + 1]:
                accepted += 1
                continue
            req.todo = [event.token_id]
            break
        if req.drafter is not None and req.produced > 1:  # what drafting costs and gives, against not drafting
            req.drafter.timed(self._step_seconds, accepted + 1, drafts > 0)
            if drafts:
                req.drafter.verified(drafts, accepted)
                self.drafted += drafts
                self.accepted += accepted
        return base + accepted + 1

    def _decode(self, entries: list[Entry]) -> list[int] | None:
        """Run the plan; for each entry, the batch index of its first token (rows with logits: a prompt's scored
        tokens, the last fed token where the entry samples, and every drafted token). None: the cache is full."""
        batch = self._batch
        n = 0
        rows = []
        for entry in entries:
            slot, chunk = entry.slot, entry.tokens
            start = len(slot.tokens)
            scoring = slot.running is not None and slot.running.scored is not None and not slot.running.produced
            logits_from = len(chunk) - 1 - entry.drafts if entry.sample else len(chunk)
            rows.append(n)
            for offset, token in enumerate(chunk):
                batch.token[n] = token
                batch.pos[n] = start + offset
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = slot.seq_id
                batch.logits[n] = scoring or offset >= logits_from
                n += 1
        batch.n_tokens = n
        result = int(self.ll.llama_decode(self._ctx, batch))
        if result not in (0, 1):
            raise EngineError(f"llama_decode failed with status {result} on a batch of {n} tokens")
        return rows if result == 0 else None

    def _score(self, req: Request, start: int, first_row: int, count: int) -> None:
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

    def _make_room(self, entries: list[Entry]) -> bool:
        """Free cache cells: the oldest idle slot's, else preempt the youngest running request (recomputed later);
        a request alone that still does not fit ends with :class:`CacheFullError`. True: retry the plan."""
        idle = [slot for slot in self._slots if slot.running is None and slot.tokens]
        if idle:
            self._clear(min(idle, key=lambda slot: slot.last_used))
            return True
        running = self._running()
        victim = max(running, key=lambda slot: slot.running.admitted)  # type: ignore[union-attr]
        request, victim.running = victim.running, None
        assert request is not None
        self._clear(victim)
        entries[:] = [entry for entry in entries if entry.slot is not victim]
        if len(running) == 1:
            request.generation.close(
                CacheFullError(
                    f"the key/value cache ({self.kv_tokens} tokens) is full: this request needs more than the whole "
                    "cache holds; start the server with a larger --kv-tokens"
                )
            )
            return False
        self.preemptions += 1
        log.info(
            "the key/value cache (%d tokens) is full: preempting a request after %d tokens, to recompute later",
            self.kv_tokens,
            request.produced,
        )
        request.todo, request.wait_for = [], None
        if request.scored is not None and not request.produced:  # scored again from the start when it resumes
            request.scored = [TokenEvent(request.prompt[0])]
        self._paused.append(Paused(request, self._left))
        return bool(entries)

    def _emit(self, req: Request, event: TokenEvent) -> bool:
        """Deliver a token; True when the request is finished (stop id, budget, or cancelled)."""
        req.generation.put(event)
        req.generated.append(event.token_id)
        request = req.request
        return (
            event.token_id in request.stop_ids
            or req.produced >= request.max_tokens
            or req.generation.cancelled.is_set()
        )

    def _leave(self, slot: Slot) -> None:
        """The request leaves the batch at once; its slot keeps the cache as a reusable prefix."""
        request, slot.running = slot.running, None  # free before the client hears of it
        assert request is not None
        slot.last_used = time.monotonic()
        self._left += 1
        request.generation.close()


def _draft(req: Request, room: int) -> list[int]:
    """A request's draft of at most ``room`` tokens (none where its drafter is off)."""
    return req.drafter.draft(req.known, room) if req.drafter is not None else []


# llama.cpp's log levels (ggml.h's enum ggml_log_level) as Python's; CONT continues the previous message.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_llama_log = logging.getLogger("turnkit.serve.llama_cpp")
_log_state: dict[str, Any] = {}


def _route_llama_logs(llama_cpp: Any) -> None:
    """Send llama.cpp's own log lines to Python logging (``turnkit.serve.llama_cpp``: its warnings and errors show,
    its loading chatter only at debug level), once per process. One warning is dropped: with one cache shared by the
    slots, llama.cpp reports the whole cache as each sequence's context (``n_ctx_seq > n_ctx_train``), but a request
    here never gets more than ``context`` tokens; :meth:`LlamaCppBackend.describe` says what was chosen instead."""
    if _log_state:
        return
    level = [logging.DEBUG]

    @llama_cpp.llama_log_callback
    def route(ggml_level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if ggml_level != 5:
            level[0] = _LEVELS.get(ggml_level, logging.DEBUG)
        line = text.decode("utf-8", errors="replace").rstrip()
        if line and "possible training context overflow" not in line:
            _llama_log.log(level[0], "%s", line)

    _log_state["callback"] = route  # kept alive as long as llama.cpp may call it
    llama_cpp.llama_log_set(route, ctypes.c_void_p(0))
