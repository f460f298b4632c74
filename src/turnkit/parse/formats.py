"""Reply formats as data: how a model writes reasoning and tool calls in its reply.

===========  ===============================================================================================
``plain``    text only
``hermes``   ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5)
``qwen3``    ``hermes`` plus ``<think>...</think>`` reasoning
``llama3``   Llama 3.1/3.2: a reply that is a JSON object ``{"name": ..., "parameters": {...}}`` (several joined by
             ``;``), optionally after ``<|python_tag|>``
``mistral``  ``[TOOL_CALLS]`` then a JSON list of ``{"name": ..., "arguments": {...}}``, or ``name[ARGS]{...}``
``reasoning``  ``<think>...</think>`` reasoning, no tools (DeepSeek-R1 and its distillations)
===========  ===============================================================================================

:func:`for_template` picks the format of a chat template from what it declares (a family's reply format) or from the
markers its templates write; it can always be named instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from turnkit.errors import UnknownReplyFormatError
from turnkit.template.chat_template import ChatTemplate

__all__ = ["REPLY_FORMATS", "ReplyFormat", "for_template", "get"]

ToolSyntax = Literal["none", "tagged_json", "llama_json", "mistral"]


@dataclass(frozen=True)
class ReplyFormat:
    """How replies of one model family are written.

    Attributes:
        name: The format's name.
        reasoning: The markers around reasoning, e.g. ``("<think>", "</think>")``.
        tool_syntax: ``tagged_json`` (a JSON object between ``tool_start`` and ``tool_end``), ``llama_json`` (the
            reply is a JSON object, optionally after ``tool_start``), ``mistral`` (``tool_start`` then a JSON list
            or ``name[ARGS]{...}``), or ``none``.
        tool_start: The marker before tool calls.
        tool_end: The marker after each tool call (``tagged_json`` only).
        arguments_keys: The keys a call's arguments may come under, first preferred.
    """

    name: str
    reasoning: tuple[str, str] | None = None
    tool_syntax: ToolSyntax = "none"
    tool_start: str | None = None
    tool_end: str | None = None
    arguments_keys: tuple[str, ...] = ("arguments",)

    @property
    def markers(self) -> tuple[str, ...]:
        found = [*(self.reasoning or ()), self.tool_start, self.tool_end]
        if self.tool_syntax == "mistral":
            found.append("[ARGS]")
        return tuple(m for m in found if m)


_THINK = ("<think>", "</think>")

REPLY_FORMATS: dict[str, ReplyFormat] = {
    f.name: f
    for f in (
        ReplyFormat("plain"),
        ReplyFormat("hermes", None, "tagged_json", "<tool_call>", "</tool_call>"),
        ReplyFormat("qwen3", _THINK, "tagged_json", "<tool_call>", "</tool_call>"),
        ReplyFormat("llama3", None, "llama_json", "<|python_tag|>", None, ("parameters", "arguments")),
        ReplyFormat("mistral", None, "mistral", "[TOOL_CALLS]"),
        ReplyFormat("reasoning", _THINK),
    )
}


def get(name: str) -> ReplyFormat:
    try:
        return REPLY_FORMATS[name]
    except KeyError:
        raise UnknownReplyFormatError(f"no reply format {name!r}; the formats are {sorted(REPLY_FORMATS)}") from None


def for_template(template: ChatTemplate) -> ReplyFormat:
    """The reply format of a chat template: the one it declares, else inferred from the markers its templates write."""
    if template.reply_format is not None:
        return get(template.reply_format)
    text = template.all_text
    thinks = "<think>" in text and "</think>" in text
    if "<tool_call>" in text:
        return REPLY_FORMATS["qwen3" if thinks else "hermes"]
    if "[TOOL_CALLS]" in text:
        return REPLY_FORMATS["mistral"]
    if "<|python_tag|>" in text or ("<|start_header_id|>" in text and '"parameters"' in text):
        return REPLY_FORMATS["llama3"]
    if thinks:
        return REPLY_FORMATS["reasoning"]
    return REPLY_FORMATS["plain"]
