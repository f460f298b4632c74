"""The API key: every request but ``/health`` and the playground page itself (and ``/metrics`` with
``--metrics-public``) needs it, as OpenAI's clients send it (``Authorization: Bearer <key>``) or as Anthropic's do
(``x-api-key: <key>``)."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

from turnkit.serve.app import ui
from turnkit.serve.app.errors import error_response
from turnkit.serve.protocol import APIError

__all__ = ["Authenticate"]


class Authenticate:
    """Every request but ``/health`` needs the key, in ``Authorization: Bearer <key>`` or ``x-api-key`` (a plain ASGI
    middleware: it leaves streaming responses and client disconnects alone)."""

    def __init__(self, app: Any, key: str, public: Iterable[str] = ()) -> None:
        self.app = app
        self.bearer = key.encode()
        self.key = key.encode()
        self.public = frozenset({"/health", *ui.PUBLIC_PATHS, *public})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in self.public:
            headers = dict(scope["headers"])
            bearer_ok = hmac.compare_digest(_bearer_token(headers.get(b"authorization", b"")), self.bearer)
            key_ok = hmac.compare_digest(headers.get(b"x-api-key", b""), self.key)
            if not (bearer_ok or key_ok):
                error = APIError(
                    401, "a valid API key is required (Authorization: Bearer <key>, or x-api-key)", code="bad_api_key"
                )
                await error_response(error, path=scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _bearer_token(header: bytes) -> bytes:
    """The credentials of an ``Authorization`` header of the Bearer scheme, whose name is case-insensitive (RFC 9110
    11.1: ``bearer KEY`` and ``BEARER KEY`` are ``Bearer KEY``); empty for any other scheme."""
    scheme, _, credentials = header.partition(b" ")
    return credentials.strip(b" ") if scheme.lower() == b"bearer" else b""
