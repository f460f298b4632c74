"""The tools a provider builds in (web search, computer use ...), which this server cannot offer a model: left out of
the prompt and named in the response (:class:`DroppedTool`, :data:`DROPPED_TOOLS_HEADER`), or refused with
``turnkit serve --refuse-builtin-tools``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from turnkit.errors import APIError

__all__ = ["DROPPED_TOOLS_HEADER", "BuiltinTools", "DroppedTool"]


#: The response header naming the built-in tools a request offered that were left out of the prompt (their types,
#: comma-separated); absent when none was.
DROPPED_TOOLS_HEADER = "turnkit-dropped-tools"


@dataclass(frozen=True)
class DroppedTool:
    """A built-in tool a request offered and the server left out of the prompt: its ``type``, where the request had
    it (``tools[8]``) and why it cannot be offered. Logged, named in :data:`DROPPED_TOOLS_HEADER`, and listed in the
    response body's ``turnkit_dropped_tools``."""

    type: str
    param: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"type": self.type, "param": self.param, "reason": self.reason}


@dataclass(frozen=True)
class BuiltinTools:
    """The tools an API's provider builds in, which this server cannot offer a model: a model here calls functions,
    described by the request's own schemas. ``hosted``: tool types the provider runs on its own servers (web search,
    file search, code execution, remote MCP ...); ``client``: types the client runs but the provider's models call in
    a format of their own, with no schema in the request (computer use, a shell, a text editor ...). A type matches
    with a version date after it (``web_search_2025_08_26``, ``web_search_20250305``); with ``any_dated``, any dated
    type is the provider's (Anthropic names each of its tools so), listed or not.

    Agents offer them unasked (Codex offers ``web_search`` by default), so by default a request that offers one is
    served without it and the response says so (:class:`DroppedTool`); a server that must not answer without them
    refuses the request instead (``turnkit serve --refuse-builtin-tools``: a 400 naming the tool)."""

    provider: str
    hosted: frozenset[str]
    client: frozenset[str]
    dated: re.Pattern[str]
    any_dated: bool = False

    def reason(self, kind: Any) -> str | None:
        """Why a tool of type ``kind`` cannot be offered, or None when it is not one of the provider's."""
        if not isinstance(kind, str):
            return None
        family = self.dated.sub("", kind)
        if kind in self.hosted or family in self.hosted:
            return f"a hosted tool: {self.provider} runs it on its own servers, and this server has nothing to run it"
        if kind in self.client or family in self.client:
            return (
                f"a tool built into {self.provider}'s models, which call it in a format of their own and not as a "
                "function with a schema: this server offers a model function tools only"
            )
        if self.any_dated and family != kind:
            return f"a tool {self.provider} defines: this server offers a model only tools with their own schema"
        return None

    def leave_out(self, kind: Any, param: str, *, refuse: bool) -> DroppedTool | None:
        """The tool of type ``kind`` at ``param`` left out (None when it is not built in); with ``refuse``, a 400
        naming it instead."""
        reason = self.reason(kind)
        if reason is None:
            return None
        if refuse:
            raise APIError(
                400,
                f"the tool type {kind!r} is not supported: {reason} (this server refuses such requests; without "
                "turnkit serve --refuse-builtin-tools it leaves the tool out and says so)",
                param=f"{param}.type",
                code="unsupported_parameter",
            )
        return DroppedTool(str(kind), param, reason)
