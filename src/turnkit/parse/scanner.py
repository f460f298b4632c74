"""Finding stop strings and text markers in a stream of text, across token boundaries, without ever releasing text
that could still become the start of one (hold-back)."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MARKER", "STOP", "TEXT", "TextScanner"]

TEXT, MARKER, STOP = "text", "marker", "stop"


class TextScanner:
    """Feed text pieces; get ``(TEXT, text)``, ``(MARKER, marker)`` and ``(STOP, stop)`` events back.

    Matching is leftmost, then longest; a match that a longer needle could still extend waits for more text, so the
    events are the same however the text is cut into pieces. The work per piece is bounded by the length of the
    longest needle, so a whole stream costs time linear in its length.
    """

    def __init__(self, stops: Iterable[str] = (), markers: Iterable[str] = ()) -> None:
        self.stops = frozenset(s for s in stops if s)
        needles = sorted(self.stops | {m for m in markers if m}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, needles))) if needles else None
        self._first = re.compile("[" + "".join(sorted({re.escape(n[0]) for n in needles})) + "]") if needles else None
        self._prefixes = {n[:k] for n in needles for k in range(1, len(n))}
        self._extends = {n: any(o != n and o.startswith(n) for o in needles) for n in needles}
        self._longest = max(map(len, needles), default=0)
        self.held = ""
        self.stopped: str | None = None

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self.stopped is not None:
            return []
        if self._pattern is None or self._first is None:
            return [(TEXT, text)] if text else []
        buffer = self.held + text
        if not self.held and not self._first.search(text):  # the common case: nothing that could start a needle
            return [(TEXT, text)] if text else []
        events: list[tuple[str, str]] = []
        pos = 0
        while (match := self._pattern.search(buffer, pos)) is not None:
            needle = match.group(0)
            if match.end() == len(buffer) and self._extends[needle]:
                break  # a longer needle may still complete here: wait
            if match.start() > pos:
                events.append((TEXT, buffer[pos : match.start()]))
            pos = match.end()
            if needle in self.stops:
                events.append((STOP, needle))
                self.stopped = needle
                self.held = ""
                return events
            events.append((MARKER, needle))
        rest = buffer[pos:]
        keep = self._partial(rest)
        if len(rest) > keep:
            events.append((TEXT, rest[: len(rest) - keep]))
        self.held = rest[len(rest) - keep :] if keep else ""
        return events

    def flush(self) -> list[tuple[str, str]]:
        """The end of the stream: what was held back is text after all (or a needle that is now complete)."""
        if self.stopped is not None or not self.held:
            return []
        held, self.held = self.held, ""
        events: list[tuple[str, str]] = []
        pos = 0
        for match in self._pattern.finditer(held) if self._pattern else ():
            if match.start() > pos:
                events.append((TEXT, held[pos : match.start()]))
            pos = match.end()
            if match.group(0) in self.stops:
                events.append((STOP, match.group(0)))
                self.stopped = match.group(0)
                return events
            events.append((MARKER, match.group(0)))
        if pos < len(held):
            events.append((TEXT, held[pos:]))
        return events

    def _partial(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some needle."""
        for size in range(min(len(text), self._longest - 1), 0, -1):
            if text[-size:] in self._prefixes:
                return size
        return 0
