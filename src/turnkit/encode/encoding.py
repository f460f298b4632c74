"""``Encoding``: the token ids of a conversation, with labels, masks and per-token attribution."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["IGNORE_INDEX", "Encoding"]

#: The label of a token that is not trained (PyTorch's cross-entropy ``ignore_index``).
IGNORE_INDEX = -100

#: ``message_index`` of tokens that belong to no message: a template's default system prompt, tool schemas, the
#: generation prompt, BOS.
NO_MESSAGE = -1


@dataclass(eq=False)
class Encoding:
    """A conversation as token ids.

    Attributes:
        input_ids: The token ids (int64).
        labels: ``input_ids`` where the token is trained, ``-100`` elsewhere.
        assistant_mask: 1 where the token is trained, else 0 (the name transformers and TRL use).
        message_index: For each token, the index of the message whose turn it belongs to (``-1`` for template text
            outside any message: a default system prompt, the generation prompt).
        is_data: For each token, True when its text came from data (message content, tool calls, tool results,
            tool schemas, documents) rather than from the template.
        text: The rendered text; ``decode(input_ids) == text``.
        control_counts: How many times the template wrote each control token, by token text.
        unrendered: ``(message index, field)`` of assistant data the template left out of the render: reasoning it
            drops from earlier turns (Qwen3), or what ``allow_dropped=True`` let through.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    assistant_mask: np.ndarray
    message_index: np.ndarray
    is_data: np.ndarray
    text: str
    control_counts: dict[str, int] = field(default_factory=dict)
    unrendered: tuple[tuple[int, str], ...] = ()

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_trained(self) -> int:
        return int(self.assistant_mask.sum())

    def to_dict(self) -> dict[str, list[int]]:
        """Plain lists: a row for ``datasets.Dataset.from_list`` or a pre-tokenized TRL dataset."""
        return {
            "input_ids": self.input_ids.tolist(),
            "labels": self.labels.tolist(),
            "assistant_masks": self.assistant_mask.tolist(),
            "attention_mask": [1] * len(self.input_ids),
        }

    def to_numpy(self) -> dict[str, np.ndarray]:
        return {
            "input_ids": self.input_ids,
            "labels": self.labels,
            "assistant_masks": self.assistant_mask,
            "attention_mask": np.ones(len(self.input_ids), dtype=np.int64),
        }

    def to_torch(self) -> dict[str, Any]:
        """Tensors with a batch dimension of 1, ready for ``model(**encoding.to_torch())``."""
        import torch

        return {key: torch.from_numpy(value.astype(np.int64)).unsqueeze(0) for key, value in self.to_numpy().items()}

    def trained_text(self, decode: Any) -> list[str]:
        """The trained stretches of tokens, decoded (``decode`` maps ids to text), in order."""
        out = []
        mask = self.assistant_mask
        start = None
        for i, flag in enumerate([*mask.tolist(), 0]):
            if flag and start is None:
                start = i
            elif not flag and start is not None:
                out.append(decode(self.input_ids[start:i].tolist()))
                start = None
        return out

    @classmethod
    def from_arrays(
        cls,
        input_ids: Sequence[int] | np.ndarray,
        mask: np.ndarray,
        message_index: np.ndarray,
        is_data: np.ndarray,
        text: str,
        control_counts: dict[str, int],
        unrendered: tuple[tuple[int, str], ...] = (),
    ) -> Encoding:
        ids = np.asarray(input_ids, dtype=np.int64)
        mask = mask.astype(np.int8, copy=False)  # 0 or 1
        labels = np.where(mask.view(bool), ids, IGNORE_INDEX)
        return cls(ids, labels, mask, message_index, is_data, text, control_counts, unrendered)
