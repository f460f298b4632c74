"""A chat request's prompt: the ids every chat-shaped API (and ``/tokenize``) encodes, and what a request asks of it.

Prompts come from ``ChatFormat.encode`` (safe by default: a user who types ``<|im_end|>`` cannot open a turn), the
same for every API:

* prefill (``continue_final``): a conversation that ends with an assistant message continues it; the prompt is the
  template's own text for that open turn (``continue_final_message``), its text encoded as data, and the reply is
  only the continuation;
* the thinking switch (``thinking``, and ``chat_template_kwargs`` named like a switch): set through the variable this
  template reads (:mod:`turnkit.template.switches`); a switch the template does not have is a 400;
* ``tool_choice`` ``required`` or a named function: the start of the call is written for the model and the rest
  decoded under the tool's schema (:func:`~turnkit.serve.structured.forced_call`).

Tools a template does not show, or whose calls turnkit cannot read back, are 400s here, before anything generates.
Nothing here knows the engine: :mod:`.start` hands the ids on.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from turnkit.encode import EncodeOptions
from turnkit.errors import SwitchError, TurnkitError
from turnkit.format import ChatFormat
from turnkit.serve.protocol import APIError, ChatInput, as_api_error
from turnkit.serve.structured import forced_call

# ``chat_template_kwargs`` are template variables. A key named like a variable the request itself sets (``messages``,
# ``tools``, ``add_generation_prompt``) would replace that checked field in the template, and one named like an encode
# option (``trust_data``, ``turns``) reads as a request for that option, which a client may not make: both are 400s
# rather than silently doing something else than what was asked.
_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt"}) | frozenset(
    option.name for option in fields(EncodeOptions)
)


def template_variables(fmt: ChatFormat, chat_input: ChatInput) -> dict[str, Any]:
    """The template variables of a request: its ``chat_template_kwargs`` and its thinking request, each switch set
    through the variable this template reads.

    A key named like a variable the request itself sets (``messages``, ``tools``, ``add_generation_prompt``) or like
    an encode option (``trust_data``, ``turns``) is a 400; so is a thinking switch the template does not have, and a
    thinking field that contradicts a ``chat_template_kwargs`` switch."""
    reserved = sorted(_RESERVED.intersection(chat_input.template_kwargs))
    if reserved:
        raise APIError(
            400,
            f"chat_template_kwargs may not set {reserved[0]!r}: it is set by the request and the server, not a "
            "template variable",
            param=f"chat_template_kwargs.{reserved[0]}",
        )
    try:
        switch = fmt.thinking_switch(tools=chat_input.tools if chat_input.offers_tools else None)
    except TurnkitError as exc:
        raise as_api_error(exc) from None
    try:
        variables = switch.translate(chat_input.template_kwargs)
    except SwitchError as exc:
        raise APIError(400, str(exc), param="chat_template_kwargs", code="unsupported_thinking_switch") from None
    thinking = chat_input.thinking
    try:
        if thinking.effort_is_hint:
            asked = switch.variables(thinking.enabled)
            if switch.effort and thinking.effort and thinking.enabled is not False:
                asked[switch.effort] = thinking.effort
        else:
            asked = switch.variables(thinking.enabled, thinking.effort)
    except SwitchError as exc:
        raise APIError(
            400, f"{thinking.param}: {exc}", param=thinking.param, code="unsupported_thinking_switch"
        ) from None
    for name, value in asked.items():
        if name in variables and variables[name] != value:
            raise APIError(
                400,
                f"{thinking.param} asks for {name}={value!r} but chat_template_kwargs sets {name}={variables[name]!r}",
                param=thinking.param,
            )
    return {**variables, **asked}


def check_tools_shown(fmt: ChatFormat, chat_input: ChatInput) -> None:
    """Tools offered to a template that does not show them are a 400: rendering with and without the tools gives
    the same prompt, so the model would never see them and its plain reply would read as if it had."""
    if not chat_input.offers_tools:
        return
    kwargs = template_variables(fmt, chat_input)
    try:
        shown = fmt.render(chat_input.messages, tools=chat_input.tools, add_generation_prompt=True, **kwargs)
        bare = fmt.render(chat_input.messages, add_generation_prompt=True, **kwargs)
    except TurnkitError as exc:
        raise as_api_error(exc) from None
    if shown == bare:
        raise APIError(
            400,
            "this model's chat template does not support tools: it renders the same prompt with and without them, "
            "so the model would never see them (serve it with a family or template that shows tools, e.g. "
            "--model NAME=PATH:qwen2.5)",
            param="tools",
            code="tools_not_supported",
        )


def chat_prompt_ids(fmt: ChatFormat, chat_input: ChatInput, *, add_generation_prompt: bool = True) -> list[int]:
    """The prompt ids of a chat input, as every chat-shaped API and ``/tokenize`` compute them: the client's own
    ``prompt_token_ids`` where it sent them (chat completions; the ids replace the render, nothing is added)."""
    if chat_input.prompt_ids is not None:
        return list(chat_input.prompt_ids)
    variables = template_variables(fmt, chat_input)
    options = EncodeOptions(
        tools=chat_input.tools if chat_input.offers_tools else None,
        add_generation_prompt=add_generation_prompt and not chat_input.continue_final,
        continue_final_message=_continued_field(chat_input) if chat_input.continue_final else False,
        turns="none",
        template_kwargs=variables,
    )
    try:
        encoding = fmt.encode(chat_input.messages, options)
    except TurnkitError as exc:
        raise as_api_error(exc) from None
    assert not isinstance(encoding, list)  # one encoding: split_turns is off
    return encoding.input_ids.tolist()


def check_tools_readable(fmt: ChatFormat, chat_input: ChatInput) -> None:
    """Tools offered to a template whose tool calls turnkit cannot read back are a 400: the model's calls would
    come back as text, the failure every agent loop trips over. (The template's reply format says why.)"""
    if not chat_input.offers_tools:
        return
    choice = fmt.reply_choice
    if choice.tools_unreadable or not choice.format.reads_tools:
        raise APIError(
            400,
            "this model's chat template writes tool calls in a syntax turnkit cannot read back, so its calls would "
            f"come back as text ({choice.format.reason}); serve it with a template override or a family whose tool "
            "syntax turnkit reads",
            param="tools",
            code="tools_not_readable",
        )


def _continued_field(chat_input: ChatInput) -> str:
    """The field a prefill continues: the final assistant message's text, or its reasoning when it has only that."""
    index = len(chat_input.messages) - 1
    final = chat_input.messages[-1] if chat_input.messages else None
    if not isinstance(final, dict) or final.get("role") != "assistant":
        raise APIError(
            400,
            "continuing the final message needs a conversation that ends with an assistant message",
            param=f"messages[{index}].role",
        )
    if final.get("tool_calls"):
        raise APIError(
            400,
            "the final assistant message calls tools, so it cannot be continued: send the tool results instead",
            param=f"messages[{index}].tool_calls",
        )
    if not final.get("content"):
        reasoning = next((f for f in ("reasoning_content", "thinking", "reasoning") if final.get(f)), None)
        if reasoning is not None:
            return reasoning
    return "content"


def forced_call_ids(fmt: ChatFormat, chat_input: ChatInput) -> list[int]:
    """For ``tool_choice`` ``required`` or a named function: the start of the call, as ids written for the model
    (the rest is decoded under the grammar of :func:`~.structured.forced_call`)."""
    forced = forced_call(fmt, chat_input)
    if forced is None:
        return []
    if chat_input.continue_final:
        raise APIError(
            400,
            "a forced tool call cannot continue the final assistant message: the call is written after a new "
            "assistant turn's header",
            param="tool_choice",
        )
    if isinstance(forced.start, int):
        return [forced.start, *_ids_with_markers(fmt, forced.text)]
    return _ids_with_markers(fmt, forced.start + forced.text)


def _ids_with_markers(fmt: ChatFormat, text: str) -> list[int]:
    """Text to ids where the tokenizer's added tokens written in it are those tokens and the rest is plain text."""
    binding = fmt.tokenizer
    ids: list[int] = []
    pos = 0
    for match in binding.added_pattern.finditer(text) if binding.added else ():
        if match.start() > pos:
            ids += binding.encode_as_text(text[pos : match.start()]).ids
        ids.append(binding.added[match.group(0)].id)
        pos = match.end()
    if pos < len(text):
        ids += binding.encode_as_text(text[pos:]).ids
    return ids
