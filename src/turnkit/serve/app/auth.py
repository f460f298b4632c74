"""The API key: every request but ``/health`` and the playground page itself (and ``/metrics`` with
``--metrics-public``) needs ``Authorization: Bearer <key>``."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

from turnkit.serve.app import ui
from turnkit.serve.app.errors import error_response
from turnkit.serve.protocol import APIError

__all__ = ["Authenticate"]


class Authenticate:
    """Every request but ``/health`` needs ``Authorization: Bearer <key>`` (a plain ASGI middleware: it leaves
    streaming responses and client disconnects alone)."""

    def __init__(self, app: Any, key: str, public: Iterable[str] = ()) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()
        self.public = frozenset({"/health", *ui.PUBLIC_PATHS, *public})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in self.public:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(401, "a valid API key is required (Authorization: Bearer <key>)", code="bad_api_key")
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
