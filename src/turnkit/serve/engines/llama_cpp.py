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

Where the keys and values live. One unified cache of ``kv_tokens`` cells, one sequence id a slot; which tokens each
slot holds, prefix reuse (a finished request's prefix stays for the next prompt that starts alike; the reused count
goes out as ``Generation.cached_tokens``), waiting on another request's prefill, clearing idle prefixes and
preempting when a step finds the cache full: :mod:`.llama_slots`. The :class:`~.base.Inbox` admits a request only
when its prompt plus ``max_tokens`` fits in what the cache has not yet promised to running requests (more with
``admission_tokens``, optimistically, as vLLM's scheduler does); otherwise it waits, first come, first served, and
past the queue's deadline it is refused before any token.

What llama.cpp is given (the cache's size, :func:`default_kv_tokens`; the batch; ``threads`` for one-token batches
and ``prefill_threads`` for every bigger one; YaRN past the trained context) and the routing of its log lines:
:mod:`.llama_context`. This module is the engine itself: the worker thread, each step's batch, and sampling.

The start check (:mod:`.llama_check`) runs before every load: a library this CPU cannot run stops the start with one
line instead of killing the server on its first token.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import ClassVar

import numpy as np

from turnkit.errors import EngineError
from turnkit.serve.engines.base import Generation, GenerationRequest, Inbox, InboxFront, Load, TokenEvent
from turnkit.serve.engines.llama_context import MEMORY_SHARE, default_kv_tokens, open_context
from turnkit.serve.engines.llama_slots import SlotCache
from turnkit.serve.engines.sampler import Sampler, log_probability
from turnkit.serve.engines.schedule import Entry, Request, plan
from turnkit.serve.engines.speculate import Drafter, StepCosts
from turnkit.serve.request_fields import EngineKind

__all__ = ["CACHE_RAM_MIB", "MEMORY_SHARE", "LlamaCppBackend", "default_kv_tokens"]

#: Host memory for parked prefixes unless told (``--cache-ram``), in MiB: llama-server's default.
CACHE_RAM_MIB = 8192

log = logging.getLogger("turnkit.serve")


class LlamaCppBackend(InboxFront):
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
        cache_ram_mib: host memory for finished requests' prefixes parked off the cache (:mod:`.llama_host_cache`;
            llama-server's ``--cache-ram``, and its default); 0: idle prefixes stay in the cache.
    """

    kind: ClassVar[EngineKind] = "llama.cpp"

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
        cache_ram_mib: int = CACHE_RAM_MIB,
    ) -> None:
        path = Path(path)
        self.name = path.stem
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self.speculate, self.draft_max, self.draft_streams = speculate and draft_max > 0, draft_max, draft_streams
        drafts = draft_max * draft_streams if self.speculate else 0
        self.llama = open_context(
            path,
            slots=max_batch,
            context=context,
            kv_tokens=kv_tokens,
            batch=max(prefill_batch, prefill_chunk + max_batch + drafts),
            threads=threads,
            prefill_threads=prefill_threads or threads,
        )
        self.ll = self.llama.ll
        self.n_vocab = self.llama.n_vocab
        self.kv_tokens = self.llama.kv_tokens
        #: The longest sequence one request may have: the context, unless the whole cache is smaller.
        self.context_length = self.llama.context_length
        self._host_mib = cache_ram_mib
        self._slots = SlotCache(self.llama, max_batch, host_bytes=cache_ram_mib * 2**20)
        super().__init__(
            Inbox(
                max_batch,
                max_queue,
                capacity=admission_tokens or self.kv_tokens,
                cost=lambda request: min(len(request.prompt_ids) + request.max_tokens, self.context_length),
                queue_timeout=queue_timeout,
            )
        )
        self.prompt_tokens_computed = 0  # prompt tokens run through the model (not reused): for tests and logs
        self.drafted = self.accepted = 0  # speculative decoding: tokens drafted, and of them accepted
        # what a step costs by its size: how long a draft pays (:mod:`.speculate`; fixed by a test's TURNKIT_STEP_COSTS)
        self._costs = StepCosts.from_environment()
        self._thread = threading.Thread(target=self._run, name="turnkit-llama", daemon=True)
        self._thread.start()

    def describe(self) -> str:
        """What was chosen, in one line for the server's start: the context and cache, the host memory finished
        prefixes are parked in, and speculative decoding's setting."""
        host = f"{self._host_mib} MiB of host memory for parked prefixes" if self._host_mib else "no prefix parking"
        drafts = f"drafts of up to {self.draft_max} tokens" if self.speculate else "off"
        return f"{self.llama.describe(self.max_batch)}; {host}; speculative decoding: {drafts}"

    # -- the server's side (submit, stop_admitting, abort: the InboxFront's) ------------------------------------

    def load_now(self) -> Load:
        reading = super().load_now()
        return Load(
            reading.running,
            reading.waiting,
            self.kv_tokens,
            reading.kv_reserved,
            self._slots.cached(),
            self.drafted,
            self.accepted,
        )

    def close(self) -> None:
        if self._shut_down(self._thread, timeout=30):
            self.llama.free()

    @property
    def cached_cells(self) -> int:
        """Cache positions held by idle slots (reusable prompts, cleared when space is needed)."""
        return self.load_now().kv_cached

    @property
    def preemptions(self) -> int:
        """Requests preempted because the cache was full (recomputed later)."""
        return self._slots.preemptions

    # -- the worker thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        slots = self._slots
        while not self._inbox.closed:
            try:
                slots.resume()
                self._inbox.admit(slots.free_slot, self._start, block=not slots.running() and not slots.paused)
                if slots.running():
                    self._step()
            except Exception as exc:
                log.exception("generation step failed")
                for slot in slots.slots:
                    request, slot.running = slot.running, None
                    slots.clear(slot)
                    if request is not None:
                        request.generation.close(RuntimeError(f"generation failed: {exc}"))
        for paused in slots.paused:
            paused.request.generation.close()
        for slot in slots.running():
            slots.leave(slot)

    def _start(self, request: GenerationRequest, generation: Generation) -> None:
        """A request the inbox admitted: checked, then placed in a slot with the longest cached prefix of its prompt."""
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
        self._slots.place(req)

    def _step(self) -> None:
        """One ``llama_decode`` of the step's plan (:func:`.schedule.plan`), then each request's next token."""
        decoding, prefilling = [], []
        for slot in self._slots.running():
            req = slot.running
            assert req is not None
            if req.generation.cancelled.is_set():
                self._slots.leave(slot)
            elif req.produced and len(req.todo) == 1:
                decoding.append(slot)
            elif not self._slots.resolve_wait(slot):
                prefilling.append(slot)
        entries = plan(
            decoding,
            prefilling,
            chunk=self.prefill_chunk,
            batch=self.llama.batch_size,
            draft=self._draft if self.speculate else None,
            draft_streams=self.draft_streams,
            context=self.context_length,
        )
        if not entries:
            return
        while True:
            started = time.perf_counter()
            rows = self._decode(entries)
            if rows is not None:
                break
            if not self._slots.make_room(entries):  # the cache is full
                return
        self._costs.observe(sum(len(entry.tokens) for entry in entries), time.perf_counter() - started)
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
                self._slots.trim(slot)

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
                self._slots.leave(slot)
                break
            if offset < drafts and event.token_id == chunk[base + offset + 1]:
                accepted += 1
                continue
            req.todo = [event.token_id]
            break
        if drafts and req.drafter is not None:
            req.drafter.verified(drafts, accepted)
            self.drafted += drafts
            self.accepted += accepted
        return base + accepted + 1

    def _draft(self, req: Request, room: int, planned: int) -> list[int]:
        """A request's draft of at most ``room`` tokens, in a step of ``planned`` tokens so far (none where its
        drafter is off)."""
        return req.drafter.draft(req.known, room, planned, self._costs) if req.drafter is not None else []

    def _decode(self, entries: list[Entry]) -> list[int] | None:
        """Run the plan; for each entry, the batch index of its first token (rows with logits: a prompt's scored
        tokens, the last fed token where the entry samples, and every drafted token). None: the cache is full."""
        batch = self.llama.batch
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
        result = int(self.ll.llama_decode(self.llama.ctx, batch))
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
        pointer = self.ll.llama_get_logits_ith(self.llama.ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

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
