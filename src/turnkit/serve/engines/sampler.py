"""Choosing the next token from a row of logits, in numpy: what an engine that hands back raw logits needs.

The semantics are the torch engine's, so that a request means the same thing on either engine. The logits are first
adjusted: logit bias, transformers' repetition penalty (on every token of the prompt and the reply so far), OpenAI's
presence and frequency penalties (on the reply's tokens). Then greedy (the argmax) at ``temperature == 0``; otherwise
softmax at the temperature, top-k, min-p, and nucleus (top-p) truncation that keeps the smallest set of likeliest
tokens whose probability reaches ``top_p`` (the token that crosses the line is kept), then one draw from a
per-request random generator, so a request with a ``seed`` draws the same tokens every time. Log-probabilities are of
the model's own distribution (before any adjustment), as OpenAI reports them.

A ``response_format`` grammar (``request.constraint``) masks the tokens it does not allow and is told each token
chosen, as on the torch engine. The draw uses numpy's generator, not torch's: the same seed gives
reproducible replies on each engine, not the same reply on both (their logits differ anyway: llama.cpp computes with
the quantized weights).
"""

from __future__ import annotations

import numpy as np
import numpy.random  # numpy loads it lazily: ~10 ms of the first sampled reply otherwise

from turnkit.serve.engines.base import GenerationRequest, TokenEvent

__all__ = ["Sampler", "log_probability"]


class Sampler:
    """One request's token choice: its random generator (seeded when the request has a seed) and its reply so far."""

    def __init__(self, request: GenerationRequest) -> None:
        self.request = request
        self.rng = np.random.default_rng(request.seed) if request.temperature > 0 else None
        self.counts: dict[int, int] = {}  # generated token id -> times, for the penalties
        self.top_k = request.top_k
        self.min_p = request.min_p
        self.repetition_penalty = request.repetition_penalty
        self.presence_penalty = request.presence_penalty
        self.frequency_penalty = request.frequency_penalty
        bias = dict(request.logit_bias)
        self.bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self.bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self.prompt_ids = set(request.prompt_ids) if self.repetition_penalty != 1.0 else set()

    def __call__(self, logits: np.ndarray) -> TokenEvent:
        """The next token for one row of logits (float32, one value per vocabulary entry)."""
        request = self.request
        scores = self._adjusted(logits)
        token = int(np.argmax(scores)) if self.rng is None else self._draw(scores)
        self.counts[token] = self.counts.get(token, 0) + 1
        if request.constraint is not None:
            request.constraint.consume(token)
        if request.top_logprobs is None:
            return TokenEvent(token)
        return log_probability(logits, token, request.top_logprobs)

    def _adjusted(self, logits: np.ndarray) -> np.ndarray:
        """The logits after bias and penalties (the row itself when none applies)."""
        scores = logits
        if len(self.bias_ids):
            scores = scores.copy()
            scores[self.bias_ids] += self.bias_values
        if self.repetition_penalty != 1.0:
            seen = np.fromiter(self.prompt_ids | self.counts.keys(), dtype=np.int64)
            scores = scores.copy()
            values = scores[seen]
            penalty = self.repetition_penalty
            scores[seen] = np.where(values > 0, values / penalty, values * penalty)
        if (self.presence_penalty or self.frequency_penalty) and self.counts:
            ids = np.fromiter(self.counts.keys(), dtype=np.int64, count=len(self.counts))
            times = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
            scores = scores.copy()
            scores[ids] -= times * self.frequency_penalty + self.presence_penalty
        if self.request.constraint is not None:
            scores = self.request.constraint.mask_array(scores)
        return scores

    def _draw(self, scores: np.ndarray) -> int:
        assert self.rng is not None
        scaled = scores.astype(np.float64) / self.request.temperature
        probs = np.exp(scaled - scaled.max())
        if 0 < self.top_k < len(probs):
            probs[probs < probs[_largest(probs, self.top_k)[-1]]] = 0.0
        if self.min_p > 0:
            probs[probs < self.min_p * probs.max()] = 0.0
        probs /= probs.sum()
        order = None
        if self.request.top_p < 1.0:
            order, probs = _nucleus(probs, self.request.top_p)
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right"))
        index = min(index, len(probs) - 1)
        return int(order[index]) if order is not None else index


def log_probability(logits: np.ndarray, token: int, top: int) -> TokenEvent:
    """``token`` with its log-probability under ``logits`` (the model's own distribution) and the ``top`` likeliest."""
    peak = float(logits.max())
    log_total = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
    best: tuple[tuple[int, float], ...] = ()
    if top:
        best = tuple((int(i), float(logits[i]) - log_total) for i in _largest(logits, top))
    return TokenEvent(token, float(logits[token]) - log_total, best)


# Sorting or partitioning the whole vocabulary costs milliseconds per token; comparing it with a threshold costs
# microseconds. Both helpers below pick candidates by threshold, loosening it until the answer is surely among them,
# and sort only those.


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` largest values, largest first (ties in index order)."""
    peak = float(values.max())
    margin = 4.0
    while True:
        candidates = np.flatnonzero(values >= peak - margin)
        if len(candidates) >= k or not np.isfinite(margin):
            break
        margin *= 4
    return candidates[np.argsort(-values[candidates], kind="stable")][:k]


def _nucleus(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The token ids of the nucleus, likeliest first, and their probabilities.

    Tokens at or above a threshold whose total exceeds ``top_p`` hold the whole nucleus: any token below it comes after
    more than ``top_p`` of the mass, so it would be cut anyway.
    """
    threshold = float(probs.max()) * 1e-3
    while True:
        candidates = np.flatnonzero(probs >= threshold)
        if probs[candidates].sum() > top_p or len(candidates) == len(probs) or threshold == 0.0:
            break
        threshold = threshold * 1e-3 if threshold > 1e-300 else 0.0
    candidates = candidates[np.argsort(-probs[candidates], kind="stable")]
    sorted_probs = probs[candidates]
    keep = np.cumsum(sorted_probs) - sorted_probs <= top_p
    return candidates[keep], sorted_probs[keep]
