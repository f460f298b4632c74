"""The error object of the one path: every problem with a request becomes an :class:`APIError`, with an HTTP status
and a message that names the field, never a 500 or a stack trace. Each API writes it in its own error shape (OpenAI's
``{"error": {"message", "type", "param", "code"}}`` by default) and in its own words (:mod:`.wording`).
"""

from __future__ import annotations

import math
from typing import Any

from turnkit.errors import TurnkitError

__all__ = ["APIError", "as_api_error"]


_KINDS = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


class APIError(Exception):
    """An error answered to the client: a 4xx is the client's ``invalid_request_error`` unless a more precise OpenAI
    type exists (401, 404, 429); a 5xx is a ``server_error``. ``retry_after`` (seconds) goes out as the
    ``Retry-After`` header of a 429 or 503: when a retry is likely to be admitted. ``facts`` are the numbers behind
    the message (``prompt_tokens``, ``context`` ...), for an API whose clients read its own wording of them.
    ``reason``: the message without the place it names (which :class:`Wording` writes in an API's own words)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        retry_after: float | None = None,
        facts: dict[str, int] | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or _KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.retry_after = retry_after
        self.facts = facts or {}
        self.reason = reason

    @property
    def headers(self) -> dict[str, str]:
        """The response headers this error asks for: ``Retry-After`` in whole seconds (at least 1)."""
        return {} if self.retry_after is None else {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def as_api_error(exc: TurnkitError) -> APIError:
    """A 400 for what turnkit refused in a request; ``param`` is the error's location (``messages[i].field``)."""
    reason = getattr(exc, "reason", None)
    return APIError(400, str(exc), param=exc.location, reason=reason if isinstance(reason, str) else None)
