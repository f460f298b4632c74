"""Every record accounted for: whose record it is (its own id, and where it was read), and why one was rejected.

A record keeps the id its author gave it: ``--id-field NAME`` names the field; by default an ``id`` field is used
when the record has one. Where it was read (``file:line``) is kept beside it as ``source``, so a rejected record can
always be found again, with or without an id.

Reject reasons are counted under keys that read as whole phrases: the parts that vary from record to record (quoted
values, numbers, lists, the details in parentheses that quote an exception) are replaced by ``…`` or left out, and
nothing is cut mid-phrase: ``unknown speaker 'bot' (known: ['gpt', 'human', ...])`` counts as
``unknown speaker …``.
"""

from __future__ import annotations

import re
from typing import Any

from turnkit.errors import RecordError

__all__ = ["ID_FIELD_DEFAULT", "reason_key", "record_id", "reject"]

#: The field a record's id is taken from when ``--id-field`` is not given (used only where present).
ID_FIELD_DEFAULT = "id"

_LIST = re.compile(r"\[[^\[\]]*\]")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_INNERMOST = re.compile(r"\s*\([^()]*\)")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
_ELLIPSES = re.compile(r"…(?:[\s,…]*…)?")


def reason_key(reason: str) -> str:
    """The key a reject reason is counted under: the whole phrase, with what varies per record taken out."""
    key = reason
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
    return " ".join(key.split())


def record_id(data: Any, source: str, id_field: str | None) -> str:
    """The record's own id: ``data[id_field]``, or ``data["id"]`` when present by default, else its source.

    Raises:
        RecordError: ``id_field`` was named and the record has no usable value there.
    """
    field = id_field or ID_FIELD_DEFAULT
    value = data.get(field) if isinstance(data, dict) else None
    if isinstance(value, str | int) and not isinstance(value, bool) and str(value) != "":
        return str(value)
    if id_field is None:
        return source
    if value is None:
        raise RecordError(f"the record has no {id_field} field (--id-field)", id_field)
    raise RecordError(f"the id field {id_field} holds a {type(value).__name__}, not a string or an integer", id_field)


def reject(record: str, source: str, reason: str, field: str | None) -> dict[str, Any]:
    """One line of ``rejects.jsonl``."""
    return {"record_id": record, "source": source, "reason": reason, "field": field}
