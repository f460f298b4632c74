"""What one token looks like on a page: its exact text, made visible, and whether it is a control token.

A page must show the *exact* token, not a tidied decode: ``decode([id])`` of a token that holds half of a UTF-8
character prints ``�`` and hides what the model saw. The text comes from the tokenizer's byte table (each id's own
bytes). Whitespace is made visible (``·`` space, ``→`` tab, ``↵`` newline), so two prompts that differ by one space
look different. A character whose bytes span several tokens (``東`` as ``e6 9d`` + ``b1``, an emoji as two tokens) is
shown once, on the token where it starts, and the tokens holding its other bytes are marked as its continuation
(:func:`sequence_segments`; a page shows each token's bytes on hover); bytes that form no character with their
neighbours stay ``\\xNN``.

Control tokens are the ones text can never produce: the tokenizer's added tokens (``fmt.tokenizer.by_id``) and the ids
that end a reply (``fmt.stops``). Token ids of a family are never hard-coded here: both sets come from the tokenizer.

The same pieces feed the ``turnkit inspect`` page (rendered in Python) and the server's playground (sent as JSON).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from turnkit.tokenizer import StopSet, TokenizerBinding

__all__ = [
    "CONTINUATION",
    "STAND_INS",
    "ForgedMarker",
    "Piece",
    "Segment",
    "TokenTexts",
    "find_forged_markers",
    "partial_bytes",
    "sequence_segments",
]

#: Stand-ins that make whitespace and invisible characters visible, one character each.
_VISIBLE = {" ": "·", "\t": "→", "\n": "↵", "\r": "␍", "\u00a0": "⍽"}
#: Stand-in to character, for a page's script to give back a token's exact text.
STAND_INS = {shown: char for char, shown in _VISIBLE.items()}
#: Whitespace, invisible characters, and bytes that are not a whole UTF-8 character (as surrogate escapes).
_INVISIBLE = re.compile("[ \x00-\x1f\x7f\u00a0\u200b-\u200f\u2028\u2029\ufeff\udc80-\udcff]")


#: A run of a chip's text, by kind: ``""`` text as it is, ``"v"`` a stand-in (whitespace, an invisible character, a
#: byte that is no character), ``"char"`` a character whose bytes continue in the next token(s), ``"cont"`` a token's
#: bytes that continue a character shown on an earlier one (the character is the text; a page shows
#: :data:`CONTINUATION` in its place).
Segment = tuple[str, str]

#: What a continuation token shows: the character itself is on the token where it starts.
CONTINUATION = "⁀"


def _shown(text: str) -> list[Segment]:
    """Whole characters as segments: stand-ins for whitespace, invisible characters and lone bytes."""
    out: list[Segment] = []
    last = 0
    for match in _INVISIBLE.finditer(text):
        if match.start() > last:
            out.append(("", text[last : match.start()]))
        found = match.group(0)
        code = ord(found)
        if found in _VISIBLE:
            out.append(("v", _VISIBLE[found]))
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(("v", f"\\x{code - 0xDC00:02x}"))
        else:
            out.append(("v", f"\\u{code:04x}"))
        last = match.end()
    if last < len(text):
        out.append(("", text[last:]))
    return out


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

    def segments(self) -> list[Segment]:
        """The token's text on its own, as :data:`Segment` runs (a byte that is no whole character is ``\\xNN``;
        in a sequence, :func:`sequence_segments` joins such bytes with their neighbours)."""
        if self.control:
            return [("", self.text)]
        return _shown(self.raw.decode("utf-8", errors="surrogateescape"))

    def to_dict(self, segments: list[Segment] | None = None) -> dict[str, object]:
        """As JSON for a page that builds chips at run time (the server's playground); ``segments`` as the token
        shows in its sequence (:func:`sequence_segments`), with its bytes when they are not whole characters."""
        shown = self.segments() if segments is None else segments
        out: dict[str, object] = {
            "id": self.id,
            "text": self.text,
            "control": self.control,
            "newline": self.newline,
            "segments": [[kind, text] for kind, text in shown],
        }
        if partial_bytes(shown):
            out["bytes"] = self.raw.hex(" ")
            out["chars"] = "".join(text for kind, text in shown if kind in ("char", "cont"))
        return out


def partial_bytes(segments: Sequence[Segment]) -> bool:
    """Whether a token's segments show bytes that are part of a character (a page then gives its bytes on hover)."""
    return any(kind in ("char", "cont") or (kind == "v" and text.startswith("\\x")) for kind, text in segments)


def sequence_segments(pieces: Sequence[Piece]) -> list[list[Segment]]:
    """Each token's segments as it shows in its sequence: a character whose bytes span tokens is shown once, on the
    token where it starts (``"char"``), and each later token holding its bytes shows :data:`CONTINUATION`
    (``"cont"``). Control tokens break runs: their text is whole."""
    out: list[list[Segment]] = [[] for _ in pieces]
    start = 0
    while start < len(pieces):
        if pieces[start].control:
            out[start] = pieces[start].segments()
            start += 1
            continue
        end = start
        while end < len(pieces) and not pieces[end].control:
            end += 1
        _join_run(pieces, start, end, out)
        start = end
    return out


def _join_run(pieces: Sequence[Piece], start: int, end: int, out: list[list[Segment]]) -> None:
    """Segments of the text tokens ``pieces[start:end]``, whose bytes are decoded together."""
    bounds = [0]
    for piece in pieces[start:end]:
        bounds.append(bounds[-1] + len(piece.raw))
    data = b"".join(piece.raw for piece in pieces[start:end])
    token = 0
    position = 0
    whole: list[str] = []  # characters of the current token, not yet flushed

    def flush() -> None:
        if whole:
            out[start + token].extend(_shown("".join(whole)))
            whole.clear()

    for char in data.decode("utf-8", errors="surrogateescape"):
        size = 1 if 0xDC80 <= ord(char) <= 0xDCFF else len(char.encode())
        while position >= bounds[token + 1]:
            flush()
            token += 1
        finish = position + size
        if finish <= bounds[token + 1]:
            whole.append(char)
        else:  # the character's bytes run on into later tokens
            flush()
            out[start + token].append(("char", char))
            last = token
            while finish > bounds[last + 1]:
                last += 1
                out[start + last].append(("cont", char))
        position = finish
    flush()


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
