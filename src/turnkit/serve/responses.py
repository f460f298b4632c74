"""OpenAI's Responses API (``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``): a thin translation onto the
one path.

A body is read into the same :class:`~.protocol.ChatRequest` chat completions make. ``input`` is a string or a list
of items: messages (``input_text``/``output_text`` parts; ``developer`` is the system role), ``function_call`` and
``reasoning`` items (the assistant's calls and reasoning, merged into one assistant turn as a template expects) and
``function_call_output`` items (tool messages). ``instructions`` is the system message; function ``tools`` (also
inside a ``namespace``), ``tool_choice`` (a forced call is decoded under the tool's schema), ``text.format``
(structured output), ``reasoning.effort`` (the template's thinking switch), ``max_output_tokens`` and the sampling
fields map onto the chat request.

The session's steps come back as the documented stream: ``response.created``, ``response.in_progress``, then per
output item ``response.output_item.added``, its deltas (``response.output_text.delta``,
``response.reasoning_text.delta``, ``response.function_call_arguments.delta``) and their ``.done`` events,
``response.output_item.done``, and ``response.completed`` (or ``response.incomplete`` when ``max_output_tokens`` ran
out; the item it ran out in is then ``incomplete`` too), every event with its ``sequence_number``. The whole response
is the one those events build (:class:`ResponseEvents`), so a streamed and a whole answer cannot disagree.

``store`` (the default) keeps a response and the conversation that led to it in a :class:`ResponseStore` (in memory,
bounded, expiring), so ``previous_response_id`` continues it and ``GET``/``DELETE`` find it; a
``function_call_output`` must answer a ``function_call`` made before it (in ``input`` or the stored conversation).

The body's fields are :data:`FIELDS`: fields that do not change the output (``metadata``, ``prompt_cache_key``,
``client_metadata``, ``include`` of encrypted reasoning, ``user``...) are accepted; a field that would change it and
cannot be honoured (``background``, ``truncation: "auto"``...) is a 400 naming it, and so is a field the API does not
have (``max_tokens``: it is ``max_output_tokens`` here). OpenAI's built-in tools (:data:`BUILTIN_TOOLS`: hosted ones
such as ``web_search``, which Codex offers by default, and the client-run ones its models call in their own format)
are left out of the prompt and named in the response's ``turnkit_dropped_tools``, or refused with a 400 where the
server is told to (``refuse_builtin``). Errors name the body's own places (``input[3]``,
``max_output_tokens``), also for errors found once the input was translated into a chat request.
"""

from __future__ import annotations

import copy
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from turnkit.parse.reply import CallStatus, EndReason
from turnkit.serve.protocol import (
    TEMPLATE_FIELDS,
    APIError,
    BuiltinTools,
    ChatRequest,
    DroppedTool,
    Fields,
    Wording,
    read_chat_input,
    read_field,
    read_reasoning_effort,
    read_single_reply_sampling,
    template_fields,
)
from turnkit.serve.session import Session

__all__ = ["BUILTIN_TOOLS", "FIELDS", "ResponseEvents", "ResponseStore", "ResponsesRequest", "parse_responses"]

Event = dict[str, Any]

#: Every top-level field of a Responses body (:class:`~.protocol.Fields`). Without effect: what the OpenAI SDK and
#: Codex send that does not change the reply. Refused: what this server does not do (a value that asks for nothing
#: passes).
FIELDS = Fields(
    "Responses",
    read=TEMPLATE_FIELDS
    | {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "temperature",
        "top_p",
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
        **dict.fromkeys(("seed", "n", "stop", "stop_sequences", "logprobs", "logit_bias", "top_k", "min_p"), None),
        **dict.fromkeys(("presence_penalty", "frequency_penalty", "repetition_penalty"), None),
    },
)
#: The chat request's fields that the Responses API names otherwise.
_FIELD_NAMES = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}
_MESSAGE_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})

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


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class StoredResponse:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]  # the messages it continued and its own reply (without its instructions)
    expires: float


class ResponseStore:
    """Responses kept for ``previous_response_id`` and ``GET``: at most ``size``, each for ``ttl_s`` seconds, the
    oldest dropped first (in memory: a restart forgets them, as the OpenAI API forgets ``store: false`` ones)."""

    def __init__(self, size: int = 1024, ttl_s: float = 3600.0) -> None:
        self.size, self.ttl_s = size, ttl_s
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[response["id"]] = StoredResponse(response, conversation, time.monotonic() + self.ttl_s)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is not None and item.expires < time.monotonic():
                del self._items[response_id]
                return None
            return item

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def found(self, response_id: str, param: str = "response_id") -> StoredResponse:
        item = self.get(response_id)
        if item is None:
            raise APIError(
                404 if param == "response_id" else 400,
                f"no response with id {response_id!r} is stored (it expired, was deleted, was made with store: "
                "false, or the server restarted)",
                param=param,
                code="response_not_found",
            )
        return item


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
    given, given_places = _input(body.get("input"), _call_ids(history))
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
    sampling = read_single_reply_sampling(body, max_tokens=max_tokens, temperature_max=2.0)
    chat = ChatRequest(**sampling, chat_input=chat_input, response_format=response_format, wording=wording)
    echo = {
        "instructions": instructions,
        "max_output_tokens": max_tokens,
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": read_field(body, "parallel_tool_calls", bool, True),
        "previous_response_id": previous_id,
        "reasoning": {"effort": effort, "summary": reasoning.get("summary")},
        "temperature": chat.temperature,
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": chat.top_p,
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


def _call_ids(conversation: list[dict[str, Any]]) -> set[str]:
    """The ids of the tool calls a conversation's assistant turns made."""
    return {
        call["id"]
        for message in conversation
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict) and isinstance(call.get("id"), str)
    }


def _input(value: Any, calls: set[str]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
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


# -- the reply ---------------------------------------------------------------------------------------------------------


class ResponseEvents:
    """The events of one response and the response they build. Iterate :meth:`events` once; ``response`` is then the
    whole response (the very object ``response.completed`` carries), and ``on_done`` has been called with it."""

    def __init__(
        self,
        session: Session,
        model: str,
        req: ResponsesRequest,
        on_done: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.session, self.req, self.on_done = session, req, on_done
        self.sequence = 0
        self.response: dict[str, Any] = {
            "id": f"resp_{session.request_id}",
            "object": "response",
            "created_at": session.created,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "model": model,
            "output": [],
            "usage": None,
            "store": req.store,
            **req.echo,
        }
        self._open: dict[str, Any] | None = None  # the output item being streamed
        self._calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its function_call item
        self._reasoning_tokens = 0

    def _event(self, kind: str, **fields: Any) -> Event:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def error_event(self, error: APIError) -> Event:
        """A failure after the stream started, as the Responses stream's ``error`` event."""
        return self._event("error", code=error.code or error.kind, message=error.message, param=error.param)

    async def events(self) -> AsyncGenerator[Event, None]:
        yield self._event("response.created", response=copy.deepcopy(self.response))
        yield self._event("response.in_progress", response=copy.deepcopy(self.response))
        async with aclosing(self.session.steps()) as steps:
            async for step in steps:
                if any(d.reasoning_content for d in step.deltas):
                    self._reasoning_tokens += 1
                for delta in step.deltas:
                    if delta.reasoning_content:
                        for event in self._text("reasoning", delta.reasoning_content):
                            yield event
                    if delta.content:
                        for event in self._text("message", delta.content):
                            yield event
                    for piece in delta.tool_calls:
                        for event in self._call(piece.index, piece.id, piece.name, piece.arguments):
                            yield event
        for event in self._close():
            yield event
        yield self._finish()

    def _add(self, item: dict[str, Any]) -> list[Event]:
        out = self._close()
        self.response["output"].append(item)
        self._open = item
        out.append(self._event("response.output_item.added", output_index=self._index, item=copy.deepcopy(item)))
        return out

    @property
    def _index(self) -> int:
        return len(self.response["output"]) - 1

    def _text(self, kind: str, text: str) -> list[Event]:
        out: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            if kind == "message":
                item: dict[str, Any] = {"type": "message", "id": _new_id("msg"), "status": "in_progress"}
                item["role"] = "assistant"
                part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"type": "reasoning", "id": _new_id("rs"), "summary": [], "status": "in_progress"}
                part = {"type": "reasoning_text", "text": ""}
            item["content"] = [part]
            out += self._add(item)
            where = {"item_id": item["id"], "output_index": self._index, "content_index": 0}
            out.append(self._event("response.content_part.added", **where, part=copy.deepcopy(part)))
        assert self._open is not None
        self._open["content"][0]["text"] += text
        where = {"item_id": self._open["id"], "output_index": self._index, "content_index": 0}
        if kind == "message":
            out.append(self._event("response.output_text.delta", **where, delta=text, logprobs=[]))
        else:
            out.append(self._event("response.reasoning_text.delta", **where, delta=text))
        return out

    def _call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[Event]:
        out: list[Event] = []
        item = self._calls.get(index)
        if item is None:
            item = {
                "type": "function_call",
                "id": _new_id("fc"),
                "call_id": call_id or "",
                "name": name or "",
                "arguments": "",
                "status": "in_progress",
            }
            if item["name"] in self.req.namespaces:
                item["namespace"] = self.req.namespaces[item["name"]]
            self._calls[index] = item
            out += self._add(item)
        if arguments:
            item["arguments"] += arguments
            where = {"item_id": item["id"], "output_index": self.response["output"].index(item)}
            out.append(self._event("response.function_call_arguments.delta", **where, delta=arguments))
        return out

    def _close(self) -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": self.response["output"].index(item)}
        out: list[Event] = []
        if item["type"] == "function_call":
            done = {"arguments": item["arguments"], "name": item["name"]}
            out.append(self._event("response.function_call_arguments.done", **where, **done))
        else:
            part = item["content"][0]
            kind = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            extra: dict[str, Any] = {"logprobs": []} if item["type"] == "message" else {}
            out.append(self._event(kind, **where, content_index=0, text=part["text"], **extra))
            out.append(self._event("response.content_part.done", **where, content_index=0, part=copy.deepcopy(part)))
        item["status"] = "incomplete" if self._cut(item) else "completed"
        out.append(
            self._event("response.output_item.done", output_index=where["output_index"], item=copy.deepcopy(item))
        )
        return out

    def _cut(self, item: dict[str, Any]) -> bool:
        """Whether the token budget ran out inside ``item``: its status is then ``incomplete``, as OpenAI marks it.

        Known only once the reply is parsed whole, which is when the last item closes (an item closed earlier was
        followed by more of the reply). Text and reasoning the budget ended are cut; a function call only when it was
        still open (its arguments are not whole JSON), not when the budget ran out right after it."""
        reply = self.session.reply
        if reply is None or reply.end != EndReason.LENGTH:
            return False
        if item["type"] != "function_call":
            return True
        index = next(i for i, call in self._calls.items() if call is item)
        return index < len(reply.tool_calls) and reply.tool_calls[index].status == CallStatus.UNTERMINATED

    def _finish(self) -> Event:
        session, reply = self.session, self.session.reply
        assert reply is not None
        cached = min(session.generation.cached_tokens, session.prompt_tokens)
        self.response["usage"] = {
            "input_tokens": session.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": session.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": self._reasoning_tokens},
            "total_tokens": session.prompt_tokens + session.completion_tokens,
        }
        if reply.finish_reason == "length":
            self.response["status"] = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
        else:
            self.response["status"] = "completed"
        if self.on_done is not None:
            self.on_done(self.response)
        kind = "response.completed" if self.response["status"] == "completed" else "response.incomplete"
        return self._event(kind, response=copy.deepcopy(self.response))

    def conversation(self) -> list[dict[str, Any]]:
        """The conversation this response continues, with its own reply: what ``previous_response_id`` picks up."""
        reply = self.session.reply
        assert reply is not None
        return [*self.req.conversation, reply.message()]
