"""Token ids back to text, one token at a time, in constant time per token.

Decoding a growing reply again and again to find what is new (what ``TextStreamer`` does) costs time proportional to
the reply on every token. Instead each token id maps to the exact bytes it stands for (a table built once from the
vocabulary and the tokenizer's decoder), and an incremental UTF-8 decoder turns bytes into text as soon as a
character is complete: a token that ends in the middle of a multi-byte character waits for the next one. A reply cut
there by its token budget ends before that character (``flush(cut=True)``): its first bytes are no character, and
printing them as U+FFFD would show a character the model never wrote.
"""

from __future__ import annotations

import codecs
from typing import Any

from turnkit.tokenizer.bytetable import ByteTable

__all__ = ["TextDecoder"]


class TextDecoder:
    """Turns a stream of (non-control) token ids into text increments; ``flush`` ends the stream."""

    def __init__(self, table: ByteTable | None, backend: Any) -> None:
        self._table = table
        self._backend = backend
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True
        self._pending: list[int] = []  # only for tokenizers without a byte table

    def feed(self, token_id: int) -> str:
        if self._table is None:
            return self._feed_slow(token_id)
        text = self._utf8.decode(self._table.bytes_of(token_id))
        if self._first and text:
            self._first = False
            if self._table.strip_first_space and text.startswith(" "):
                text = text[1:]
        return text

    def flush(self, *, cut: bool = False) -> str:
        """The text still held back, at the end of the stream. ``cut``: the stream stopped mid-reply (the token budget
        ran out), so an incomplete character at its end is dropped rather than shown as U+FFFD."""
        if self._table is None:
            text = self._backend.decode(self._pending, skip_special_tokens=False) if self._pending else ""
            self._pending = []
            return text.rstrip("\ufffd") if cut else text
        if cut:
            self._utf8.reset()
            return ""
        return self._utf8.decode(b"", final=True)

    def _feed_slow(self, token_id: int) -> str:
        # Generic fallback: decode the tokens since the last complete character; a short window, so still linear.
        self._pending.append(token_id)
        text = self._backend.decode(self._pending, skip_special_tokens=False)
        if text.endswith("\ufffd") and len(self._pending) < 8:
            return ""
        self._pending = []
        return text
