"""Parsing replies: token ids (or text) back to an assistant message, incrementally while streaming.

* :mod:`.formats`: reply formats as data (reasoning markers, tool-call syntaxes as literals and holes, argument
  encodings, Harmony channels); :mod:`.catalog`: the formats known by name;
* :mod:`.select`: the format of a template, chosen by rendering probe messages; :mod:`.derive`: a format read off
  a template's own renders;
* :mod:`.detokenize`: token ids to text in constant time per token;
* :mod:`.lexer`: needles (markers, literals, stop strings) across token boundaries, with hold-back;
* :mod:`.jsonscan`: self-delimited arguments read once, character by character; :mod:`.values`: raw values typed by
  the tool's schema, Python and Gemma literals; :mod:`.calls`: the arguments-text rule;
* :mod:`.engine`: the one engine that runs every format; :mod:`.parser`: the push parser around it;
  :mod:`.reply`: what it produces;
* :mod:`.transcript`: a ChatML transcript back to messages.
"""

from turnkit.parse.catalog import REPLY_FORMATS
from turnkit.parse.formats import Arguments, Channels, Hole, Lit, Reasoning, ReplyFormat, ToolSyntax, tool_syntax
from turnkit.parse.parser import StreamParser
from turnkit.parse.reply import CallStatus, Delta, EndReason, ParsedToolCall, Reply, ToolCallDelta

__all__ = [
    "REPLY_FORMATS",
    "Arguments",
    "CallStatus",
    "Channels",
    "Delta",
    "EndReason",
    "Hole",
    "Lit",
    "ParsedToolCall",
    "Reasoning",
    "Reply",
    "ReplyFormat",
    "StreamParser",
    "ToolCallDelta",
    "ToolSyntax",
    "tool_syntax",
]
