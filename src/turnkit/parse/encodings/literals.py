"""Literal syntaxes that are not JSON, read into JSON data: Python literals and call arguments (``city="Paris",
days=3``; a Python literal where JSON would be, what ``{{ arguments }}`` without ``tojson`` prints), and Gemma 4's
literals (``{city:<|"|>Paris<|"|>}``).

These are whole-text readers: the machine reads such arguments to their end by their brackets (:mod:`.jsonscan`'s
``BracketReader``) and hands the text here. Typing a raw value by a tool's schema is :mod:`.values`'.
"""

from __future__ import annotations

import json
import re
from typing import Any

from turnkit.errors import ValueSyntaxError

__all__ = ["gemma_value", "python_arguments", "python_literal", "python_literal_at", "skip_space"]


# -- Python call syntax ------------------------------------------------------------------------------------------


def python_literal(text: str) -> Any:
    """One Python literal (``{'city': 'São Paulo', 'metric': True}``: what a template that writes ``{{ arguments }}``
    without ``tojson`` prints) as JSON data; JSON's own syntax reads too, so a model that writes JSON in that slot is
    read as well. Anything after the literal is an error."""
    value, end = python_literal_at(text, 0)
    if text[end:].strip():
        raise ValueSyntaxError(f"unexpected text after the arguments: {text[end : end + 30]!r}")
    return value


def python_literal_at(text: str, start: int) -> tuple[Any, int]:
    """The Python literal at ``start`` of ``text`` (see :func:`python_literal`) and where it ends."""
    reader = _PythonLiterals(text)
    reader.pos = start
    return reader.value(), reader.pos


def python_arguments(text: str) -> dict[str, Any]:
    """The keyword arguments of a Python call's argument list (``city="Paris", days=3``) as JSON data.

    Values are Python literals (strings, numbers, ``True``/``None``, lists, tuples, dicts), JSON's ``true``,
    ``false`` and ``null`` too; a comma missing between two arguments is tolerated (a template that joins them
    without one teaches its model to write them so).
    """
    reader = _PythonLiterals(text)
    out: dict[str, Any] = {}
    while True:
        reader.skip(",")
        if reader.at_end():
            return out
        key = reader.name()
        if key is None:
            raise ValueSyntaxError(f"expected an argument name at {reader.rest()!r}")
        reader.skip()
        if not reader.take("="):
            raise ValueSyntaxError(f"a Python tool call must name every argument (key=value): {key!r}")
        out[key] = reader.value()


_NUMBER = re.compile(r"[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: What follows a string when a comma between two arguments is missing: the next argument's name and ``=``.
_NEXT_ARGUMENT = re.compile(r"[A-Za-z_]\w*\s*=(?!=)")
_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "0": "\0",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
}


def _unescape(body: str) -> str:
    """Python's string escapes (an unknown one keeps its backslash, as Python does)."""
    if "\\" not in body:
        return body
    out, pos = [], 0
    while pos < len(body):
        char = body[pos]
        if char != "\\" or pos + 1 >= len(body):
            out.append(char)
            pos += 1
            continue
        code = body[pos + 1]
        width = {"x": 2, "u": 4, "U": 8}.get(code)
        digits = body[pos + 2 : pos + 2 + width] if width else ""
        if width and len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits):
            out.append(chr(int(body[pos + 2 : pos + 2 + width], 16)))
            pos += 2 + width
        elif code == "\n":
            pos += 2  # a line continuation
        else:
            out.append(_ESCAPES.get(code, "\\" + code))
            pos += 2
    return "".join(out)


_PY_WORDS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


class _PythonLiterals:
    """A small reader of Python literals (strings read leniently and unescaped as Python does: :func:`_unescape`)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def rest(self) -> str:
        return self.text[self.pos : self.pos + 30]

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def skip(self, also: str = "") -> None:
        while self.pos < len(self.text) and (self.text[self.pos] in " \t\r\n" or self.text[self.pos] in also):
            self.pos += 1

    def take(self, char: str) -> bool:
        if self.text.startswith(char, self.pos):
            self.pos += len(char)
            return True
        return False

    def string(self) -> str | None:
        """A quoted string at the position, read leniently: a quote of the string's kind ends it only where an
        argument could end (``,`` ``)`` ``]`` ``}`` ``:``, the next ``name=``, or the end follow it), so the
        unescaped quotes that models write inside shell commands stay in the string; newlines may be written raw."""
        text = self.text
        match = re.match(r"[rRbBuU]{0,2}('\'\'|\"\"\"|'|\")", text[self.pos :])
        if match is None:
            return None
        raw = "r" in match.group(0).lower()
        quote = match.group(1)
        start = self.pos + match.end()
        pos = start
        while pos < len(text):
            if text[pos] == "\\" and not raw:
                pos += 2
                continue
            if text.startswith(quote, pos):
                after = pos + len(quote)
                while after < len(text) and text[after] in " \t\r\n":
                    after += 1
                closes = after >= len(text) or text[after] in ",)]}:" or _NEXT_ARGUMENT.match(text, after)
                if len(quote) == 3 or closes:
                    self.pos = pos + len(quote)
                    body = text[start:pos]
                    return body if raw else _unescape(body)
            pos += 1
        raise ValueSyntaxError("a string is not closed")

    def name(self) -> str | None:
        match = _NAME.match(self.text, self.pos)
        if match is None:
            return None
        self.pos = match.end()
        return match.group(0)

    def value(self) -> Any:
        self.skip()
        text, pos = self.text, self.pos
        if pos >= len(text):
            raise ValueSyntaxError("a value is missing")
        char = text[pos]
        if char in "[(":
            close = "]" if char == "[" else ")"
            self.pos += 1
            items: list[Any] = []
            while True:
                self.skip(",")
                if self.take(close):
                    return items
                items.append(self.value())
                self.skip()
                if not (self.take(",") or self.text.startswith(close, self.pos)):
                    raise ValueSyntaxError(f"a list is not closed at {self.rest()!r}")
        if char == "{":
            self.pos += 1
            out: dict[str, Any] = {}
            members: list[Any] = []  # a set: {'a', 'b'} (read as a list)
            while True:
                self.skip(",")
                if self.take("}"):
                    return members if members and not out else out
                key = self.value()
                self.skip()
                if not out and (members or self.text.startswith((",", "}"), self.pos)):
                    members.append(key)
                    continue
                if not self.take(":"):
                    raise ValueSyntaxError(f"a dict key has no ':' at {self.rest()!r}")
                out[str(key)] = self.value()
                self.skip()
                if not (self.take(",") or self.text.startswith("}", self.pos)):
                    raise ValueSyntaxError(f"a dict is not closed at {self.rest()!r}")
        string = self.string()
        if string is not None:
            return string
        match = _NAME.match(text, pos)
        if match is not None:
            word = match.group(0)
            if word not in _PY_WORDS:  # ``truename=`` where a comma is missing: the literal, then the next name
                word = next((w for w in _PY_WORDS if word.startswith(w)), "")
                if not word:
                    raise ValueSyntaxError(f"{match.group(0)!r} is not a literal")
            self.pos = pos + len(word)
            return _PY_WORDS[word]
        match = _NUMBER.match(text, pos)
        if match is not None and match.group(0) not in "+-":
            self.pos = match.end()
            number = match.group(0).replace("_", "")
            try:
                return int(number)
            except ValueError:
                return float(number)
        raise ValueSyntaxError(f"not a literal at {self.rest()!r}")


# -- Gemma 4 literals ----------------------------------------------------------------------------------------------


def gemma_value(text: str, quote: str = '<|"|>') -> Any:
    """A Gemma 4 value: ``{key:value,...}``, ``[...]``, ``<|"|>text<|"|>``, numbers, ``true``/``false``/``null``."""
    value, end = _gemma(text, 0, quote)
    if text[end:].strip():
        raise ValueSyntaxError(f"unexpected text after the arguments: {text[end:]!r}")
    return value


def skip_space(text: str, pos: int) -> int:
    """The position of the first character at or after ``pos`` that is not whitespace."""
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _after_item(text: str, pos: int, close: str, what: str) -> tuple[int, bool]:
    """Past an object's or list's item: after its ``,`` (False), or after the closing bracket (True)."""
    pos = skip_space(text, pos)
    if text.startswith(",", pos):
        return pos + 1, False
    if text.startswith(close, pos):
        return pos + 1, True
    raise ValueSyntaxError(f"{what} is not closed")


def _gemma(text: str, pos: int, quote: str) -> tuple[Any, int]:
    pos = skip_space(text, pos)
    if text.startswith(quote, pos):
        end = text.find(quote, pos + len(quote))
        if end < 0:
            raise ValueSyntaxError("a string is not closed")
        return text[pos + len(quote) : end], end + len(quote)
    if pos >= len(text):
        raise ValueSyntaxError("a value is missing")
    char = text[pos]
    if char == "{":
        out: dict[str, Any] = {}
        pos = skip_space(text, pos + 1)
        if text.startswith("}", pos):
            return out, pos + 1
        while True:
            pos = skip_space(text, pos)
            if text.startswith(quote, pos):
                key, pos = _gemma(text, pos, quote)
            else:
                colon = text.find(":", pos)
                if colon < 0:
                    raise ValueSyntaxError("a key has no ':'")
                key = text[pos:colon].strip()
                pos = colon
            pos = skip_space(text, pos)
            if not text.startswith(":", pos):
                raise ValueSyntaxError("a key has no ':'")
            out[str(key)], pos = _gemma(text, pos + 1, quote)
            pos, closed = _after_item(text, pos, "}", "an object")
            if closed:
                return out, pos
    if char == "[":
        items: list[Any] = []
        pos = skip_space(text, pos + 1)
        if text.startswith("]", pos):
            return items, pos + 1
        while True:
            item, pos = _gemma(text, pos, quote)
            items.append(item)
            pos, closed = _after_item(text, pos, "]", "a list")
            if closed:
                return items, pos
    end = pos
    while end < len(text) and text[end] not in ",}]":
        end += 1
    word = text[pos:end].strip()
    if word in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[word], end
    try:
        return json.loads(word), end
    except ValueError:
        return word, end
