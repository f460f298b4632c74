"""Where a probe call landed in a render: its name, its arguments, and the encoding they are written in.

The probes' names, keys and values are sentinels (:mod:`.probes`), so a call is found by searching the render for
them: the name, then the first key, then the smallest JSON value (or Python literal) around the key that holds all
the probe's keys (JSON arguments), and around that one holding the name too (a call written as one object); else
parentheses after the name (Python), braces with a quote before the value (Gemma), else one element per argument
(tagged). :mod:`.toolsyntax` builds the syntax from the text around two such calls.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from turnkit.errors import ValueSyntaxError
from turnkit.parse.choice import probes as p
from turnkit.parse.encodings import encoding_of
from turnkit.parse.encodings.literals import python_literal_at
from turnkit.parse.formats import Arguments

__all__ = ["FoundCall", "locate"]


@dataclass
class FoundCall:
    """Where one call's parts are in a rest."""

    name_start: int
    name_end: int
    args_start: int  # the encoding's own text starts here (a JSON object, the inside of parentheses, a key literal)
    args_end: int  # ... and ends here
    unit_start: int  # for a call written as one JSON object holding its name: the object
    unit_end: int
    encoding: str
    arguments: Arguments | None = None


def _json_at(text: str, start: int, python: bool = False) -> tuple[object, int] | None:
    """The JSON value at ``start`` and where it ends; ``python``: a Python literal there reads too."""
    try:
        value, end = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        if not python:
            return None
        try:
            return python_literal_at(text, start)
        except ValueSyntaxError:
            return None
    return value, end


def _enclosing_object(text: str, inside: int, want: object, python: bool) -> tuple[int, int, object] | None:
    """The nearest JSON value (``python``: or Python literal) starting before ``inside`` that spans it and satisfies
    ``want(value)``."""
    start = inside
    while True:
        start = max(text.rfind("{", 0, start), text.rfind("[", 0, start))
        if start < 0:
            return None
        decoded = _json_at(text, start, python)
        if decoded is not None and decoded[1] > inside and want(decoded[0]):  # type: ignore[operator]
            return start, decoded[1], decoded[0]


def locate(
    rest: str, name: str, keys: tuple[str, ...], after: int, like: FoundCall | None = None, *, python: bool = False
) -> FoundCall | None:
    """Find a probe call by its sentinels, and its encoding (``like``: a call already found, whose quote a Gemma
    call without a string argument reuses; ``python``: the template writes Python literals where JSON would be)."""
    name_at = rest.find(name, after)
    if name_at < 0:
        return None
    name_end = name_at + len(name)
    if not keys:
        return FoundCall(name_at, name_end, name_end, name_end, name_at, name_end, "")
    key_at = rest.find(keys[0], name_end) if rest.find(keys[0], name_end) >= 0 else rest.find(keys[0], after)
    if key_at < 0:
        return None

    def holds_keys(value: object) -> bool:
        return isinstance(value, dict) and all(k in value for k in keys)

    args = _enclosing_object(rest, key_at, holds_keys, python)
    if args is not None:
        args_start, args_end, _ = args

        def holds_call(value: object) -> bool:
            if not isinstance(value, dict):
                return False
            return name in value or any(v == name for v in value.values())

        unit = _enclosing_object(rest, min(args_start, name_at) + 0, holds_call, python)
        if unit is not None and unit[0] <= name_at and unit[1] >= args_end:
            obj = unit[2]
            assert isinstance(obj, dict)
            if name in obj:
                spec = Arguments("json_call", name_as_key=True, python_literals=python)
            else:
                name_key = next(k for k, v in obj.items() if v == name)
                args_key = next(k for k, v in obj.items() if isinstance(v, dict) and holds_keys(v))
                spec = Arguments("json_call", name_key=name_key, keys=(args_key,), python_literals=python)
            return FoundCall(name_at, name_end, unit[0], unit[1], unit[0], unit[1], "json_call", spec)
        json_args = Arguments("json", python_literals=python)
        return FoundCall(name_at, name_end, args_start, args_end, name_at, args_end, "json", json_args)
    if re.match(r"\s*\(", rest[name_end:]):
        open_at = rest.index("(", name_end)
        close = _python_close(rest, open_at + 1)
        if close is not None and keys[0] in rest[open_at:close]:
            return FoundCall(name_at, name_end, open_at + 1, close, name_at, close + 1, "python", Arguments("python"))
    if re.match(r"\s*\{", rest[name_end:]):
        open_at = rest.index("{", name_end)
        between = rest[key_at + len(keys[0]) : rest.find(p.TEXT_VALUE, key_at)]
        quote = between.lstrip(":").strip() if between.startswith(":") else ""
        if like is not None and like.arguments is not None and encoding_of(like.arguments).quoted:
            quote = like.arguments.quote
        close = _gemma_close(rest, open_at, quote)
        if close is not None and quote:
            gemma = Arguments("gemma", quote=quote)
            return FoundCall(name_at, name_end, open_at, close, name_at, close, "gemma", gemma)
    return FoundCall(name_at, name_end, key_at, key_at, name_at, key_at, "tagged")


def _python_close(text: str, start: int) -> int | None:
    depth, quote, pos = 0, "", start
    while pos < len(text):
        char = text[pos]
        if quote:
            if char == "\\":
                pos += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return pos if char == ")" else None
            depth -= 1
        pos += 1
    return None


def _gemma_close(text: str, start: int, quote: str) -> int | None:
    depth, pos = 0, start
    while pos < len(text):
        if text.startswith(quote, pos):
            end = text.find(quote, pos + len(quote))
            if end < 0:
                return None
            pos = end + len(quote)
            continue
        if text[pos] in "{[":
            depth += 1
        elif text[pos] in "}]":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return None
