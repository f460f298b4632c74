"""Tool calls from their written text: the one rule for arguments text, and the formats read once a call is whole.

Every call turnkit returns has arguments that are JSON text (what OpenAI clients ``json.loads``), whatever the model
wrote: an object is passed as written; a JSON *string* that holds a serialized object (a model that serialized its
arguments itself, as Granite does) is that object's text rather than being encoded twice; any other JSON string
stays a JSON string (``"hello"`` gives the arguments text ``"\\"hello\\""``, as vLLM does), never bare text that is
not JSON. :func:`arguments_text` is that rule, used by the streaming Hermes reader and by the formats below alike.

Llama 3 JSON calls and Mistral's ``[TOOL_CALLS]`` have no end marker per call, so their text is buffered and read
here when the reply ends (:func:`llama_calls`, :func:`mistral_calls`). Each call keeps ``raw``, the text the model
wrote for it, so a call that fails to parse loses nothing.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from turnkit.parse.jsonscan import ObjectReader
from turnkit.parse.reply import CallStatus

__all__ = ["WrittenCall", "arguments_text", "checked_call", "llama_calls", "mistral_calls"]

_WS = " \t\r\n"


class WrittenCall(NamedTuple):
    """A tool call as read from its text, before it gets an id."""

    name: str
    arguments: str
    status: CallStatus
    error: str | None
    raw: str


def arguments_text(raw: str) -> tuple[str, str | None]:
    """The arguments text for the raw JSON text of an arguments value, and an error when it is not valid JSON."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return raw, f"the arguments are not valid JSON ({exc})"
    if isinstance(value, str):
        try:
            serialized = json.loads(value)
        except ValueError:
            return raw, None
        return (value if isinstance(serialized, dict) else raw), None
    return raw, None


def checked_call(name: str, value: str, raw: str) -> WrittenCall:
    """A call whose JSON is complete and has a name: ok, unless its arguments value is not valid JSON."""
    arguments, error = arguments_text(value)
    return WrittenCall(name, arguments, CallStatus.INVALID_JSON if error else CallStatus.OK, error, raw)


def _read_objects(text: str, keys: tuple[str, ...]) -> list[tuple[ObjectReader, str]]:
    """The JSON objects of ``text``, separated by ``;`` or whitespace, each with the text it was read from."""
    out = []
    rest = text
    while rest.strip(_WS + ";"):
        body = rest.lstrip(_WS + ";")
        reader = ObjectReader(keys)
        reader.feed(body)
        out.append((reader, body[: len(body) - len(reader.rest)] if reader.done else body))
        if not reader.done:
            break
        rest = reader.rest
    return out


def llama_calls(text: str, keys: tuple[str, ...]) -> list[WrittenCall] | None:
    """``{"name": ..., "parameters": {...}}`` objects (after ``<|python_tag|>``, separated by ``;``); None when the
    text is not a tool call after all (no ``name`` and no ``<|python_tag|>``)."""
    tagged = text.startswith("<|python_tag|>")
    objects = _read_objects(text.removeprefix("<|python_tag|>"), keys)
    if not objects or ("name" not in objects[0][0].values and not tagged):
        return None
    return [_from_reader(reader, raw, keys) for reader, raw in objects]


def _from_reader(reader: ObjectReader, raw: str, keys: tuple[str, ...]) -> WrittenCall:
    if reader.failed:
        return WrittenCall("", "", CallStatus.INVALID_JSON, reader.failed, raw)
    try:
        name = reader.value("name")
    except ValueError:
        name = None
    value = next((reader.values[k] for k in keys if k in reader.values), "{}")
    if not reader.done:  # buffered calls are read when the reply has ended: it ended inside this one
        return WrittenCall(
            name if isinstance(name, str) else "", value, CallStatus.UNTERMINATED, "the JSON is not complete", raw
        )
    if not isinstance(name, str):
        return WrittenCall("", value, CallStatus.INVALID_JSON, "the tool call has no string 'name'", raw)
    return checked_call(name, value, raw)


def mistral_calls(text: str, tool_start: str) -> list[WrittenCall]:
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` or ``[TOOL_CALLS]name[ARGS]{...}`` (repeated)."""
    out: list[WrittenCall] = []
    for chunk in text.split(tool_start):
        if not chunk.strip(_WS):
            continue
        if "[ARGS]" in chunk:
            name, _, value = chunk.partition("[ARGS]")
            out.append(checked_call(name.strip(), value.strip(_WS), chunk))
            continue
        try:
            items = json.loads(chunk)
        except ValueError as exc:
            error = f"the tool calls are not valid JSON ({exc})"
            out.append(WrittenCall("", chunk.strip(_WS), CallStatus.INVALID_JSON, error, chunk))
            continue
        for item in items if isinstance(items, list) else [items]:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                error = "a tool call has no string 'name'"
                out.append(WrittenCall("", json.dumps(item), CallStatus.INVALID_JSON, error, chunk))
                continue
            value = json.dumps(item.get("arguments", item.get("parameters", {})), ensure_ascii=False)
            out.append(checked_call(item["name"], value, chunk))
    return out
