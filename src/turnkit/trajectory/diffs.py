"""Where two renders part, for the history-rewrite errors: the first differing character or id, and an excerpt
around it (an error names the place and shows both sides, not two whole prompts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["excerpt", "first_difference"]


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The first place where two texts (or two id lists) differ; the shorter one's length where it begins the other."""
    size = min(len(a), len(b))
    return next((i for i in range(size) if a[i] != b[i]), size)


def excerpt(text: str, at: int, width: int = 30) -> str:
    """``width`` characters of ``text`` either side of ``at``: where two renders part, for an error message."""
    return text[max(0, at - width) : at + width]
