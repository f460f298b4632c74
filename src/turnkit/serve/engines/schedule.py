"""The llama.cpp engine's state and its plan for one step: which tokens of which request the next ``llama_decode``
computes.

A step is one batch. Its plan, in order:

* every decoding request's last sampled token (its logits give the next token), and, for a few streams, tokens
  drafted from the context (:mod:`.speculate`), verified in the same batch;
* then prompt tokens, **first come, first served**: the budget goes to the oldest admitted request first (its whole
  prompt before a younger one's first chunk), as vLLM's scheduler does. Prefilling everyone admitted together would
  make every first token wait for nearly all the prefill: sixteen 3,000-token prompts sent at once had their first
  tokens after 400 s, all of them; in arrival order the first is answered after one prompt's prefill, the second
  after two. A request whose prefix another one is still computing waits for it (``wait_for``) and is skipped.

The budget follows the load. While any stream decodes, ``chunk`` prompt tokens a step (128 by default: about half a
second of this machine kind's two cores), so that the running replies keep their pace; when nothing decodes nobody
waits on the step, and a prompt is read ``batch`` tokens at a time (the whole batch: fewer, larger matrix products).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from turnkit.serve.engines.base import Generation, GenerationRequest, TokenEvent

if TYPE_CHECKING:
    from turnkit.serve.engines.sampler import Sampler
    from turnkit.serve.engines.speculate import Drafter

__all__ = ["Entry", "Paused", "Request", "Slot", "common", "plan"]

_ARRIVALS = itertools.count()


@dataclass
class Request:
    """A running request: what is left to feed (the prompt's rest, or the last sampled token) and how to sample."""

    request: GenerationRequest
    generation: Generation
    sampler: Sampler
    prompt: list[int]
    todo: list[int]
    generated: list[int] = field(default_factory=list)
    admitted: float = field(default_factory=time.monotonic)
    arrival: int = field(default_factory=lambda: next(_ARRIVALS))  # admission order, ties impossible
    wait_for: Slot | None = None  # a slot still prefilling this request's prefix
    wait_shared: int = 0
    scored: list[TokenEvent] | None = None  # with prompt_logprobs: the prompt's tokens scored so far
    drafter: Drafter | None = None  # speculative decoding from the context (None: off)

    @property
    def produced(self) -> int:
        return len(self.generated)

    @property
    def known(self) -> list[int]:
        """Every token of the sequence so far: the prompt, then what was generated (the last one not yet fed)."""
        return self.prompt + self.generated


@dataclass
class Slot:
    """One llama.cpp sequence id and the token ids whose keys and values it holds (positions 0..len-1)."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    running: Request | None = None
    last_used: float = 0.0


@dataclass
class Paused:
    """A preempted request, and how many requests had left when it was preempted: it resumes once one more has."""

    request: Request
    left: int


@dataclass
class Entry:
    """What one slot feeds in a step: ``tokens`` at its next positions; ``sample``: the last fed token's logits give
    the request's next token (a decoding request, or a prompt's last chunk); its last ``drafts`` tokens are a draft,
    each of which has its logits computed too, to be verified."""

    slot: Slot
    tokens: list[int]
    sample: bool
    drafts: int = 0


def plan(
    decoding: list[Slot],
    prefilling: list[Slot],
    *,
    chunk: int,
    batch: int,
    draft: Callable[[Request, int, int], list[int]] | None = None,
    draft_streams: int = 0,
    context: int,
) -> list[Entry]:
    """One step's entries (see the module's docstring). ``decoding``: slots whose request has its next token to feed;
    ``prefilling``: slots with prompt tokens left (and no prefix to wait for). ``draft(request, room, planned)``: at
    most ``room`` drafted tokens for a request, the step having ``planned`` tokens so far (one for each decoding
    stream, and the drafts made before); drafts are made only while at most ``draft_streams`` requests decode, and
    never past the request's ``max_tokens`` or the ``context``. Every token fits in ``batch``."""
    oldest = sorted(decoding, key=_age)
    entries: list[Entry] = []
    room = batch - len(oldest)
    planned = len(oldest)  # the step's tokens so far: one a stream, and the drafts made
    for slot in oldest:
        req = slot.running
        assert req is not None
        drafted: list[int] = []
        if draft is not None and len(oldest) <= draft_streams and room > 0:
            # the draft's tokens need cache cells the request was promised: the budget's and the context's rest
            left = min(req.request.max_tokens - req.produced - 1, context - len(slot.tokens) - 1)
            drafted = draft(req, min(room, left), planned) if left > 0 else []
            room -= len(drafted)
            planned += len(drafted)
        entries.append(Entry(slot, req.todo + drafted, True, len(drafted)))
    budget = min(chunk if oldest else batch, room)
    for slot in sorted(prefilling, key=_age):
        if budget <= 0:
            break
        todo = slot.running.todo  # type: ignore[union-attr]
        piece = todo[:budget]
        entries.append(Entry(slot, piece, len(piece) == len(todo)))
        budget -= len(piece)
    return entries


def _age(slot: Slot) -> int:
    """Arrival order: the order requests were admitted in (a preempted one keeps its place, so it comes first
    again)."""
    assert slot.running is not None
    return slot.running.arrival


def common(a: list[int], b: list[int]) -> int:
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
