"""Choosing the reply format of a template (temporary: substring rules, replaced by probe renders)."""

from __future__ import annotations

from turnkit.parse.catalog import REPLY_FORMATS, get
from turnkit.parse.formats import ReplyFormat
from turnkit.template.chat_template import ChatTemplate

__all__ = ["for_template"]


def for_template(template: ChatTemplate) -> ReplyFormat:
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
