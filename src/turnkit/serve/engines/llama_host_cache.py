"""The llama.cpp engine's prompt cache in host memory: finished requests' keys and values, parked off the KV cache.

Why. All slots share one unified key/value cache, and every step's attention runs over each cell up to the highest
one in use: cells of other sequences are masked off, but not free. On this machine kind's CPU a 4,600-token prompt
took 18 s instead of 14 s once sixteen short finished requests had kept their prefixes in the cache beside an earlier
conversation's, and each later turn of a conversation paid the same way. llama-server has done the following since
its host-memory prompt cache (ggml-org/llama.cpp#16391, ``--cache-ram``), and this does it too: when a request is
placed, every idle slot except the one it reuses is *parked* here (its sequence's state, read with
``llama_state_seq_get_data``) and cleared from the cache, and a later prompt that starts with a parked one's tokens
gets them back (``llama_state_seq_set_data``) instead of computing them: a copy of tens of milliseconds for a
conversation of thousands of tokens, against seconds. The least recently used entries go when ``budget`` bytes are
exceeded; an entry whose tokens begin a newer one's is dropped, the newer one holds them.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Any

from turnkit.serve.engines.schedule import common

__all__ = ["HostCache", "Parked"]


@dataclass
class Parked:
    """A sequence's tokens and its state as llama.cpp wrote it."""

    tokens: list[int]
    data: Any  # a ctypes array of bytes
    size: int
    last_used: float = field(default_factory=time.monotonic)


class HostCache:
    """Parked sequences of one llama.cpp context, at most ``budget`` bytes. Used by the engine's thread only."""

    def __init__(self, ll: Any, ctx: Any, budget: int) -> None:
        self.ll, self.ctx, self.budget = ll, ctx, budget
        self.entries: list[Parked] = []
        self.used = 0

    def park(self, seq_id: int, tokens: list[int]) -> bool:
        """Copy sequence ``seq_id`` (holding ``tokens``) here; False when it does not fit or llama.cpp wrote
        nothing (the caller keeps it in the cache then)."""
        size = int(self.ll.llama_state_seq_get_size(self.ctx, seq_id))
        if not tokens or size == 0 or size > self.budget:
            return False
        data = (ctypes.c_uint8 * size)()
        written = int(self.ll.llama_state_seq_get_data(self.ctx, data, size, seq_id))
        if written == 0:
            return False
        for entry in [e for e in self.entries if common(e.tokens, tokens) == len(e.tokens)]:
            self._drop(entry)
        self.entries.append(Parked(list(tokens), data, written))
        self.used += written
        while self.used > self.budget:
            self._drop(min(self.entries, key=lambda entry: entry.last_used))
        return True

    def longest(self, known: list[int], limit: int) -> tuple[Parked | None, int]:
        """The entry sharing the longest prefix with ``known`` (at most ``limit`` tokens), and that length."""
        best, shared = None, 0
        for entry in self.entries:
            length = min(common(entry.tokens, known), limit)
            if length > shared:
                best, shared = entry, length
        return best, shared

    def restore(self, entry: Parked, seq_id: int) -> bool:
        """Put ``entry`` back into the cache as sequence ``seq_id`` (which must be empty) and forget it here; False
        when llama.cpp could not place it (a cache too full or too fragmented for it: the prompt is computed then)."""
        self._drop(entry)
        return int(self.ll.llama_state_seq_set_data(self.ctx, entry.data, entry.size, seq_id)) != 0

    @property
    def tokens(self) -> int:
        """Tokens held here, for the server's logs."""
        return sum(len(entry.tokens) for entry in self.entries)

    def _drop(self, entry: Parked) -> None:
        self.entries.remove(entry)
        self.used -= entry.size
