"""The page model: what an inspect page shows, built from encodings, with no HTML in it.

A page holds one or more *examples* (a conversation's encoding; one per turn when the template is not prefix-stable;
or rows sampled from prepared shards). An example is split into *blocks*, runs of tokens of one message in reading
order, each with its counts. Every token is a :class:`Chip`: its id, exact text, origin, whether it is trained, its
label and message. Around them: a summary, the forged markers found in data, and, for a conversation, the "train vs
serve" comparison of every assistant turn.

Keeping this separate from the HTML means the numbers a page shows are computed (and tested) once, here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from turnkit.encode.encoding import IGNORE_INDEX, Encoding
from turnkit.inspect.tokens import ForgedMarker, Piece, Segment, TokenTexts, find_forged_markers, sequence_segments

__all__ = ["Block", "Chip", "Example", "Page", "TurnComparison", "example_from_arrays", "example_from_encoding"]

Origin = Literal["template", "data", "control", "text"]


@dataclass(frozen=True, slots=True)
class Chip:
    """One token of an example.

    ``origin`` is ``control`` for a control id, else ``data`` or ``template`` by where its text came from; tokens
    read back from shards carry no attribution, so their plain text is ``text``.
    """

    piece: Piece
    origin: Origin
    trained: bool
    label: int
    message: int
    forged: bool = False
    #: The text as it shows in its sequence (a character split across tokens shows once: see ``sequence_segments``).
    segments: tuple[Segment, ...] = ()


@dataclass(frozen=True)
class Block:
    """A run of tokens of one message (``message == -1``: template text outside any message)."""

    message: int
    role: str
    chips: list[Chip]

    @property
    def tokens(self) -> int:
        return len(self.chips)

    @property
    def trained(self) -> int:
        return sum(chip.trained for chip in self.chips)


class _Counted(Protocol):
    @property
    def tokens(self) -> int: ...

    @property
    def trained(self) -> int: ...


class _Totals:
    """``tokens`` and ``trained`` summed over the counted parts: an example's blocks, a page's examples."""

    def _parts(self) -> Sequence[_Counted]:
        raise NotImplementedError

    @property
    def tokens(self) -> int:
        return sum(part.tokens for part in self._parts())

    @property
    def trained(self) -> int:
        return sum(part.trained for part in self._parts())


@dataclass(frozen=True)
class Example(_Totals):
    """One training example: its blocks, the forged markers in it, and what it is."""

    title: str
    blocks: list[Block]
    forged: list[ForgedMarker] = field(default_factory=list)
    note: str = ""

    @property
    def chips(self) -> list[Chip]:
        return [chip for block in self.blocks for chip in block.chips]

    def _parts(self) -> Sequence[Block]:
        return self.blocks


@dataclass(frozen=True)
class TurnComparison:
    """Train vs serve for one assistant turn.

    ``prompt_prefix`` (from ``fmt.diff_prompts``): the serving prompt's tokens are the training example's first
    tokens; where not, ``position`` is the first different token and the two token rows show the neighbourhood.
    ``generated_prefix`` (from ``fmt.check_prefix_stable``): the turn as the model generated it is a prefix of the
    training render. Where the serving prompt's text or the generated turn's text is not, ``excerpt_of`` says which
    (``prompt`` or ``generated``) and the two text excerpts show where they part, ``excerpt_at`` characters in.
    """

    message: int
    prompt_prefix: bool | None
    generated_prefix: bool
    position: int | None = None
    serving: list[str] = field(default_factory=list)
    training: list[str] = field(default_factory=list)
    token_at: int = 0
    excerpt_of: str = ""
    expected_excerpt: str = ""
    render_excerpt: str = ""
    excerpt_at: int = 0


@dataclass(frozen=True)
class Page(_Totals):
    """Everything one inspect page shows."""

    title: str
    source: str
    examples: list[Example]
    comparisons: list[TurnComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def _parts(self) -> Sequence[Example]:
        return self.examples

    def origin_counts(self) -> Counter[str]:
        return Counter(chip.origin for example in self.examples for chip in example.chips)

    def control_counts(self) -> list[tuple[str, int, int]]:
        """Each control token on the page: its text, id and how often it occurs, most frequent first."""
        counts = Counter(
            (chip.piece.text, chip.piece.id) for ex in self.examples for chip in ex.chips if chip.origin == "control"
        )
        return [(text, token_id, n) for (text, token_id), n in counts.most_common()]

    @property
    def forged(self) -> int:
        return sum(len(example.forged) for example in self.examples)


def _blocks(chips: list[Chip], roles: Mapping[int, str]) -> list[Block]:
    blocks: list[Block] = []
    start = 0
    for end in range(1, len(chips) + 1):
        if end == len(chips) or chips[end].message != chips[start].message:
            message = chips[start].message
            blocks.append(Block(message, roles.get(message, ""), chips[start:end]))
            start = end
    return blocks


def _chips(
    pieces: list[Piece],
    labels: np.ndarray,
    message_index: Sequence[int],
    is_data: Sequence[bool] | None,
    forged: list[ForgedMarker],
) -> list[Chip]:
    inside: set[int] = set()
    for marker in forged:
        inside.update(range(marker.start, marker.end))
    chips = []
    shown = sequence_segments(pieces)
    for n, piece in enumerate(pieces):
        label = int(labels[n])
        if piece.control:
            origin: Origin = "control"
        elif is_data is None:
            origin = "text"
        else:
            origin = "data" if is_data[n] else "template"
        chips.append(
            Chip(piece, origin, label != IGNORE_INDEX, label, int(message_index[n]), n in inside, tuple(shown[n]))
        )
    return chips


def example_from_encoding(
    encoding: Encoding, texts: TokenTexts, roles: Mapping[int, str], *, title: str, note: str = ""
) -> Example:
    """An example from an :class:`~turnkit.encode.Encoding`: origin and message from its attribution."""
    pieces = texts.pieces(encoding.input_ids.tolist())
    forged = find_forged_markers(pieces, texts.binding)
    chips = _chips(pieces, encoding.labels, encoding.message_index.tolist(), encoding.is_data.tolist(), forged)
    return Example(title, _blocks(chips, roles), forged, note)


def example_from_arrays(
    input_ids: Sequence[int], labels: Sequence[int], texts: TokenTexts, *, title: str, note: str = ""
) -> Example:
    """An example from bare ids and labels (a prepared shard's row): no attribution, so one block."""
    pieces = texts.pieces(input_ids)
    forged = find_forged_markers(pieces, texts.binding)
    label_array = np.asarray(labels, dtype=np.int64)
    if len(label_array) != len(pieces):
        raise ValueError(f"{title}: {len(pieces)} input_ids but {len(label_array)} labels")
    chips = _chips(pieces, label_array, [-1] * len(pieces), None, forged)
    return Example(title, _blocks(chips, {}), forged, note)


def comparisons(fmt: Any, messages: Sequence[Any], tools: Any, variables: Mapping[str, Any]) -> list[TurnComparison]:
    """Train vs serve for every assistant turn, from ``fmt.diff_prompts`` and ``fmt.check_prefix_stable``."""
    report = fmt.check_prefix_stable(messages, tools=tools, **variables)
    diffs = {diff.index: diff for diff in fmt.diff_prompts(messages, tools=tools, **variables)}
    out = []
    for turn in report.turns:
        diff = diffs.get(turn.index)
        serving = [] if diff is None else list(diff.serving_tokens)
        training = [] if diff is None else list(diff.training_tokens)
        out.append(
            TurnComparison(
                message=turn.index,
                prompt_prefix=None if diff is None else diff.agrees,
                generated_prefix=turn.turn_stable,
                position=None if diff is None else diff.position,
                serving=serving,
                training=training,
                token_at=_first_difference(serving, training),
                excerpt_of="" if turn.stable else "prompt" if not turn.prompt_stable else "generated",
                expected_excerpt=turn.expected_excerpt,
                render_excerpt=turn.render_excerpt,
                excerpt_at=_first_difference(turn.expected_excerpt, turn.render_excerpt),
            )
        )
    return out


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
