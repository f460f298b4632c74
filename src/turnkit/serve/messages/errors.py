"""Anthropic's error object: an :class:`~turnkit.serve.protocol.APIError` as the Messages API writes it, worded as
Anthropic words the errors its clients act on."""

from __future__ import annotations

from typing import Any

from turnkit.serve.protocol import APIError

__all__ = ["error_body"]

_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(error: APIError) -> dict[str, Any]:
    """An :class:`~.protocol.APIError` in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.

    Context overflows are worded as Anthropic words them, because agents act on the words: Claude Code compacts the
    conversation on ``prompt is too long: N tokens > M maximum`` and retries with a smaller ``max_tokens`` on
    ``input length and `max_tokens` exceed context limit: N + K > M``."""
    kind = _ERROR_TYPES.get(error.status, "invalid_request_error" if error.status < 500 else "api_error")
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    facts = error.facts
    if error.code == "context_length_exceeded" and "max_tokens" in facts:
        message = (
            f"input length and `max_tokens` exceed context limit: {facts['prompt_tokens']} + {facts['max_tokens']} > "
            f"{facts['context']}, decrease input length or `max_tokens` and try again"
        )
    elif error.code == "context_length_exceeded":
        message = f"prompt is too long: {facts.get('prompt_tokens')} tokens > {facts.get('context')} maximum"
    return {"type": "error", "error": {"type": kind, "message": message}}
