"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``): a thin translation onto the
one path.

A body is read into the same :class:`~.protocol.ChatRequest` chat completions make: ``system`` becomes a system
message; ``text`` blocks become message text; ``tool_use`` blocks become the assistant's tool calls and
``tool_result`` blocks tool messages; ``thinking`` blocks become the assistant's reasoning; ``tools`` (with
``input_schema``) become function tools, ``tool_choice`` ``any``/``tool`` a forced call (decoded under the tool's
schema), and a conversation that ends with an assistant message is continued (prefill). ``thinking`` and
``output_config.effort`` set the template's thinking switch. The session's steps come back as Anthropic's stream
events (``message_start``, ``content_block_start``/``_delta``/``_stop`` with ``text_delta``, ``thinking_delta`` and
``input_json_delta``, ``message_delta`` with the ``stop_reason`` and usage, ``message_stop``), and a whole message is
those events folded, as the official client folds a stream.

Tool calls are sent when the reply has ended, each as one ``tool_use`` block: its ``input`` must be a JSON object, so
a call is only sent once the parser knows it parsed. A call the model wrote but that did not parse (broken JSON, an
unknown tool) cannot be a ``tool_use`` block; it is sent as the text the model wrote, never dropped.

The body's fields are :data:`FIELDS`: fields that do not change the output (``metadata``, ``cache_control``,
``service_tier``, the ``keep: "all"`` thinking edit of ``context_management`` ...) are accepted; a field that would
change the result and cannot be honoured (an image block, an MCP server ...) is a 400 naming it, and so is a field the
API does not have (``seed``). The tools Anthropic defines (:data:`BUILTIN_TOOLS`: server tools such as
``web_search_20250305``, and client tools whose schema is built into Claude, such as ``bash_20250124``) are left out of
the prompt and named in the reply's ``turnkit_dropped_tools``, or refused with a 400 where the server is told to
(``refuse_builtin``). Errors have Anthropic's shape (:func:`error_body`) and name the body's own
places (``messages[1].content[2].input``), also for errors found once the conversation was translated.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from turnkit.parse.reply import CallStatus, EndReason
from turnkit.serve.protocol import (
    TEMPLATE_FIELDS,
    APIError,
    BuiltinTools,
    ChatRequest,
    DroppedTool,
    Fields,
    Thinking,
    Wording,
    read_chat_input,
    read_field,
    read_reasoning_effort,
    read_single_reply_sampling,
    template_fields,
)
from turnkit.serve.session import Session

__all__ = [
    "BUILTIN_TOOLS",
    "FIELDS",
    "PING",
    "Event",
    "MessagesRequest",
    "error_body",
    "fold_message",
    "message_events",
    "parse_messages",
]

Event = dict[str, Any]
#: The event Anthropic's API sends after ``message_start`` and in a stream's silences (a keep-alive its clients skip).
PING: Event = {"type": "ping"}

_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}

#: Every top-level field of a Messages (or ``count_tokens``) body (:class:`~.protocol.Fields`). ``temperature``,
#: ``top_p`` and ``top_k`` are still read: older clients send them. Without effect: what Claude Code and the SDK send
#: that does not change the reply (where and how fast it runs, caching, billing, fallbacks for refusals).
FIELDS = Fields(
    "Messages",
    read=TEMPLATE_FIELDS
    | {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "metadata",
        "context_management",
    },
    without_effect=frozenset(
        {
            "service_tier",
            "cache_control",
            "inference_geo",
            "speed",
            "diagnostics",
            "betas",
            "fallbacks",
            "fallback_credit_token",
            "billing_policy",
        }
    ),
    refused={
        "container": ("code execution containers are not supported", ("",)),
        "mcp_servers": ("MCP servers are not supported (run the MCP client on your side and pass its tools)", ([],)),
        "compaction": ("compaction requests are not supported", ()),
        "thread": ("server-held threads are not supported: send the whole conversation", ()),
    },
    foreign={
        "max_completion_tokens": "max_tokens",
        "max_output_tokens": "max_tokens",
        "stop": "stop_sequences",
        "input": "messages",
        "instructions": "system",
        "response_format": "output_config.format",
        "reasoning_effort": "output_config.effort",
        "reasoning": "thinking",
        **dict.fromkeys(("seed", "n", "logprobs", "top_logprobs", "logit_bias", "min_p"), None),
        **dict.fromkeys(("presence_penalty", "frequency_penalty", "repetition_penalty"), None),
    },
)
#: The chat request's fields that the Messages API names otherwise.
_FIELD_NAMES = {"response_format": "output_config.format"}

# Block types that carry what a text model cannot read or a server feature this server does not have.
_UNREADABLE = {"image", "document", "search_result", "container_upload"}
_SERVER_BLOCKS = {"server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result"}

#: The tools Anthropic defines (:class:`~.protocol.BuiltinTools`), each a type with a version date
#: (``web_search_20250305``): server tools, run on Anthropic's servers, and client tools the client runs whose input
#: schema is built into Claude (the request gives none). A dated type not listed is one of Anthropic's too.
BUILTIN_TOOLS = BuiltinTools(
    "Anthropic",
    hosted=frozenset(
        {
            "web_search",
            "web_fetch",
            "code_execution",
            "tool_search_tool_regex",
            "tool_search_tool_bm25",
            "mcp_toolset",
            "advisor",
        }
    ),
    client=frozenset({"bash", "text_editor", "computer", "memory", "browser_toolset", "computer_toolset"}),
    dated=re.compile(r"_\d{8}$"),
    any_dated=True,
)


def error_body(error: APIError) -> dict[str, Any]:
    """An :class:`~.protocol.APIError` in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.

    Context overflows are worded as Anthropic words them, because agents act on the words: Claude Code compacts the
    conversation on ``prompt is too long: N tokens > M maximum`` and retries with a smaller ``max_tokens`` on
    ``input length and `max_tokens` exceed context limit: N + K > M``."""
    kind = _ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    facts = error.facts
    if error.code == "context_length_exceeded" and "max_tokens" in facts:
        message = (
            f"input length and `max_tokens` exceed context limit: {facts['prompt_tokens']} + {facts['max_tokens']} > "
            f"{facts['context']}, decrease input length or `max_tokens` and try again"
        )
    elif error.code == "context_length_exceeded":
        message = f"prompt is too long: {facts.get('prompt_tokens')} tokens > {facts.get('context')} maximum"
    return {"type": "error", "error": {"type": kind, "message": message}}


@dataclass(frozen=True)
class MessagesRequest:
    """A Messages body read onto the one path: the :class:`~.protocol.ChatRequest`, and whether thinking text is
    shown (``thinking.display: "omitted"`` asks for thinking blocks without their text)."""

    chat: ChatRequest
    show_thinking: bool = True
    dropped_tools: tuple[DroppedTool, ...] = ()  # built-in tools left out of the prompt


def parse_messages(body: dict[str, Any], *, counting: bool = False, refuse_builtin: bool = False) -> MessagesRequest:
    """A Messages body (or a ``count_tokens`` body, which has no ``max_tokens``), checked field by field. A tool
    Anthropic defines (:data:`BUILTIN_TOOLS`) is left out of the prompt and listed in ``dropped_tools``, or with
    ``refuse_builtin`` a 400."""
    FIELDS.check(body)
    max_tokens = read_field(body, "max_tokens", int)
    if max_tokens is None and not counting:
        raise APIError(400, "max_tokens is required", param="max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    stops = read_field(body, "stop_sequences", list, [])
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
        raise APIError(400, "stop_sequences must be at most 16 non-empty strings", param="stop_sequences")
    top_k = read_field(body, "top_k", int)
    if top_k is not None and top_k < 0:
        raise APIError(400, f"top_k must be 0 or more, got {top_k}", param="top_k")
    read_field(body, "metadata", dict)
    _check_context_management(read_field(body, "context_management", dict))
    raw_tools = read_field(body, "tools", list, [])
    messages, places, referenced = _conversation(body)
    wording = Wording(_FIELD_NAMES, places)
    tools, dropped = _tools(raw_tools, referenced, refuse_builtin)
    tool_choice = _tool_choice(read_field(body, "tool_choice", dict))
    chat_body = {"messages": messages, "tools": tools or None, "tool_choice": tool_choice, **template_fields(body)}
    try:
        chat_input = read_chat_input(chat_body)
    except APIError as error:
        raise wording.reword(error) from None
    thinking, shown = _thinking(body)
    chat_input = replace(chat_input, continue_final=messages[-1]["role"] == "assistant", thinking=thinking)
    sampling = read_single_reply_sampling(body, max_tokens=max_tokens, temperature_max=1.0, stop=stops, top_k=top_k)
    chat = ChatRequest(**sampling, chat_input=chat_input, response_format=_output_format(body), wording=wording)
    return MessagesRequest(chat, show_thinking=shown, dropped_tools=tuple(dropped))


def _check_context_management(value: dict[str, Any] | None) -> None:
    """Edits that would clear context are not made here; only the edit that keeps every thinking block passes."""
    for index, edit in enumerate((value or {}).get("edits") or []):
        if (
            isinstance(edit, dict)
            and str(edit.get("type", "")).startswith("clear_thinking")
            and edit.get("keep")
            in (
                "all",
                None,
            )
        ):
            continue
        raise APIError(
            400,
            f"context_management edit {edit.get('type') if isinstance(edit, dict) else edit!r} is not supported: "
            "this server keeps the whole conversation",
            param=f"context_management.edits[{index}]",
            code="unsupported_parameter",
        )


def _thinking(body: dict[str, Any]) -> tuple[Thinking, bool]:
    """``thinking`` (``enabled``, ``disabled``, ``adaptive``: the template's default) and ``output_config.effort``
    (a hint: it sets the template's effort variable where it has one), and whether thinking text is shown."""
    thinking = read_field(body, "thinking", dict, {})
    kind = thinking.get("type")
    if kind not in (None, "enabled", "disabled", "adaptive"):
        raise APIError(
            400, f"thinking.type must be 'enabled', 'disabled' or 'adaptive', got {kind!r}", param="thinking.type"
        )
    display = thinking.get("display", "summarized")
    if display not in ("summarized", "omitted"):
        raise APIError(400, f"thinking.display must be 'summarized' or 'omitted', got {display!r}", param="thinking")
    config = read_field(body, "output_config", dict, {})
    effort = config.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise APIError(400, "output_config.effort must be a string", param="output_config.effort")
    hint = read_reasoning_effort(effort, "output_config.effort")
    enabled = {"enabled": True, "disabled": False}.get(kind or "")
    return Thinking(enabled=enabled, effort=hint.effort, param="thinking", effort_is_hint=True), display != "omitted"


def _output_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``output_config.format`` (``{"type": "json_schema", "schema": ...}``): the reply is JSON of the schema."""
    config = read_field(body, "output_config", dict, {})
    fmt = config.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise APIError(
            400, "output_config.format must be {'type': 'json_schema', 'schema': {...}}", param="output_config.format"
        )
    return {"type": "json_schema", "name": None, "schema": fmt["schema"]}


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


def _conversation(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, str]], set[str]]:
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


def _tools(
    raw: list[Any], referenced: set[str], refuse_builtin: bool
) -> tuple[list[dict[str, Any]], list[DroppedTool]]:
    """Custom tools as function tools, and the tools Anthropic defines left out (a 400 with ``refuse_builtin``). A
    tool with ``defer_loading`` (tool search) is shown only once a ``tool_reference`` has loaded it."""
    out = []
    dropped: list[DroppedTool] = []
    for index, tool in enumerate(raw):
        where = f"tools[{index}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        left_out = BUILTIN_TOOLS.leave_out(kind, where, refuse=refuse_builtin)
        if left_out is not None:
            dropped.append(left_out)
            continue
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise APIError(400, "a tool must be an object with a name and an input_schema", param=where)
        if kind not in (None, "custom"):
            raise APIError(
                400,
                f"the tool type {kind!r} is not supported: a tool here is a custom tool (type 'custom' or none) with "
                "its name, description and input_schema",
                param=f"{where}.type",
                code="unsupported_parameter",
            )
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise APIError(400, "a tool needs an input_schema (a JSON schema object)", param=f"{where}.input_schema")
        if tool.get("defer_loading") and tool["name"] not in referenced:
            continue
        function = {"name": tool["name"], "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out, dropped


def _tool_choice(choice: dict[str, Any] | None) -> str | dict[str, Any]:
    """Anthropic's ``tool_choice`` in chat terms: ``any`` is ``required``, ``tool`` names the function."""
    if choice is None:
        return "auto"
    kind = choice.get("type")
    if choice.get("disable_parallel_tool_use") and kind == "auto":
        raise APIError(
            400,
            "disable_parallel_tool_use with tool_choice auto is not supported (a forced call, any or tool, is "
            "always one call)",
            param="tool_choice.disable_parallel_tool_use",
        )
    if kind in ("auto", "none"):
        return str(kind)
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise APIError(400, f"tool_choice.type must be 'auto', 'any', 'tool' or 'none', got {kind!r}", param="tool_choice")


# -- the reply ---------------------------------------------------------------------------------------------------------


async def message_events(
    session: Session, model: str, *, show_thinking: bool = True, dropped_tools: Sequence[DroppedTool] = ()
) -> AsyncGenerator[Event, None]:
    """The stream events of one reply: ``message_start`` (its message names the ``dropped_tools`` in
    ``turnkit_dropped_tools``, a field Anthropic's clients keep and ignore), a ``ping``, the content blocks as the text
    and thinking grow, then the tool calls (each one ``tool_use`` block), ``message_delta`` (stop reason, usage) and
    ``message_stop``."""
    start: Event = {
        "type": "message_start",
        "message": {
            "id": f"msg_{session.request_id}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": session.prompt_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        },
    }
    if dropped_tools:
        start["message"]["turnkit_dropped_tools"] = [tool.to_dict() for tool in dropped_tools]
    yield start
    yield PING
    blocks = _Blocks()
    async with aclosing(session.steps()) as steps:
        async for step in steps:
            for delta in step.deltas:
                if delta.reasoning_content:
                    for event in blocks.grow("thinking", delta.reasoning_content if show_thinking else ""):
                        yield event
                if delta.content:
                    for event in blocks.grow("text", delta.content):
                        yield event
    reply = session.reply
    assert reply is not None
    for event in blocks.close():
        yield event
    for call in reply.tool_calls:
        if call.status == CallStatus.OK:
            block = {"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name, "input": {}}
            for event in blocks.whole(block, {"type": "input_json_delta", "partial_json": call.arguments or "{}"}):
                yield event
        else:  # a call that did not parse cannot be a tool_use block: it is what the model wrote
            for event in blocks.grow("text", call.raw or call.arguments):
                yield event
            for event in blocks.close():
                yield event
    cached = min(session.generation.cached_tokens, session.prompt_tokens)
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": _stop_reason(session), "stop_sequence": reply.stop if _stopped(session) else None},
        "usage": {
            "input_tokens": session.prompt_tokens - cached,
            "output_tokens": session.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        },
    }
    yield {"type": "message_stop"}


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _stopped(session: Session) -> bool:
    return session.reply is not None and session.reply.end == EndReason.STOP_STRING


def _stop_reason(session: Session) -> str:
    reply = session.reply
    assert reply is not None
    if reply.finish_reason == "length":
        return "max_tokens"
    if reply.finish_reason == "tool_calls":
        return "tool_use"
    return "stop_sequence" if _stopped(session) else "end_turn"


class _Blocks:
    """The content blocks of a reply being streamed: one block is open at a time, and a delta of another kind closes
    it and opens the next."""

    def __init__(self) -> None:
        self.count = 0
        self.open: str | None = None

    def grow(self, kind: str, text: str) -> list[Event]:
        out = []
        if self.open != kind:
            out += self.close()
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text"}
            if kind == "text":
                block["text"] = ""
            out.append({"type": "content_block_start", "index": self.count, "content_block": block})
            self.open = kind
        if text:
            delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta"}
            if kind == "text":
                delta["text"] = text
            out.append({"type": "content_block_delta", "index": self.count, "delta": delta})
        return out

    def whole(self, block: dict[str, Any], delta: dict[str, Any]) -> list[Event]:
        out = self.close()
        out.append({"type": "content_block_start", "index": self.count, "content_block": block})
        out.append({"type": "content_block_delta", "index": self.count, "delta": delta})
        out.append({"type": "content_block_stop", "index": self.count})
        self.count += 1
        return out

    def close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        self.count += 1
        return [{"type": "content_block_stop", "index": self.count - 1}]


def fold_message(events: Sequence[Event]) -> dict[str, Any]:
    """The whole ``message`` that the events add up to, folded as the official client folds a stream."""
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for event in events:
        kind = event["type"]
        if kind == "message_start":
            message = json.loads(json.dumps(event["message"]))
        elif kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop" and event["index"] in partial:
            message["content"][event["index"]]["input"] = json.loads(partial.pop(event["index"]) or "{}")
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"].update(event["usage"])
    return message
