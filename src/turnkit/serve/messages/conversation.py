"""A Messages conversation as chat messages: ``system`` and each message's content blocks (``text``, ``tool_use``,
``tool_result``, ``thinking``), each message with where its parts came from, so an error found once the conversation
was translated names the body's own place (``messages[1].content[2].input``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from turnkit.serve.protocol import APIError, Wording, read_field

__all__ = ["read_conversation"]

# Block types that carry what a text model cannot read or a server feature this server does not have.
_UNREADABLE = {"image", "document", "search_result", "container_upload"}
_SERVER_BLOCKS = {"server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result"}


def _text_of(blocks: Sequence[Any], where: str, *, allowed: frozenset[str] = frozenset({"text"})) -> str:
    """The text of text blocks, joined by newlines (as servers flatten text parts for a template that reads a
    string)."""
    texts = []
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind not in allowed:
            raise _block_error(block, f"{where}[{index}]")
    return "\n".join(texts)


def _block_error(block: Any, where: str) -> APIError:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in _UNREADABLE:
        why = f"{kind} blocks are not supported: this server serves text models"
    elif kind in _SERVER_BLOCKS:
        why = f"{kind} blocks are not supported: this server runs no server tools"
    elif kind is None:
        why = "a content block must be an object with a 'type'"
    else:
        why = f"a {kind!r} block is not valid here"
    return APIError(400, why, param=where)


def read_conversation(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, str]], set[str]]:
    """``system`` and ``messages`` as chat messages, where each came from (a :class:`~.protocol.Wording`'s
    ``messages``), and the tools named by ``tool_reference`` blocks (tool search)."""
    out: list[dict[str, Any]] = []
    places: list[dict[str, str]] = []
    system = body.get("system")
    if isinstance(system, list):
        system = _text_of(system, "system")
    elif system is not None and not isinstance(system, str):
        raise APIError(400, "system must be a string or a list of text blocks", param="system")
    if system:
        out.append({"role": "system", "content": system})
        places.append({"": "system", ".content": "system"})
    raw = read_field(body, "messages", list)
    if not raw:
        raise APIError(400, "messages must be a non-empty list", param="messages")
    referenced: set[str] = set()
    for index, message in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise APIError(400, "a message must be an object with 'role' and 'content'", param=where)
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise APIError(400, "content must be a string or a list of content blocks", param=f"{where}.content")
        if role == "assistant":
            turn, place = _assistant(content, f"{where}.content")
            out.append(turn)
            places.append({"": where, **place})
        elif role in ("user", "system"):  # Claude Code sends system messages inside the conversation too
            for turn, place in _user(role, content, f"{where}.content", referenced):
                out.append(turn)
                places.append({"": where, **place})
        else:
            raise APIError(400, f"role must be 'user' or 'assistant', got {role!r}", param=f"{where}.role")
    return out, places, referenced


def _user(
    role: str, blocks: list[Any], where: str, referenced: set[str]
) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """A user turn: each ``tool_result`` a tool message, the text between them a user message, in block order; each
    with where its parts came from."""
    out: list[tuple[dict[str, Any], dict[str, str]]] = []
    texts: list[str] = []
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result" and role == "user":
            if texts:
                out.append(({"role": role, "content": "\n".join(texts)}, {".content": where}))
                texts = []
            at = f"{where}[{index}]"
            place = {"": at, ".content": f"{at}.content", ".tool_call_id": f"{at}.tool_use_id"}
            out.append((_tool_result(block, at, referenced), place))
        else:
            raise _block_error(block, f"{where}[{index}]")
    if texts or not out:
        out.append(({"role": role, "content": "\n".join(texts)}, {".content": where}))
    return out


def _tool_result(block: dict[str, Any], where: str, referenced: set[str]) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise APIError(400, "a tool_result block needs its tool_use_id", param=f"{where}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "tool_reference":
                referenced.add(str(part.get("tool_name", "")))
        names = [p.get("tool_name") for p in content if isinstance(p, dict) and p.get("type") == "tool_reference"]
        text = _text_of(content, f"{where}.content", allowed=frozenset({"text", "tool_reference"}))
        if names and not text:
            text = "Tools loaded: " + ", ".join(str(n) for n in names)
        content = text
    elif not isinstance(content, str):
        raise APIError(400, "tool_result content must be a string or a list of blocks", param=f"{where}.content")
    if block.get("is_error") is True:  # a template has no field for it: the model reads it in the result's text
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _assistant(blocks: list[Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """An assistant turn: its text, its thinking as reasoning, its ``tool_use`` blocks as tool calls; and where each
    call came from."""
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    place = {".content": where, ".reasoning_content": where, ".tool_calls": where}
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}[{index}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted by another server: there is nothing this model could read in it
        elif kind == "tool_use":
            name, arguments = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not name or not isinstance(block.get("id"), str):
                raise APIError(400, "a tool_use block needs an id and a name", param=at)
            if not isinstance(arguments, dict):
                raise APIError(400, "a tool_use block's input must be an object", param=f"{at}.input")
            place.update(Wording.call(len(calls), at, arguments="input", name="name"))
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            )
        else:
            raise _block_error(block, at)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message, place
