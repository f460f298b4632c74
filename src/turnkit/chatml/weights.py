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

from collections.abc import Iterable
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
    #: The rows set per ``init`` (appended rows, and spare rows that new tokens took).
    initialised: tuple[int, ...] = ()


def module_names(model: Any) -> tuple[str, str | None]:
    """The qualified names of ``model``'s input embeddings and output head (``model.embed_tokens``, ``lm_head``)."""
    names = {id(module): name for name, module in model.named_modules()}
    head = model.get_output_embeddings()
    return names[id(model.get_input_embeddings())], None if head is None else names.get(id(head))


def _fill(matrix: Any, rows: list[int], known: int, init: Init, generator: Any) -> None:
    """Set ``matrix[rows]`` from the rows of the tokens the base knew (``matrix[:known]``): their mean, or noise with
    their spread. A bias (1-D) gets the mean, or 0."""
    import torch

    if not rows:
        return
    reference = matrix[:known].float()
    index = torch.tensor(rows, dtype=torch.long)
    if init == "mean":
        value = reference.mean(dim=0, keepdim=True).expand(len(rows), *matrix.shape[1:])
    elif matrix.dim() == 1:
        value = torch.zeros(len(rows))
    else:
        spread = float(reference.std()) if reference.numel() > 1 else 0.02
        value = torch.randn((len(rows), *matrix.shape[1:]), generator=generator) * spread
    matrix[index] = value.to(matrix.dtype)


def resize(
    model: Any,
    vocab_size: int,
    *,
    new_ids: Iterable[int] = (),
    known_tokens: int | None = None,
    pad_to_multiple_of: int | None = None,
    init: Init = "mean",
) -> WeightChanges:
    """Grow ``model``'s embeddings and head to hold ``vocab_size`` tokens (rounded up to ``pad_to_multiple_of``),
    never shrinking them, and set the new rows per ``init``. The model is changed in place.

    The new rows are the appended ones and the rows of ``new_ids`` (tokens new to the vocabulary) that a base whose
    matrix has spare rows (more rows than tokens) already had: those belonged to no token and were never trained.
    The mean is taken over the rows of the ``known_tokens`` tokens the base had (default: every old row).
    """
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
    known = old_rows if known_tokens is None else max(1, min(known_tokens, old_rows))
    target = max(old_rows, vocab_size)
    if pad_to_multiple_of:
        target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
    if target != old_rows:
        model.resize_token_embeddings(target, mean_resizing=False)
    rows = sorted({i for i in new_ids if known <= i < old_rows} | set(range(old_rows, target)))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        _fill(model.get_input_embeddings().weight, rows, known, init, generator)
        head = model.get_output_embeddings()
        if head is not None and not tied:
            _fill(head.weight, rows, known, init, generator)
            if getattr(head, "bias", None) is not None:
                _fill(head.bias, rows, known, init, generator)
    head = model.get_output_embeddings()
    if tied and (head is None or head.weight is not model.get_input_embeddings().weight):
        raise ChatMLError("resizing untied the embeddings and the head of a tied model")
    model.config.vocab_size = target
    return WeightChanges(old_rows, target, tied, init, embeddings, head_name, tuple(rows))
