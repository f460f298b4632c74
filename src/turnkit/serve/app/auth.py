"""The API key: every request but ``/health`` and the playground page itself needs ``Authorization: Bearer <key>``."""

from __future__ import annotations

import hmac
from typing import Any

from turnkit.serve.app import ui
from turnkit.serve.app.errors import error_response
from turnkit.serve.protocol import APIError

__all__ = ["Authenticate"]


class Authenticate:
    """Every request but ``/health`` needs ``Authorization: Bearer <key>`` (a plain ASGI middleware: it leaves
    streaming responses and client disconnects alone)."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and scope["path"] not in ui.PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(401, "a valid API key is required (Authorization: Bearer <key>)", code="bad_api_key")
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
