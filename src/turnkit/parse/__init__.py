"""Parsing replies: token ids (or text) back to an assistant message, incrementally while streaming.

* :mod:`.formats`: reply formats as data (reasoning markers, tool-call syntaxes as literals and holes, argument
  encodings, Harmony channels); :mod:`.catalog`: the formats known by name;
* :mod:`.select`: the format of a template, chosen by rendering probe messages (:mod:`.probes`); :mod:`.derive`: a
  format read off a template's own renders, with :mod:`.markers` (marker shapes), :mod:`.locate` (where the probe
  calls landed) and :mod:`.toolsyntax` (the tool syntax built from the text around them);
* :mod:`.detokenize`: token ids to text in constant time per token;
* :mod:`.lexer`: needles (markers, literals, stop strings) across token boundaries, with hold-back;
* :mod:`.encodings`: argument encodings as data, one row each (how it is read, what its text starts with, whether
  it holds the name), each reader in a module of its own; :mod:`.jsonscan`: self-delimited arguments read once,
  character by character; :mod:`.values`: raw values typed by the tool's schema; :mod:`.literals`: Python and Gemma
  literals; :mod:`.calls`: the arguments-text rule;
* :mod:`.machine`: the one machine that runs every format, a driver over its collaborators: :mod:`.compiled` (the
  format in symbol space), :mod:`.modes` (where the reading stands: one type per mode, with its own data; the code
  that reads a mode returns the next, the machine alone assigns it), :mod:`.state` (what they share, the deltas out),
  :mod:`.needles` (what each mode looks for), :mod:`.walk` and :mod:`.candidates` (a call's elements),
  :mod:`.arguments` and :mod:`.params` (argument readers), :mod:`.headers` (Harmony's headers), :mod:`.callstate`
  (the call being read);
* :mod:`.parser`: the push parser around the machine; :mod:`.prompt`: a parser for one request's prompt and stops;
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
