"""Choosing the next token from a row of logits, in numpy: what an engine that hands back raw logits needs.

The semantics are the torch engine's, so that a request means the same thing on either engine: greedy (the argmax) at
``temperature == 0``; otherwise softmax of ``logits / temperature``, then nucleus (top-p) truncation that keeps the
smallest set of likeliest tokens whose probability reaches ``top_p`` (the token that crosses the line is kept), then
one draw from a per-request random generator, so a request with a ``seed`` draws the same tokens every time.
Log-probabilities are of the model's own distribution (before temperature and top-p), as OpenAI reports them.

The draw uses numpy's generator, not torch's: the same seed gives reproducible replies on each engine, not the same
reply on both (their logits differ anyway: llama.cpp computes with the quantized weights).
"""

from __future__ import annotations

import numpy as np

from turnkit.serve.backend import GenerationRequest, TokenEvent

__all__ = ["Sampler"]


class Sampler:
    """One request's token choice; holds the request's random generator (seeded when the request has a seed)."""

    def __init__(self, request: GenerationRequest) -> None:
        self.request = request
        self.rng = np.random.default_rng(request.seed) if request.temperature > 0 else None

    def __call__(self, logits: np.ndarray) -> TokenEvent:
        """The next token for one row of logits (float32, one value per vocabulary entry)."""
        request = self.request
        token = int(np.argmax(logits)) if self.rng is None else self._draw(logits)
        if request.top_logprobs is None:
            return TokenEvent(token)
        shifted = logits - logits.max()
        logprobs = shifted - np.log(np.exp(shifted, dtype=np.float64).sum())
        top: tuple[tuple[int, float], ...] = ()
        if request.top_logprobs:
            k = request.top_logprobs
            best = np.argpartition(-logprobs, k - 1)[:k]
            best = best[np.argsort(-logprobs[best], kind="stable")]
            top = tuple((int(i), float(logprobs[i])) for i in best)
        return TokenEvent(token, float(logprobs[token]), top)

    def _draw(self, logits: np.ndarray) -> int:
        assert self.rng is not None
        scaled = logits.astype(np.float64) / self.request.temperature
        scaled -= scaled.max()
        probs = np.exp(scaled)
        probs /= probs.sum()
        if self.request.top_p < 1.0:
            order, probs = _nucleus(probs, self.request.top_p)
        else:
            order = None
        cumulative = np.cumsum(probs)
        index = min(int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right")), len(probs) - 1)
        return int(order[index]) if order is not None else index


def _nucleus(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The token ids of the nucleus, likeliest first, and their probabilities.

    A full sort of the vocabulary costs milliseconds per token; the nucleus is usually a few dozen tokens, so the
    likeliest ``k`` are partitioned out and sorted, doubling ``k`` until they hold more than ``top_p``.
    """
    size = len(probs)
    k = 64
    while True:
        k = min(k, size)
        best = np.argpartition(-probs, k - 1)[:k] if k < size else np.arange(size)
        best = best[np.argsort(-probs[best], kind="stable")]
        sorted_probs = probs[best]
        keep = np.cumsum(sorted_probs) - sorted_probs <= top_p
        if not keep[-1] or k == size:
            return best[keep], sorted_probs[keep]
        k *= 4
