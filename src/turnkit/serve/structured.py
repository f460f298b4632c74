"""Structured output: ``response_format`` ``json_object`` and ``json_schema`` by grammar-constrained decoding.

The grammar comes from llguidance: a JSON schema (``{"type": "object"}`` for ``json_object``) becomes a matcher
over the model's own tokenizer, and at every step the backend masks the tokens the matcher does not allow
(:class:`JsonConstraint`, the ``constraint`` of a :class:`~.backend.GenerationRequest`). The matcher allows the stop
token only once the JSON is complete, so a reply that ends by itself always parses. JSON is written compactly (no
free whitespace), which keeps a small model from wandering into endless blank space.

A reply cut short (``max_tokens``, a stop string) is not JSON: :func:`checked` turns it into a 400
``incomplete_json`` error rather than a 200 with text that does not parse (in a stream, an error event before
``[DONE]``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any

from turnkit.format import ChatFormat
from turnkit.serve.protocol import APIError

__all__ = ["JsonConstraint", "checked", "constraint_for"]

_TOKENIZERS: dict[int, Any] = {}  # id of a tokenizers.Tokenizer -> (that tokenizer, its llguidance tokenizer)
_LOCK = threading.Lock()


def _ll_tokenizer(fmt: ChatFormat) -> Any:
    """The llguidance tokenizer of a format's tokenizer, built once (about a second) and kept."""
    import llguidance

    backend = fmt.tokenizer.backend
    with _LOCK:
        held = _TOKENIZERS.get(id(backend))
        if held is None or held[0] is not backend:
            held = (backend, llguidance.LLTokenizer(backend.to_str(), eos_token=sorted(fmt.stop_ids)))
            _TOKENIZERS[id(backend)] = held
    return held[1]


class JsonConstraint:
    """One reply's grammar matcher: :meth:`mask` sets disallowed logits to ``-inf``, :meth:`consume` advances."""

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        import llguidance

        self.matcher = llguidance.LLMatcher(tokenizer, grammar)
        self.size = tokenizer.vocab_size
        if self.matcher.is_error():
            raise APIError(400, f"response_format: {self.matcher.get_error()}", param="response_format")

    def _allowed(self, size: int) -> Any:
        """A boolean array over ``size`` logits: True where the grammar allows the token (rows past the tokenizer's
        vocabulary never are)."""
        import numpy as np

        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self.size].astype(bool)
        keep = np.zeros(size, dtype=bool)
        keep[: min(len(allowed), size)] = allowed[:size]
        return keep

    def mask(self, scores: Any) -> Any:
        """``scores`` (a 1-D torch tensor of logits) with every token the grammar forbids at ``-inf``."""
        import torch

        keep = torch.from_numpy(self._allowed(scores.shape[-1]))
        return scores.masked_fill(~keep.to(scores.device), float("-inf"))

    def mask_array(self, scores: Any) -> Any:
        """The same for a 1-D numpy array of logits (the llama.cpp engine's sampler)."""
        import numpy as np

        return np.where(self._allowed(scores.shape[-1]), scores, -np.inf).astype(scores.dtype, copy=False)

    def consume(self, token_id: int) -> None:
        self.matcher.consume_token(token_id)


def constraint_for(fmt: ChatFormat, response_format: dict[str, Any] | None) -> Callable[[], JsonConstraint] | None:
    """A maker of one :class:`JsonConstraint` per choice, or ``None`` for a plain text reply. A schema llguidance
    cannot compile is a 400 naming ``response_format``. Slow the first time for a tokenizer: call it in a thread."""
    if response_format is None:
        return None
    import llguidance

    schema = response_format.get("schema") if response_format["type"] == "json_schema" else None
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema or {"type": "object"}, defaults={"whitespace_flexible": False}
        )
    except (ValueError, TypeError) as exc:
        raise APIError(
            400, f"response_format: the JSON schema cannot be used: {exc}", param="response_format"
        ) from None
    tokenizer = _ll_tokenizer(fmt)
    JsonConstraint(tokenizer, grammar)  # compile once now: a bad schema is a 400 before anything generates
    return lambda: JsonConstraint(tokenizer, grammar)


async def checked(chunks: AsyncGenerator[dict[str, Any], None]) -> AsyncGenerator[dict[str, Any], None]:
    """The chat chunks, unchanged, then a check that every choice's content is whole JSON: a reply cut short is a
    400 ``incomplete_json`` (raised before the usage chunk, so a whole response is never folded from it)."""
    contents: dict[int, list[str]] = {}
    finishes: dict[int, str | None] = {}
    try:
        async for chunk in chunks:
            if not chunk["choices"]:
                for index, parts in sorted(contents.items()):
                    _check_json("".join(parts), finishes.get(index), index)
            for choice in chunk["choices"]:
                contents.setdefault(choice["index"], []).append(choice["delta"].get("content") or "")
                finishes[choice["index"]] = choice["finish_reason"] or finishes.get(choice["index"])
            yield chunk
    finally:
        await chunks.aclose()


def _check_json(text: str, finish: str | None, index: int) -> None:
    try:
        json.loads(text)
    except ValueError:
        why = "max_tokens" if finish == "length" else "a stop string or the end of the reply"
        raise APIError(
            400,
            f"choice {index}: the JSON reply was cut short by {why} before it was complete; raise max_tokens "
            "(the reply would not parse)",
            param="max_tokens" if finish == "length" else "response_format",
            code="incomplete_json",
        ) from None
