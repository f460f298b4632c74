"""What one token looks like on a page: its exact text, made visible, and whether it is a control token.

A page must show the *exact* token, not a tidied decode: ``decode([id])`` of a token that holds half of a UTF-8
character prints ``�`` and hides what the model saw. The text comes from the tokenizer's byte table (each id's own
bytes); bytes that do not form a character are shown as ``\\xNN``. Whitespace is made visible (``·`` space, ``→`` tab,
``↵`` newline), so two prompts that differ by one space look different.

Control tokens are the ones text can never produce: the tokenizer's added tokens (``fmt.tokenizer.by_id``) and the ids
that end a reply (``fmt.stops``). Token ids of a family are never hard-coded here: both sets come from the tokenizer.

The same pieces feed the ``turnkit inspect`` page (rendered in Python) and the server's playground (sent as JSON).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from turnkit.tokenizer import StopSet, TokenizerBinding

__all__ = ["STAND_INS", "ForgedMarker", "Piece", "TokenTexts", "find_forged_markers"]

#: Stand-ins that make whitespace and invisible characters visible, one character each.
_VISIBLE = {" ": "·", "\t": "→", "\n": "↵", "\r": "␍", "\u00a0": "⍽"}
#: Stand-in to character, for a page's script to give back a token's exact text.
STAND_INS = {shown: char for char, shown in _VISIBLE.items()}
#: Whitespace, invisible characters, and bytes that are not a whole UTF-8 character (as surrogate escapes).
_INVISIBLE = re.compile("[ \x00-\x1f\x7f\u00a0\u200b-\u200f\u2028\u2029\ufeff\udc80-\udcff]")


@dataclass(frozen=True, slots=True)
class Piece:
    """One token as a page shows it.

    Attributes:
        id: The token id.
        raw: The token's exact bytes.
        text: Its text (``\\xNN`` for bytes that are not a whole UTF-8 character).
        control: Whether it is a control token (an added token or an end-of-reply id).
        newline: Whether its text holds a newline (a page breaks the line after it, as the text does).
    """

    id: int
    raw: bytes
    text: str
    control: bool
    newline: bool

    def segments(self) -> list[tuple[bool, str]]:
        """The text as ``(visible_stand_in, text)`` runs: stand-ins for whitespace, invisible characters and raw
        bytes are set apart so that a page can style them (and a reader can tell a real ``·`` from a space)."""
        if self.control:
            return [(False, self.text)]
        text = self.raw.decode("utf-8", errors="surrogateescape")
        out: list[tuple[bool, str]] = []
        last = 0
        for match in _INVISIBLE.finditer(text):
            if match.start() > last:
                out.append((False, text[last : match.start()]))
            found = match.group(0)
            code = ord(found)
            if found in _VISIBLE:
                out.append((True, _VISIBLE[found]))
            elif 0xDC80 <= code <= 0xDCFF:
                out.append((True, f"\\x{code - 0xDC00:02x}"))
            else:
                out.append((True, f"\\u{code:04x}"))
            last = match.end()
        if last < len(text):
            out.append((False, text[last:]))
        return out

    def to_dict(self) -> dict[str, object]:
        """As JSON for a page that builds chips at run time (the server's playground)."""
        return {
            "id": self.id,
            "text": self.text,
            "control": self.control,
            "newline": self.newline,
            "segments": [[visible, text] for visible, text in self.segments()],
        }


class TokenTexts:
    """Token ids to :class:`Piece` objects, for one tokenizer (and its bytes back to ids, for a reply's tokens)."""

    def __init__(self, binding: TokenizerBinding, stops: StopSet) -> None:
        self.binding = binding
        self.control_ids = frozenset(binding.by_id) | stops.ids
        self._table = binding.byte_table
        self._by_bytes: dict[bytes, int] | None = None

    def raw(self, token_id: int) -> bytes:
        """The exact bytes of a token (an added token's own text)."""
        added = self.binding.by_id.get(token_id)
        if added is not None:
            return added.content.encode()
        if self._table is not None:
            return self._table.bytes_of(token_id)
        return self.binding.decode([token_id]).encode()

    def piece(self, token_id: int) -> Piece:
        raw = self.raw(token_id)
        text = raw.decode("utf-8", errors="backslashreplace")
        return Piece(token_id, raw, text, token_id in self.control_ids, b"\n" in raw)

    def pieces(self, ids: Iterable[int]) -> list[Piece]:
        cache: dict[int, Piece] = {}
        out = []
        for token_id in ids:
            token_id = int(token_id)
            found = cache.get(token_id)
            if found is None:
                found = cache[token_id] = self.piece(token_id)
            out.append(found)
        return out

    def id_of_bytes(self, raw: bytes) -> int | None:
        """The id whose bytes are exactly ``raw`` (OpenAI log-probabilities carry a token's bytes, not its id)."""
        if self._by_bytes is None:
            table = self._table.table if self._table is not None else []
            by_bytes: dict[bytes, int] = {}
            for token_id, token_bytes in enumerate(table):
                if token_bytes and token_id not in self.binding.by_id:
                    by_bytes.setdefault(token_bytes, token_id)
            self._by_bytes = by_bytes
        return self._by_bytes.get(raw)


@dataclass(frozen=True)
class ForgedMarker:
    """A control token's text that stands in the sequence as plain text tokens: data that spelled a marker, which the
    safe encoder kept as text (the model never sees the control token there).

    Attributes:
        marker: The marker text (``<|im_end|>``).
        start: The index of its first token in the sequence.
        end: One past the index of its last token.
        control_id: The id the marker would have been, had it not been neutralised.
    """

    marker: str
    start: int
    end: int
    control_id: int


def find_forged_markers(pieces: Sequence[Piece], binding: TokenizerBinding) -> list[ForgedMarker]:
    """Every added-token string spelled out by non-control tokens, found in their exact bytes.

    Searching bytes (not decoded text) keeps token boundaries exact even where a token holds part of a character.
    """
    markers = sorted(binding.added, key=len, reverse=True)
    if not markers:
        return []
    pattern = re.compile(b"|".join(re.escape(m.encode()) for m in markers))
    found: list[ForgedMarker] = []
    run_start = 0
    for end in [*(i for i, p in enumerate(pieces) if p.control), len(pieces)]:
        run = pieces[run_start:end]
        if run:
            data = b"".join(p.raw for p in run)
            if pattern.search(data):
                offsets = [0]
                for p in run:
                    offsets.append(offsets[-1] + len(p.raw))
                for match in pattern.finditer(data):
                    first = _token_at(offsets, match.start())
                    last = _token_at(offsets, match.end() - 1)
                    marker = match.group(0).decode()
                    control_id = binding.added[marker].id
                    found.append(ForgedMarker(marker, run_start + first, run_start + last + 1, control_id))
        run_start = end + 1
    return found


def _token_at(offsets: list[int], byte: int) -> int:
    """The index of the token holding byte ``byte``, given each token's start offset (and the end)."""
    lo, hi = 0, len(offsets) - 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if offsets[mid] <= byte:
            lo = mid
        else:
            hi = mid - 1
    return lo
