"""Which message, and which source, each token belongs to.

The render with provenance gives character spans of data, each tagged with the message (or tools, documents,
variables) it came from; the tokenizer gives a character-to-token map. From the two:

* ``is_data``: a token whose characters overlap data (merged spans, so a token straddling two fields counts once);
* ``message_index``: a turn (the text up to and including an end-of-turn marker and the separator after it) belongs
  to the first message whose data it holds, and within a turn each message's data and the template text after it
  belong to that message (a template may fold several tool results into one turn). Template text of turns that hold
  no message's data (a default system prompt, the generation prompt) belongs to no message.

:class:`Turns` is also what loss masks locate turns with (:mod:`turnkit.encode.masks`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

import numpy as np

from turnkit.encode.encoding import NO_MESSAGE
from turnkit.encode.tokenize import CharToToken

__all__ = ["Spans", "Turns", "data_mask", "merged"]


class Spans:
    """Character spans to token ranges, for one encoding."""

    def __init__(self, text: str, count: int, char_to_token: CharToToken) -> None:
        self.text = text
        self.count = count
        self.char_to_token = char_to_token

    def token_at(self, position: int, step: int, limit: int) -> int | None:
        while position != limit:
            found = self.char_to_token(position)
            if found is not None:
                return found
            position += step
        return None

    def tokens(self, start: int, end: int) -> tuple[int, int]:
        """The tokens that overlap characters ``[start, end)``, as a ``[first, last)`` range (empty if none)."""
        if end <= start:
            return (0, 0)
        first = self.char_to_token(start)
        if first is None:
            first = self.token_at(start + 1, 1, end)
        last = self.char_to_token(end - 1)
        if last is None:
            last = self.token_at(end - 2, -1, start - 1)
        if first is None or last is None:
            return (0, 0)
        return (first, last + 1)


class Turns:
    """The turns of a render: where each ends (its end-of-turn marker and the separator after it), and the data."""

    def __init__(self, size: int, ends: list[tuple[int, int, int]], data_spans: Sequence[tuple[int, int, int]]):
        self.size = size
        self.ends = ends  # (marker start, marker end, end of the separator after it)
        self.boundaries = [stop for _, _, stop in ends]
        self.data_spans = [s for s in data_spans if s[2] >= 0 and s[1] > s[0]]

    def data_extent(self, index: int) -> tuple[int | None, int | None]:
        mine = [(a, b) for a, b, source in self.data_spans if source == index]
        if not mine:
            return (None, None)
        return (min(a for a, _ in mine), max(b for _, b in mine))

    def previous_message_end(self, index: int, limit: int) -> int:
        """Where the data of earlier messages ends, before ``limit`` (a turn starts after it)."""
        ends = [b for a, b, source in self.data_spans if source < index and b <= limit]
        return max(ends) if ends else 0

    def next_message_start(self, index: int) -> int:
        """Where the data of a later message first appears (the end of the text when none does)."""
        later = [a for a, _, source in self.data_spans if source > index]
        return min(later) if later else self.size

    def previous_boundary(self, position: int) -> int:
        at = bisect.bisect_right(self.boundaries, position) - 1
        return self.boundaries[at] if at >= 0 else 0

    def next_boundary(self, position: int) -> int:
        at = bisect.bisect_right(self.boundaries, position)
        return self.boundaries[at] if at < len(self.boundaries) else self.size

    def message_at(self, start: int, end: int) -> int:
        """The message a stretch of text belongs to: the first message with data inside it, else the turn's."""
        inside = [source for a, b, source in self.data_spans if a < end and b > start]
        if inside:
            return inside[0]
        return self._owner(start)

    def _owner(self, position: int) -> int:
        lower = self.previous_boundary(position)
        owner = NO_MESSAGE
        for a, _, source in self.data_spans:
            if a >= lower and a <= position:
                owner = source
            elif a > position:
                if owner == NO_MESSAGE and a < self.next_boundary(position):
                    owner = source
                break
        return owner

    def message_index(self, spans: Spans) -> np.ndarray:
        """Per token: the message whose turn it belongs to (``-1`` for turns that hold no message's data).

        A turn (the text up to and including an end-of-turn marker and its separator) belongs to the first message
        whose data it holds; within a turn, each message's data and the template text after it belong to that
        message (a template may fold several tool results into one turn).
        """
        out = np.full(spans.count, NO_MESSAGE, dtype=np.int32)
        data = self.data_spans
        points: list[tuple[int, int]] = []  # (character where it starts, message)
        bounds = [0, *self.boundaries, self.size]
        j = 0
        for chunk_start, chunk_end in itertools.pairwise(bounds):
            while j < len(data) and data[j][0] < chunk_start:
                j += 1
            first = True
            while j < len(data) and data[j][0] < chunk_end:
                source = data[j][2]
                if first or source != points[-1][1]:
                    points.append((chunk_start if first else data[j][0], source))
                first = False
                j += 1
            if first:
                points.append((chunk_start, NO_MESSAGE))
        for n, (start, source) in enumerate(points):
            if source == NO_MESSAGE:
                continue
            end = points[n + 1][0] if n + 1 < len(points) else self.size
            first_token, last_token = spans.tokens(start, end)
            out[first_token:last_token] = source
        return out


def data_mask(spans: Spans, data_spans: Sequence[tuple[int, int, int]]) -> np.ndarray:
    """Per token: True when its characters overlap data (message fields, tool schemas, documents, variables)."""
    is_data = np.zeros(spans.count, dtype=bool)
    for start, end in merged(data_spans):
        first, last = spans.tokens(start, end)
        is_data[first:last] = True
    return is_data


def merged(spans: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Character spans with touching or overlapping ones joined (sources ignored)."""
    out: list[tuple[int, int]] = []
    for start, end, _ in sorted(spans):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out
