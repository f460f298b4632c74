"""A Responses ``input`` as chat messages: messages, ``reasoning`` and ``function_call`` items (merged into one
assistant turn, as a template expects) and ``function_call_output`` items (tool messages, each answering a call made
before it), each with where it came from, so an error found once the input was translated names ``input[3]``."""

from __future__ import annotations

from typing import Any

from turnkit.serve.protocol import APIError, Wording

__all__ = ["call_ids", "read_input"]

_MESSAGE_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def call_ids(conversation: list[dict[str, Any]]) -> set[str]:
    """The ids of the tool calls a conversation's assistant turns made."""
    return {
        call["id"]
        for message in conversation
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict) and isinstance(call.get("id"), str)
    }


def read_input(value: Any, calls: set[str]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """``input`` as chat messages, and where each came from (a :class:`~.protocol.Wording`'s ``messages``):
    consecutive reasoning, assistant text and function calls make one assistant turn. ``calls``: the ids of the calls
    made before (in the stored conversation); a ``function_call_output`` must answer one of them or a
    ``function_call`` before it, as OpenAI requires."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}], [{"": "input", ".content": "input"}]
    if value is None:
        return [], []
    if not isinstance(value, list):
        raise APIError(400, "input must be a string or a list of items", param="input")
    out: list[dict[str, Any]] = []
    places: list[dict[str, str]] = []
    turn: dict[str, Any] | None = None  # the assistant turn being built
    calls = set(calls)

    def assistant(starts_new: bool, where: str) -> tuple[dict[str, Any], dict[str, str]]:
        nonlocal turn
        if turn is None or starts_new:
            turn = {"role": "assistant", "content": ""}
            out.append(turn)
            places.append({"": where})
        return turn, places[-1]

    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise APIError(400, "an input item must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = _MESSAGE_ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
            if role is None:
                raise APIError(
                    400,
                    f"role must be user, system, developer or assistant, got {item.get('role')!r}",
                    param=f"{where}.role",
                )
            text = _text(item.get("content"), f"{where}.content")
            if role == "assistant":
                starts_new = turn is not None and bool(turn.get("tool_calls") or turn["content"])
                current, place = assistant(starts_new, where)
                current["content"] += text
                place[".content"] = f"{where}.content"
            else:
                turn = None
                out.append({"role": role, "content": text})
                places.append({"": where})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
            starts_new = turn is not None and bool(turn.get("tool_calls") or turn["content"])
            current, place = assistant(starts_new, where)
            current["reasoning_content"] = current.get("reasoning_content", "") + reasoning
            place[".reasoning_content"] = where
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise APIError(400, "a function_call item needs call_id, name and arguments (strings)", param=where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            current, place = assistant(False, where)
            calls_made = current.setdefault("tool_calls", [])
            place.setdefault(".tool_calls", where)  # the first call stands for them all
            place.update(Wording.call(len(calls_made), where, arguments="arguments", name="name"))
            calls_made.append(call)
            calls.add(call_id)
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise APIError(400, "a function_call_output item needs its call_id", param=f"{where}.call_id")
            if call_id not in calls:
                raise APIError(
                    400,
                    f"no function call found for the function_call_output with call_id {call_id!r}: no function_call "
                    "item before it (in input, or in the response previous_response_id names) has that call_id",
                    param=f"{where}.call_id",
                )
            turn = None
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
            places.append({"": where, ".content": f"{where}.output", ".tool_call_id": f"{where}.call_id"})
        else:
            raise APIError(
                400,
                f"input items of type {kind!r} are not supported (messages, function_call, function_call_output and "
                "reasoning are)",
                param=f"{where}.type",
                code="unsupported_parameter",
            )
    return out, places


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts joined by newlines; an image, file or audio part is a 400."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, "content must be a string or a list of parts", param=where)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text", part.get("refusal")), str):
            texts.append(part.get("text", part.get("refusal")))
        else:
            raise APIError(
                400,
                f"content parts of type {kind!r} are not supported: this server serves text models",
                param=f"{where}[{index}]",
            )
    return "\n".join(texts)
