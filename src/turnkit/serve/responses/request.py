"""A Responses body read into the one path's :class:`~turnkit.serve.protocol.ChatRequest`: the body's fields
(:data:`FIELDS`), the stored conversation ``previous_response_id`` continues, ``instructions``, the tools (function
tools, a ``namespace``'s too; OpenAI's built-in ones left out or refused), ``tool_choice``, ``text.format`` and
``reasoning``, and what the response object echoes back. The ``input`` items are :mod:`.input`'s."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field, replace
from typing import Any

from turnkit.serve.protocol import (
    TEMPLATE_FIELDS,
    APIError,
    BuiltinTools,
    ChatRequest,
    DroppedTool,
    Fields,
    Wording,
    foreign_samplers,
    read_chat_input,
    read_field,
    read_reasoning_effort,
    read_single_reply_sampling,
    sampler_fields,
    template_fields,
)
from turnkit.serve.responses.input import call_ids, read_input
from turnkit.serve.responses.store import ResponseStore

__all__ = ["BUILTIN_TOOLS", "FIELDS", "ResponsesRequest", "parse_responses"]

#: Every top-level field of a Responses body (:class:`~.protocol.Fields`). Without effect: what the OpenAI SDK and
#: Codex send that does not change the reply. Refused: what this server does not do (a value that asks for nothing
#: passes).
FIELDS = Fields(
    "Responses",
    read=TEMPLATE_FIELDS
    | sampler_fields("responses")
    | {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "text",
        "reasoning",
        "stream",
        "store",
        "metadata",
        "include",
        "parallel_tool_calls",
        "user",
    },
    without_effect=frozenset(
        {
            "safety_identifier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "client_metadata",
            "service_tier",
            "stream_options",
        }
    ),
    refused={
        "background": ("background responses are not supported", (False,)),
        "conversation": ("conversations are not supported; use previous_response_id", ()),
        "prompt": ("stored prompt templates are not supported", ()),
        "truncation": ("only truncation 'disabled' is supported: this server never drops input", ("disabled",)),
        "max_tool_calls": ("max_tool_calls is not supported", ()),
        "top_logprobs": ("log-probabilities are not supported in the Responses API; use chat completions", (0,)),
        "context_management": ("context management (compaction) is not supported", ()),
    },
    foreign={
        "messages": "input",
        "max_tokens": "max_output_tokens",
        "max_completion_tokens": "max_output_tokens",
        "system": "instructions",
        "response_format": "text.format",
        "reasoning_effort": "reasoning.effort",
        "thinking": "reasoning",
        **dict.fromkeys(("seed", "n", "stop", "stop_sequences", "logprobs", "logit_bias"), None),
        **foreign_samplers("responses"),
    },
)
#: The chat request's fields that the Responses API names otherwise.
_FIELD_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}

#: OpenAI's built-in tool types (:class:`~.protocol.BuiltinTools`): hosted ones, run on OpenAI's servers, and the ones
#: the client runs but OpenAI's models call as output items of their own (``computer_call``, ``local_shell_call``,
#: ``custom_tool_call`` ...), never as function calls.
BUILTIN_TOOLS = BuiltinTools(
    "OpenAI",
    hosted=frozenset(
        {
            "web_search",
            "web_search_preview",
            "file_search",
            "code_interpreter",
            "image_generation",
            "mcp",
            "tool_search",
            "programmatic_tool_calling",
        }
    ),
    client=frozenset({"computer", "computer_use_preview", "local_shell", "shell", "apply_patch", "custom"}),
    dated=re.compile(r"_\d{4}_\d{2}_\d{2}$"),
)


@dataclass
class ResponsesRequest:
    """A Responses body on the one path: the chat request (conversation, tools, sampling), and what the response
    object echoes back."""

    chat: ChatRequest
    conversation: list[dict[str, Any]]  # the stored history and this input, without the instructions
    store: bool
    echo: dict[str, Any] = field(default_factory=dict)
    namespaces: dict[str, str] = field(default_factory=dict)  # function name -> the namespace it came in
    dropped_tools: list[DroppedTool] = field(default_factory=list)  # built-in tools left out of the prompt


def parse_responses(body: dict[str, Any], store: ResponseStore, *, refuse_builtin: bool = False) -> ResponsesRequest:
    """A Responses body, checked field by field (400s name the field); ``previous_response_id`` is looked up in
    ``store``. A built-in tool (:data:`BUILTIN_TOOLS`) is left out of the prompt and listed in ``dropped_tools``, or
    with ``refuse_builtin`` a 400."""
    FIELDS.check(body)
    max_tokens = read_field(body, "max_output_tokens", int)
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"max_output_tokens must be at least 1, got {max_tokens}", param="max_output_tokens")
    read_field(body, "metadata", dict)
    read_field(body, "include", list)
    previous_id = read_field(body, "previous_response_id", str)
    history = copy.deepcopy(store.found(previous_id, "previous_response_id").conversation) if previous_id else []
    places: list[dict[str, str]] = [{"": "previous_response_id"} for _ in history]
    given, given_places = read_input(body.get("input"), call_ids(history))
    conversation = history + given
    instructions = read_field(body, "instructions", str)
    if instructions:
        places.insert(0, {"": "instructions", ".content": "instructions"})
    wording = Wording(_FIELD_NAMES, places + given_places)
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    if not messages:
        raise APIError(400, "input must be a string or a non-empty list of items", param="input")
    tools, namespaces, dropped = _tools(read_field(body, "tools", list, []), refuse_builtin)
    chat_body = {"messages": messages, "tools": tools or None, "tool_choice": _tool_choice(body)}
    try:
        chat_input = read_chat_input({**chat_body, **template_fields(body)})
    except APIError as error:
        raise wording.reword(error) from None
    reasoning = read_field(body, "reasoning", dict, {})
    effort = reasoning.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise APIError(400, "reasoning.effort must be a string", param="reasoning.effort")
    chat_input = replace(chat_input, thinking=read_reasoning_effort(effort, "reasoning.effort"))
    text = read_field(body, "text", dict, {})
    response_format = _text_format(text)
    if response_format is not None and chat_input.offers_tools:
        raise APIError(400, "text.format and tools cannot be combined", param="text.format")
    sampling = read_single_reply_sampling(body, "responses", max_tokens=max_tokens)
    chat = ChatRequest(**sampling, chat_input=chat_input, response_format=response_format, wording=wording)
    echo = {
        "instructions": instructions,
        "max_output_tokens": max_tokens,
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": read_field(body, "parallel_tool_calls", bool, True),
        "previous_response_id": previous_id,
        "reasoning": {"effort": effort, "summary": reasoning.get("summary")},
        "temperature": chat.samplers.get("temperature"),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": chat.samplers.get("top_p"),
        "truncation": "disabled",
        "user": body.get("user"),
    }
    if dropped:
        echo["turnkit_dropped_tools"] = [tool.to_dict() for tool in dropped]
    return ResponsesRequest(chat, conversation, read_field(body, "store", bool, True), echo, namespaces, dropped)


def _text_format(text: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format``; ``text.verbosity`` other than the default cannot be honoured."""
    if text.get("verbosity") not in (None, "medium"):
        raise APIError(400, "text.verbosity is not supported", param="text.verbosity", code="unsupported_parameter")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema", {}), dict):
        return {"type": "json_schema", "name": fmt.get("name"), "schema": fmt.get("schema", {})}
    raise APIError(
        400,
        "text.format must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'schema': {...}}",
        param="text.format",
    )


def _tool_choice(body: dict[str, Any]) -> str | dict[str, Any]:
    choice = body.get("tool_choice", "auto")
    if choice in ("auto", "none", "required"):
        return str(choice)
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise APIError(
        400,
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        param="tool_choice",
    )


def _tools(raw: list[Any], refuse_builtin: bool) -> tuple[list[dict[str, Any]], dict[str, str], list[DroppedTool]]:
    """Function tools in chat's shape (a ``namespace``'s functions under their own names), and the built-in tools
    left out (a 400 with ``refuse_builtin``); any other type is a 400."""
    out: list[dict[str, Any]] = []
    namespaces: dict[str, str] = {}
    dropped: list[DroppedTool] = []

    def function(tool: Any, where: str, namespace: str | None) -> None:
        kind = tool.get("type") if isinstance(tool, dict) else None
        left_out = BUILTIN_TOOLS.leave_out(kind, where, refuse=refuse_builtin)
        if left_out is not None:
            dropped.append(left_out)
            return
        if kind != "function":
            raise APIError(
                400,
                f"the tool type {kind!r} is not supported: this server offers a model function tools (type "
                "'function', or a 'namespace' of them)",
                param=f"{where}.type",
                code="unsupported_parameter",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, "a function tool needs a name", param=f"{where}.name")
        spec: dict[str, Any] = {"name": name, "parameters": tool.get("parameters") or {"type": "object"}}
        if isinstance(tool.get("description"), str):
            spec["description"] = tool["description"]
        if namespace is not None:
            namespaces[name] = namespace
        out.append({"type": "function", "function": spec})

    for index, tool in enumerate(raw):
        where = f"tools[{index}]"
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            for inner, member in enumerate(tool.get("tools") or []):
                function(member, f"{where}.tools[{inner}]", str(tool.get("name", "")))
        else:
            function(tool, where, None)
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        raise APIError(400, "tool names must be unique (across namespaces too)", param="tools")
    return out, namespaces, dropped
