"""Reading a request body: at most :data:`MAX_BODY_BYTES` (413 beyond, without reading the rest into memory), valid
UTF-8 JSON, an object, nested at most :data:`MAX_DEPTH` deep (400 beyond: ``json.loads`` itself would recurse until
Python's limit). Every endpoint, the playground's included, reads its body here."""

from __future__ import annotations

import json
from typing import Any

from turnkit.serve.protocol import APIError

__all__ = ["MAX_BODY_BYTES", "MAX_DEPTH", "read_body", "read_json"]

#: The largest request body read (413 beyond): far more than any context this server runs holds as text.
MAX_BODY_BYTES = 2 * 1024 * 1024
#: The deepest nesting of arrays and objects a body may have (400 beyond): tool schemas need a few levels, not more.
MAX_DEPTH = 64


def read_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object: valid UTF-8 JSON, nested at most :data:`MAX_DEPTH` deep."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        body = None
        _too_deep()
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    _check_depth(body)
    return body


async def read_body(request: Any) -> dict[str, Any]:
    """The request's JSON object, read at most :data:`MAX_BODY_BYTES` (413 beyond, without reading the
    rest into memory)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes", code="request_too_large")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes", code="request_too_large")
        parts.append(part)
    return read_json(b"".join(parts))


def _too_deep() -> None:
    raise APIError(400, f"the request body nests arrays and objects over {MAX_DEPTH} deep", code="too_deep")


def _check_depth(value: Any) -> None:
    """Walk the body without recursion; fail at the first value deeper than :data:`MAX_DEPTH`."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            _too_deep()
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
