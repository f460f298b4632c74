"""Checks of prepared training data against the model it trains: what the labels actually teach.

Each row is decoded, read back into messages and encoded again with turnkit (every assistant turn trained, with its
end marker). Where that reproduces the row's ids exactly, the row's labels are compared with turnkit's mask; this
needs a transcript turnkit can read back (ChatML), and rows where it fails are counted, not judged.

* ``labels-missing-end-marker``: a reply the labels train must train its end-of-turn marker too, or the model never
  learns to stop (the seed: "that final id matters more than any other"). Rows that cannot be re-encoded are judged
  by their trained stretches: each must contain an end-of-turn id.
* ``labels-train-prompt``: a trained token that turnkit would not train belongs to the template or to a user, system
  or tool turn. A whitespace token right after a trained end marker is tolerated (TRL's prefix-diff masks train the
  newline after ``<|im_end|>``; it is never generated, since generation stops first).
* ``labels-not-input-ids``: where a token is trained its label must be its own id (models shift labels themselves).
* ``labels-empty-reply``: a trained reply that holds nothing but its end-of-turn marker teaches the model to stop at
  once; it is what a template that leaves out a turn's tool calls or content leaves behind (SmolLM2's template writes
  no tool calls: ``<|im_start|>assistant\n<|im_end|>``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from turnkit.doctor.context import Context
from turnkit.doctor.data import Dataset, Example
from turnkit.doctor.findings import Problem
from turnkit.errors import NotEvaluated, TurnkitError
from turnkit.parse.transcript import parse_transcript

if TYPE_CHECKING:
    from turnkit.encode.encoding import Encoding

__all__ = [
    "DataContext",
    "check_data_summary",
    "check_labels_empty_reply",
    "check_labels_end_marker",
    "check_labels_input_ids",
    "check_labels_prompt",
    "check_tokenizer_fingerprint",
    "trained_spans",
]

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Reencoded:
    """A row read back into messages and encoded again: turnkit's mask for the same ids."""

    messages: list[dict[str, Any]]
    encoding: Encoding


@dataclass
class DataContext:
    """The dataset and the model whose format it must follow."""

    model: Context
    dataset: Dataset
    _reencoded: list[Reencoded | None] | None = field(default=None, repr=False)

    def end_ids(self) -> dict[int, str]:
        """Ids that close a reply: the template's end-of-turn marker first, then every id the format stops on."""
        marker, token_id = self.model.end_marker()
        stops = self.model.fmt.stops
        return {token_id: marker, **{i: t for i, t in {**stops.end_of_turn, **stops.eos}.items() if i != token_id}}

    def reencoded(self) -> list[Reencoded | None]:
        """For each example, its re-encoding, or None where it cannot be read back to the same ids (computed once)."""
        if self._reencoded is None:
            fmt, tokenizer = self.model.fmt, self.model.tokenizer
            self._reencoded = []
            for example in self.dataset.examples:
                try:
                    messages = parse_transcript(tokenizer.decode(example.input_ids.tolist()))
                    encoding = cast("Encoding", fmt.encode(messages, turns="all"))  # one example: no split_turns
                except TurnkitError:
                    self._reencoded.append(None)
                    continue
                same = np.array_equal(encoding.input_ids, example.input_ids)
                self._reencoded.append(Reencoded(messages, encoding) if same else None)
        return self._reencoded

    @property
    def reencoded_count(self) -> int:
        return 0 if self._reencoded is None else sum(r is not None for r in self._reencoded)


def trained_spans(labels: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of trained positions."""
    trained = np.concatenate([[False], labels != IGNORE_INDEX, [False]])
    edges = np.flatnonzero(trained[1:] != trained[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _counted(ctx: DataContext) -> str:
    n = len(ctx.dataset.examples)
    return f"{n} example{'s' if n != 1 else ''}" + (" (--limit reached)" if ctx.dataset.truncated else "")


def _excerpt(ctx: DataContext, ids: np.ndarray, limit: int = 60) -> str:
    text = ctx.model.tokenizer.decode(ids.tolist())
    return repr(text if len(text) <= limit else "..." + text[-limit:])


def check_labels_input_ids(ctx: DataContext) -> list[Problem]:
    """``labels-not-input-ids``: trained labels are not the token's own id (shifted, or from another sequence)."""
    bad = [e for e in ctx.dataset.examples if _mismatch(e)]
    if not bad:
        return []
    first = bad[0]
    trained = first.labels != IGNORE_INDEX
    shifted = np.array_equal(first.labels[:-1][trained[:-1]], first.input_ids[1:][trained[:-1]])
    how = " (they are shifted by one: the model shifts labels itself)" if shifted else ""
    return [
        Problem(
            f"{len(bad)} of {_counted(ctx)}: trained labels differ from input_ids at the same position{how}; first "
            f"in record {first.record}",
            "labels must be input_ids with -100 where not trained (turnkit prepare writes them so)",
            str(ctx.dataset.path),
        )
    ]


def _mismatch(example: Example) -> bool:
    trained = example.labels != IGNORE_INDEX
    return bool((example.labels[trained] != example.input_ids[trained]).any())


def _unmarked_replies(example: Example, redone: Reencoded | None, wanted: np.ndarray) -> list[tuple[int, int]]:
    """The replies this row trains without their end marker: turnkit's replies when re-encoded, else its stretches."""
    trained = example.labels != IGNORE_INDEX
    if redone is None:
        spans = trained_spans(example.labels)
        return [(a, b) for a, b in spans if not np.isin(example.labels[a:b], wanted).any()]
    out = []
    for start, end in trained_spans(np.where(redone.encoding.assistant_mask.astype(bool), 0, IGNORE_INDEX)):
        if not trained[start:end].any():
            continue  # a reply this row does not train at all (turns="last"): not this check's business
        markers = np.isin(example.input_ids[start:end], wanted)
        if markers.any() and not trained[start:end][markers].all():
            out.append((start, end))
    return out


def _reply_count(example: Example, redone: Reencoded | None) -> int:
    if redone is None:
        return len(trained_spans(example.labels))
    mask = np.where(redone.encoding.assistant_mask.astype(bool), 0, IGNORE_INDEX)
    trained = example.labels != IGNORE_INDEX
    return sum(1 for a, b in trained_spans(mask) if trained[a:b].any())


def check_labels_end_marker(ctx: DataContext) -> list[Problem]:
    """``labels-missing-end-marker``: a trained reply does not train the end-of-turn marker id."""
    end_ids = ctx.end_ids()
    marker_id, marker = next(iter(end_ids.items()))
    wanted = np.fromiter(end_ids, dtype=np.int64)
    replies = missing = at_end = 0
    first: tuple[Example, tuple[int, int]] | None = None
    for example, redone in zip(ctx.dataset.examples, ctx.reencoded(), strict=True):
        replies += _reply_count(example, redone)
        for start, end in _unmarked_replies(example, redone, wanted):
            missing += 1
            at_end += end == len(example.labels)
            first = first or (example, (start, end))
    if first is None:
        return []
    example, (start, end) = first
    cut = f" ({at_end} of them reach the end of their example: cut by truncation?)" if at_end else ""
    return [
        Problem(
            f"{missing} of {replies} trained replies in {_counted(ctx)} do not train the end-of-turn marker "
            f"{marker!r} (id {marker_id}){cut}: the model does not learn to stop; first in record {example.record}, "
            f"reply ending {_excerpt(ctx, example.input_ids[start:end])}",
            "train the marker with each reply: turnkit prepare without --no-end-marker (fmt.encode(..., "
            "train_end_marker=True)); in TRL, keep the end-of-turn token in the completion mask",
            str(ctx.dataset.path),
        )
    ]


def _empty_reply(example: Example, span: tuple[int, int], end_ids: set[int], decode: Any) -> bool:
    """A trained stretch of end-of-turn ids, and whitespace at most (``\n<|im_end|>``)."""
    ids = example.input_ids[span[0] : span[1]].tolist()
    if len(ids) > 4 or not any(i in end_ids for i in ids):
        return False
    return all(i in end_ids or not decode([i]).strip() for i in ids)


def check_labels_empty_reply(ctx: DataContext) -> list[Problem]:
    """``labels-empty-reply``: a trained reply holds only its end-of-turn marker (the model learns to stop at once)."""
    end_ids = set(ctx.end_ids())
    decode = ctx.model.tokenizer.decode
    replies = empty = 0
    first: Example | None = None
    for example in ctx.dataset.examples:
        for span in trained_spans(example.labels):
            replies += 1
            if _empty_reply(example, span, end_ids, decode):
                empty += 1
                first = first or example
    if first is None:
        return []
    marker = next(iter(ctx.end_ids().values()))
    return [
        Problem(
            f"{empty} of {replies} trained replies in {_counted(ctx)} hold nothing but the end-of-turn marker "
            f"{marker!r}: the model learns to stop at once after the prompt; first in record {first.record} (a "
            "template that leaves out a reply's tool calls or content leaves this behind)",
            "prepare the data again with turnkit prepare (without --allow-dropped): it rejects turns the template "
            "does not render (the reject names the message and field), or use a template that renders them",
            str(ctx.dataset.path),
        )
    ]


def _tolerated(ids: np.ndarray, trained: np.ndarray, position: int, end_ids: set[int], text: str) -> bool:
    """A whitespace token directly after a trained end marker."""
    if text.strip() or position == 0 or not trained[position - 1]:
        return False
    return int(ids[position - 1]) in end_ids


def check_labels_prompt(ctx: DataContext) -> list[Problem]:
    """``labels-train-prompt``: labels train template text or user/system/tool turns (found by re-encoding)."""
    tokenizer = ctx.model.tokenizer
    end_ids = set(ctx.end_ids())
    offenders = []
    for example, redone in zip(ctx.dataset.examples, ctx.reencoded(), strict=True):
        if redone is None:
            continue
        ids, trained = example.input_ids, example.labels != IGNORE_INDEX
        candidates = np.flatnonzero(trained & ~redone.encoding.assistant_mask.astype(bool)).tolist()
        stray = [p for p in candidates if not _tolerated(ids, trained, p, end_ids, tokenizer.decode([int(ids[p])]))]
        if stray:
            offenders.append((example, stray, redone))
    checked = ctx.reencoded_count
    if not checked:
        raise NotEvaluated(
            f"none of {_counted(ctx)} could be read back into messages and re-encoded to the same ids (this reads "
            "ChatML transcripts)"
        )
    if not offenders:
        return []
    example, stray, redone = offenders[0]
    indices = redone.encoding.message_index[stray].tolist()
    roles = sorted({redone.messages[i]["role"] if i >= 0 else "template" for i in indices})
    return [
        Problem(
            f"{len(offenders)} of {checked} re-encoded examples train tokens outside assistant replies; first in "
            f"record {example.record}: {len(stray)} trained token(s) of {'/'.join(roles)} text, starting "
            f"{_excerpt(ctx, example.input_ids[stray[0] : stray[0] + 12])}",
            "mask everything but assistant replies (-100): turnkit prepare, or fmt.encode(...).labels; in TRL, "
            "assistant_only_loss / completion_only_loss",
            str(ctx.dataset.path),
        )
    ]


def check_tokenizer_fingerprint(ctx: DataContext) -> list[Problem]:
    """``data-tokenizer-mismatch``: the data was prepared with another tokenizer than the model's."""
    manifest = ctx.dataset.manifest
    recorded = manifest.data.get("tokenizer_sha256") if manifest else None
    if not isinstance(recorded, str):
        raise NotEvaluated("no turnkit manifest.json with a tokenizer fingerprint")
    actual = hashlib.sha256(ctx.model.tokenizer.backend.to_str().encode()).hexdigest()
    if actual == recorded:
        return []
    return [
        Problem(
            f"manifest.json records tokenizer sha256 {recorded[:12]}..., but the model's tokenizer is "
            f"{actual[:12]}...: the ids in this data may mean other tokens to this model",
            "prepare the data again with --model pointing at the checkpoint you train",
            str(ctx.dataset.path / "manifest.json"),
        )
    ]


def check_data_summary(ctx: DataContext) -> list[Problem]:
    """``data-summary``: how much was checked (always reported, so a clean result is never a silent one)."""
    examples = ctx.dataset.examples
    spans = sum(_reply_count(e, r) for e, r in zip(examples, ctx.reencoded(), strict=True))
    empty = sum(1 for e in examples if not (e.labels != IGNORE_INDEX).any())
    tokens = sum(len(e.input_ids) for e in examples)
    return [
        Problem(
            f"checked {_counted(ctx)} ({tokens} tokens, {spans} trained replies, {empty} training nothing; "
            f"{ctx.reencoded_count} read back and re-encoded)",
            "raise --limit to check more rows" if ctx.dataset.truncated else "nothing to do",
            str(ctx.dataset.path),
        )
    ]
