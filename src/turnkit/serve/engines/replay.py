"""A backend that plays scripted token ids: the tests use it for tool calls, which a 135M model does not make
reliably."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from turnkit.errors import BackendBusyError
from turnkit.serve.engines.inbox import Load
from turnkit.serve.engines.request import GenerationRequest, TokenEvent
from turnkit.serve.engines.stream import Generation
from turnkit.serve.request_fields import EngineKind

__all__ = ["ReplayBackend"]


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

    def engine_info(self) -> dict[str, object] | None:
        return None

    def describe(self) -> str | None:
        return None

    def stop_admitting(self, refusal: BackendBusyError) -> None:
        self._refusal = refusal

    def abort(self, error: BackendBusyError) -> None:
        self._refusal = error
        for generation in list(self._live):
            generation.fail(error)

    def close(self) -> None:
        pass
