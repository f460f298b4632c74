"""Dataset record formats to conversations: OpenAI messages, ShareGPT, Alpaca (and ``auto``, per record).

Each converter returns the messages (OpenAI shape) and the tools of a record, or raises :class:`RecordError` with the
reason and the field, which the pipeline writes to ``rejects.jsonl``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from turnkit.errors import RecordError

__all__ = ["FORMATS", "FieldMap", "RecordError", "to_conversation"]

FORMATS = ("auto", "openai", "sharegpt", "alpaca")

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function_call": "assistant",
}


@dataclass(frozen=True)
class FieldMap:
    """Where a record keeps its parts, when not under the usual names."""

    messages: str | None = None  # "messages" (openai) or "conversations" (sharegpt)
    tools: str = "tools"
    system: str = "system"
    instruction: str = "instruction"
    input: str = "input"
    output: str = "output"


def _tools(record: dict[str, Any], fields: FieldMap) -> list[Any] | None:
    tools = record.get(fields.tools)
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError as exc:
            raise RecordError(f"tools is a string but not JSON ({exc})", fields.tools) from None
    if not isinstance(tools, list):
        raise RecordError("tools must be a list of tool schemas", fields.tools)
    return tools


def _field(record: dict[str, Any], key: str, kind: str) -> Any:
    """The record's conversation field; a record without it says so (and what it has), not that it is malformed."""
    if key not in record:
        has = ", ".join(sorted(map(str, record))[:8]) or "no fields"
        raise RecordError(f"the record has no {key} field for --format {kind} (it has: {has})", key)
    return record[key]


def _openai(record: dict[str, Any], fields: FieldMap) -> tuple[list[Any], list[Any] | None]:
    key = fields.messages or "messages"
    messages = _field(record, key, "openai")
    if not isinstance(messages, list):
        raise RecordError(f"{key} must be a list of messages", key)
    return messages, _tools(record, fields)


def _sharegpt(record: dict[str, Any], fields: FieldMap) -> tuple[list[Any], list[Any] | None]:
    key = fields.messages or "conversations"
    turns = _field(record, key, "sharegpt")
    if not isinstance(turns, list):
        raise RecordError(f"{key} must be a list of turns", key)
    messages: list[dict[str, Any]] = []
    system = record.get(fields.system)
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    for index, turn in enumerate(turns):
        where = f"{key}[{index}]"
        if not isinstance(turn, dict):
            raise RecordError("a turn must be an object with 'from' and 'value'", where)
        speaker, value = turn.get("from"), turn.get("value")
        role = _SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise RecordError(f"unknown speaker {speaker!r} (known: {sorted(_SHAREGPT_ROLES)})", f"{where}.from")
        if not isinstance(value, str):
            raise RecordError("value must be a string", f"{where}.value")
        if speaker == "function_call":
            try:
                call = json.loads(value)
            except ValueError as exc:
                raise RecordError(f"a function_call value must be JSON ({exc})", f"{where}.value") from None
            calls = call if isinstance(call, list) else [call]
            if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
                raise RecordError("a function_call needs a 'name'", f"{where}.value")
            tool_calls = [
                {"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}}
                for c in calls
            ]
            messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        else:
            messages.append({"role": role, "content": value})
    return messages, _tools(record, fields)


def _alpaca(record: dict[str, Any], fields: FieldMap) -> tuple[list[Any], list[Any] | None]:
    instruction, extra, output = (record.get(f) for f in (fields.instruction, fields.input, fields.output))
    if not isinstance(instruction, str) or not instruction.strip():
        raise RecordError("instruction must be a non-empty string", fields.instruction)
    if extra is not None and not isinstance(extra, str):
        raise RecordError("input must be a string", fields.input)
    if not isinstance(output, str):
        raise RecordError("output must be a string", fields.output)
    messages: list[dict[str, Any]] = []
    system = record.get(fields.system)
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    prompt = instruction if not extra else f"{instruction}\n\n{extra}"
    messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    return messages, None


_CONVERTERS = {"openai": _openai, "sharegpt": _sharegpt, "alpaca": _alpaca}


def detect(record: dict[str, Any], fields: FieldMap) -> str:
    if fields.messages and fields.messages in record:
        value = record[fields.messages]
        if isinstance(value, list) and value and isinstance(value[0], dict) and "from" in value[0]:
            return "sharegpt"
        return "openai"
    if "messages" in record:
        return "openai"
    if "conversations" in record:
        return "sharegpt"
    if fields.instruction in record or fields.output in record:
        return "alpaca"
    raise RecordError("unknown record format: no 'messages', 'conversations', 'instruction' or 'output'")


def to_conversation(record: Any, input_format: str, fields: FieldMap) -> tuple[list[Any], list[Any] | None]:
    """The messages and tools of a record."""
    if not isinstance(record, dict):
        raise RecordError(f"a record must be a JSON object, got {type(record).__name__}")
    kind = detect(record, fields) if input_format == "auto" else input_format
    return _CONVERTERS[kind](record, fields)
