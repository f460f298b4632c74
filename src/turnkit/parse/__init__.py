"""Parsing replies: token ids (or text) back to an assistant message, incrementally while streaming.

Four sub-packages, each importing only the ones listed before it (``tests/test_architecture.py`` checks it):

* :mod:`.encodings`: how a call's arguments are written and read, one row per encoding, each reader in a module of
  its own, with the value scanners they share;
* :mod:`.formats`: reply formats as data (reasoning markers, tool-call syntaxes as literals and holes, Harmony
  channels) and the catalog of formats known by name;
* :mod:`.reading`: the one machine that reads a reply in any format, and the push parser around it;
* :mod:`.choice`: a template's format, chosen by rendering probe messages and keeping the reading that gives them back
  (or derived from the renders).

Beside them: :mod:`.reply` (what a reading produces: the reply, its deltas, why it ended), below all four, and
:mod:`.transcript` (a ChatML transcript back to messages), above them.
"""

from turnkit.parse.formats import Arguments, Channels, Hole, Lit, Reasoning, ReplyFormat, ToolSyntax, tool_syntax
from turnkit.parse.formats.catalog import REPLY_FORMATS
from turnkit.parse.reading.parser import StreamParser
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
