"""An incremental reader of one JSON object: its top-level keys and the raw text of their values, as it arrives.

Tool calls stream as ``{"name": "get_weather", "arguments": {"city": "Par`` ... ; a client wants the name as soon as
it is complete and the arguments piece by piece. Reading character by character, once, keeps the total work linear
(re-parsing the whole buffer on every token, as some servers do, is quadratic).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ObjectReader"]

_WS = " \t\r\n"


class ObjectReader:
    """Reads a JSON object fed in pieces.

    ``feed`` returns the new raw text of the value under ``stream_key`` (the arguments) as it arrives, once the value
    is an object or array; a string or scalar value is only known when complete. ``values`` holds each top-level
    value's raw text once complete, ``done`` is set after the closing brace, ``rest`` holds what followed it.
    """

    def __init__(self, stream_keys: tuple[str, ...] = ("arguments",)) -> None:
        self.stream_keys = stream_keys
        self.values: dict[str, str] = {}
        self.done = False
        self.failed: str | None = None
        self.rest = ""
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

    def feed(self, text: str) -> str:
        if self.done or self.failed:
            self.rest += text
            return ""
        streamed: list[str] = []
        for n, char in enumerate(text):
            state = self._state
            if state == "value":
                self._value.append(char)
                if self._streaming:
                    streamed.append(char)
                if self._in_string:
                    if self._escape:
                        self._escape = False
                    elif char == "\\":
                        self._escape = True
                    elif char == '"':
                        self._in_string = False
                        if self._depth == 0:
                            self._end_value()
                elif self._depth == 0:  # a scalar (true, 42, null): it ends at ',', '}' or whitespace
                    if char in ",}" + _WS:
                        self._value.pop()
                        self._end_value()
                        self._after_value(char)
                        if self.done:
                            self._finish(text, n)
                            break
                elif char == '"':
                    self._in_string = True
                elif char in "{[":
                    self._depth += 1
                elif char in "}]":
                    self._depth -= 1
                    if self._depth == 0:
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
                        break
                    self._state = "colon"
                else:
                    self._key.append(char)
                continue
            if char in _WS:
                continue
            if state == "start":
                if char != "{":
                    self._fail(f"expected '{{', got {char!r}")
                    break
                self._state = "key_or_end"
            elif state == "key_or_end":
                if char == '"':
                    self._key = []
                    self._state = "key"
                elif char == "}" and not self.values:
                    self._finish(text, n)
                    break
                else:
                    self._fail(f"expected a key, got {char!r}")
                    break
            elif state == "colon":
                if char != ":":
                    self._fail(f"expected ':', got {char!r}")
                    break
                self._state = "value_start"
            elif state == "value_start":
                self._value = [char]
                self._state = "value"
                if char == '"':
                    self._in_string = True
                elif char in "{[":
                    self._depth = 1
                    if self._current in self.stream_keys:
                        self._streaming = True
                        streamed.append(char)
            elif state == "after_value":
                self._after_value(char)
                if self.done:
                    self._finish(text, n)
                    break
        return "".join(streamed)

    def _end_value(self) -> None:
        self.values[self._current or ""] = "".join(self._value)
        self._streaming = False
        self._state = "after_value"

    def _after_value(self, char: str) -> None:
        if char == ",":
            self._state = "key_or_end"
        elif char == "}":
            self.done = True
        elif char not in _WS:
            self._fail(f"expected ',' or '}}', got {char!r}")

    def _finish(self, text: str, index: int) -> None:
        self.done = True
        self.rest = text[index + 1 :]

    def _fail(self, reason: str) -> None:
        self.failed = reason

    def value(self, *keys: str) -> Any:
        """The parsed value of the first of ``keys`` that is present (``None`` when none is)."""
        for key in keys:
            if key in self.values:
                return json.loads(self.values[key])
        return None
