"""See the tokens: one self-contained HTML page per conversation (or per sample of prepared shards).

>>> from turnkit.inspect import conversation_page, render_html
>>> html = render_html(conversation_page(fmt, messages, tools=tools))  # doctest: +SKIP

Layers: :mod:`.tokens` (a token's exact text, control ids, forged markers), :mod:`.page` (the page model, no HTML),
:mod:`.conversation` and :mod:`.shards` (page models from a conversation or from shards), :mod:`.render` (the HTML).
The server's playground (:mod:`turnkit.serve.app.ui`) shows its tokens with the same pieces, CSS and script.
"""

from turnkit.inspect.conversation import conversation_page
from turnkit.inspect.page import Block, Chip, Example, Page, TurnComparison
from turnkit.inspect.render import render_html
from turnkit.inspect.shards import prepared_model, shards_page
from turnkit.inspect.tokens import ForgedMarker, Piece, TokenTexts

__all__ = [
    "Block",
    "Chip",
    "Example",
    "ForgedMarker",
    "Page",
    "Piece",
    "TokenTexts",
    "TurnComparison",
    "conversation_page",
    "prepared_model",
    "render_html",
    "shards_page",
]
