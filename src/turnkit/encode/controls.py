"""The template's markers in a render: which became control tokens, which end turns, and which the tokenizer lacks.

Safety rests on one rule: every complete added-token string in the render was written by the template (data was
broken before the render, :mod:`turnkit.encode.marking`), so the control tokens of an encoding are exactly the
added-token strings found in the render. This module finds them, checks afterwards that each control id appears in
the ids exactly as often as the template wrote it, and finds the end-of-turn markers that loss masks end turns at.

A template paired with the wrong tokenizer (Llama 3.1's template over a ChatML tokenizer) writes markers the tokenizer
has no token for: ``<|eot_id|>`` becomes the text pieces ``<``, ``|``, ``eot`` ..., labelled template text and
trained. Nothing is unsafe about that (data still cannot forge a control token), but the model would learn a format
it was never given, so every such marker is reported once per encoder with a :class:`MissingControlTokenWarning`.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from turnkit.encode.attribution import Turns
from turnkit.encode.tokenize import Controls
from turnkit.errors import EncodeError, MessageError, MissingControlTokenWarning
from turnkit.messages import KNOWN_ROLES
from turnkit.tokenizer import TokenizerBinding

__all__ = [
    "MARKER_SHAPES",
    "ControlCheck",
    "MissingMarkers",
    "check_roles",
    "find_controls",
    "find_turns",
]

#: Marker shapes a tokenizer may fail to hold as one token (its added tokens are found by the tokenizer's own list).
#: Written by a template, these are markers wherever they appear. (``doctor`` audits checkpoints with the same shapes.)
MARKER_SHAPES = re.compile(
    r"<\|[^\s|<>]{1,48}\|>"  # <|im_start|>, <|eot_id|>, <|START_OF_TURN_TOKEN|>
    r"|<｜[^｜\s]{1,48}｜>"  # DeepSeek's full-width bars
    r"|<\|[A-Za-z_]{1,30}>|<[A-Za-z_]{1,30}\|>"  # Gemma 4's <|turn> and <turn|>
    r"|</?s>"  # Llama 2 / Mistral BOS and EOS
)

_WHITESPACE = " \t\r\n"


def find_controls(binding: TokenizerBinding, text: str) -> list[tuple[int, int, str]]:
    """Every added-token string in a render made from broken data: the control tokens the template wrote."""
    return [(m.start(), m.end(), m.group(0)) for m in binding.added_pattern.finditer(text)]


def find_turns(
    text: str, controls: Controls, stop_texts: Iterable[str], data_spans: Sequence[tuple[int, int, int]]
) -> Turns:
    """The turns of a render: each ends at a control token that ends a reply, and the whitespace after it."""
    stops = stop_texts if isinstance(stop_texts, (set, frozenset)) else set(stop_texts)
    ends = []
    for start, end, token in controls:
        if token in stops:
            stop = end
            while stop < len(text) and text[stop] in _WHITESPACE:
                stop += 1
            ends.append((start, end, stop))
    return Turns(len(text), ends, data_spans)


class ControlCheck:
    """The invariant after tokenizing: each control id appears exactly as often as the template wrote its marker."""

    def __init__(self, binding: TokenizerBinding) -> None:
        self.binding = binding
        size = max([binding.backend.get_vocab_size(with_added_tokens=True), *binding.by_id]) + 2
        self._is_control = np.zeros(size, dtype=bool)  # the last entry stands for any id past the vocabulary
        self._is_control[list(binding.by_id)] = True

    def __call__(self, ids: np.ndarray, counts: Counter[str], written: list[int] | None = None) -> None:
        """Raise unless the control ids in ``ids`` are those of ``counts`` (by token text), as often. ``written``:
        the ids of the markers as the template wrote them, in order; when the encoding holds exactly those (as it
        does unless something is wrong), no counting is needed."""
        found = ids[np.take(self._is_control, ids, mode="clip")].tolist()
        if written is not None and found == written:
            return
        added = self.binding.added
        if dict.__eq__(Counter(found), {added[t].id: n for t, n in counts.items()}):  # no zero counts on either side
            return
        raise EncodeError(
            f"internal check failed: the template wrote {sum(counts.values())} control tokens but the encoding holds "
            f"{len(found)} ({dict(counts)}); please report this with the template and the tokenizer"
        )


def check_roles(binding: TokenizerBinding, chat: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a role that spells part of a control token: roles are not broken like data (they are checked words),
    and a template that writes ``'<|' + role + '|>'`` would make the control token out of it."""
    for index, message in enumerate(chat):
        role = message["role"]
        if role in KNOWN_ROLES:
            continue
        word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(role)}(?![A-Za-z0-9_])")
        for token in binding.added:
            if word.search(token):
                raise MessageError(
                    f"role {role!r} spells part of the control token {token!r}; a template that writes "
                    "'<|' + role + '|>' would turn it into that token",
                    index=index,
                    field="role",
                )


class MissingMarkers:
    """Finds markers the template writes that the tokenizer has no token for, and warns once per marker.

    Only template text is searched (data may spell any marker; it is encoded as text whatever the tokenizer), for
    :data:`MARKER_SHAPES` and for the markers the format declares (its end-of-turn markers, BOS and EOS).
    """

    def __init__(self, binding: TokenizerBinding, declared: Iterable[str], origin: str = "") -> None:
        self.added = binding.added
        self.origin = origin or binding.origin or "the tokenizer"
        self.declared = sorted({m for m in declared if m and m not in binding.added})
        self.warned: set[str] = set()
        self._scanned: set[str] = set()  # template text already searched (renders repeat it across a dataset)
        self._skeletons: dict[int, Any] = {}  # skeletons whose renders were searched (by id, kept alive)

    def check(
        self, text: str, data_spans: Sequence[tuple[int, int, int]], *, stacklevel: int, skeleton: Any = None
    ) -> None:
        """Warn about each marker of the template's own text (between the data spans) the tokenizer lacks.

        ``skeleton``: the skeleton a spliced render was filled from. Every render filled from one holds the same
        template text (its literals; each hole is data), so a skeleton is searched once."""
        if skeleton is not None:
            if self._skeletons.get(id(skeleton)) is skeleton:
                return
            if len(self._skeletons) >= 4096:
                self._skeletons.clear()
            self._skeletons[id(skeleton)] = skeleton
        pos = 0
        for start, end in _in_order(data_spans):
            if start > pos:
                self._scan(text, pos, start, stacklevel + 1)
            pos = max(pos, end)
        if pos < len(text):
            self._scan(text, pos, len(text), stacklevel + 1)

    def _scan(self, text: str, start: int, end: int, stacklevel: int) -> None:
        piece = text[start:end]
        if piece in self._scanned:
            return
        if len(self._scanned) >= 65_536:
            self._scanned.clear()
        self._scanned.add(piece)
        for match in MARKER_SHAPES.finditer(text, start, end):
            marker = match.group(0)
            if marker not in self.added:
                self._warn(marker, stacklevel + 1)
        for marker in self.declared:
            if text.find(marker, start, end) >= 0:
                self._warn(marker, stacklevel + 1)

    def _warn(self, marker: str, stacklevel: int) -> None:
        if marker in self.warned:
            return
        self.warned.add(marker)
        warnings.warn(
            f"the template writes {marker!r} but {self.origin} has no token for it: it is encoded as text pieces, "
            "labelled template text and trained; use the tokenizer of the checkpoint the template comes from",
            MissingControlTokenWarning,
            stacklevel=stacklevel + 1,
        )


def _in_order(data_spans: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The data spans sorted by start (the text between them is the template's)."""
    return sorted((start, end) for start, end, _ in data_spans if end > start)
