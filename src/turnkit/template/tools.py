"""Tools for templates: JSON-schema dicts pass through; Python functions become schemas from hints and docstring.

The schema of a function is the one ``transformers.utils.get_json_schema`` builds (the templates of tool-calling
models were written against that shape), so passing a function to turnkit and to transformers renders the same text:

>>> def get_weather(city: str, unit: str = "celsius"):
...     '''Get the current weather.
...
...     Args:
...         city: The city to look up.
...         unit: The unit of temperature. (choices: ["celsius", "fahrenheit"])
...     '''
>>> function_schema(get_weather)["function"]["parameters"]["required"]
['city']
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import types
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from turnkit.errors import ToolSchemaError

__all__ = ["function_schema", "tool_schemas"]

_JSON_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
_BASIC_TYPES: dict[Any, dict[str, Any]] = {
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    list: {"type": "array"},
    tuple: {"type": "array"},
    dict: {"type": "object"},
    Any: {},
}

_DESCRIPTION = re.compile(r"^(.*?)[\n\s]*(Args:|Returns:|Raises:|\Z)", re.DOTALL)
_ARGS_BLOCK = re.compile(r"\n\s*Args:\n(.*?)[\n\s]*(Returns:|Raises:|\Z)", re.DOTALL)
_ONE_ARG = re.compile(
    r"(?:^|\n)([ \t]*)(\w+)(?:[ \t]*\([^()\n]*\))?:\s*(.*?)\s*(?=\n(?!\1[ \t])[ \t]*\w+(?:[ \t]*\([^()\n]*\))?:|\Z)",
    re.DOTALL,
)
_RETURNS_BLOCK = re.compile(r"\n\s*Returns:\n\s*(.*?)[\n\s]*(Raises:|\Z)", re.DOTALL)
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    kinds = list(dict.fromkeys(_JSON_SCALARS[type(v)] for v in values))
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": values}


def _hint_schema(hint: Any, where: str) -> dict[str, Any]:
    origin, args = get_origin(hint), get_args(hint)
    if origin is None and isinstance(hint, type) and issubclass(hint, Enum):
        values = [member.value for member in hint]
        if not values or any(type(v) not in _JSON_SCALARS for v in values):
            raise ToolSchemaError(f"{where}: the Enum {hint.__name__} must have members with JSON scalar values")
        return _enum_schema(values)
    if origin is None:
        try:
            return dict(_BASIC_TYPES[hint])
        except (KeyError, TypeError):
            raise ToolSchemaError(
                f"{where}: cannot turn the type hint {hint!r} into a JSON schema; use basic types, Enum, Literal, "
                "or list/tuple/dict/Union of them, or pass a JSON schema dict instead of the function"
            ) from None
    if origin is Union or origin is types.UnionType:
        subtypes = [_hint_schema(t, where) for t in args if t is not type(None)]
        if len(subtypes) == 1:
            schema = subtypes[0]
        elif all(s.keys() == {"type"} and isinstance(s["type"], str) for s in subtypes):
            names = sorted({s["type"] for s in subtypes})
            schema = {"type": names[0] if len(names) == 1 else names}
        else:
            schema = {"anyOf": subtypes}
        if type(None) in args:
            schema["nullable"] = True
        return schema
    if origin is Literal and args:
        if any(type(a) not in _JSON_SCALARS for a in args):
            raise ToolSchemaError(f"{where}: Literal values must be JSON scalars")
        return _enum_schema(list(args))
    if origin is list:
        return {"type": "array", "items": _hint_schema(args[0], where)} if args else {"type": "array"}
    if origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or ... in args:
            raise ToolSchemaError(f"{where}: use list[...] for variable-length or single-element tuples")
        return {"type": "array", "prefixItems": [_hint_schema(t, where) for t in args]}
    if origin is dict:
        schema = {"type": "object"}
        if len(args) == 2:
            schema["additionalProperties"] = _hint_schema(args[1], where)
        return schema
    raise ToolSchemaError(f"{where}: cannot turn the type hint {hint!r} into a JSON schema")


def _parameters_schema(func: Callable[..., Any], name: str) -> dict[str, Any]:
    hints = get_type_hints(func)
    params = inspect.signature(func).parameters
    first = next(iter(params), None)
    receiver = first if first in ("self", "cls") and params[first].annotation is inspect.Parameter.empty else None
    required = []
    for pname, param in params.items():
        if pname == receiver:
            continue
        if param.annotation is inspect.Parameter.empty:
            raise ToolSchemaError(f"tool {name!r}: argument {pname!r} has no type hint")
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    properties: dict[str, Any] = {}
    for pname, hint in hints.items():
        if pname == receiver:
            continue
        if pname == "return":
            with contextlib.suppress(ToolSchemaError):  # templates rarely show it; an odd one must not block the tool
                properties[pname] = _hint_schema(hint, f"tool {name!r}, return")
        else:
            properties[pname] = _hint_schema(hint, f"tool {name!r}, argument {pname!r}")
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def function_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The ``{"type": "function", "function": {...}}`` schema of a Python function (Google-style docstring)."""
    name = getattr(func, "__name__", "operation")
    doc = inspect.getdoc(func)
    if not doc:
        raise ToolSchemaError(f"tool {name!r} has no docstring; its description and argument descriptions come from it")
    doc = doc.strip()
    description_match = _DESCRIPTION.search(doc)
    args_match = _ARGS_BLOCK.search(doc)
    returns_match = _RETURNS_BLOCK.search(doc)
    arg_docs: dict[str, str] = {}
    if args_match:
        block = "\n".join(line for line in args_match.group(1).split("\n") if line.strip())
        arg_docs = {m[1]: re.sub(r"\s*\n+\s*", " ", m[2].strip()) for m in _ONE_ARG.findall(block)}

    parameters = _parameters_schema(func, name)
    returns = parameters["properties"].pop("return", None)
    if returns is not None and returns_match:
        returns["description"] = returns_match.group(1).strip()
    for arg, schema in parameters["properties"].items():
        if arg not in arg_docs:
            raise ToolSchemaError(f"tool {name!r}: the docstring's Args section does not describe {arg!r}")
        text = arg_docs[arg]
        choices = _CHOICES.search(text)
        if choices:
            schema["enum"] = [c.strip() if isinstance(c, str) else c for c in json.loads(choices.group(1))]
            text = text[: choices.start()].strip()
        schema["description"] = text

    function: dict[str, Any] = {
        "name": name,
        "description": description_match.group(1).strip() if description_match else None,
        "parameters": parameters,
    }
    if returns is not None:
        function["return"] = returns
    return {"type": "function", "function": function}


def tool_schemas(tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None) -> list[Any] | None:
    """Tools as the template sees them: dicts unchanged, functions and methods turned into schemas."""
    if tools is None:
        return None
    if isinstance(tools, str | bytes | Mapping):
        raise ToolSchemaError("tools must be a list of JSON-schema dicts or Python functions")
    out: list[Any] = []
    for index, tool in enumerate(tools):
        if isinstance(tool, Mapping):
            out.append(tool)
        elif inspect.isfunction(tool) or inspect.ismethod(tool):
            out.append(function_schema(tool))
        else:
            raise ToolSchemaError(
                f"tools[{index}] is a {type(tool).__name__}; give a JSON-schema dict or a Python function"
            )
    return out
