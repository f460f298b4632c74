"""The llama.cpp engine's slots: which tokens each sequence of the key/value cache holds, and who may use them.

Why a module of its own: the step loop (:mod:`.llama_cpp`) decides what to compute; this decides where a request's
keys and values live, which is a bookkeeping of its own with its own invariants (a slot's ``tokens`` are exactly the
cells its sequence id holds, positions 0..len-1). Kept apart, each can be read without the other.

Prefix reuse. A slot's cache stays after its request leaves (an idle slot), like llama-server's prompt cache: the next
request whose prompt starts with the same tokens (the same system prompt, the conversation so far) reuses that prefix
instead of computing it, from an idle slot in place or copied from a busy one (in the unified cache a copy only tags
the same cells with another sequence id). A request whose prefix another request is still prefilling waits for it
rather than computing it twice.

Host memory. When a request is placed, every other idle slot is parked in host memory (:mod:`.llama_host_cache`) and
cleared from the cache, so the attention of the running requests spans their own cells only; a prompt that starts
like a parked one gets it back from there (unless no budget is given: then idle prefixes stay in the cache).

Room. Should a step find the cache full, cells held by idle slots (finished requests' prefixes) are cleared, oldest
first; then the youngest running request is preempted: its cells are freed and it is recomputed later from its prompt
and the tokens it already generated, its client none the wiser. Only a request that cannot fit even alone ends, with
:class:`~.base.CacheFullError` naming the cache.
"""

from __future__ import annotations

import logging
import time

from turnkit.errors import CacheFullError
from turnkit.serve.engines.base import TokenEvent
from turnkit.serve.engines.llama_context import LlamaContext
from turnkit.serve.engines.llama_host_cache import HostCache
from turnkit.serve.engines.schedule import Entry, Paused, Request, Slot, common

__all__ = ["SlotCache"]

log = logging.getLogger("turnkit.serve")

# A request waits for another one's prefill only when that saves at least this many tokens of computing.
_MIN_SHARED_WAIT = 16
# A finished sequence's prefix shorter than this (and than a quarter of it) is computed again rather than reused.
_MIN_KEEP = 256


class SlotCache:
    """``slots`` sequences of one llama.cpp cache: placing a request where the longest prefix of its sequence is,
    waiting on another's prefill, making room, preempting and resuming. Used by the engine's thread only."""

    def __init__(self, llama: LlamaContext, slots: int, host_bytes: int = 0) -> None:
        self.ll, self.memory, self.kv_tokens = llama.ll, llama.memory, llama.kv_tokens
        self.host = HostCache(llama.ll, llama.ctx, host_bytes) if host_bytes > 0 else None
        self.slots = [Slot(n) for n in range(slots)]
        self.paused: list[Paused] = []  # preempted requests, to resume before new ones
        self.left = 0  # requests that have left the batch, for resuming preempted ones
        self.preemptions = 0

    def running(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.running is not None]

    def free_slot(self) -> bool:
        return any(slot.running is None for slot in self.slots)

    def cached(self) -> int:
        """Cache positions held by idle slots (reusable prompts, cleared when space is needed)."""
        return sum(len(slot.tokens) for slot in self.slots if slot.running is None)

    def resume(self) -> None:
        """Put preempted requests back (they come before new ones), once a request has left since their preemption."""
        while self.paused and self.free_slot():
            paused = self.paused[0]
            if paused.request.generation.cancelled.is_set():
                self.paused.pop(0).request.generation.close()
                continue
            if self.running() and self.left <= paused.left:
                return
            self.paused.pop(0)
            self.place(paused.request)

    def place(self, req: Request) -> None:
        """Give ``req`` a slot, with the longest prefix of its sequence that any slot holds."""
        known = req.known
        # The last known token is always computed (its logits give the next token); a prompt to score, all of them.
        limit = 0 if req.scored is not None and not req.produced else len(known) - 1
        idle = [slot for slot in self.slots if slot.running is None]
        shared = {slot.seq_id: self._reusable(slot, min(common(slot.tokens, known), limit)) for slot in self.slots}
        source = max(self.slots, key=lambda slot: (shared[slot.seq_id], slot.running is None))
        parked, parked_shared = self.host.longest(known, limit) if self.host else (None, 0)
        if parked is not None and self._worth(parked_shared, len(parked.tokens)) > shared[source.seq_id]:
            slot = min(idle, key=lambda s: (bool(s.tokens), s.last_used))  # back from host memory
            self._park(slot)
            self.clear(slot)
            if self.host.restore(parked, slot.seq_id):  # type: ignore[union-attr]
                slot.tokens = list(parked.tokens)
                if not self.ll.llama_memory_seq_rm(self.memory, slot.seq_id, parked_shared, -1):
                    self.clear(slot)
                del slot.tokens[parked_shared:]
        elif shared[source.seq_id] and source.running is None and self._may_cut(source, shared[source.seq_id], idle):
            slot = source  # an idle slot holds the longest prefix: reuse it in place
            if not self.ll.llama_memory_seq_rm(self.memory, slot.seq_id, shared[slot.seq_id], -1):
                self.clear(slot)
            del slot.tokens[shared[slot.seq_id] :]
        else:  # a fresh slot (empty ones first, then the least recently used), with a running one's prefix if any
            slot = min(idle, key=lambda s: (shared[s.seq_id], bool(s.tokens), s.last_used))
            self._park(slot)
            self.clear(slot)
            self._copy(source, slot, shared[source.seq_id])
        req.todo = known[len(slot.tokens) :]
        if not req.produced:
            req.generation.cached_tokens = len(slot.tokens)
        # Another request may be computing a longer piece of this prompt right now: wait for it, not compute it twice.
        req.wait_for, req.wait_shared = None, 0
        for other in self.running():
            if other.running is not None and not other.running.produced and other is not slot:
                future = min(common(other.running.prompt, known), limit)
                if future >= len(slot.tokens) + _MIN_SHARED_WAIT and future > req.wait_shared:
                    req.wait_for, req.wait_shared = other, future
        slot.running = req
        for other in idle:
            if other is not slot and other.tokens and self._park(other):
                self.clear(other)

    def _reusable(self, slot: Slot, shared: int) -> int:
        """The prefix of an idle slot worth reusing (:meth:`_worth`); a running slot's, all of it (its cells are in
        every step's attention anyway)."""
        return shared if slot.running is not None else self._worth(shared, len(slot.tokens))

    def _worth(self, shared: int, held: int) -> int:
        """``shared`` tokens of a finished sequence of ``held``, or 0 where computing them again is better: with host
        memory, a short prefix (under :data:`_MIN_KEEP` tokens and a quarter of the sequence, llama-server's rule)
        of another conversation would keep its cells wherever that conversation had them, maybe far up the cache,
        and every step of the new request would attend over the span up to them."""
        if self.host is None or shared >= _MIN_KEEP or 4 * shared >= held:
            return shared
        return 0

    def _may_cut(self, slot: Slot, shared: int, idle: list[Slot]) -> bool:
        """Whether an idle slot may be cut to its first ``shared`` tokens for a new request: yes when that drops less
        than it keeps (the next turn of the same conversation), or once the rest is parked in host memory; otherwise
        (another conversation that only starts alike) only when no empty slot could take a copy of the prefix."""
        if len(slot.tokens) <= 2 * shared or self._park(slot):
            return True
        return not any(not other.tokens for other in idle)

    def _park(self, slot: Slot) -> bool:
        """Copy an idle slot's cells to host memory (nothing without a budget, or for an empty slot); True if
        parked, so the caller may clear the slot without losing its prefix."""
        return self.host is not None and bool(slot.tokens) and self.host.park(slot.seq_id, slot.tokens)

    def _copy(self, source: Slot, target: Slot, count: int) -> None:
        if count:
            self.ll.llama_memory_seq_cp(self.memory, source.seq_id, target.seq_id, 0, count)
            target.tokens = source.tokens[:count]

    def clear(self, slot: Slot) -> None:
        self.ll.llama_memory_seq_rm(self.memory, slot.seq_id, -1, -1)
        slot.tokens = []

    def trim(self, slot: Slot) -> None:
        """Free the slot's cells past its ``tokens`` (a draft's rejected tokens)."""
        self.ll.llama_memory_seq_rm(self.memory, slot.seq_id, len(slot.tokens), -1)

    def resolve_wait(self, slot: Slot) -> bool:
        """For a request waiting on another's prefill: copy the prefix once it is there; True while still waiting."""
        req = slot.running
        assert req is not None
        source = req.wait_for
        if source is None:
            return False
        if common(source.tokens, req.known) >= req.wait_shared:
            self.clear(slot)
            self._copy(source, slot, req.wait_shared)
            req.todo = req.known[req.wait_shared :]
            if not req.produced:
                req.generation.cached_tokens = req.wait_shared
        elif source.running is not None and common(source.running.prompt, req.known) >= req.wait_shared:
            return True  # the prefix is still being computed
        req.wait_for = None
        return False

    def make_room(self, entries: list[Entry]) -> bool:
        """Free cache cells: the oldest idle slot's, else preempt the youngest running request (recomputed later);
        a request alone that still does not fit ends with :class:`CacheFullError`. True: retry the plan."""
        idle = [slot for slot in self.slots if slot.running is None and slot.tokens]
        if idle:
            self.clear(min(idle, key=lambda slot: slot.last_used))
            return True
        running = self.running()
        victim = max(running, key=lambda slot: slot.running.admitted)  # type: ignore[union-attr]
        request, victim.running = victim.running, None
        assert request is not None
        self.clear(victim)
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
        self.paused.append(Paused(request, self.left))
        return bool(entries)

    def leave(self, slot: Slot) -> None:
        """The request leaves the batch at once; its slot keeps the cache as a reusable prefix."""
        request, slot.running = slot.running, None  # free before the client hears of it
        assert request is not None
        slot.last_used = time.monotonic()
        self.left += 1
        request.generation.close()
