"""The tokenizer side of add-chatml: the two markers as single special ids, a pad token, EOS, the template.

A marker that the vocabulary already holds (as an added token or a plain entry) keeps its id and is flagged special,
so its string in a render always becomes that one id; only missing markers are appended. The pad token must not be
``<|im_end|>``: a collator that masks labels where ``input_ids == pad_token_id`` would then mask every end of turn and
the model would never learn to stop. An existing pad is kept, else an end-of-text token the vocabulary already has,
else ``<|pad|>`` is added.

EOS becomes ``<|im_end|>``. The base's old EOS stays a stop id (in the lists :mod:`~turnkit.chatml.convert` writes
to the configs): a model that sometimes still writes it then stops instead of running on (seed 000: "add both as
stop IDs rather than patching output text").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnkit.chatml.template import IM_END, IM_START
from turnkit.errors import ChatMLError

__all__ = ["PAD", "TokenChanges", "add_tokens"]

PAD = "<|pad|>"

#: Tokens a base vocabulary may already have that make a good pad (never written by the ChatML template).
_PAD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "<|pad|>", "<pad>", "[PAD]", "</s>")


@dataclass(frozen=True)
class TokenChanges:
    """What :func:`add_tokens` did to a tokenizer.

    Attributes:
        im_start_id: The id of ``<|im_start|>``.
        im_end_id: The id of ``<|im_end|>`` (the new EOS).
        pad_token: The pad token (never ``<|im_end|>``), and ``pad_id`` its id.
        added: The token strings that were new to the vocabulary (reused ones are not listed), ``added_ids`` theirs.
        old_eos: The base's EOS token and id (None when it had none); kept as a stop id.
        eos_ids: The stop ids in order: ``<|im_end|>`` first, then the old EOS when it differs.
        old_size: ``len(tokenizer)`` before, and ``new_size`` after.
    """

    im_start_id: int
    im_end_id: int
    pad_token: str
    pad_id: int
    added: tuple[str, ...]
    added_ids: tuple[int, ...]
    old_eos: str | None
    old_eos_id: int | None
    eos_ids: tuple[int, ...]
    old_size: int
    new_size: int


def _special(token: str) -> Any:
    from tokenizers import AddedToken

    return AddedToken(token, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)


def _choose_pad(tokenizer: Any) -> str:
    current = tokenizer.pad_token
    if current and current != IM_END:
        return str(current)
    vocab = tokenizer.get_vocab()
    return next((token for token in _PAD_CANDIDATES if token in vocab), PAD)


def _single_special_id(tokenizer: Any, token: str) -> int:
    """The one id ``token`` encodes to, checked: a marker that splits or is not special is a broken conversion."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    token_id = tokenizer.convert_tokens_to_ids(token)
    if ids != [token_id] or token_id not in tokenizer.all_special_ids:
        raise ChatMLError(
            f"{token!r} did not become one special token id (encodes to {ids}); the tokenizer "
            f"{type(tokenizer).__name__} cannot hold added special tokens"
        )
    return int(token_id)


def add_tokens(tokenizer: Any, template: str) -> TokenChanges:
    """Add (or reuse) ``<|im_start|>``, ``<|im_end|>`` and a pad token as special tokens, make ``<|im_end|>`` the
    EOS and set ``template`` as the chat template; ``tokenizer`` (a transformers fast tokenizer) is changed in place.
    """
    old_size = len(tokenizer)
    vocab = tokenizer.get_vocab()
    old_eos = tokenizer.eos_token
    old_eos_id = None if old_eos is None else int(tokenizer.convert_tokens_to_ids(old_eos))
    pad = _choose_pad(tokenizer)
    wanted = [IM_START, IM_END]
    added = tuple(token for token in (*wanted, pad) if token not in vocab)
    extra = [str(t) for t in getattr(tokenizer, "extra_special_tokens", None) or () if isinstance(t, str)]
    tokenizer.add_special_tokens(
        {"extra_special_tokens": [_special(t) for t in wanted if t not in extra]}, replace_extra_special_tokens=False
    )
    tokenizer.add_special_tokens({"eos_token": _special(IM_END), "pad_token": _special(pad)})
    tokenizer.chat_template = template
    im_start_id = _single_special_id(tokenizer, IM_START)
    im_end_id = _single_special_id(tokenizer, IM_END)
    pad_id = _single_special_id(tokenizer, pad)
    eos_ids = (im_end_id,) if old_eos_id in (None, im_end_id) else (im_end_id, old_eos_id)
    return TokenChanges(
        im_start_id=im_start_id,
        im_end_id=im_end_id,
        pad_token=pad,
        pad_id=pad_id,
        added=added,
        added_ids=tuple(int(tokenizer.convert_tokens_to_ids(token)) for token in added),
        old_eos=old_eos,
        old_eos_id=old_eos_id,
        eos_ids=tuple(int(i) for i in eos_ids if i is not None),
        old_size=old_size,
        new_size=len(tokenizer),
    )
