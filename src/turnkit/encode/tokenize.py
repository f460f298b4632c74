"""Rendered text to token ids, with a character-to-token map, exactly as the checkpoint's tokenizer would encode it.

Three ways, picked per tokenizer and per conversation:

* **segments** (tokenizers where cutting at added tokens cannot change the result, ``binding.segment_safe``): the text
  is cut at the template's control tokens, each control token becomes its id and each piece between them is encoded
  with added tokens disabled (``binding.data``). Pieces are kept in a :class:`SegmentCache`, so a system prompt or
  tool schemas that repeat across a dataset are tokenized once.
* **whole text** (other tokenizers, data without added-token strings): one ``binding.encode`` call, so the ids are
  exactly ``apply_chat_template(tokenize=True)``'s.
* **pieces** (other tokenizers, data in which added-token strings were broken): as segments, without the cache.

In every case the ids of control tokens come from the template's own markers: data never becomes one.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from turnkit.tokenizer import TokenizerBinding

__all__ = [
    "CharToToken",
    "Controls",
    "Pieces",
    "SegmentCache",
    "Tokenized",
    "encode_pieces",
    "encode_text",
    "segments",
]

#: A control token the template wrote: (start, end, token text) in the render.
Controls = Sequence[tuple[int, int, str]]
#: Character offset in the text to the index of the token that holds it (None between tokens).
CharToToken = Callable[[int], "int | None"]
#: Token ids and their character-to-token map.
Tokenized = tuple[Sequence[int], CharToToken]


class Pieces:
    """Token positions of text encoded piece by piece: maps a character offset to the token that holds it."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.char_starts: list[int] = []
        self.token_starts: list[int] = []
        self.lookups: list[CharToToken | None] = []

    def char_to_token(self, position: int) -> int | None:
        piece = bisect.bisect_right(self.char_starts, position) - 1
        if piece < 0:
            return None
        lookup = self.lookups[piece]
        if lookup is None:
            return self.token_starts[piece]
        found = lookup(position - self.char_starts[piece])
        return None if found is None else self.token_starts[piece] + found

    @classmethod
    def build(cls, controls: Controls, encoded: Iterable[Any], binding: TokenizerBinding, size: int) -> Pieces:
        """Control tokens as their ids, and the text pieces between them: ``encoded`` holds the ids and
        character-to-token map of each, in order (one for each piece :func:`segments` cuts)."""
        pieces = cls()
        ids, char_starts, token_starts, lookups = pieces.ids, pieces.char_starts, pieces.token_starts, pieces.lookups
        added = binding.added
        texts = iter(encoded)
        pos = 0
        for start, end, token in controls:  # the hot loop of every encode: no method calls
            if start > pos:
                piece_ids, lookup = next(texts)
                char_starts.append(pos)
                token_starts.append(len(ids))
                lookups.append(lookup)
                ids.extend(piece_ids)
            char_starts.append(start)
            token_starts.append(len(ids))
            lookups.append(None)
            ids.append(added[token].id)
            pos = end
        if pos < size:
            piece_ids, lookup = next(texts)
            char_starts.append(pos)
            token_starts.append(len(ids))
            lookups.append(lookup)
            ids.extend(piece_ids)
        return pieces


def segments(text: str, controls: Controls) -> list[tuple[int, str]]:
    """The text between the template's control tokens, with where each piece starts."""
    out: list[tuple[int, str]] = []
    pos = 0
    for start, end, _ in controls:
        if start > pos:
            out.append((pos, text[pos:start]))
        pos = end
    if pos < len(text):
        out.append((pos, text[pos:]))
    return out


def encode_pieces(binding: TokenizerBinding, text: str, controls: Controls) -> Pieces:
    """Control tokens as their ids; everything between them as plain text (added tokens disabled)."""
    cut = segments(text, controls)
    encoded = binding.data.encode_batch([piece for _, piece in cut], add_special_tokens=False)
    return Pieces.build(controls, [(e.ids, e.char_to_token) for e in encoded], binding, len(text))


def encode_text(
    binding: TokenizerBinding, cache: SegmentCache, text: str, controls: Controls, *, broken: bool
) -> Tokenized:
    """The ids of one render (``broken``: added-token strings in its data were broken), the right way for the
    tokenizer: segments through the cache, else pieces, else the whole text in one call."""
    if binding.segment_safe:
        # Text between control tokens, tokenized once and cached: a system prompt or tool schemas shared by
        # many conversations are not tokenized again.
        cut = segments(text, controls)
        cache.fill([piece for _, piece in cut], binding.data)
        assembled = cache.assemble(binding, text, controls, cut)
        return assembled.ids, assembled.char_to_token
    if broken:
        pieces = encode_pieces(binding, text, controls)
        return pieces.ids, pieces.char_to_token
    encoding = binding.encode(text)
    return encoding.ids, encoding.char_to_token


class SegmentCache:
    """Tokenized text pieces, kept across conversations and batches (least recently used out first).

    Datasets repeat a few system prompts and tool schemas across many records; tokenizing is ~90% of an encode, so
    each distinct piece is tokenized once. The capacity bounds memory on datasets where nothing repeats.
    """

    def __init__(self, capacity: int = 65_536) -> None:
        self.capacity = capacity
        self._items: dict[str, Any] = {}

    def clear(self) -> None:
        """Forget every piece (a benchmark's fresh pass over a dataset)."""
        self._items.clear()

    def get(self, piece: str) -> Any:
        found = self._items.pop(piece)
        self._items[piece] = found  # most recent last
        return found

    def missing(self, pieces: Sequence[str]) -> list[str]:
        """The distinct pieces not in the cache yet."""
        return list(dict.fromkeys(p for p in pieces if p not in self._items))

    def store(self, pieces: Sequence[str], encodings: Sequence[Any]) -> None:
        for piece, encoding in zip(pieces, encodings, strict=True):
            self._items[piece] = (encoding.ids, encoding.char_to_token)
        self._evict(len(pieces))

    def fill(self, pieces: Sequence[str], tokenizer: Any) -> None:
        """Tokenize the pieces that are not cached yet, in this thread."""
        missing = self.missing(pieces)
        for piece in missing:
            encoding = tokenizer.encode(piece, add_special_tokens=False)
            self._items[piece] = (encoding.ids, encoding.char_to_token)
        self._evict(len(pieces))

    def assemble(self, binding: TokenizerBinding, text: str, controls: Controls, cut: list[tuple[int, str]]) -> Pieces:
        """The pieces of ``text`` (all cached already) and its control tokens, in order."""
        lookup = self.get
        return Pieces.build(controls, [lookup(piece) for _, piece in cut], binding, len(text))

    def _evict(self, in_use: int) -> None:
        overflow = len(self._items) - max(self.capacity, in_use)
        if overflow > 0:  # the least recently used are first
            for key in list(itertools.islice(self._items, overflow)):
                del self._items[key]
