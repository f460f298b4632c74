"""What a trainer takes from a trajectory: rows of ``input_ids``, ``labels`` and ``logprobs`` aligned one to one.

A row is written by appending: the prompt and each delta untrained, each sampled reply trained with the engine's
log-probabilities. Nothing here renders or encodes; the trainers' shapes (:mod:`turnkit.trainers`) are sliced from
these rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from turnkit.encode.encoding import IGNORE_INDEX

__all__ = ["Row", "RowBuilder"]


@dataclass(frozen=True)
class Row:
    """One training row: ``input_ids``, ``labels`` (the id where sampled, ``-100`` elsewhere) and ``logprobs``, one
    value per position: the engine's log-probability of each sampled token, ``nan`` for a sampled token whose
    log-probability was not given, ``0.0`` off the sampled tokens."""

    input_ids: list[int]
    labels: list[int]
    logprobs: list[float]

    @property
    def mask(self) -> list[int]:
        """1 on the sampled tokens, 0 elsewhere (TRL's ``completion_mask``, verl's ``response_mask``)."""
        return [int(label != IGNORE_INDEX) for label in self.labels]

    def to_dict(self) -> dict[str, list[Any]]:
        return {
            "input_ids": list(self.input_ids),
            "labels": list(self.labels),
            "logprobs": list(self.logprobs),
            "attention_mask": [1] * len(self.input_ids),
        }


@dataclass
class RowBuilder:
    """A row being written: a trajectory appends its prompt, sampled ids (trained, with their log-probabilities)
    and deltas (not trained) here, and closes it into a :class:`Row`."""

    ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def add(self, ids: Sequence[int], *, trained: bool, logprobs: Sequence[float] | None = None) -> None:
        self.ids.extend(ids)
        self.labels.extend(ids if trained else [IGNORE_INDEX] * len(ids))
        if not trained:
            self.logprobs.extend([0.0] * len(ids))
        else:
            self.logprobs.extend([math.nan] * len(ids) if logprobs is None else [float(x) for x in logprobs])

    def row(self) -> Row:
        return Row(list(self.ids), list(self.labels), list(self.logprobs))
