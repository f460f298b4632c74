"""``turnkit.add_chatml(model, tokenizer)``: give a base model the ChatML format, in memory.

The steps of seed 000 ("Adding ChatML to a base model"), each checked: the markers become single special ids
(:mod:`~turnkit.chatml.tokens`), the embeddings and head grow with mean-initialised rows
(:mod:`~turnkit.chatml.weights`), the chat template is ChatML (:mod:`~turnkit.chatml.template`), and EOS is
``<|im_end|>`` everywhere generation reads it: the tokenizer, ``model.config`` and ``model.generation_config``, as
lists that keep the old EOS. Unlike TRL's ``clone_chat_template`` nothing is downloaded, new rows are not random, and
the vocabulary is padded only when asked.

>>> changes = add_chatml(model, tokenizer, system_prompt="You are a helpful assistant.")
>>> changes.lora["modules_to_save"]            # ['embed_tokens', 'lm_head'] for a Llama
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnkit import families
from turnkit.chatml.template import IM_END, IM_START, chatml_template
from turnkit.chatml.tokens import TokenChanges, add_tokens
from turnkit.chatml.weights import Init, WeightChanges, resize
from turnkit.errors import ChatMLError, FamilyNotFoundError

__all__ = ["ChatMLChanges", "add_chatml", "describe_template"]


@dataclass(frozen=True)
class ChatMLChanges:
    """What :func:`add_chatml` changed: token ids, rows, EOS ids, the template, and the LoRA advice."""

    tokens: TokenChanges
    weights: WeightChanges
    template: str
    #: The stop ids written to the configs: ``<|im_end|>`` first, then the base's (tokenizer EOS, config lists).
    eos_ids: list[int]

    @property
    def new_token_ids(self) -> list[int]:
        """The ids of the markers and pad whose rows were added here (untrained until fine-tuned)."""
        t = self.tokens
        return sorted({i for i in (t.im_start_id, t.im_end_id, t.pad_id) if i in self.weights.initialised})

    @property
    def lora(self) -> dict[str, Any]:
        """What a LoRA fine-tune must train in full: the embeddings and the head, by their real module names.

        ``modules_to_save`` holds the last part of each name (PEFT matches entries as name suffixes); without it the
        new rows stay untrained and the fine-tune never learns to write ``<|im_end|>``: it never stops.
        """
        names = [self.weights.embeddings, *([self.weights.head] if self.weights.head else [])]
        return {
            "modules_to_save": [name.rsplit(".", 1)[-1] for name in names],
            "embeddings": self.weights.embeddings,
            "head": self.weights.head,
            "tied": self.weights.tied,
            # PEFT keeps a tied model's one matrix shared only when asked (LoraConfig(ensure_weight_tying=True))
            "ensure_weight_tying": self.weights.tied,
            "new_token_ids": self.new_token_ids,
            "why": "the rows of the added tokens start untrained: LoRA alone never trains them, so a chat fine-tune "
            "without these modules never learns to write <|im_end|> (it never stops)",
        }

    def summary(self) -> str:
        """What changed, in lines a person reads after ``turnkit add-chatml``."""
        t, w = self.tokens, self.weights
        reused = [m for m in (IM_START, IM_END, t.pad_token) if m not in t.added]
        lines = [
            f"markers: {IM_START} = {t.im_start_id}, {IM_END} = {t.im_end_id} (single special ids)",
            f"pad: {t.pad_token} = {t.pad_id}",
            f"added to the vocabulary: {', '.join(t.added) or 'nothing'}"
            + (f"; reused: {', '.join(dict.fromkeys(reused))}" if reused else ""),
            f"vocabulary: {t.old_size} -> {t.new_size} tokens; embedding rows {w.old_rows} -> {w.new_rows} "
            f"({'tied' if w.tied else 'untied'} head, new rows: {w.init})",
            f"EOS: {IM_END} in the tokenizer; eos_token_id {self.eos_ids} in config.json and generation_config.json"
            + (f" ({IM_END} first, then the base's stop ids)" if len(self.eos_ids) > 1 else ""),
            f"LoRA: train the embeddings and the head in full: modules_to_save={self.lora['modules_to_save']}"
            + (", ensure_weight_tying=True (tied: one matrix)" if w.tied else "")
            + " (without it the new rows never learn and the model never stops)",
        ]
        return "\n".join(lines)


def describe_template(template: Any) -> str:
    """A short name for a chat template, for messages: its family when turnkit knows it, and its first line."""
    if isinstance(template, dict):
        return "templates " + ", ".join(sorted(template))
    text = str(template)
    try:
        family = f"the {families.infer(text).name} family's shape, "
    except FamilyNotFoundError:
        family = ""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{family}starting {first[:80]!r}"


def check_template(current: Any, wanted: str, *, force: bool, where: str = "the tokenizer") -> None:
    """Refuse to replace a different chat template unless ``force``; the same ChatML template is fine."""
    if current and current != wanted and not force:
        raise ChatMLError(
            f"{where} already has a chat template ({describe_template(current)}); add-chatml replaces it only with "
            "--force (force=True), since a model fine-tuned on one format should not be served with another"
        )


def _ids(value: Any) -> list[int]:
    """An ``eos_token_id`` setting (an id, a list of ids, or None) as a list."""
    if isinstance(value, int):
        return [value]
    return [i for i in value if isinstance(i, int)] if isinstance(value, (list, tuple)) else []


def _set_eos(config: Any, eos_ids: list[int], pad_id: int) -> None:
    config.eos_token_id = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    config.pad_token_id = pad_id


def add_chatml(
    model: Any,
    tokenizer: Any,
    *,
    system_prompt: str | None = None,
    pad_to_multiple_of: int | None = None,
    init: Init = "mean",
    force: bool = False,
) -> ChatMLChanges:
    """Give ``model`` and ``tokenizer`` (transformers objects) the ChatML format, in place, and say what changed.

    Args:
        system_prompt: A default system turn, written when a conversation does not start with one.
        pad_to_multiple_of: Round the embedding rows up to a multiple of this (64 suits GPUs); unused rows are not
            tokens of the tokenizer.
        init: New rows at the ``"mean"`` of the old rows (default), or ``"random"``.
        force: Replace a chat template the tokenizer already has (otherwise :class:`ChatMLError` names it).

    Raises:
        ChatMLError: Another template without ``force``, a marker that does not become one special id, a bad option.
    """
    template = chatml_template(system_prompt)
    check_template(tokenizer.chat_template, template, force=force)
    if init not in ("mean", "random"):
        raise ChatMLError(f"init must be 'mean' or 'random', not {init!r}")
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise ChatMLError(f"pad_to_multiple_of must be a positive number of rows, not {pad_to_multiple_of}")
    tokens = add_tokens(tokenizer, template)  # nothing is changed before every option is checked
    weights = resize(
        model,
        len(tokenizer),
        new_ids=tokens.added_ids,
        known_tokens=tokens.old_size,
        pad_to_multiple_of=pad_to_multiple_of,
        init=init,
    )
    generation = getattr(model, "generation_config", None)
    before = [*tokens.eos_ids, *_ids(model.config.eos_token_id), *_ids(getattr(generation, "eos_token_id", None))]
    eos_ids = list(dict.fromkeys(before))  # <|im_end|> first, every stop id the base had kept, in order
    _set_eos(model.config, eos_ids, tokens.pad_id)
    if generation is not None:
        _set_eos(generation, eos_ids, tokens.pad_id)
        generation.eos_token_id = eos_ids  # a list here always: generate() stops on any of them
    return ChatMLChanges(tokens, weights, template, eos_ids)
