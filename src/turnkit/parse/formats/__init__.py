"""Reply formats as data: what a model's reply looks like, never how it is read.

* :mod:`.reply_format`: the description (:class:`ReplyFormat`: reasoning markers, tool-call syntaxes as literals and
  holes, the arguments' encoding by name, Harmony-style channels), re-exported here;
* :mod:`.catalog`: the formats turnkit knows by name, one entry per syntax the serving peers parse.

What differs by argument encoding is asked of :mod:`turnkit.parse.encodings`' table, below this package. The code
that reads a reply in a format is :mod:`turnkit.parse.reading`, above it; choosing a template's format is
:mod:`turnkit.parse.choice`, at the top.
"""

from turnkit.parse.formats.reply_format import (
    Arguments,
    Channels,
    Element,
    Hole,
    Lit,
    Reasoning,
    ReplyFormat,
    ToolSyntax,
    pattern,
    tool_syntax,
)

__all__ = [
    "Arguments",
    "Channels",
    "Element",
    "Hole",
    "Lit",
    "Reasoning",
    "ReplyFormat",
    "ToolSyntax",
    "pattern",
    "tool_syntax",
]
