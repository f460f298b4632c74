"""The one set of token ids that end a reply, resolved from the tokenizer and the format's declarations.

Encoding needs it to find where a trained turn ends (its end-of-turn marker is trained, so the model learns to stop);
parsing and serving need it to stop generating. Computing it once, here, keeps the two from drifting apart: the id a
training example ends a turn with is always an id the server stops on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from turnkit.tokenizer.binding import TokenizerBinding

__all__ = ["StopSet"]


@dataclass(frozen=True)
class StopSet:
    """The ids that end a reply, by kind.

    Attributes:
        end_of_turn: Control tokens that close an assistant turn (``<|im_end|>``, ``<|eot_id|>``): the format's
            declared end markers, its EOS token, and every EOS id the checkpoint declares that is an added token.
        eos: Other ids the checkpoint declares as end of sequence (tokenizer EOS, ``generation_config.json``'s list, a
            GGUF's eos/eot/eom) that are not added tokens.
    """

    end_of_turn: Mapping[int, str]
    eos: Mapping[int, str]

    @classmethod
    def build(cls, binding: TokenizerBinding, declared: Iterable[str]) -> StopSet:
        """From the tokenizer and the marker texts the format declares (a family's stop tokens, its EOS token)."""
        texts = {text for text in declared if text}
        texts.update(binding.by_id[i].content for i in binding.eos_ids if i in binding.by_id)
        end_of_turn = {binding.added[t].id: t for t in sorted(texts) if t in binding.added}
        # An EOS id that is an added token is an end-of-turn marker by now; the rest are plain vocabulary ids.
        eos = {i: binding.id_to_token(i) or "" for i in sorted(binding.eos_ids) if i not in end_of_turn}
        return cls(end_of_turn, eos)

    @property
    def texts(self) -> frozenset[str]:
        """The end-of-turn marker texts (each one control token of the tokenizer)."""
        return frozenset(self.end_of_turn.values())

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(self.end_of_turn) | frozenset(self.eos)
