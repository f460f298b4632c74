"""What every checkpoint check reads: the target, and what is learned from it once (the probe's skeleton).

Checks ask the context for what they need (``ctx.fmt``, ``ctx.tokenizer``, ``ctx.skeleton``); when that does not
exist on this target, the context raises :class:`NotEvaluated` with the reason, so a check never has to guess and
the report says why it did not run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turnkit.doctor.probe import Skeleton, learn_skeleton
from turnkit.doctor.target import NEEDS_IDS, Target
from turnkit.errors import NotEvaluated
from turnkit.format import ChatFormat

if TYPE_CHECKING:
    from turnkit.doctor.forgery import ForgeryResult

__all__ = ["Context"]


class Context:
    """One target and the facts derived from it, computed on first use and shared by the checks."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._skeleton: Skeleton | NotEvaluated | None = None
        #: The forged-turn test's counts, once ``forgeable-tokenizer`` ran (``--ci`` prints them).
        self.forgery: ForgeryResult | None = None

    @property
    def fmt(self) -> ChatFormat:
        if self.target.fmt is None:
            raise NotEvaluated(f"no usable chat template ({self.target.no_template})")
        return self.target.fmt

    @property
    def tokenizer(self) -> Any:
        if self.target.tokenizer is None:
            raise NotEvaluated(NEEDS_IDS if self.target.kind == "template" else "no tokenizer could be read")
        return self.target.tokenizer

    @property
    def skeleton(self) -> Skeleton:
        """The probe's skeleton (the outcome, success or not, is kept: every check sees the same)."""
        if self._skeleton is None:
            try:
                self._skeleton = learn_skeleton(self.fmt, self.tokenizer)
            except NotEvaluated as exc:
                self._skeleton = exc
        if isinstance(self._skeleton, NotEvaluated):
            raise self._skeleton
        return self._skeleton

    def end_marker(self) -> tuple[str, int]:
        """The template's end-of-turn marker and its single token id (``NotEvaluated`` when there is none)."""
        marker = self.skeleton.end_marker
        if marker is None:
            raise NotEvaluated("the template writes no marker after an assistant reply (see no-end-marker)")
        token_id = self.single_id(marker)
        if token_id is None:
            raise NotEvaluated(f"the end-of-turn marker {marker} is not one token (see marker-not-single-token)")
        return marker, token_id

    def single_id(self, text: str) -> int | None:
        """The id of ``text`` when the tokenizer makes it one token, else None."""
        tokenizer = self.tokenizer
        if text in tokenizer.added:
            return tokenizer.added[text].id
        ids = tokenizer.encode(text).ids
        return ids[0] if len(ids) == 1 else None

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])
