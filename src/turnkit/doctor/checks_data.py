"""Checks of prepared training data against the model it trains: what the labels actually teach.

* ``labels-missing-end-marker``: each trained stretch (an assistant reply) must contain the end-of-turn marker id,
  or the model never learns to stop (the seed: "that final id matters more than any other").
* ``labels-train-prompt``: each row is decoded, read back into messages and encoded again with turnkit; a trained
  token that turnkit would not train belongs to the template or to a user, system or tool turn. This needs a
  transcript turnkit can read back (ChatML) and a re-encoding that reproduces the row's ids exactly; rows where
  either fails are counted, not judged. A whitespace token right after a trained end marker is tolerated (TRL's
  prefix-diff masks train the newline after ``<|im_end|>``; it is never generated, since generation stops first).
* ``labels-not-input-ids``: where a token is trained its label must be its own id (models shift labels themselves).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from turnkit.doctor.context import Context
from turnkit.doctor.data import Dataset, Example
from turnkit.doctor.findings import NotEvaluated, Problem
from turnkit.errors import TurnkitError
from turnkit.parse.transcript import parse_transcript

__all__ = [
    "DataContext",
    "check_data_summary",
    "check_labels_end_marker",
    "check_labels_input_ids",
    "check_labels_prompt",
    "check_tokenizer_fingerprint",
    "trained_spans",
]

IGNORE_INDEX = -100


@dataclass
class DataContext:
    """The dataset and the model whose format it must follow."""

    model: Context
    dataset: Dataset
    reencoded: int = 0

    def end_ids(self) -> dict[int, str]:
        """Ids that close a reply: the template's end-of-turn marker and the checkpoint's EOS ids."""
        marker, token_id = self.model.end_marker()
        ids = {token_id: marker}
        for eos in self.model.tokenizer.eos_ids:
            ids.setdefault(eos, self.model.token_text(eos))
        return ids


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


def check_labels_end_marker(ctx: DataContext) -> list[Problem]:
    """``labels-missing-end-marker``: a trained reply does not contain the end-of-turn marker id."""
    end_ids = ctx.end_ids()
    marker_id, marker = next(iter(end_ids.items()))
    wanted = np.fromiter(end_ids, dtype=np.int64)
    spans = missing = at_end = 0
    first: tuple[Example, tuple[int, int]] | None = None
    for example in ctx.dataset.examples:
        for start, end in trained_spans(example.labels):
            spans += 1
            if np.isin(example.labels[start:end], wanted).any():
                continue
            missing += 1
            at_end += end == len(example.labels)
            first = first or (example, (start, end))
    if first is None:
        return []
    example, (start, end) = first
    cut = f" ({at_end} of them reach the end of their example: cut by truncation?)" if at_end else ""
    return [
        Problem(
            f"{missing} of {spans} trained replies in {_counted(ctx)} do not train the end-of-turn marker "
            f"{marker!r} (id {marker_id}){cut}: the model does not learn to stop; first in record {example.record}, "
            f"reply ending {_excerpt(ctx, example.input_ids[start:end])}",
            "train the marker with each reply: turnkit prepare without --no-end-marker (fmt.encode(..., "
            "train_end_marker=True)); in TRL, keep the end-of-turn token in the completion mask",
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
    fmt, tokenizer = ctx.model.fmt, ctx.model.tokenizer
    end_ids = set(ctx.end_ids())
    checked, offenders = 0, []
    for example in ctx.dataset.examples:
        try:
            messages = parse_transcript(tokenizer.decode(example.input_ids.tolist()))
            encoding = fmt.encode(messages, turns="all")
        except TurnkitError:
            continue
        if not np.array_equal(encoding.input_ids, example.input_ids):
            continue
        checked += 1
        trained = example.labels != IGNORE_INDEX
        ids = example.input_ids
        candidates = np.flatnonzero(trained & ~encoding.assistant_mask.astype(bool)).tolist()
        stray = [p for p in candidates if not _tolerated(ids, trained, p, end_ids, tokenizer.decode([int(ids[p])]))]
        if stray:
            offenders.append((example, stray, encoding, messages))
    ctx.reencoded = checked
    if not checked:
        raise NotEvaluated(
            f"none of {_counted(ctx)} could be read back into messages and re-encoded to the same ids (this reads "
            "ChatML transcripts)"
        )
    if not offenders:
        return []
    example, stray, encoding, messages = offenders[0]
    roles = sorted({messages[i]["role"] if i >= 0 else "template" for i in encoding.message_index[stray].tolist()})
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
    spans = sum(len(trained_spans(e.labels)) for e in examples)
    empty = sum(1 for e in examples if not (e.labels != IGNORE_INDEX).any())
    tokens = sum(len(e.input_ids) for e in examples)
    return [
        Problem(
            f"checked {_counted(ctx)} ({tokens} tokens, {spans} trained replies, {empty} training nothing; "
            f"{ctx.reencoded} re-encoded for labels-train-prompt)",
            "raise --limit to check more rows" if ctx.dataset.truncated else "nothing to do",
            str(ctx.dataset.path),
        )
    ]
