"""The batch function both engines run: raw records in, training rows and rejects out, every record accounted for.

For each record: convert it to a conversation (:mod:`.formats`), scan its data for the target template's control
markers (keep them as text, reject the record, or strip them), encode it with ``ChatFormat.encode`` (safe, with masks),
apply ``--max-length`` (drop the record, or drop whole earliest turns: an assistant turn's end marker is never cut),
and emit rows. Anything that goes wrong becomes a reject with the record id, the reason and the field.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Literal

from turnkit.data.formats import FieldMap, RecordError, to_conversation
from turnkit.data.sources import RawRecord
from turnkit.errors import TurnkitError

__all__ = ["PrepareConfig", "ShardResult", "process_records"]


@dataclass(frozen=True)
class PrepareConfig:
    """The options of ``turnkit prepare`` that shape the rows (they go into the manifest)."""

    model: str
    input_format: str = "auto"
    fields: FieldMap = field(default_factory=FieldMap)
    max_length: int | None = None
    truncation: Literal["drop", "turns"] = "drop"
    turns: Literal["all", "last"] = "all"
    train_end_marker: bool = True
    split_turns: bool = False
    markers: Literal["keep", "reject", "strip"] = "keep"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ShardResult:
    """What processing a run of records produced."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)
    read: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    truncated: int = 0
    markers: Counter[str] = field(default_factory=Counter)
    records_with_markers: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "written": self.read - len(self.rejects),
            "rows": len(self.rows),
            "rejected": len(self.rejects),
            "rejected_by_reason": dict(Counter(_reason_kind(r["reason"]) for r in self.rejects)),
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "truncated": self.truncated,
            "markers": dict(self.markers),
            "records_with_markers": self.records_with_markers,
        }


def _reason_kind(reason: str) -> str:
    """A short key for a reject reason, for the report's counts."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "…", reason.split(":")[0])[:80]


@lru_cache(maxsize=4)
def _format(model: str) -> Any:
    from turnkit.embedded import resolve_model
    from turnkit.format import ChatFormat

    return ChatFormat.from_pretrained(resolve_model(model))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _scan(messages: Any, tools: Any, pattern: re.Pattern[str], plain_json: bool) -> Counter[str]:
    """Control-marker strings in a record's data. One search over its JSON text (fast) when every marker is written
    the same in JSON; else a walk over every string."""
    if plain_json:
        try:
            return Counter(pattern.findall(json.dumps([messages, tools], ensure_ascii=False)))
        except (TypeError, ValueError):
            pass
    return Counter(m for s in _strings([messages, tools]) for m in pattern.findall(s))


def _strip(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return pattern.sub("", value)
    if isinstance(value, dict):
        return {_strip(k, pattern): _strip(v, pattern) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, pattern) for v in value]
    return value


def _encode(fmt: Any, messages: list[Any], tools: Any, config: PrepareConfig) -> list[Any]:
    encoded = fmt.encode(
        messages,
        tools=tools,
        turns=config.turns,
        train_end_marker=config.train_end_marker,
        split_turns=config.split_turns,
        attribution=False,  # rows hold ids, labels and masks only
    )
    return encoded if isinstance(encoded, list) else [encoded]


def _fit(fmt: Any, messages: list[Any], tools: Any, config: PrepareConfig) -> tuple[list[Any], bool]:
    """Encode, applying ``max_length``: drop the record, or drop whole earliest turns until it fits."""
    limit = config.max_length
    encodings = _encode(fmt, messages, tools, config)
    if limit is None or all(len(e) <= limit for e in encodings):
        return encodings, False
    if config.truncation == "drop":
        longest = max(len(e) for e in encodings)
        raise RecordError(f"too long: {longest} tokens, over max_length {limit} (truncation=drop)")
    system = [m for m in messages[:1] if isinstance(m, dict) and m.get("role") == "system"]
    rest = messages[len(system) :]
    starts = [i for i, m in enumerate(rest) if isinstance(m, dict) and m.get("role") == "user"]
    for start in starts[1:]:  # drop whole turns from the front: a turn starts at a user message
        encodings = _encode(fmt, system + rest[start:], tools, config)
        if all(len(e) <= limit for e in encodings):
            return encodings, True
    raise RecordError(f"too long: even the last turn alone is over max_length {limit} tokens (truncation=turns)")


def process_records(records: Sequence[RawRecord], config: PrepareConfig) -> ShardResult:
    """Rows and rejects for a run of records. Deterministic: the same records give the same result."""
    fmt = _format(config.model)
    markers = sorted(fmt.tokenizer.added, key=len, reverse=True)
    marker_pattern = re.compile("|".join(map(re.escape, markers))) if markers else None
    plain_json = all(json.dumps(m, ensure_ascii=False)[1:-1] == m for m in markers)
    result = ShardResult()
    for record in records:
        result.read += 1
        if record.error is not None:
            result.rejects.append({"record_id": record.record_id, "reason": record.error, "field": record.field})
            continue
        try:
            messages, tools = to_conversation(record.data, config.input_format, config.fields)
            if marker_pattern is not None:
                found = _scan(messages, tools, marker_pattern, plain_json)
                if found:
                    result.records_with_markers += 1
                    result.markers.update(found)
                    if config.markers == "reject":
                        first = found.most_common(1)[0][0]
                        raise RecordError(f"control marker {first!r} in the data (markers=reject)", "messages")
                    if config.markers == "strip":
                        messages, tools = _strip(messages, marker_pattern), _strip(tools, marker_pattern)
            encodings, truncated = _fit(fmt, messages, tools, config)
        except (TurnkitError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, RecordError) else str(exc)
            where = exc.location if isinstance(exc, TurnkitError) else None
            result.rejects.append({"record_id": record.record_id, "reason": reason, "field": where})
            continue
        result.truncated += truncated
        for turn, encoding in enumerate(encodings):
            row = {  # arrays: the shard writer builds Arrow columns from them directly
                "record_id": record.record_id,
                "turn": turn if config.split_turns else None,
                "input_ids": encoding.input_ids,
                "labels": encoding.labels,
                "assistant_masks": encoding.assistant_mask,
            }
            result.rows.append(row)
            result.tokens += len(encoding)
            result.trained_tokens += encoding.num_trained
    return result
