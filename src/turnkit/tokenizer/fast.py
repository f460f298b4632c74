"""An exact fast path for byte-level BPE: tiktoken's encoder, built from the tokenizer's own vocab, merges and regex.

Tokenizing is most of the cost of encoding a conversation. For byte-level BPE vocabularies (GPT-2 style: SmolLM2,
Qwen, most current models) tiktoken's BPE gives the same ids several times faster than the ``tokenizers`` call, but
only where the two algorithms provably agree. tiktoken merges, at each step, the adjacent pair whose concatenation has
the lowest rank (rank = token id), and returns a pre-token piece whole when it is a token; ``tokenizers`` merges the
adjacent pair that comes first in its merge list. They agree when (checked here, from the tokenizer's definition):

1. the model is BPE with no dropout, no subword prefix or suffix, no byte fallback, and every vocab entry is bytes
   in the byte-level alphabet;
2. each merge's result is in the vocabulary, no two merges make the same token, a merge's parts come before its
   result, and results' ids grow with the merge order (so "lowest id" is "first merge");
3. every merged token, tokenized alone by the tokenizer's own BPE, is that one token. Then any two adjacent pieces
   whose concatenation is a token are that token's merge (they are a state of the token's own merging, which ends in
   the token), so both algorithms see the same candidates in the same order, and a piece that is a token is
   returned whole by both;
4. the pre-tokenizer is GPT-2's byte-level regex, or a ``Split`` regex followed by a byte-level step without a regex:
   tiktoken runs the same pattern (its regex engine, fancy-regex, is tested against Oniguruma's classes on every
   Unicode code point in ``tests/tokenizer/test_fast_tokenizer.py``), and where the pattern is not GPT-2's, each result
   is also checked to cover its whole text;
5. no normalizer, or NFC (text that is not already NFC goes to ``tokenizers``).

Text holding a character whose bytes have no token (``tokenizers`` drops it, tiktoken cannot) goes to ``tokenizers``,
as does a lone surrogate (which ``tokenizers`` rejects as before). A differential self-check on a built-in probe text
(:mod:`.probe`) runs at load: ids and every character's token must equal the ``tokenizers`` twin's. Anything not
shown equivalent falls back to ``tokenizers``, and the binding says which path is used and why.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tokenizers

from turnkit.tokenizer.bytetable import _byte_level_alphabet

__all__ = ["FastEncoding", "FastTokenizer", "build_fast_tokenizer", "fast_plan"]

#: The regex of ``tokenizers``' ByteLevel pre-tokenizer with ``use_regex`` (GPT-2's).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

#: Set to 0 to always encode with ``tokenizers`` (for comparisons).
ENV_SWITCH = "TURNKIT_FAST_TOKENIZER"


@dataclass(frozen=True)
class FastPlan:
    """What tiktoken needs: the pattern, the ranks (bytes -> id), and what must go to ``tokenizers`` instead."""

    pattern: str
    ranks: dict[bytes, int]
    unencodable: re.Pattern[str] | None  # characters with a byte that has no token
    nfc: bool  # the tokenizer normalizes to NFC: text not already NFC falls back
    check_cover: bool  # the pattern is not GPT-2's: check every result covers its text


def _pre_tokenizer_pattern(spec: Any) -> str:
    """The single regex the pre-tokenizer applies, or raise ValueError with why it has none."""
    if spec is None:
        raise ValueError("no pre-tokenizer (not byte-level)")
    parts = spec.get("pretokenizers") if spec.get("type") == "Sequence" else [spec]
    parts = list(parts or [])
    if not parts or parts[-1].get("type") != "ByteLevel":
        kinds = [p.get("type") for p in parts]
        raise ValueError(f"pre-tokenizer {kinds} does not end in a ByteLevel step")
    last = parts[-1]
    if last.get("add_prefix_space"):
        raise ValueError("ByteLevel adds a prefix space")
    if len(parts) == 1:
        if not last.get("use_regex", True):
            raise ValueError("ByteLevel without a regex and no Split before it")
        return GPT2_PATTERN
    if len(parts) != 2 or last.get("use_regex", True):
        raise ValueError(f"pre-tokenizer {[p.get('type') for p in parts]} is not Split + ByteLevel")
    split = parts[0]
    pattern = split.get("pattern") or {}
    if split.get("type") != "Split" or "Regex" not in pattern:
        raise ValueError(f"pre-tokenizer step {split.get('type')} is not a Split on a regex")
    if split.get("behavior") != "Isolated" or split.get("invert"):
        raise ValueError(f"Split behaviour {split.get('behavior')} (invert={split.get('invert')}) is not Isolated")
    return str(pattern["Regex"])


def _normalizer_is_nfc(spec: Any) -> bool:
    """False for no normalizer, True for NFC; ValueError for anything else."""
    if spec is None:
        return False
    parts = spec.get("normalizers") if spec.get("type") == "Sequence" else [spec]
    kinds = [p.get("type") for p in parts or []]
    if not kinds:
        return False
    if kinds == ["NFC"]:
        return True
    raise ValueError(f"normalizer {kinds} is not supported (only none or NFC)")


def fast_plan(tokenizer: tokenizers.Tokenizer) -> FastPlan:
    """Decide from the tokenizer's definition whether tiktoken gives the same ids; ValueError says why not."""
    spec = json.loads(tokenizer.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"model {model.get('type')} is not BPE")
    if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise ValueError("BPE with dropout or a subword prefix/suffix")
    if model.get("byte_fallback"):
        raise ValueError("BPE with byte fallback (SentencePiece style, not byte-level)")
    nfc = _normalizer_is_nfc(spec.get("normalizer"))
    pattern = _pre_tokenizer_pattern(spec.get("pre_tokenizer"))

    alphabet = _byte_level_alphabet()
    vocab: dict[str, int] = model.get("vocab") or {}
    added = {t["content"] for t in spec.get("added_tokens", [])}

    def to_bytes(token: str) -> bytes:
        try:
            return bytes(alphabet[c] for c in token)
        except KeyError:
            raise ValueError(f"vocab entry {token!r} is not in the byte-level alphabet") from None

    ranks: dict[bytes, int] = {}
    for char, byte in alphabet.items():
        token_id = vocab.get(char)
        if token_id is not None:
            ranks[bytes([byte])] = token_id
    merged: list[str] = []
    last_id = -1
    for merge in model.get("merges") or []:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        result = left + right
        token_id, left_id, right_id = vocab.get(result), vocab.get(left), vocab.get(right)
        if token_id is None or left_id is None or right_id is None:
            raise ValueError(f"merge {left!r} + {right!r} has a part or result outside the vocab")
        if token_id <= last_id:
            raise ValueError(f"merge ranks do not follow ids (merge {left!r} + {right!r} -> id {token_id})")
        if left_id >= token_id or right_id >= token_id:
            raise ValueError(f"merge {left!r} + {right!r} uses a token made after its result")
        last_id = token_id
        ranks[to_bytes(result)] = token_id
        merged.append(result)
    if len(set(ranks.values())) != len(ranks):
        raise ValueError("two byte strings share an id")
    if model.get("ignore_merges"):
        # the tokenizer returns any vocab entry that is a whole piece: every entry must then be reachable by merges
        others = [t for t, i in vocab.items() if t not in added and to_bytes(t) not in ranks]
        if others:
            raise ValueError(f"ignore_merges with vocab entries no merge makes ({len(others)}, e.g. {others[0]!r})")
    _check_merged_tokens(model, merged, vocab)
    missing = [byte for byte in range(256) if bytes([byte]) not in ranks]
    return FastPlan(pattern, ranks, _unencodable(missing), nfc, pattern != GPT2_PATTERN)


def _check_merged_tokens(model: dict[str, Any], merged: Sequence[str], vocab: dict[str, int]) -> None:
    """Condition 3: each merged token, tokenized alone by the tokenizer's BPE (merges only), is itself."""
    from tokenizers.models import BPE

    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model.get("merges") or []]
    bpe = BPE(vocab=vocab, merges=merges, ignore_merges=False)  # merges only, even where the tokenizer shortcuts
    for token in merged:
        pieces = bpe.tokenize(token)
        if len(pieces) != 1 or pieces[0].id != vocab[token]:
            raise ValueError(f"token {token!r} is not what its own merges make ({[p.value for p in pieces]})")


def _unencodable(missing: Sequence[int]) -> re.Pattern[str] | None:
    """Characters whose UTF-8 bytes include one with no token."""
    if not missing:
        return None
    ranges: list[str] = []
    singles = [chr(b) for b in missing if b < 0x80]
    if singles:
        ranges.append("".join(re.escape(c) for c in singles))
    for byte in (b for b in missing if b >= 0x80):
        if 0x80 <= byte <= 0xBF:  # a continuation byte: any character of two or more bytes may hold it
            ranges.append("\u0080-\U0010ffff")
        elif 0xC2 <= byte <= 0xDF:
            start = (byte & 0x1F) << 6
            ranges.append(f"{chr(start)}-{chr(start + 0x3F)}")
        elif 0xE0 <= byte <= 0xEF:
            start = (byte & 0x0F) << 12
            ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(start + 0xFFF))}")
        elif 0xF0 <= byte <= 0xF4:
            start = (byte & 0x07) << 18
            ranges.append(f"{chr(start)}-{chr(min(start + 0x3FFFF, 0x10FFFF))}")
        # 0xC0, 0xC1, 0xF5-0xFF never occur in UTF-8
    return re.compile(f"[{''.join(ranges)}]") if ranges else None


class FastEncoding:
    """Ids of one text, with ``char_to_token`` as ``tokenizers.Encoding`` has it (computed on first use)."""

    __slots__ = ("_ends", "_lengths", "ids", "text")

    def __init__(self, ids: list[int], text: str, lengths: Sequence[int]) -> None:
        self.ids = ids
        self.text = text
        self._lengths = lengths
        self._ends: list[int] | None = None

    def char_to_token(self, position: int) -> int | None:
        """The first token holding (the first byte of) character ``position``; None outside the text."""
        if position < 0 or position >= len(self.text):
            return None
        at = position if self.text.isascii() else len(self.text[:position].encode("utf-8"))
        ends = self._ends  # byte offset where each token ends, as far as a lookup has needed them
        if ends is None:
            ends = self._ends = []
        if ends and ends[-1] > at:
            return bisect_right(ends, at)
        # Extend only as far as this position: a loss mask looks up a turn's first characters, near the start.
        total = ends[-1] if ends else 0
        lengths, ids = self._lengths, self.ids
        for index in range(len(ends), len(ids)):
            total += lengths[ids[index]]
            ends.append(total)
            if total > at:
                return index
        return None


class FastTokenizer:
    """Encodes text with every added token disabled, through tiktoken where that is exact, else ``tokenizers``.

    It has the shape the encoder uses of the ``tokenizers`` twin: ``encode(text, add_special_tokens=False)`` and
    ``encode_batch(texts, add_special_tokens=False)``, returning objects with ``ids`` and ``char_to_token``.
    """

    def __init__(self, plan: FastPlan, fallback: tokenizers.Tokenizer) -> None:
        import tiktoken

        self.plan = plan
        self.fallback = fallback
        encoding = tiktoken.Encoding("turnkit", pat_str=plan.pattern, mergeable_ranks=plan.ranks, special_tokens={})
        self._core = encoding._core_bpe  # the Rust encoder itself: no surrogate repair, releases the GIL
        size = max(plan.ranks.values()) + 1
        lengths = [0] * size
        for token, token_id in plan.ranks.items():
            lengths[token_id] = len(token)
        self.lengths = lengths
        self.fallbacks = 0  # texts sent to tokenizers (for tests and benchmarks)

    def _exact(self, text: str) -> bool:
        plan = self.plan
        if text.isascii():
            return plan.unencodable is None or plan.unencodable.search(text) is None
        if plan.unencodable is not None and plan.unencodable.search(text):
            return False
        return not plan.nfc or unicodedata.is_normalized("NFC", text)

    def encode(self, text: str, add_special_tokens: bool = False) -> Any:
        """One text (``add_special_tokens`` is accepted for the twin's signature; nothing is ever added)."""
        if self._exact(text):
            try:
                ids = self._core.encode_ordinary(text)
            except UnicodeEncodeError:  # a lone surrogate: tokenizers rejects it, as it always did
                ids = None
            if ids is not None and (not self.plan.check_cover or self._covers(ids, text)):
                return FastEncoding(ids, text, self.lengths)
        self.fallbacks += 1
        return self.fallback.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[Any]:
        """Many texts, in this thread (the encoder already runs this in a thread; tiktoken releases the GIL)."""
        return [self.encode(text) for text in texts]

    def _covers(self, ids: list[int], text: str) -> bool:
        lengths = self.lengths
        return sum(lengths[i] for i in ids) == len(text.encode("utf-8"))


_BUILT: dict[str, tuple[FastTokenizer | None, str]] = {}


def build_fast_tokenizer(twin: tokenizers.Tokenizer, *, key: str | None = None) -> tuple[FastTokenizer | None, str]:
    """The fast tokenizer for ``twin`` (a tokenizer without added tokens), or None; and a line saying which path.

    Deciding costs about a second for a 150k vocabulary, so it is done once per process for each distinct twin
    (copies of a tokenizer that differ only in added tokens share it), found by ``key`` where the caller has one for
    the twin's content (else the SHA-256 of its JSON).
    """
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None, f"tokenizers ({ENV_SWITCH}=0)"
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return None, "tokenizers (tiktoken is not installed: pip install 'turnkit[fast]')"
    key = key or hashlib.sha256(twin.to_str().encode()).hexdigest()
    if key not in _BUILT:
        if len(_BUILT) >= 8:
            del _BUILT[next(iter(_BUILT))]
        _BUILT[key] = _build(twin)
    return _BUILT[key]


def _build(twin: tokenizers.Tokenizer) -> tuple[FastTokenizer | None, str]:
    try:
        plan = fast_plan(twin)
    except ValueError as exc:
        return None, f"tokenizers (not provably equal to tiktoken: {exc})"
    try:
        fast = FastTokenizer(plan, twin)
    except Exception as exc:  # noqa: BLE001 - tiktoken refuses a pattern or ranks in several ways
        return None, f"tokenizers (tiktoken cannot build this encoding: {exc})"
    from turnkit.tokenizer.probe import self_check

    problem = self_check(fast, twin)
    if problem:
        return None, f"tokenizers (the self-check on the probe text failed: {problem})"
    return fast, "tiktoken (byte-level BPE, checked equal to tokenizers)"
