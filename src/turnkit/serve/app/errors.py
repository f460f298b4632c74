"""How every failure becomes an error object: a request problem is an :class:`~turnkit.serve.protocol.APIError` (its
status and a body naming the field); an unknown route is a 404 and a wrong method a 405; anything unexpected is logged
and answered as a 500 *by the route itself* (:func:`answering`). Starlette's own last-resort handler re-raises after
answering, and the server then drops the client's keep-alive connection; answering in the route keeps it.

Each wire API writes the same error in its own shape: OpenAI's ``{"error": {...}}`` by default, Anthropic's
``{"type": "error", "error": {...}}`` under ``/v1/messages`` (:func:`shape_for`, one table for the routes, the router's
own 404 and 405, and the API key check)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from turnkit.serve import messages
from turnkit.serve.protocol import APIError

__all__ = ["EXCEPTION_HANDLERS", "ErrorShape", "Handler", "answering", "error_response", "shape_for"]

log = logging.getLogger("turnkit.serve")

Handler = Callable[[Request], Awaitable[Response]]
ErrorShape = Callable[[APIError], dict[str, Any]]

#: Path prefixes whose API writes errors in its own shape (the rest: OpenAI's).
_SHAPES: dict[str, ErrorShape] = {"/v1/messages": messages.error_body}


def shape_for(path: str) -> ErrorShape:
    """The error shape of the API a path belongs to."""
    return next((shape for prefix, shape in _SHAPES.items() if path.startswith(prefix)), APIError.body)


def error_response(error: APIError, headers: Mapping[str, str] | None = None, *, path: str = "") -> Response:
    """The error object in the shape of the API ``path`` belongs to, with its status and the headers it asks for
    (``Retry-After`` on a 429 or 503)."""
    return JSONResponse(shape_for(path)(error), status_code=error.status, headers={**error.headers, **(headers or {})})


def answering(handler: Handler) -> Handler:
    """The route's answer, or its error as its API's error object (500 for the unexpected, with the cause logged)."""

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as error:
            return error_response(error, path=request.url.path)
        except Exception:  # noqa: BLE001 (logged with its traceback by _failed)
            return _failed(request)

    return answer


async def _http_error(request: Request, exc: Exception) -> Response:
    """The router's own errors: 404 for an unknown path, 405 for a method the path does not take."""
    assert isinstance(exc, HTTPException)
    message = str(exc.detail)
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
    elif exc.status_code == 404:
        message = f"there is no endpoint {request.url.path}"
    return error_response(APIError(exc.status_code, message), headers=exc.headers, path=request.url.path)


async def _unexpected(request: Request, exc: Exception) -> Response:
    """Last resort, for failures outside any route (routes answer their own; see :func:`answering`)."""
    return _failed(request)


def _failed(request: Request) -> Response:
    """A 500 for the exception being handled, whose cause goes to the log, not to the client."""
    log.exception("unexpected error answering %s", request.url.path)
    return error_response(APIError(500, "the server failed to answer this request; see its log"), path=request.url.path)


#: Starlette's handlers for what happens outside a route: the router's 404 and 405, and the last resort.
EXCEPTION_HANDLERS = {HTTPException: _http_error, Exception: _unexpected}
