"""Finding the next needle (a marker, a literal of the reply format, a stop string) in a stream of text, for a needle
set that changes with the parser's state, across token boundaries, never releasing text that could still become the
start of a needle (hold-back).

The parser asks :meth:`Lexer.next` for one event at a time with the needles of its current state: the text before
the earliest needle, or the needle itself (leftmost, then longest), or nothing when the text so far could still be
the start of a needle. Work per call is bounded by the buffered text, which is the unread part of the last piece
plus at most the longest needle, so a whole reply costs time linear in its length.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

__all__ = ["NEEDLE", "TEXT", "Lexer", "Needles", "needles"]

TEXT, NEEDLE = "text", "needle"


class Needles:
    """A compiled needle set (build it with :func:`needles`, which caches them)."""

    def __init__(self, items: frozenset[str]) -> None:
        ordered = sorted(items, key=len, reverse=True)
        self.items = items
        self.pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self.prefixes = frozenset(n[:k] for n in ordered for k in range(1, len(n)))
        self.extends = {n: any(o != n and o.startswith(n) for o in ordered) for n in ordered}
        self.longest = max(map(len, ordered), default=0)
        #: The characters a needle starts with: text holding none of them holds no needle, nor the start of one.
        self.first = frozenset(n[0] for n in ordered)
        self.first_pattern = re.compile("[" + "".join(map(re.escape, sorted(self.first))) + "]") if ordered else None

    def partial(self, text: str) -> int:
        """The length of the longest end of ``text`` that is a proper prefix of some needle."""
        first, prefixes = self.first, self.prefixes
        for begin in range(max(0, len(text) - self.longest + 1), len(text)):
            if text[begin] in first and text[begin:] in prefixes:
                return len(text) - begin
        return 0

    def pending_before(self, text: str, start: int) -> bool:
        """True when a needle could begin before ``start`` and still complete with more text."""
        first, prefixes = self.first, self.prefixes
        begins = range(max(0, len(text) - self.longest + 1), start)
        return any(text[begin] in first and text[begin:] in prefixes for begin in begins)


@lru_cache(maxsize=512)
def _compiled(items: frozenset[str]) -> Needles:
    return Needles(items)


def needles(items: Iterable[str]) -> Needles:
    return _compiled(frozenset(i for i in items if i))


class Lexer:
    """Buffered text; :meth:`next` takes one event off the front for a given needle set."""

    def __init__(self) -> None:
        self.buffer = ""
        self.final = False

    def push(self, text: str) -> None:
        if text:
            self.buffer = self.buffer + text if self.buffer else text

    def unread(self, text: str) -> None:
        """Put text back at the front (what a self-delimited reader did not consume)."""
        if text:
            self.buffer = text + self.buffer

    def take(self) -> str:
        """Everything buffered (a reader that consumes text itself)."""
        text, self.buffer = self.buffer, ""
        return text

    def next(self, found: Needles) -> tuple[str, str] | None:
        buffer = self.buffer
        if not buffer:
            return None
        if found.first_pattern is None or found.first_pattern.search(buffer) is None:
            self.buffer = ""  # the common case: nothing here starts a needle
            return TEXT, buffer
        match = found.pattern.search(buffer) if found.pattern is not None else None
        if match is not None:
            start, end = match.span()
            if not self.final and found.pending_before(buffer, start):
                match = None  # a longer needle that starts earlier may still complete: decide with more text
            elif start > 0:
                self.buffer = buffer[start:]
                return TEXT, buffer[:start]
            elif not self.final and found.extends[match.group(0)] and buffer in found.prefixes:
                return None  # a longer needle may still complete here: wait
            else:
                self.buffer = buffer[end:]
                return NEEDLE, match.group(0)
        keep = 0 if self.final else found.partial(buffer)
        if len(buffer) <= keep:
            return None
        self.buffer = buffer[len(buffer) - keep :] if keep else ""
        return TEXT, buffer[: len(buffer) - keep]
