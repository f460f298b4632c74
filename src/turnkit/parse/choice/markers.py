"""What a template's markers look like, and the units two renders are compared in.

Derivation (:mod:`.derive`) and format selection (:mod:`.select`) read markers off rendered text without knowing
the vocabulary: a marker is a piece of a known shape (``<|im_end|>``, DeepSeek's full-width bars, Gemma 4's
``<|turn>``, ``</think>``, ``[TOOL_CALLS]``), and literals learned from renders begin and end at token boundaries
(:func:`tokens`), so a literal never splits a marker or a word.
"""

from __future__ import annotations

import re

__all__ = ["common_prefix", "common_suffix", "first_marker", "is_marker", "marker_pieces", "tokens"]


#: Shapes of marker pieces (a run such as ``<|open|>think<|sep|>`` is split into pieces and words).
_PIECE = re.compile(
    r"<\|[^\s<>|]{0,48}\|>"  # <|im_end|>
    r"|<｜[^｜\s]{1,48}｜>"  # DeepSeek's full-width bars
    r"|<\|[^\s<>|]{1,30}>|<[^\s<>|]{1,30}\|>"  # Gemma 4's <|turn> and <turn|>
    r"|</?[^\s<>]{1,60}>"  # <think>, </s>, <seed:think>, <｜DSML｜tool_calls>
    r"|\[/?[A-Za-z_][\w:.\-]{0,30}\]|\[\|[\w]+\|\]"  # [THINK], [|endofturn|]
)
#: Tokens of text being compared: marker pieces, words, whitespace runs, single characters. Literals learned from
#: renders begin and end at token boundaries, so a literal never splits a marker or a word.
_TOKEN = re.compile(_PIECE.pattern + r"|\w+|\s+|.", re.DOTALL)


def marker_pieces(run: str) -> list[str]:
    """A whitespace-free run split into marker pieces and the text between them."""
    out: list[str] = []
    pos = 0
    for match in _PIECE.finditer(run):
        if match.start() > pos:
            out.append(run[pos : match.start()])
        out.append(match.group(0))
        pos = match.end()
    if pos < len(run):
        out.append(run[pos:])
    return out


def is_marker(piece: str) -> bool:
    """The piece has the shape of a marker (``<|im_end|>``, ``</think>``, ``[TOOL_CALLS]``)."""
    return bool(_PIECE.fullmatch(piece))


def first_marker(text: str) -> str | None:
    """The marker a text starts with (after whitespace): a marker piece, or a run of symbols (MiniMax's ``[e~[``)."""
    runs = text.split()
    if not runs:
        return None
    pieces = marker_pieces(runs[0])
    if is_marker(pieces[0]):
        return pieces[0]
    run = runs[0]
    if (
        len(run) <= 40
        and not run.isalnum()
        and not re.fullmatch(r"[\w'\-]+[:.,!?]?", run)
        and not set(run) & set("{}\"'")
    ):
        return run
    return None


def tokens(text: str) -> list[str]:
    """Marker pieces, words, whitespace runs and single characters: the units renders are compared in."""
    return _TOKEN.findall(text)


def common_prefix(a: str, b: str) -> str:
    """The tokens both texts start with."""
    out = []
    for x, y in zip(tokens(a), tokens(b), strict=False):
        if x != y:
            break
        out.append(x)
    return "".join(out)


def common_suffix(a: str, b: str) -> str:
    """The tokens both texts end with."""
    out = []
    for x, y in zip(reversed(tokens(a)), reversed(tokens(b)), strict=False):
        if x != y:
            break
        out.append(x)
    return "".join(reversed(out))
