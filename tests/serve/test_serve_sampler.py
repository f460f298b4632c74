"""The numpy sampler of the llama.cpp engine: the torch engine's semantics, checked against torch on the same logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkit.serve.engines.base import GenerationRequest
from turnkit.serve.engines.sampler import Sampler, _largest, _nucleus


def _logits(seed: int, scale: float, size: int = 4096) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=size) * scale).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), scale=st.floats(0.05, 10), top_p=st.floats(0.01, 0.999))
def test_the_nucleus_is_the_torch_engines(seed, scale, top_p):
    logits = _logits(seed, scale)
    probs = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=-1)
    sorted_probs, order = probs.sort(descending=True, stable=True)
    cut = sorted_probs.cumsum(0) - sorted_probs > top_p  # the torch engine's rule
    expected = order[~cut].tolist()
    ids, kept = _nucleus(probs.numpy(), top_p)
    assert ids.tolist() == expected
    assert kept.sum() == pytest.approx(float(sorted_probs[~cut].sum()))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), scale=st.floats(0.01, 10), k=st.integers(1, 20))
def test_the_largest_are_topk(seed, scale, k):
    logits = _logits(seed, scale)
    assert _largest(logits, k).tolist() == torch.tensor(logits).topk(k).indices.tolist()


def test_log_probabilities_are_the_models_own():
    logits = _logits(1, 3.0)
    event = Sampler(GenerationRequest([1], 4, temperature=0, top_logprobs=5))(logits)
    expected = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), dim=-1)
    values, indices = expected.topk(5)
    assert event.token_id == int(indices[0]) and event.logprob == pytest.approx(float(values[0]), abs=1e-5)
    assert [i for i, _ in event.top] == indices.tolist()
    assert [v for _, v in event.top] == pytest.approx(values.tolist(), abs=1e-5)


def test_a_seed_repeats_the_draws_and_no_seed_does_not():
    logits = _logits(2, 1.0)

    def draws(seed):
        sampler = Sampler(GenerationRequest([1], 4, temperature=1.0, top_p=0.95, seed=seed))
        return [sampler(logits).token_id for _ in range(30)]

    assert draws(7) == draws(7)
    assert draws(None) != draws(None)


def test_draws_follow_the_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    sampler = Sampler(GenerationRequest([1], 4, temperature=1.0, top_p=0.7, seed=0))
    counts = np.bincount([sampler(logits).token_id for _ in range(4000)], minlength=4)
    # top-p 0.7 keeps 0.5 and 0.3 (the token that crosses the line stays): 5/8 and 3/8
    assert counts[2:].sum() == 0 and counts[0] / 4000 == pytest.approx(0.625, abs=0.03)


def test_bias_and_penalties_adjust_the_logits_as_the_torch_engine():
    """Logit bias, then transformers' repetition penalty (prompt and reply), then OpenAI's presence and frequency
    penalties (reply only): the same arithmetic as ``TorchBackend._adjusted``, on chosen ids."""
    logits = _logits(3, 2.0, size=64)
    request = GenerationRequest(
        [5, 6],
        8,
        temperature=0,
        logit_bias={9: -100.0, 10: 3.0},
        repetition_penalty=2.0,
        presence_penalty=0.5,
        frequency_penalty=0.25,
    )
    sampler = Sampler(request)
    sampler.counts = {7: 2, 8: 1}  # the reply so far: 7 twice, 8 once
    adjusted = sampler._adjusted(logits.copy())
    expected = logits.astype(np.float64).copy()
    expected[9] -= 100.0
    expected[10] += 3.0
    for token in (5, 6, 7, 8):
        expected[token] = expected[token] / 2.0 if expected[token] > 0 else expected[token] * 2.0
    expected[7] -= 2 * 0.25 + 0.5
    expected[8] -= 1 * 0.25 + 0.5
    assert adjusted == pytest.approx(expected, abs=1e-4)


def test_a_grammar_masks_what_it_forbids_and_hears_each_token():
    class OnlyEven:
        def __init__(self):
            self.heard = []

        def mask_array(self, scores):
            return np.where(np.arange(len(scores)) % 2 == 0, scores, -np.inf).astype(scores.dtype)

        def consume(self, token):
            self.heard.append(token)

    grammar = OnlyEven()
    logits = _logits(4, 3.0, size=32)
    event = Sampler(GenerationRequest([1], 4, temperature=0, constraint=grammar))(logits)
    assert event.token_id % 2 == 0 and event.token_id == int(np.argmax(logits[::2])) * 2
    assert grammar.heard == [event.token_id]
