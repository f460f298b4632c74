"""Every record accounted for: whose record it is (its own id, and where it was read), and why one was rejected.

A record keeps the id its author gave it: ``--id-field NAME`` names the field; by default an ``id`` field is used
when the record has one. Where it was read (``file:line``) is kept beside it as ``source``, so a rejected record can
always be found again, with or without an id.

Reject reasons are counted under keys that read as whole phrases: the parts that vary from record to record (quoted
values, numbers, lists, the details in parentheses that quote an exception) are replaced by ``…`` or left out, and
nothing is cut mid-phrase: ``unknown speaker 'bot' (known: ['gpt', 'human', ...])`` counts as
``unknown speaker …``. A quoted word that names the reject's field stays, since it is what a user acts on:
``the message has no 'role'`` is counted as itself, not as ``the message has no …``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from turnkit.errors import RecordError

__all__ = [
    "ID_FIELD_DEFAULT",
    "PREPARE_ADVICE",
    "duplicate_ids",
    "has_own_id",
    "prepare_advice",
    "reason_key",
    "record_id",
    "reject",
]

#: The field a record's id is taken from when ``--id-field`` is not given (used only where present).
ID_FIELD_DEFAULT = "id"

_LIST = re.compile(r"\[[^\[\]]*\]")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_INNERMOST = re.compile(r"\s*\([^()]*\)")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
_ELLIPSES = re.compile(r"…(?:[\s,…]*…)?")
_FIELD_NAMES = re.compile(r"[A-Za-z_][\w-]*")


def reason_key(reason: str, field: str | None = None) -> str:
    """The key a reject reason is counted under: the whole phrase, with what varies per record taken out (a quoted
    name that is part of ``field``, the reject's field path, is kept)."""
    names = set(_FIELD_NAMES.findall(field or ""))
    named: dict[str, str] = {}  # a private-use character standing for each kept word while the rest is replaced

    def keep(match: re.Match[str]) -> str:
        word = match.group(0)
        if word[1:-1] not in names:
            return "…"
        placeholder = chr(0xE000 + len(named))
        named[placeholder] = word
        return placeholder

    key = _QUOTED.sub(keep, reason) if names else reason
    while True:  # innermost lists first: nested lists collapse to one …
        shorter = _LIST.sub("…", key)
        if shorter == key:
            break
        key = shorter
    key = _QUOTED.sub("…", key)
    while True:  # parentheses that quote details ("(known: ...)", an exception's text) go, innermost first
        found = _INNERMOST.search(key)
        if found is None:
            break
        group = found.group(0)
        kept = "" if ":" in group else group.replace("(", "\x00").replace(")", "\x01")
        key = key[: found.start()] + kept + key[found.end() :]
    key = key.replace("\x00", "(").replace("\x01", ")")
    key = _NUMBER.sub("…", key)
    key = _ELLIPSES.sub("…", key)
    for placeholder, word in named.items():
        key = key.replace(placeholder, word)
    return " ".join(key.split())


#: Encode advice in a reject reason names ``ChatFormat.encode``'s arguments; a prepare run needs its own option (the
#: flag, and the ``PrepareConfig`` field of the same name). Each left side is a phrase of a library message
#: (tests/data/test_prepare.py checks that each still occurs).
PREPARE_ADVICE: tuple[tuple[str, str], ...] = (
    (
        "encode with split_turns=True (see check_prefix_stable)",
        "prepare with --split-turns (PrepareConfig.split_turns; turnkit encode --check-prefix shows where)",
    ),
    ("pass allow_dropped=True", "prepare with --allow-dropped (PrepareConfig.allow_dropped)"),
)


def prepare_advice(reason: str) -> str:
    """A reject reason with encode's advice replaced by the prepare option that does the same."""
    for library, option in PREPARE_ADVICE:
        reason = reason.replace(library, option)
    return reason


def has_own_id(data: Any, id_field: str | None) -> bool:
    """Whether the record carries its id (``data[id_field]``, or ``data["id"]`` by default) as :func:`record_id`
    takes it; a record without one is named by where it was read, which the manifest counts
    (``record_ids.from_source``): such an id changes when the input is reordered or split, so a run says so."""
    value = data.get(id_field or ID_FIELD_DEFAULT) if isinstance(data, dict) else None
    return isinstance(value, str | int) and not isinstance(value, bool) and str(value) != ""


def record_id(data: Any, source: str, id_field: str | None) -> str:
    """The record's own id: ``data[id_field]``, or ``data["id"]`` when present by default, else its source.

    Raises:
        RecordError: ``id_field`` was named and the record has no usable value there.
    """
    field = id_field or ID_FIELD_DEFAULT
    value = data.get(field) if isinstance(data, dict) else None
    if has_own_id(data, id_field):
        return str(value)
    if id_field is None:
        return source
    if value is None:
        raise RecordError(f"the record has no {id_field} field (--id-field)", id_field)
    raise RecordError(f"the id field {id_field} holds a {type(value).__name__}, not a string or an integer", id_field)


def reject(record: str, source: str, reason: str, field: str | None) -> dict[str, Any]:
    """One line of ``rejects.jsonl``."""
    return {"record_id": record, "source": source, "reason": reason, "field": field}


#: How many duplicated ids the manifest lists (with where each was read), of however many there are.
_EXAMPLES = 5


def duplicate_ids(shards: Iterable[Path]) -> dict[str, Any]:
    """Written records that share their id with another written record, from the shards' ``record_id``, ``source``
    and ``turn`` columns: how many ids, how many records hold one, and the first few ids in read order with where
    each record was read.

    Records are written whatever their ids (the shards are cut and written in parallel, so no shard can know another's
    ids), but an id that names two records no longer finds one: in a trainer's logs, in ``rejects.jsonl``, in a
    resumed run. So the run says so. A record is its first row (``turn`` 0, or null without ``split_turns``): the rows
    of one record split into turns share its id rightly.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parts = []
    for path in shards:
        table = pq.read_table(path, columns=["record_id", "source", "turn"])
        parts.append(table.filter(pc.fill_null(pc.equal(table["turn"], 0), True)).select(["record_id", "source"]))
    none: dict[str, Any] = {"ids": 0, "records": 0, "examples": []}
    if not parts:
        return none
    records = pa.concat_tables(parts)
    counts = records.group_by("record_id").aggregate([("record_id", "count")])
    shared = counts.filter(pc.greater(counts["record_id_count"], 1))
    if shared.num_rows == 0:
        return none
    held = records.filter(pc.is_in(records["record_id"], value_set=shared["record_id"]))
    first = pc.unique(held["record_id"])[:_EXAMPLES]  # in order of first appearance, which is read order
    sources: dict[str, list[str]] = {str(rid): [] for rid in first.to_pylist()}
    for row in held.filter(pc.is_in(held["record_id"], value_set=first)).to_pylist():
        sources[row["record_id"]].append(row["source"])
    return {
        "ids": shared.num_rows,
        "records": int(pc.sum(shared["record_id_count"]).as_py()),
        "examples": [{"record_id": rid, "sources": where[:_EXAMPLES]} for rid, where in sources.items()],
    }
