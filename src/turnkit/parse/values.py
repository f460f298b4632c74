"""Argument values from the text a model wrote, when that text is not JSON: raw parameter text typed by the tool's
JSON schema, Python call literals, and Gemma 4's literals.

The schema decides, as the template that wrote the value would have it read back: a ``string`` stays a string even
when it looks like a number (``"007"``); ``integer``/``number``/``boolean``/``null`` parse (Python's ``True`` and
``None`` too, since templates write ``{{ value }}``); ``object``/``array`` parse as JSON, else as a Python literal
(``{'a': 1}``, what ``{{ value }}`` writes for a dict). A union takes the first non-string type the text parses as,
else a string when the union allows one; a nullable string given ``null`` is null; an ``enum`` without a ``type``
is a string. Text a schema cannot type is kept as a string rather than dropped.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ValueSyntaxError",
    "gemma_value",
    "is_plain_string",
    "param_schema",
    "python_arguments",
    "typed_value",
]

Schema = Mapping[str, Any]


class ValueSyntaxError(ValueError):
    """Arguments text that does not read in its encoding."""


def param_schema(parameters: Schema | None, key: str) -> Schema | None:
    """The schema of one parameter of a tool's ``parameters`` schema (None when it has none)."""
    if not isinstance(parameters, Mapping):
        return None
    properties = parameters.get("properties")
    if isinstance(properties, Mapping) and isinstance(properties.get(key), Mapping):
        return properties[key]
    return None


def _types(schema: Schema | None) -> list[str]:
    """The JSON types a schema allows, in the order written ([] when it says nothing)."""
    if not isinstance(schema, Mapping):
        return []
    found: list[str] = []
    kind = schema.get("type")
    if isinstance(kind, str):
        found.append(kind)
    elif isinstance(kind, list):
        found.extend(k for k in kind if isinstance(k, str))
    for key in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(key) or []:
            found.extend(_types(option))
    if not found and isinstance(schema.get("enum"), list):
        enum = schema["enum"]
        found.extend(dict.fromkeys(_json_type(v) for v in enum))
    if not found and "const" in schema:
        found.append(_json_type(schema["const"]))
    if not found and isinstance(schema.get("properties"), Mapping):
        found.append("object")
    if not found and "items" in schema:
        found.append("array")
    if schema.get("nullable") is True:
        found.append("null")
    return list(dict.fromkeys(found))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def is_plain_string(schema: Schema | None) -> bool:
    """True when the value can only be a string: its text streams as it is written."""
    return _types(schema) == ["string"]


_WORDS = {"true": True, "false": False, "null": None, "none": None}


def _as(kind: str, text: str) -> tuple[bool, Any]:
    """``(True, value)`` when ``text`` reads as JSON type ``kind``."""
    stripped = text.strip()
    if kind == "string":
        return True, text
    if kind in ("integer", "number"):
        try:
            value = json.loads(stripped)
        except ValueError:
            try:
                value = float(stripped) if kind == "number" else int(stripped)
            except ValueError:
                return False, None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False, None
        if kind == "integer" and isinstance(value, float):
            if not value.is_integer():
                return False, None
            value = int(value)
        if isinstance(value, float) and not math.isfinite(value):
            return False, None
        return True, value
    if kind == "boolean":
        word = stripped.lower()
        return (True, word == "true") if word in ("true", "false") else (False, None)
    if kind == "null":
        return (True, None) if stripped.lower() in ("null", "none") else (False, None)
    if kind in ("object", "array"):
        value = _structured(stripped)
        if value is _NOTHING:
            return False, None
        ok = isinstance(value, dict) if kind == "object" else isinstance(value, list)
        return ok, value
    return False, None


_NOTHING = object()


def _structured(text: str) -> Any:
    """JSON, else a Python literal (what ``{{ value }}`` writes for a dict), else nothing."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return _plain(ast.literal_eval(text))
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return _NOTHING


def _plain(value: Any) -> Any:
    """A Python literal as JSON data (tuples are lists; keys are strings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_plain(v) for v in value]
    if isinstance(value, complex | bytes):
        raise ValueError("not JSON data")
    return value


def typed_value(raw: str, schema: Schema | None) -> Any:
    """A raw parameter value as the JSON value its schema says (see the module docstring)."""
    kinds = _types(schema)
    if not kinds:
        return _guess(raw)
    for kind in kinds:
        if kind == "string":
            continue
        ok, value = _as(kind, raw)
        if ok:
            return value
    if "string" in kinds:
        return raw
    return _guess(raw)


def _guess(raw: str) -> Any:
    """No schema: JSON (and Python's True/None, a Python dict) when the text reads as one, else the text."""
    stripped = raw.strip()
    if stripped.lower() in _WORDS:
        return _WORDS[stripped.lower()]
    if stripped[:1] in "-0123456789[{" or stripped[:1] == '"':
        value = _structured(stripped)
        if value is not _NOTHING and not (isinstance(value, float) and not math.isfinite(value)):
            return value
    return raw


# -- Python call syntax ------------------------------------------------------------------------------------------


class _Literals(ast.NodeTransformer):
    """JSON's words in Python syntax: ``true``, ``false``, ``null`` as names."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        words: dict[str, Any] = {"true": True, "false": False, "null": None}
        if node.id in words:
            return ast.copy_location(ast.Constant(words[node.id]), node)
        raise ValueSyntaxError(f"{node.id!r} is not a literal")


def python_arguments(text: str) -> dict[str, Any]:
    """The keyword arguments of a Python call's argument list (``city="Paris", days=3``) as JSON data."""
    try:
        tree = ast.parse(f"f({text})", mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ValueSyntaxError(f"the arguments are not Python call syntax ({exc})") from None
    call = tree.body
    if not isinstance(call, ast.Call):
        raise ValueSyntaxError("the arguments are not Python call syntax")
    if call.args:
        raise ValueSyntaxError("a Python tool call must name every argument (key=value)")
    out: dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            raise ValueSyntaxError("a Python tool call cannot unpack **arguments")
        try:
            node = _Literals().visit(keyword.value)
            out[keyword.arg] = _plain(ast.literal_eval(node))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
            raise ValueSyntaxError(f"argument {keyword.arg!r} is not a literal ({exc})") from None
    return out


# -- Gemma 4 literals ----------------------------------------------------------------------------------------------


def gemma_value(text: str, quote: str = '<|"|>') -> Any:
    """A Gemma 4 value: ``{key:value,...}``, ``[...]``, ``<|"|>text<|"|>``, numbers, ``true``/``false``/``null``."""
    value, end = _gemma(text, 0, quote)
    if text[end:].strip():
        raise ValueSyntaxError(f"unexpected text after the arguments: {text[end:]!r}")
    return value


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _gemma(text: str, pos: int, quote: str) -> tuple[Any, int]:
    pos = _skip(text, pos)
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
        pos = _skip(text, pos + 1)
        if text.startswith("}", pos):
            return out, pos + 1
        while True:
            pos = _skip(text, pos)
            if text.startswith(quote, pos):
                key, pos = _gemma(text, pos, quote)
            else:
                colon = text.find(":", pos)
                if colon < 0:
                    raise ValueSyntaxError("a key has no ':'")
                key = text[pos:colon].strip()
                pos = colon
            pos = _skip(text, pos)
            if not text.startswith(":", pos):
                raise ValueSyntaxError("a key has no ':'")
            out[str(key)], pos = _gemma(text, pos + 1, quote)
            pos = _skip(text, pos)
            if text.startswith(",", pos):
                pos += 1
                continue
            if text.startswith("}", pos):
                return out, pos + 1
            raise ValueSyntaxError("an object is not closed")
    if char == "[":
        items: list[Any] = []
        pos = _skip(text, pos + 1)
        if text.startswith("]", pos):
            return items, pos + 1
        while True:
            item, pos = _gemma(text, pos, quote)
            items.append(item)
            pos = _skip(text, pos)
            if text.startswith(",", pos):
                pos += 1
                continue
            if text.startswith("]", pos):
                return items, pos + 1
            raise ValueSyntaxError("a list is not closed")
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
