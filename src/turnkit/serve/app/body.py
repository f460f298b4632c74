"""Reading a request body: at most :data:`MAX_BODY_BYTES` (413 beyond, without reading the rest into memory), valid
UTF-8 JSON, an object, nested at most :data:`MAX_DEPTH` deep (400 beyond: ``json.loads`` itself would recurse until
Python's limit). Every endpoint, the playground's included, reads its body here; a large one is decoded and checked
in a worker thread (:func:`read_request`), so that the event loop keeps answering other clients."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

from turnkit.serve.protocol import APIError

__all__ = ["MAX_BODY_BYTES", "MAX_DEPTH", "OFF_LOOP_BYTES", "read_body", "read_json", "read_request"]

T = TypeVar("T")

#: The largest request body read (413 beyond): far more than any context this server runs holds as text.
MAX_BODY_BYTES = 2 * 1024 * 1024
#: Bodies from this size on are decoded and checked off the event loop (:func:`read_request`).
OFF_LOOP_BYTES = 64 * 1024
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
    return await read_request(request, _as_is)


async def read_request(request: Any, parse: Callable[[dict[str, Any]], T]) -> T:
    """The request's JSON object read as :func:`read_body` does, then checked by ``parse`` (an API's reader, e.g.
    ``parse_chat``). A body over :data:`OFF_LOOP_BYTES` is decoded and checked in a worker thread: a 10,000-message
    conversation takes long enough to stall every other client (``/health`` included) if the event loop did it."""
    raw = await _read_raw(request)
    if len(raw) < OFF_LOOP_BYTES:
        return parse(read_json(raw))
    return await asyncio.to_thread(lambda: parse(read_json(raw)))


def _as_is(body: dict[str, Any]) -> dict[str, Any]:
    return body


async def _read_raw(request: Any) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes", code="request_too_large")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes", code="request_too_large")
        parts.append(part)
    return b"".join(parts)


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
