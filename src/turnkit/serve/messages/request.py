"""A Messages body read into the one path's :class:`~turnkit.serve.protocol.ChatRequest`: the body's fields
(:data:`FIELDS`), the tools (custom tools as function tools, Anthropic's own left out or refused), ``tool_choice``,
``thinking`` and ``output_config``. The conversation's blocks are :mod:`.conversation`'s."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from turnkit.serve.messages.conversation import read_conversation
from turnkit.serve.protocol import (
    TEMPLATE_FIELDS,
    APIError,
    BuiltinTools,
    ChatRequest,
    DroppedTool,
    Fields,
    Thinking,
    Wording,
    foreign_samplers,
    read_chat_input,
    read_field,
    read_reasoning_effort,
    read_single_reply_sampling,
    sampler_fields,
    template_fields,
)

__all__ = ["BUILTIN_TOOLS", "FIELDS", "MessagesRequest", "parse_messages"]

#: Every top-level field of a Messages (or ``count_tokens``) body (:class:`~.protocol.Fields`). ``temperature``,
#: ``top_p`` and ``top_k`` are still read: older clients send them. Without effect: what Claude Code and the SDK send
#: that does not change the reply (where and how fast it runs, caching, billing, fallbacks for refusals).
FIELDS = Fields(
    "Messages",
    read=TEMPLATE_FIELDS
    | sampler_fields("messages")
    | {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "stream",
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
        **dict.fromkeys(("seed", "n", "logprobs", "top_logprobs", "logit_bias"), None),
        **foreign_samplers("messages"),
    },
)
#: The chat request's fields that the Messages API names otherwise.
_FIELD_NAMES = {"response_format": "output_config.format"}

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
    read_field(body, "metadata", dict)
    _check_context_management(read_field(body, "context_management", dict))
    raw_tools = read_field(body, "tools", list, [])
    messages, places, referenced = read_conversation(body)
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
    sampling = read_single_reply_sampling(body, "messages", max_tokens=max_tokens, stop=stops)
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
