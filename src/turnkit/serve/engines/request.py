"""What an engine is asked and what it answers: a :class:`GenerationRequest` (prompt ids, the samplers, the budget,
the stop ids, a grammar) in, :class:`TokenEvent` objects out.

A grammar reaches an engine as a :class:`TokenConstraint`, one interface for the three ways engines apply it: the
numpy sampler masks an array of logits, the torch engine a tensor, and vLLM, which runs its own matcher in its engine
process, takes the grammar's text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from turnkit.serve.request_fields import SamplerValues

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["GenerationRequest", "TokenConstraint", "TokenEvent"]


class TokenConstraint(Protocol):
    """One reply's grammar (:class:`turnkit.serve.structured.JsonConstraint`): it masks the tokens the grammar does
    not allow next, and is told each token the reply takes."""

    #: The grammar's text (llguidance's), for an engine that compiles and runs its own matcher (vLLM's).
    grammar: str

    def consume(self, token_id: int) -> None:
        """Advance past ``token_id``, a token the reply took."""
        ...

    def mask_array(self, scores: np.ndarray) -> np.ndarray:
        """``scores`` (a numpy row of logits) with every token the grammar forbids at ``-inf``."""
        ...

    def mask(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` (a 1-D torch tensor of logits) with every token the grammar forbids at ``-inf``."""
        ...


@dataclass(frozen=True)
class GenerationRequest(SamplerValues):
    """Prompt ids and how to sample: the samplers (:class:`~turnkit.serve.request_fields.SamplerValues`, keyword
    arguments; ``temperature == 0`` is greedy decoding) and the fields below. Every default changes nothing, and the
    server refuses a request that sets a field its engine does not honour (declared in
    :mod:`turnkit.serve.request_fields`), so an engine reads only what it honours.

    * ``top_k`` (0: off), ``min_p`` (0: off): keep the ``top_k`` likeliest tokens / those at least ``min_p`` times
      as likely as the likeliest;
    * ``repetition_penalty`` (1: off): transformers' penalty on every token of the prompt and the reply so far;
    * ``presence_penalty``, ``frequency_penalty`` (0: off): OpenAI's, on the reply's tokens so far;
    * ``logit_bias``: added to the logits of those token ids (-100 bans, 100 forces);
    * ``constraint``: a grammar matcher (:mod:`.structured`) that masks tokens the grammar does not allow;
    * ``prompt_logprobs``: set :attr:`Generation.prompt` (``/v1/completions`` with ``echo`` and ``logprobs``).
    """

    prompt_ids: Sequence[int]
    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    seed: int | None = None
    top_logprobs: int | None = None  # None: no log-probabilities; 0: the chosen token's only
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    constraint: TokenConstraint | None = None
    prompt_logprobs: int | None = None  # None: none; k: each prompt token's log-probability and k alternatives


@dataclass(frozen=True)
class TokenEvent:
    """One generated token, with its log-probability and the most likely alternatives when asked for."""

    token_id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
