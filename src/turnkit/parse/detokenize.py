"""Token ids back to text, one token at a time, in constant time per token.

Decoding a growing reply again and again to find what is new (what ``TextStreamer`` does) costs time proportional to
the reply on every token. Instead each token id maps to the exact bytes it stands for (a table built once from the
vocabulary and the tokenizer's decoder), and an incremental UTF-8 decoder turns bytes into text as soon as a
character is complete: a token that ends in the middle of a multi-byte character waits for the next one.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

__all__ = ["ByteTable", "TextDecoder"]

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's mapping of the 256 byte values to printable characters, inverted: character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _decoder_kinds(spec: Any) -> list[str]:
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [kind for part in spec.get("decoders", []) for kind in _decoder_kinds(part)]
    kind = spec.get("type", "")
    if kind == "Replace" and spec.get("pattern", {}).get("String") == "▁":
        return ["Metaspace"]
    if kind == "Strip":
        return ["Strip"] if spec.get("start", 0) else []
    return [kind]


class ByteTable:
    """The bytes every token id stands for.

    Built from the vocabulary and the tokenizer's decoder: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM), and
    SentencePiece-style (``▁`` for spaces, ``<0xNN>`` byte fallback). Added tokens stand for their own text.
    """

    def __init__(self, table: list[bytes], strip_first_space: bool) -> None:
        self.table = table
        #: SentencePiece decoders drop the space that starts a text (it was added when encoding).
        self.strip_first_space = strip_first_space

    @classmethod
    def from_tokenizer(cls, backend: Any) -> ByteTable | None:
        """The table for a ``tokenizers.Tokenizer``, or None when its decoder is not one this module knows."""
        spec = json.loads(backend.to_str())
        kinds = set(_decoder_kinds(spec.get("decoder")))
        byte_level = "ByteLevel" in kinds
        metaspace = "Metaspace" in kinds
        if not (byte_level or metaspace) or kinds - {"ByteLevel", "Metaspace", "ByteFallback", "Fuse", "Strip"}:
            return None
        alphabet = _byte_level_alphabet() if byte_level else {}
        added = {int(t["id"]): t["content"] for t in spec.get("added_tokens", [])}
        vocab = backend.get_vocab(with_added_tokens=True)
        table = [b""] * (max(vocab.values(), default=-1) + 1)
        for token, token_id in vocab.items():
            if token_id in added:
                table[token_id] = added[token_id].encode()
            elif byte_level:
                try:
                    table[token_id] = bytes(alphabet[c] for c in token)
                except KeyError:
                    table[token_id] = token.encode()
            elif (match := _BYTE_TOKEN.fullmatch(token)) is not None:
                table[token_id] = bytes([int(match.group(1), 16)])
            else:
                table[token_id] = token.replace("▁", " ").encode()
        return cls(table, strip_first_space=metaspace and "Strip" in kinds)

    def bytes_of(self, token_id: int) -> bytes:
        return self.table[token_id] if 0 <= token_id < len(self.table) else b""


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

    def flush(self) -> str:
        if self._table is None:
            text = self._backend.decode(self._pending, skip_special_tokens=False) if self._pending else ""
            self._pending = []
            return text
        return self._utf8.decode(b"", final=True)

    def _feed_slow(self, token_id: int) -> str:
        # Generic fallback: decode the tokens since the last complete character; a short window, so still linear.
        self._pending.append(token_id)
        text = self._backend.decode(self._pending, skip_special_tokens=False)
        if text.endswith("\ufffd") and len(self._pending) < 8:
            return ""
        self._pending = []
        return text
