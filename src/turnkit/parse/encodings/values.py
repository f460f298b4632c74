"""Argument values from the text a model wrote, when that text is not JSON: raw parameter text typed by the tool's
JSON schema, and MiniMax M3's elements (each leaf typed the same way). Python and Gemma 4 literals, whose syntax
says their types, are :mod:`.literals`'.

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

from turnkit.errors import UnreadableArguments, ValueSyntaxError
from turnkit.parse.encodings.literals import python_literal_at, skip_space

__all__ = [
    "element_arguments",
    "is_plain_string",
    "param_schema",
    "schema_types",
    "typed_value",
    "unquoted_arguments",
]

Schema = Mapping[str, Any]


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


# -- Python call arguments written without quotes -------------------------------------------------------------------


#: An argument's start: its name and ``=`` (``==`` is a comparison, not an assignment).
_ARGUMENT = re.compile(r"([A-Za-z_]\w*)\s*=(?!=)")
#: Where a value written without quotes ends: the next ``, name=``.
_NEXT_ARGUMENT = re.compile(r",\s*[A-Za-z_]\w*\s*=(?!=)")


def unquoted_arguments(text: str, parameters: Schema | None, tool: str) -> dict[str, Any]:
    """A Python call's keyword arguments where a template wrote values without quotes (``{{ key }}={{ value }}``:
    ``city=São Paulo, days=3``), read with the tool's schema, as the template that wrote them would have them read.

    A value that reads as a Python literal up to the next comma is that literal (a quoted string, a number, a list);
    a string parameter takes the raw text up to the next ``, name=`` or the end of the arguments; another type reads
    the raw text as that type (``days=3``). Where the text does not allow exactly one reading, the call fails with
    the reason (:class:`UnreadableArguments`): no schema says the value is a string, the type does not read, a
    ``, name=`` inside a raw value names no parameter of the tool (text of the value, or an argument of its own?),
    an argument given twice or without a value.
    """
    names = _parameter_names(parameters)
    out: dict[str, Any] = {}
    raw_before: str | None = None  # the argument before, when its value was raw text
    pos = 0
    while True:
        pos = skip_space(text, pos)
        if pos >= len(text):
            return out
        match = _ARGUMENT.match(text, pos)
        if match is None:
            raise UnreadableArguments(f"expected an argument name (key=value) at {text[pos : pos + 30]!r}")
        key = match.group(1)
        if key in out:
            raise UnreadableArguments(f"argument {key!r} of {tool} is written twice")
        if names is not None and key not in names and raw_before is not None:
            raise UnreadableArguments(
                f"{key!r} is no parameter of {tool}, so ', {key}=' may be text of the unquoted value of {raw_before!r} "
                "or an argument of its own: the text allows two readings"
            )
        start = skip_space(text, match.end())
        schema = param_schema(parameters, key)
        literal = _literal_argument(text, start, plain_string=_types(schema) == ["string"])
        if literal is not None:
            out[key], pos = literal
            raw_before = None
            continue
        found = _NEXT_ARGUMENT.search(text, start)
        end = found.start() if found else len(text)
        out[key] = _unquoted_value(text[start:end].strip(), schema, key, tool)
        raw_before = key
        pos = end + 1 if found else end


def _parameter_names(parameters: Schema | None) -> set[str] | None:
    """The parameters a tool's schema lists (None when it lists none, so no name can be told unknown)."""
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    return set(properties) if isinstance(properties, Mapping) and properties else None


def _literal_argument(text: str, start: int, *, plain_string: bool) -> tuple[Any, int] | None:
    """The Python literal at ``start`` and where the next argument starts, when the literal runs to a comma or the end
    (``3`` in ``days=3, ...``; not ``3`` in ``street=3rd Avenue``); an unquoted literal for a parameter that can only
    be a string is its text instead (``zip=02139`` keeps its zero), so None."""
    if plain_string and text[start : start + 1] not in ("'", '"', "[", "{", "("):
        return None
    try:
        value, after = python_literal_at(text, start)
    except ValueSyntaxError:
        return None
    after = skip_space(text, after)
    if after < len(text) and text[after] != ",":
        return None
    return value, after + 1 if after < len(text) else after


def _unquoted_value(raw: str, schema: Schema | None, key: str, tool: str) -> Any:
    """A value written without quotes, typed by its parameter's schema (one reading, or the reason there is none)."""
    if not raw:
        raise UnreadableArguments(f"argument {key!r} of {tool} has no value")
    kinds = _types(schema)
    if not kinds:
        raise UnreadableArguments(
            f"argument {key!r} of {tool} is written without quotes ({raw!r}) and no schema of {tool} types it, so "
            "nothing says it is a string (give the tools with their parameters)"
        )
    if "string" in kinds:
        return typed_value(raw, schema)
    for kind in kinds:
        ok, value = _as(kind, raw)
        if ok:
            return value
    raise UnreadableArguments(
        f"argument {key!r} of {tool} is written without quotes ({raw!r}), and its schema types it "
        f"{' or '.join(kinds)}: the text does not read as one"
    )


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
        at = skip_space(text, pos)
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
        first = skip_space(text, inner)
        nested = text.startswith(prefix + "<", first) and not text.startswith(end_tag, first)
        if nested and _types(child)[:1] == ["string"]:  # a schema that lists string first keeps the elements as text
            finish = text.find(end_tag, inner)
            if finish < 0:
                raise ValueSyntaxError(f"<{key}> is not closed")
            items.append((key, text[inner:finish]))
            pos = finish + len(end_tag)
            continue
        if nested:
            value, after = _elements(text, inner, prefix, child)
            after = skip_space(text, after)
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
