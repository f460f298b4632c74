"""Parsing replies: token ids (or text) back to an assistant message, incrementally while streaming.

* :mod:`.formats`: reply formats as data (Hermes/Qwen, Llama 3 JSON, Mistral, ``<think>`` reasoning);
* :mod:`.detokenize`: token ids to text in constant time per token;
* :mod:`.scanner`: stop strings and text markers across token boundaries, with hold-back;
* :mod:`.jsonscan`: tool-call JSON read once, character by character;
* :mod:`.calls`: the arguments-text rule, and the tool-call formats read once a call is whole (Llama 3, Mistral);
* :mod:`.parser`: the push parser; :mod:`.reply`: what it produces;
* :mod:`.transcript`: a ChatML transcript back to messages.
"""

from turnkit.parse.formats import REPLY_FORMATS, ReplyFormat
from turnkit.parse.parser import StreamParser
from turnkit.parse.reply import CallStatus, Delta, EndReason, ParsedToolCall, Reply, ToolCallDelta

__all__ = [
    "REPLY_FORMATS",
    "CallStatus",
    "Delta",
    "EndReason",
    "ParsedToolCall",
    "Reply",
    "ReplyFormat",
    "StreamParser",
    "ToolCallDelta",
]
