"""Structured output: ``response_format`` ``json_object`` and ``json_schema`` by grammar-constrained decoding."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

from turnkit.format import ChatFormat
from turnkit.serve.protocol import APIError

__all__ = ["checked", "constraint_for"]


def constraint_for(fmt: ChatFormat, response_format: dict[str, Any] | None) -> Callable[[], Any] | None:
    if response_format is None:
        return None
    raise APIError(400, "response_format is not supported yet", param="response_format", code="unsupported_parameter")


def checked(chunks: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    return chunks
