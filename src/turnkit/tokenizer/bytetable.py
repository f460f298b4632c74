"""The bytes every token id stands for, built once from a tokenizer's vocabulary and decoder.

Decoding a growing reply again and again to find what is new costs time proportional to the reply on every token.
With this table each token id maps to its exact bytes, so a stream decodes in constant time per token
(:mod:`turnkit.parse.reading.detokenize` adds the incremental UTF-8 decoder on top).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["ByteTable"]

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
    def from_tokenizer(cls, backend: Any, spec: dict[str, Any] | None = None) -> ByteTable | None:
        """The table for a ``tokenizers.Tokenizer``, or None when its decoder is not one this module knows. ``spec``
        is its ``tokenizer.json`` when the caller has it parsed already (else it is read from ``backend``)."""
        spec = json.loads(backend.to_str()) if spec is None else spec
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

    def with_added(self, added: dict[int, str]) -> ByteTable:
        """This table with ``added`` (id to text) laid over it, as :meth:`from_tokenizer` reads a tokenizer's added
        tokens: each stands for its own text. One vocabulary's table serves every copy of it with other added tokens
        (a template's markers) at the cost of a list copy."""
        table = list(self.table)
        if added:
            table.extend([b""] * (max(added) + 1 - len(table)))
        for token_id, content in added.items():
            table[token_id] = content.encode()
        return ByteTable(table, strip_first_space=self.strip_first_space)

    def bytes_of(self, token_id: int) -> bytes:
        return self.table[token_id] if 0 <= token_id < len(self.table) else b""
