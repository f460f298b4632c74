"""The model side of add-chatml: grow the input embeddings and the output head to the new vocabulary.

New rows start at the mean of the existing rows by default. A new token then begins with the average embedding and,
in the head, the average next-token logit, so its probability starts at about that of an average token instead of
whatever a random row gives it (seed 000; Hewitt, "Initializing new word embeddings for pretrained language
models"). transformers' own ``mean_resizing`` samples from a Gaussian around the mean instead; here the rows are
exactly the mean, which the tests check. ``init="random"`` draws them from a normal with the old rows' spread.

A tied model stays tied (one matrix, the head reads the embeddings); an untied head is resized and initialised on
its own, bias included when it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from turnkit.errors import ChatMLError

__all__ = ["Init", "WeightChanges", "module_names", "resize"]

Init = Literal["mean", "random"]


@dataclass(frozen=True)
class WeightChanges:
    """What :func:`resize` did: embedding rows before and after, whether head and embeddings share one matrix, how
    new rows were set, and the real module names of the embeddings and the head (for LoRA's ``modules_to_save``)."""

    old_rows: int
    new_rows: int
    tied: bool
    init: str
    embeddings: str
    head: str | None


def module_names(model: Any) -> tuple[str, str | None]:
    """The qualified names of ``model``'s input embeddings and output head (``model.embed_tokens``, ``lm_head``)."""
    names = {id(module): name for name, module in model.named_modules()}
    head = model.get_output_embeddings()
    return names[id(model.get_input_embeddings())], None if head is None else names.get(id(head))


def _fill(rows: Any, old: Any, init: Init, generator: Any) -> None:
    import torch

    reference = old.float()
    if init == "mean":
        value = reference.mean(dim=0, keepdim=True)
        rows.copy_(value.expand_as(rows).to(rows.dtype))
    else:
        spread = float(reference.std()) if reference.numel() > 1 else 0.02
        noise = torch.randn(rows.shape, generator=generator, dtype=torch.float32) * spread
        rows.copy_(noise.to(rows.dtype))


def resize(model: Any, vocab_size: int, *, pad_to_multiple_of: int | None = None, init: Init = "mean") -> WeightChanges:
    """Grow ``model``'s embeddings and head to hold ``vocab_size`` tokens (rounded up to ``pad_to_multiple_of``),
    never shrinking them, and set the new rows per ``init``. The model is changed in place."""
    import torch

    if init not in ("mean", "random"):
        raise ChatMLError(f"init must be 'mean' or 'random', not {init!r}")
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise ChatMLError(f"pad_to_multiple_of must be a positive number of rows, not {pad_to_multiple_of}")
    embeddings, head_name = module_names(model)
    old_embedding = model.get_input_embeddings().weight
    old_head = model.get_output_embeddings()
    tied = old_head is not None and old_head.weight is old_embedding
    old_rows = int(old_embedding.shape[0])
    head_rows = old_rows if old_head is None else int(old_head.weight.shape[0])
    target = max(old_rows, vocab_size)
    if pad_to_multiple_of:
        target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
    if target != old_rows:
        model.resize_token_embeddings(target, mean_resizing=False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        if target > old_rows:
            _fill(weight[old_rows:], weight[:old_rows], init, generator)
        head = model.get_output_embeddings()
        if head is not None and not tied and head.weight.shape[0] > head_rows:
            _fill(head.weight[head_rows:], head.weight[:head_rows], init, generator)
            bias = getattr(head, "bias", None)
            if bias is not None:
                bias[head_rows:] = bias[:head_rows].float().mean().to(bias.dtype) if init == "mean" else 0
    head = model.get_output_embeddings()
    if tied and (head is None or head.weight is not model.get_input_embeddings().weight):
        raise ChatMLError("resizing untied the embeddings and the head of a tied model")
    model.config.vocab_size = target
    return WeightChanges(old_rows, target, tied, init, embeddings, head_name)
