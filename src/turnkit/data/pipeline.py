"""The batch function both runners run: raw records in, training rows and rejects out, every record accounted for.

For each record: convert it to a conversation (:mod:`.formats`), scan its data for the target template's control
markers (keep them as text, reject the record, or strip them), encode it with ``ChatFormat.encode`` (safe, with masks),
apply ``--max-length`` (drop the record, or drop whole earliest turns: an assistant turn's end marker is never cut),
and emit rows. Anything that goes wrong becomes a reject with the record's id and source, the reason and the field
(:mod:`.accounting`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Literal

from turnkit.data.accounting import has_own_id, prepare_advice, reason_key, record_id, reject
from turnkit.data.formats import FieldMap, RecordError, to_conversation
from turnkit.data.sources import RawRecord
from turnkit.encode.coverage import REASONING
from turnkit.encode.options import EncodeOptions
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
    allow_dropped: bool = False  # train a turn whose tool calls or content the template leaves out
    markers: Literal["keep", "reject", "strip"] = "keep"
    id_field: str | None = None  # the record's own id; None: "id" where present, else file:line

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
    #: Assistant turns whose reasoning the template left out (Qwen3 drops it before the last user message), and
    #: the records they are in.
    reasoning_left_out: int = 0
    records_reasoning_left_out: int = 0
    #: Records whose id is where they were read (``file:line``): they had no id field (or could not be read).
    ids_from_source: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "written": self.read - len(self.rejects),
            "rows": len(self.rows),
            "rejected": len(self.rejects),
            "rejected_by_reason": dict(Counter(reason_key(r["reason"], r["field"]) for r in self.rejects)),
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "truncated": self.truncated,
            "markers": dict(self.markers),
            "records_with_markers": self.records_with_markers,
            "reasoning_left_out": self.reasoning_left_out,
            "records_reasoning_left_out": self.records_reasoning_left_out,
            "ids_from_source": self.ids_from_source,
        }


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


#: Characters that JSON text holds outside its strings, or that start an escape: a marker starting with none of them
#: can only appear in JSON text inside a string that holds its first character.
_JSON_SYNTAX = frozenset('{}[]":,.+-\\ \t\r\n0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ')


def _lone_surrogate() -> RecordError:
    return RecordError("the text holds a lone surrogate: it is not valid Unicode", "messages")


def _nothing_to_find(value: Any, starts: str) -> bool:
    """Whether ``value`` is plain JSON data none of whose strings holds a character of ``starts`` (the characters
    markers start with): then its JSON text holds no marker, and the search of :func:`_scan` is skipped. Raises the
    reject of a lone surrogate, as that search does."""
    stack = [value]
    wide = []  # strings that are not ASCII: checked for lone surrogates
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if not item.isascii():
                wide.append(item)
            for char in starts:
                if char in item:
                    return False
        elif kind is dict:
            for key, inner in item.items():
                if type(key) is not str:
                    return False  # json.dumps writes or refuses such keys: let it decide
                stack.append(key)
                stack.append(inner)
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif not (item is None or kind is bool or kind is int or kind is float):
            return False
    for text in wide:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # the tokenizer would refuse it with a TypeError
            raise _lone_surrogate() from None
    return True


def _scan(messages: Any, tools: Any, markers: _Markers) -> Counter[str]:
    """Control-marker strings in a record's data. None at all when no string holds a character markers start with
    (the common case, decided without building text); else one search over its JSON text when every marker is
    written the same in JSON; else a walk over every string."""
    pattern, plain_json = markers.pattern, markers.plain_json
    if markers.starts is not None and _nothing_to_find([messages, tools], markers.starts):
        return Counter()
    if plain_json:
        try:
            text = json.dumps([messages, tools], ensure_ascii=False)
        except (TypeError, ValueError):
            pass
        else:
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # the tokenizer would refuse it with a TypeError
                    raise _lone_surrogate() from None
            return Counter(pattern.findall(text))
    return Counter(m for s in _strings([messages, tools]) for m in pattern.findall(s))


def _strip(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return pattern.sub("", value)
    if isinstance(value, dict):
        return {_strip(k, pattern): _strip(v, pattern) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, pattern) for v in value]
    return value


def _options(config: PrepareConfig) -> EncodeOptions:
    return EncodeOptions(
        turns=config.turns,
        train_end_marker=config.train_end_marker,
        split_turns=config.split_turns,
        allow_dropped=config.allow_dropped,
        attribution=False,  # rows hold ids, labels and masks only
    )


def _encode(fmt: Any, messages: list[Any], tools: Any, config: PrepareConfig) -> list[Any]:
    encoded = fmt.encode(messages, _options(config), tools=tools)
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


_BATCH = 128  # conversations per encode_batch call: big enough to pipeline, small enough to redo one by one


def process_records(records: Sequence[RawRecord], config: PrepareConfig, *, spare_core: bool = True) -> ShardResult:
    """Rows and rejects for a run of records. Deterministic: the same records give the same result.

    ``spare_core``: whether a core is free for the tokenizer to work in its own thread while templates render, where
    the tokenizer works without the GIL (see ``Encoder.encode_batch``; not where every core already runs a worker:
    there a thread only adds contention).

    Records are parsed, converted and scanned one by one, then encoded through ``encode_batch`` in runs of
    ``_BATCH`` (repeated system prompts and tool schemas are tokenized once); a run in which some record fails is
    encoded again one by one, so each failure is the reject of its own record.
    """
    fmt = _format(config.model)
    markers = _markers(config.model)
    result = ShardResult()
    outcomes: list[Any] = []  # per record, in read order: a reject, or [record id, source, messages, tools]
    for record in records:
        result.read += 1
        source = record.record_id
        data, error, where = record.read()
        if error is not None:
            result.ids_from_source += 1
            outcomes.append(reject(source, source, error, where))
            continue
        rid = source
        result.ids_from_source += not has_own_id(data, config.id_field)  # its id is where it was read
        try:
            rid = record_id(data, source, config.id_field)
            messages, tools = to_conversation(data, config.input_format, config.fields)
            if markers is not None:
                found = _scan(messages, tools, markers)
                if found:
                    result.records_with_markers += 1
                    result.markers.update(found)
                    if config.markers == "reject":
                        first = found.most_common(1)[0][0]
                        raise RecordError(f"control marker {first!r} in the data (markers=reject)", "messages")
                    if config.markers == "strip":
                        messages, tools = _strip(messages, markers.pattern), _strip(tools, markers.pattern)
        except (TurnkitError, ValueError) as exc:
            outcomes.append(_rejected(rid, source, exc))
            continue
        outcomes.append([rid, source, messages, tools])
    todo = [o for o in outcomes if isinstance(o, list)]
    for start in range(0, len(todo), _BATCH):
        _encode_run(fmt, todo[start : start + _BATCH], config, spare_core)
    for outcome in outcomes:
        if isinstance(outcome, dict):
            result.rejects.append(outcome)
            continue
        rid, source, _, _, encoded = outcome
        if isinstance(encoded, dict):
            result.rejects.append(encoded)
            continue
        encodings, truncated = encoded
        result.truncated += truncated
        left_out = {index for e in encodings for index, name in e.unrendered if name == REASONING}
        result.reasoning_left_out += len(left_out)
        result.records_reasoning_left_out += bool(left_out)
        for turn, encoding in enumerate(encodings):
            row = {  # arrays: the shard writer builds Arrow columns from them directly
                "record_id": rid,
                "source": source,
                "turn": turn if config.split_turns else None,
                "input_ids": encoding.input_ids,
                "labels": encoding.labels,
                "assistant_masks": encoding.assistant_mask,
            }
            result.rows.append(row)
            result.tokens += len(encoding)
            result.trained_tokens += encoding.num_trained
    return result


def _rejected(rid: str, source: str, exc: Exception) -> dict[str, Any]:
    reason = exc.reason if isinstance(exc, RecordError) else prepare_advice(str(exc))
    where = exc.location if isinstance(exc, TurnkitError) else None
    return reject(rid, source, reason, where)


def _encode_run(fmt: Any, run: list[list[Any]], config: PrepareConfig, spare_core: bool) -> None:
    """Encode a run of converted records; appends ``(encodings, truncated)`` or a reject to each."""
    try:
        batch = fmt.encoder.encode_batch(
            [{"messages": messages, "tools": tools} for _, _, messages, tools in run],
            _options(config),
            tokenizer_thread=None if spare_core else False,
        )
    except (TurnkitError, ValueError):
        batch = None  # some record of the run fails: encode them one by one to know which
    limit = config.max_length
    for at, item in enumerate(run):
        rid, source, messages, tools = item
        if batch is not None:
            encodings = batch[at] if isinstance(batch[at], list) else [batch[at]]
            if limit is None or all(len(e) <= limit for e in encodings):
                item.append((encodings, False))
                continue
        try:
            item.append(_fit(fmt, messages, tools, config))
        except (TurnkitError, ValueError) as exc:
            item.append(_rejected(rid, source, exc))


@dataclass(frozen=True)
class _Markers:
    """How to find the tokenizer's added-token strings in a record's data."""

    pattern: re.Pattern[str]
    plain_json: bool  # every marker is written the same inside JSON text
    starts: str | None  # the characters markers start with, when none of them is JSON syntax (see _nothing_to_find)


@lru_cache(maxsize=4)
def _markers(model: str) -> _Markers | None:
    """The markers of the model's tokenizer (None when it has none)."""
    markers = sorted(_format(model).tokenizer.added, key=len, reverse=True)
    if not markers:
        return None
    starts = "".join(sorted({m[0] for m in markers}))
    return _Markers(
        re.compile("|".join(map(re.escape, markers))),
        all(json.dumps(m, ensure_ascii=False)[1:-1] == m for m in markers),
        None if _JSON_SYNTAX.intersection(starts) else starts,
    )
