"""turnkit's grammar inside vLLM's engine: a logits processor that masks what a request's llguidance grammar forbids.

``response_format`` and forced tool calls decode under the grammar :mod:`turnkit.serve.structured` builds, on vLLM as
on llama.cpp and torch. vLLM has structured outputs of its own (xgrammar or llguidance fed a schema or a grammar),
but they are not used, for three reasons:

* they need vLLM's tokenizer (``skip_tokenizer_init`` refuses them), and this engine runs without one, so that
  nothing in vLLM reads or writes text;
* a finished grammar lets only the tokenizer's one ``eos_token`` through, where a template ends a turn with its own
  marker (turnkit's stop ids: ``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>`` ...); vllm#49227 was that mismatch
  ending JSON early;
* a forced call must hold the template's own call syntax around the arguments (the start marker written for the
  model, the name, the arguments under the tool's schema, the end marker as its token id): that is the grammar
  :func:`~turnkit.serve.structured.forced_call` writes, the same one the other engines run.

So the request carries the grammar (llguidance's serialized form), its stop ids and where its tokenizer comes from in
``SamplingParams.extra_args["turnkit"]``, and :class:`TurnkitGrammar`, loaded by vLLM in its engine process
(``logits_processors``), compiles one matcher per request there, advances it by the tokens vLLM sampled, and sets
every token it does not allow to ``-inf`` before vLLM samples. The price against vLLM's own: the mask is computed on
the engine's step rather than beside the forward pass (llguidance takes tens of microseconds a token); requests
without a grammar pay nothing.

This module imports vLLM at its top: only the vllm engine (and vLLM's engine process) imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

__all__ = ["KEY", "TurnkitGrammar", "extra_args"]

#: The key of ``SamplingParams.extra_args`` a grammar request is under.
KEY = "turnkit"

_TOKENIZERS: dict[tuple[str, tuple[int, ...]], Any] = {}
_LOCK = threading.Lock()


def extra_args(grammar: str, stop_ids: Iterable[int], tokenizer: str | Path) -> dict[str, Any]:
    """What a request with a grammar tells the engine process: the grammar, the ids that may end it, and the model
    file or folder turnkit read its tokenizer from (the engine process reads the same one)."""
    return {KEY: {"grammar": grammar, "stop_ids": sorted(stop_ids), "tokenizer": str(tokenizer)}}


def _ll_tokenizer(source: str, stop_ids: tuple[int, ...]) -> Any:
    """llguidance's tokenizer of the model's tokenizer as turnkit reads it (a GGUF's or a folder's), ending on the
    template's stop ids; built once per model and stop set."""
    import llguidance

    from turnkit.tokenizer import TokenizerBinding

    with _LOCK:
        held = _TOKENIZERS.get((source, stop_ids))
        if held is None:
            path = Path(source)
            binding = TokenizerBinding.from_folder(path) if path.is_dir() else TokenizerBinding.from_gguf(path)
            held = llguidance.LLTokenizer(binding.backend.to_str(), eos_token=list(stop_ids))
            _TOKENIZERS[(source, stop_ids)] = held
    return held


class _Matcher:
    """One request's matcher: advanced by the request's output ids, then masking one row of logits."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import llguidance

        tokenizer = _ll_tokenizer(spec["tokenizer"], tuple(spec["stop_ids"]))
        self.matcher = llguidance.LLMatcher(tokenizer, spec["grammar"])
        self.size = tokenizer.vocab_size
        self.seen = 0

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        for token in output_ids[self.seen :]:
            self.matcher.consume_token(int(token))
        self.seen = len(output_ids)
        import numpy as np

        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: min(self.size, logits.shape[-1])].astype(bool)
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool)
        keep[: len(allowed)] = torch.from_numpy(allowed)
        return logits.masked_fill(~keep.to(logits.device), float("-inf"))


class TurnkitGrammar(AdapterLogitsProcessor):
    """vLLM's per-request logits processor for requests that carry ``extra_args["turnkit"]`` (:func:`extra_args`)."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is likeliest: greedy requests need it too

    def new_req_logits_processor(self, params: SamplingParams) -> Callable[[list[int], torch.Tensor], torch.Tensor]:
        spec = (params.extra_args or {}).get(KEY)
        return _Matcher(spec) if spec else None  # type: ignore[return-value]  # vLLM's own signature allows None
