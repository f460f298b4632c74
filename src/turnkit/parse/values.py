"""Argument values from the text a model wrote, when that text is not JSON: raw parameter text typed by the tool's
JSON schema, Python call literals (and a Python literal where JSON would be), and Gemma 4's literals.

The schema decides, as the template that wrote the value would have it read back: a ``string`` stays a string even
when it looks like a number (``"007"``); ``integer``/``number``/``boolean``/``null`` parse (Python's ``True`` and
``None`` too, since templates write ``{{ value }}``); ``object``/``array`` parse as JSON, else as a Python literal
(``{'a': 1}``, what ``{{ value }}`` writes for a dict). A union takes the first non-string type the text parses as,
else a string when the union allows one; a nullable string given ``null`` is null; an ``enum`` without a ``type``
is a string. Without a schema (no tools given, or a parameter the schema does not list) a value is the text as
written. Text a schema cannot type is kept as a string rather than dropped.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ValueSyntaxError",
    "element_arguments",
    "gemma_value",
    "is_plain_string",
    "param_schema",
    "python_arguments",
    "python_literal",
    "python_literal_at",
    "schema_types",
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
    for option in [o for k in ("anyOf", "oneOf", "allOf") for o in parameters.get(k) or []]:  # a composed schema
        if (found := param_schema(option, key)) is not None:
            return found
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


def schema_types(schema: Schema | None) -> list[str]:
    """The JSON types a parameter's schema allows ([] when it says nothing)."""
    return _types(schema)


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
        return raw  # no schema says otherwise: the text as written (as vLLM does; "007" stays "007")
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
    """A small reader of Python literals (``ast.literal_eval`` reads each string token)."""

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


# -- MiniMax M3's elements -------------------------------------------------------------------------------------------


def element_arguments(text: str, prefix: str, parameters: Schema | None) -> dict[str, Any]:
    """``<key>value</key>`` elements, each tag after ``prefix``; an element holding elements is an object, or a list
    when they are all ``<item>``; a leaf is typed by its schema."""
    value, end = _elements(text, 0, prefix, {"type": "object", **(parameters or {})})
    if text[end:].strip():
        raise ValueSyntaxError(f"unexpected text after the arguments: {text[end:][:40]!r}")
    if not isinstance(value, dict):
        raise ValueSyntaxError("the arguments are not elements")
    return value


def _child_schema(schema: Schema | None, key: str) -> Schema | None:
    if not isinstance(schema, Mapping):
        return None
    if key == "item" and isinstance(schema.get("items"), Mapping):
        return schema["items"]
    return param_schema(schema, key)


def _elements(text: str, pos: int, prefix: str, schema: Schema | None) -> tuple[Any, int]:
    """Elements from ``pos`` until a closing tag (not consumed) or the end: an object or a list."""
    items: list[tuple[str, Any]] = []
    while True:
        at = _skip(text, pos)
        if not text.startswith(prefix + "<", at) or text.startswith(prefix + "</", at):
            break
        start = at + len(prefix) + 1
        close = text.find(">", start)
        if close < 0:
            raise ValueSyntaxError("a tag is not closed")
        key = text[start:close]
        end_tag = f"{prefix}</{key}>"
        inner = close + 1
        child = _child_schema(schema, key)
        nested = text.startswith(prefix + "<", _skip(text, inner)) and not text.startswith(end_tag, _skip(text, inner))
        if nested and _types(child)[:1] == ["string"]:  # a schema that lists string first keeps the elements as text
            finish = text.find(end_tag, inner)
            if finish < 0:
                raise ValueSyntaxError(f"<{key}> is not closed")
            items.append((key, text[inner:finish]))
            pos = finish + len(end_tag)
            continue
        if nested:
            value, after = _elements(text, inner, prefix, child)
            after = _skip(text, after)
            if not text.startswith(end_tag, after):
                raise ValueSyntaxError(f"<{key}> is not closed")
            pos = after + len(end_tag)
        else:
            finish = text.find(end_tag, inner)
            if finish < 0:
                raise ValueSyntaxError(f"<{key}> is not closed")
            value = typed_value(text[inner:finish], child)
            pos = finish + len(end_tag)
        items.append((key, value))
    if items and all(key == "item" for key, _ in items):
        return [value for _, value in items], pos
    return dict(items), pos
