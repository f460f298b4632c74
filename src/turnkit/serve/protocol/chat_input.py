"""What a chat prompt is made of, read from a body with the same checks wherever it appears (chat completions,
``/tokenize``; Responses and Messages build a chat input body of their own): ``messages`` and their roles, ``tools``,
``tool_choice``, prefill, the reasoning effort, and turnkit's template fields.
"""

from __future__ import annotations

from typing import Any

from turnkit.errors import APIError
from turnkit.serve.protocol.fields import read_field
from turnkit.serve.protocol.requests import ChatInput, Thinking

__all__ = [
    "CHAT_INPUT_FIELDS",
    "CHAT_ROLES",
    "TEMPLATE_FIELDS",
    "read_chat_input",
    "read_reasoning_effort",
    "template_fields",
]


#: turnkit's own fields that pick or feed the template, taken alike by every chat-shaped API (chat completions,
#: Responses, Messages) and ``/tokenize``: ``chat_template`` and ``family`` (where the server allows overrides) and
#: ``chat_template_kwargs``.
TEMPLATE_FIELDS = frozenset({"chat_template", "chat_template_kwargs", "family"})

#: The fields :func:`read_chat_input` reads.
CHAT_INPUT_FIELDS = TEMPLATE_FIELDS | {
    "messages",
    "tools",
    "tool_choice",
    "continue_final_message",
    "add_generation_prompt",
    "reasoning_effort",
}

#: The roles of a chat completions message: OpenAI's, less the legacy ``function`` (its ``functions`` field is not
#: supported either). A template may know other roles, but a client's role goes into the prompt as written: ``bot``
#: would be a turn the model never saw in training, so it is refused as the Responses and Messages APIs refuse theirs.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def template_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The :data:`TEMPLATE_FIELDS` a body sets, for an API that builds its own chat input body."""
    return {name: body[name] for name in TEMPLATE_FIELDS if name in body}


def _check_roles(messages: list[Any]) -> None:
    """Every message's role is one of :data:`CHAT_ROLES` (a message that is not an object, or has no role, is left to
    the message checks, which say so)."""
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if isinstance(role, str) and role not in CHAT_ROLES:
            roles = ", ".join(repr(r) for r in CHAT_ROLES[:-1]) + f" or {CHAT_ROLES[-1]!r}"
            raise APIError(400, f"role must be {roles}, got {role!r}", param=f"messages[{index}].role")


def _check_tool_results(messages: list[Any]) -> None:
    """Every ``tool`` message answers a call made before it: its ``tool_call_id`` is the ``id`` of a tool call of an
    earlier assistant message. OpenAI refuses one that answers nothing, and the Responses API here refuses a
    ``function_call_output`` whose ``call_id`` no ``function_call`` made; a result that answers no call would reach
    the template as an orphan turn, which the model never saw in training. A tool message without an id is left to
    the template (some read only the order of results)."""
    made: set[str] = set()
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    made.add(call["id"])
        elif message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str) and call_id and call_id not in made:
                place = f"messages[{index}].tool_call_id"
                reason = (
                    f"{call_id!r} answers no tool call: no assistant message before it has a tool call with that "
                    "id" + (f" (the calls made: {', '.join(map(repr, sorted(made)))})" if made else "")
                )
                raise APIError(400, f"{place}: {reason}", param=place, reason=reason)


def read_chat_input(body: dict[str, Any]) -> ChatInput:
    """``messages``, ``tools``, ``tool_choice``, ``chat_template_kwargs`` and the template override fields, checked
    (the messages themselves are checked where they are rendered, with their index in every error)."""
    messages = read_field(body, "messages", list)
    if not messages:
        raise APIError(400, "messages must be a non-empty list", param="messages")
    _check_roles(messages)
    _check_tool_results(messages)
    tools = read_field(body, "tools", list)
    if tools is not None:
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
                raise APIError(
                    400,
                    f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                    param=f"tools[{index}]",
                )
        tools = tools or None
    tool_choice = body.get("tool_choice", "auto")
    names = [t["function"]["name"] for t in tools or []]
    if tool_choice in ("auto", "none", "required"):
        pass
    elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if name not in names:
            raise APIError(
                400,
                f"tool_choice names the function {name!r}, which is not among the tools {names}",
                param="tool_choice",
            )
    else:
        raise APIError(
            400,
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    if tool_choice == "required" and not tools:
        raise APIError(400, "tool_choice 'required' needs tools", param="tool_choice")
    continue_final = read_field(body, "continue_final_message", bool, False)
    if continue_final and read_field(body, "add_generation_prompt", bool, False):
        raise APIError(
            400,
            "continue_final_message and add_generation_prompt exclude each other: the first continues the last "
            "message, the second opens a new assistant turn",
            param="add_generation_prompt",
        )
    return ChatInput(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        template_kwargs=read_field(body, "chat_template_kwargs", dict, {}),
        chat_template=read_field(body, "chat_template", str),
        family=read_field(body, "family", str),
        continue_final=continue_final,
        thinking=read_reasoning_effort(read_field(body, "reasoning_effort", str), "reasoning_effort"),
    )


def read_reasoning_effort(effort: str | None, param: str) -> Thinking:
    """OpenAI's reasoning effort (``none``, ``minimal``, ``low``, ``medium``, ``high``, ``xhigh``, or a template's
    own level): ``none`` turns thinking off, any other level asks for it (the template's effort variable gets the
    level as given, and checks it itself)."""
    if effort is None:
        return Thinking(param=param)
    if not effort or len(effort) > 32:
        raise APIError(400, f"{param} must be a reasoning level such as 'low', 'medium' or 'high'", param=param)
    if effort == "none":
        return Thinking(enabled=False, param=param)
    return Thinking(effort=effort, param=param)
