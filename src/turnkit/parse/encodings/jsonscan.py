"""Incremental readers of self-delimited arguments text: a JSON object with its top-level keys (:class:`ObjectReader`),
one JSON value streamed as written (:class:`ValueReader`), and bracketed text whose end only its brackets and quotes
tell (:class:`BracketReader`: Python call arguments, Gemma 4 literals).

Tool calls stream as ``{"name": "get_weather", "arguments": {"city": "Par`` ... ; a client wants the name as soon as
it is complete and the arguments piece by piece. Reading character by character, once, keeps the total work linear
(re-parsing the whole buffer on every token, as some servers do, is quadratic).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["WS", "BracketReader", "ObjectReader", "ValueReader"]

#: JSON's whitespace, which is also what a template may write around a marker or a value.
WS = " \t\r\n"
#: The states of :class:`ObjectReader` in which one character must come: it, and the state it leads to.
_PUNCTUATION = {"start": ("{", "key_or_end"), "colon": (":", "value_start")}
_STRING_SPECIAL = re.compile(r'[\\"]')


class _Nesting:
    """Where a JSON value being read stands (how deep in brackets, inside a string, right after a backslash), for the
    readers below."""

    _depth = 0
    _in_string = False
    _escape = False

    def _structure_char(self, char: str) -> bool:
        """A character of a value outside its strings: True where it closes the value (its depth back to 0)."""
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            return self._depth == 0
        return False

    def _string_char(self, char: str) -> bool:
        """A string's character that is not part of a plain run (a backslash, a quote, what an escape escapes):
        True where it closes the string."""
        if self._escape:
            self._escape = False
        elif char == "\\":
            self._escape = True
        elif char == '"':
            self._in_string = False
            return True
        return False


class ObjectReader(_Nesting):
    """Reads a JSON object fed in pieces.

    ``feed`` returns how many characters of the text belong to the object (the rest follows it) and adds the new
    raw text of the value under one of ``stream_keys`` (the arguments) to ``streamed`` as it arrives, once that value
    is an object or array; a string or scalar value is only known when complete. ``values`` holds each top-level
    value's raw text once complete, ``done`` is set after the closing brace.
    """

    def __init__(self, stream_keys: tuple[str, ...] = ("arguments",), *, stream_first: bool = False) -> None:
        self.stream_keys = stream_keys
        #: Stream the first key's value whatever its key (``{"NAME": {...}}``, the name written as the key).
        self.stream_first = stream_first
        self.values: dict[str, str] = {}
        self.done = False
        self.failed: str | None = None
        self.streamed = ""
        self.parts: list[str] = []
        self._state = "start"  # start, key_or_end, key, colon, value_start, value, after_value
        self._key: list[str] = []
        self._current: str | None = None
        self._value: list[str] = []
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._streaming = False

    @property
    def in_string(self) -> bool:
        """True while the reader is inside a JSON string (a key or a value): a marker written there is text."""
        return self._state == "key" or (self._state == "value" and self._in_string)

    @property
    def streaming(self) -> bool:
        return self._streaming

    @property
    def text(self) -> str:
        """What was read."""
        return "".join(self.parts)

    @property
    def first_key(self) -> str | None:
        """The first key, once read."""
        return next(iter(self.values), None) if self.values else self._current

    def feed(self, text: str) -> int:
        if self.done or self.failed:
            return 0
        streamed: list[str] = []
        used = len(text)
        n = -1
        while n + 1 < len(text):
            n += 1
            char = text[n]
            state = self._state
            if state == "value" and self._in_string and not self._escape and char not in '\\"':
                stop = _STRING_SPECIAL.search(text, n)  # a string's plain run, taken at once
                end = stop.start() if stop is not None else len(text)
                self._value.append(text[n:end])
                if self._streaming:
                    streamed.append(text[n:end])
                n = end - 1
                continue
            if state == "value":
                self._value.append(char)
                if self._streaming:
                    streamed.append(char)
                if self._in_string:
                    if self._string_char(char) and self._depth == 0:
                        self._end_value()
                elif self._depth == 0:  # a scalar (true, 42, null): it ends at ',', '}' or whitespace
                    if char in ",}" + WS:
                        self._value.pop()
                        self._end_value()
                        self._after_value(char)
                        if self.done or self.failed:
                            used = n + 1
                            break
                elif self._structure_char(char):
                    self._end_value()
                continue
            if state == "key":
                if self._escape:
                    self._escape = False
                    self._key.append(char)
                elif char == "\\":
                    self._escape = True
                    self._key.append(char)
                elif char == '"':
                    try:
                        self._current = json.loads('"' + "".join(self._key) + '"')
                    except ValueError:
                        self._fail("a key is not a valid JSON string")
                        used = n
                        break
                    self._state = "colon"
                else:
                    self._key.append(char)
                continue
            if char in WS:
                continue
            punctuation = _PUNCTUATION.get(state)
            if punctuation is not None:  # the object's '{', or a key's ':'
                want, then = punctuation
                if char != want:
                    self._fail(f"expected {want!r}, got {char!r}")
                    used = n
                    break
                self._state = then
            elif state == "key_or_end":
                if char == '"':
                    self._key = []
                    self._state = "key"
                elif char == "}" and not self.values:
                    self.done = True
                    used = n + 1
                    break
                else:
                    self._fail(f"expected a key, got {char!r}")
                    used = n
                    break
            elif state == "value_start":
                self._value = [char]
                self._state = "value"
                if char == '"':
                    self._in_string = True
                elif char in "{[":
                    self._depth = 1
                    if self._current in self.stream_keys or (self.stream_first and not self.values):
                        self._streaming = True
                        streamed.append(char)
            elif state == "after_value":
                self._after_value(char)
                if self.done or self.failed:
                    used = n + 1 if self.done else n
                    break
        self.parts.append(text[:used])
        self.streamed += "".join(streamed)
        return used

    def _end_value(self) -> None:
        self.values[self._current or ""] = "".join(self._value)
        self._streaming = False
        self._state = "after_value"

    def _after_value(self, char: str) -> None:
        if char == ",":
            self._state = "key_or_end"
        elif char == "}":
            self.done = True
        elif char not in WS:
            self._fail(f"expected ',' or '}}', got {char!r}")

    def _fail(self, reason: str) -> None:
        self.failed = reason

    def value(self, *keys: str) -> Any:
        """The parsed value of the first of ``keys`` that is present (``None`` when none is)."""
        for key in keys:
            if key in self.values:
                return json.loads(self.values[key])
        return None


class ValueReader(_Nesting):
    """Reads one JSON object, array or string fed in pieces, as written: ``feed`` returns how many characters belong
    to it (the rest follows it); ``text`` is what was read; ``done`` once it closed, ``failed`` when it did not start
    with ``{``, ``[`` or ``"``. Only nesting is tracked here; whether the text is valid JSON is checked when it is
    complete."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.done = False
        self.failed: str | None = None
        #: The value is a JSON string: its arguments text is only known when it is complete (see ``calls``).
        self.is_string = False
        self._depth = 0
        self._in_string = False
        self._escape = False

    @property
    def in_string(self) -> bool:
        return self._in_string

    @property
    def started(self) -> bool:
        return self._depth > 0 or self.done

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def feed(self, text: str) -> int:
        if self.done or self.failed:
            return 0
        n = -1
        while n + 1 < len(text):
            n += 1
            char = text[n]
            if self._in_string and not self._escape and char not in '\\"':
                stop = _STRING_SPECIAL.search(text, n)  # a string's plain run, skipped at once
                n = (stop.start() if stop is not None else len(text)) - 1
                continue
            if self._depth == 0:
                if char in WS:
                    continue
                if char == '"':
                    self.is_string = True
                    self._in_string = True
                elif char not in "{[":
                    self.failed = f"expected '{{', got {char!r}"
                    self.parts.append(text[:n])
                    return n
                self._depth = 1
                continue
            if self._in_string:
                if self._string_char(char) and self.is_string:
                    self.done = True
                    self.parts.append(text[: n + 1])
                    return n + 1
            elif self._structure_char(char):
                self.done = True
                self.parts.append(text[: n + 1])
                return n + 1
        self.parts.append(text)
        return len(text)


class BracketReader:
    """Reads bracketed text whose end only its brackets and quotes tell.

    ``until_close``: the text is the inside of parentheses already opened (``city="Paris", days=3``), ended by the
    first unmatched ``)``, which is not consumed; otherwise it is one bracketed value (``{...}``), consumed through
    its closing bracket. ``quotes`` are the string delimiters (``'`` and ``"`` with backslash escapes for Python;
    Gemma's ``<|"|>`` without escapes).
    """

    def __init__(self, *, quotes: tuple[str, ...], escapes: bool, until_close: bool) -> None:
        self.quotes = quotes
        self.escapes = escapes
        self.until_close = until_close
        self.done = False
        self.failed: str | None = None
        self._parts: list[str] = []  # the text read so far
        self._tail = ""  # text not yet decided (an escape or a quote cut by the piece's end)
        self._depth = 0
        self._quote: str | None = None
        self._longest_quote = max(map(len, quotes))
        #: per quote, what can end a string's plain run: the quote's first character, and the escape character
        self._specials = {q: re.compile("[" + re.escape(q[0] + ("\\" if escapes else "")) + "]") for q in quotes}

    @property
    def in_string(self) -> bool:
        return self._quote is not None

    @property
    def text(self) -> str:
        """What was read."""
        return "".join(self._parts) + self._tail

    def _keep(self, text: str) -> None:
        self._parts.append(text)
        self._tail = ""

    def feed(self, text: str) -> int:
        """Characters of ``text`` that belong to the value (all of them while it is open)."""
        if self.done or self.failed:
            return 0
        start = len(self._tail)
        buffer = self._tail + text
        pos = 0
        end = len(buffer)
        while pos < end:
            quote = self._quote
            if quote is not None:
                found = self._specials[quote].search(buffer, pos)  # a string's plain run, skipped at once
                if found is None:
                    pos = end
                    break
                pos = found.start()
                if self.escapes and buffer[pos] == "\\":
                    if pos + 1 >= end:
                        break
                    pos += 2
                    continue
                if buffer.startswith(quote, pos):
                    pos += len(quote)
                    self._quote = None
                    continue
                if end - pos < len(quote) and quote.startswith(buffer[pos:]):
                    break  # maybe the closing quote: wait for more
                pos += 1
                continue
            quote = next((q for q in self.quotes if buffer.startswith(q, pos)), None)
            partial = quote is None and end - pos < self._longest_quote
            if partial and any(q.startswith(buffer[pos:]) and len(q) > 1 for q in self.quotes):
                break
            if quote is not None:
                self._quote = quote
                pos += len(quote)
                continue
            char = buffer[pos]
            if self._depth == 0 and not self.until_close:
                if char in WS:
                    pos += 1
                    continue
                if char not in "{[":
                    self.failed = f"expected '{{', got {char!r}"
                    self._keep(buffer[:pos])
                    return max(0, pos - start)
            if char in "([{":
                self._depth += 1
            elif char in ")]}":
                if self._depth == 0:
                    if self.until_close and char == ")":
                        self.done = True
                        self._keep(buffer[:pos])
                        return pos - start
                    self.failed = f"unbalanced {char!r}"
                    self._keep(buffer[:pos])
                    return max(0, pos - start)
                self._depth -= 1
                if self._depth == 0 and not self.until_close:
                    self.done = True
                    self._keep(buffer[: pos + 1])
                    return pos + 1 - start
            pos += 1
        self._parts.append(buffer[:pos])
        self._tail = buffer[pos:]
        return len(text)
