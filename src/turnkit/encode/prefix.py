"""Prefix stability: does the model train on the context it will see at inference?

At inference the prompt for assistant turn ``k`` is ``render(messages[:k], add_generation_prompt=True)``. Training on
the whole conversation in one example assumes that this prompt is a prefix of ``render(messages)``. Templates that
rewrite history break that: Qwen3 drops the reasoning of earlier turns, DeepSeek-R1 pre-writes ``<think>\\n`` in the
generation prompt but not in history, Mistral moves the system message to the last user turn. Then each turn must be
trained as its own example (``encode(..., split_turns=True)``).

The encoder checks the same two things for each turn it trains (:mod:`turnkit.encode.history`), with the helpers
here, so that ``encode`` refuses exactly what :func:`check_prefix_stable` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PrefixReport",
    "PromptDiff",
    "TurnCheck",
    "as_generated",
    "check_prefix_stable",
    "compare_turn",
    "diff_prompts",
    "serving_prompt",
]

_CONTEXT = 40


@dataclass(frozen=True)
class TurnCheck:
    """One assistant turn of a conversation, checked twice against the full training render:

    * ``prompt_stable``: the serving prompt (the messages before it, with the generation prompt) is a prefix;
    * ``turn_stable``: the turn rendered as the last message (as the model generated it) is a prefix too. Qwen3
      fails this one: once a later user turn follows, it drops the turn's reasoning.

    When one fails, ``offset`` is where, and the excerpts show both sides around it.
    """

    index: int
    prompt_stable: bool
    turn_stable: bool
    offset: int | None = None
    expected_excerpt: str = ""
    render_excerpt: str = ""

    @property
    def stable(self) -> bool:
        return self.prompt_stable and self.turn_stable

    def __str__(self) -> str:
        if self.stable:
            return f"message {self.index}: prefix-stable"
        what = "the serving prompt" if not self.prompt_stable else "the turn as generated"
        return (
            f"message {self.index}: {what} is not a prefix of the training render (character {self.offset})\n"
            f"  expected: {self.expected_excerpt!r}\n  training render: {self.render_excerpt!r}"
        )


@dataclass(frozen=True)
class PrefixReport:
    """The prefix stability of every assistant turn of a conversation."""

    turns: list[TurnCheck] = field(default_factory=list)

    @property
    def stable(self) -> bool:
        return all(turn.stable for turn in self.turns)

    @property
    def unstable_turns(self) -> list[int]:
        return [turn.index for turn in self.turns if not turn.stable]

    def __bool__(self) -> bool:
        return self.stable

    def __str__(self) -> str:
        head = "prefix-stable" if self.stable else f"not prefix-stable at messages {self.unstable_turns}"
        return "\n".join([head, *(str(turn) for turn in self.turns if not turn.stable)])


def _first_difference(a: str, b: str) -> int:
    size = min(len(a), len(b))
    for i in range(size):
        if a[i] != b[i]:
            return i
    return size


def serving_prompt(render: Callable[..., str], chat: Sequence[dict[str, Any]], index: int, **kwargs: Any) -> str:
    """What the model sees before it writes turn ``index``: the messages before it, with the generation prompt."""
    return render(chat[:index], add_generation_prompt=True, **kwargs) if index else ""


def as_generated(render: Callable[..., str], chat: Sequence[dict[str, Any]], index: int, **kwargs: Any) -> str:
    """Turn ``index`` as the model generated it: rendered as the last message."""
    return render(chat[: index + 1], add_generation_prompt=False, **kwargs)


def compare_turn(index: int, full: str, *, prompt: str | None = None, generated: str | None = None) -> TurnCheck:
    """Check turn ``index``'s serving prompt and the turn as generated (each when given) against the full render."""
    prompt_stable = prompt is None or full.startswith(prompt)
    turn_stable = generated is None or full.startswith(generated)
    if prompt_stable and turn_stable:
        return TurnCheck(index, True, True)
    expected = prompt if not prompt_stable else generated
    assert expected is not None
    at = _first_difference(expected, full)
    lo = max(0, at - _CONTEXT)
    return TurnCheck(index, prompt_stable, turn_stable, at, expected[lo : at + _CONTEXT], full[lo : at + _CONTEXT])


def check_prefix_stable(render: Callable[..., str], chat: Sequence[dict[str, Any]], **kwargs: Any) -> PrefixReport:
    """Check every assistant turn: its serving prompt, and the turn itself, against the full training render."""
    full = render(chat, add_generation_prompt=False, **kwargs)
    turns = [
        compare_turn(
            index,
            full,
            prompt=serving_prompt(render, chat, index, **kwargs),
            generated=as_generated(render, chat, index, **kwargs),
        )
        for index, message in enumerate(chat)
        if message["role"] == "assistant"
    ]
    return PrefixReport(turns)


@dataclass(frozen=True)
class PromptDiff:
    """Where, token by token, the serving prompt of an assistant turn leaves the training sequence."""

    index: int
    agrees: bool
    position: int | None = None
    serving_tokens: list[str] = field(default_factory=list)
    training_tokens: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.agrees:
            return f"message {self.index}: the serving prompt is a prefix of the training tokens"
        lines = [f"message {self.index}: first different token at position {self.position}"]
        width = max(len(self.serving_tokens), len(self.training_tokens))
        lines.append(f"  {'':>4} {'serving':<32} training")
        for n in range(width):
            serving = self.serving_tokens[n] if n < len(self.serving_tokens) else ""
            training = self.training_tokens[n] if n < len(self.training_tokens) else ""
            mark = "  " if serving == training else "!="
            lines.append(f"  {mark:>4} {serving!r:<32} {training!r}")
        return "\n".join(lines)


def diff_prompts(
    encode: Callable[..., Any], token_text: Callable[[int], str], chat: Sequence[dict[str, Any]], **kwargs: Any
) -> list[PromptDiff]:
    """For every assistant turn, compare the serving prompt's token ids with the training encoding's, token by token."""
    training = encode(chat, add_generation_prompt=False, **kwargs).input_ids.tolist()
    out = []
    for index, message in enumerate(chat):
        if message["role"] != "assistant" or index == 0:
            continue
        serving = encode(chat[:index], add_generation_prompt=True, **kwargs).input_ids.tolist()
        if training[: len(serving)] == serving:
            out.append(PromptDiff(index, True))
            continue
        at = next(i for i in range(len(serving)) if i >= len(training) or training[i] != serving[i])
        lo, hi = max(0, at - 3), at + 5
        out.append(
            PromptDiff(
                index,
                False,
                at,
                [token_text(t) for t in serving[lo:hi]],
                [token_text(t) for t in training[lo:hi]],
            )
        )
    return out
