"""An API's own words for the fields the one path names in chat completions' words: a Responses error names
``input[3]`` and ``max_output_tokens``, not the chat request's ``messages[2]`` and ``max_tokens``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from turnkit.errors import APIError

__all__ = ["Wording"]


_MESSAGE_PLACE = re.compile(r"messages\[(\d+)\](.*)")


@dataclass
class Wording:
    """How one API names what the one path names in chat completions' words, so that an error raised past the API's
    parser (rendering, the context check, the grammar, the engine) names the API's own fields.

    ``fields``: chat field to this API's field (Responses: ``max_tokens`` is ``max_output_tokens``, ``messages`` is
    ``input``, ``response_format`` is ``text.format``). ``messages``: for each chat message the API's translation
    made, where its parts came from: ``""`` is the message itself, and longer paths (``.content``,
    ``.tool_calls[0].function.arguments``) name a part that came from elsewhere (the ``arguments`` of a
    ``function_call`` item, the ``input`` of a ``tool_use`` block). A path under a known part keeps its tail where
    that part is an item of a list (``input[3]`` + ``.content``); a message from a field (``instructions``, the
    conversation ``previous_response_id`` names) is that field. The chat API's own wording is the empty one."""

    fields: Mapping[str, str] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)

    @staticmethod
    def call(index: int, where: str, *, arguments: str, name: str) -> dict[str, str]:
        """The places of an assistant message's tool call ``index`` that came from ``where``, whose arguments and
        name the API calls ``arguments`` and ``name`` (paths under ``where``)."""
        call = f".tool_calls[{index}]"
        return {
            call: where,
            f"{call}.function.arguments": f"{where}.{arguments}",
            f"{call}.function.name": f"{where}.{name}",
        }

    def place(self, param: str | None) -> str | None:
        """``param`` in this API's words (unchanged where the API names it the same)."""
        if param is None:
            return None
        match = _MESSAGE_PLACE.fullmatch(param)
        if match is not None and int(match.group(1)) < len(self.messages):
            parts, rest = self.messages[int(match.group(1))], match.group(2)
            known = max((p for p in parts if rest == p or rest.startswith((p + ".", p + "["))), key=len, default=None)
            if known is not None:  # the tail of a list item's path reads the same (input[3].content)
                where = parts[known]
                return where + rest[len(known) :] if where.endswith("]") else where
        head = re.match(r"[a-z_]+", param)
        if head is not None and head.group(0) in self.fields:
            return self.fields[head.group(0)] + param[head.end() :]
        return param

    def reword(self, error: APIError) -> APIError:
        """``error`` naming this API's fields: its ``param``, and its message where that names the place (a
        message's place in front of its reason, or the field the error is about)."""
        param = self.place(error.param)
        if param == error.param:
            return error
        message = error.message
        if error.reason is not None:
            message = f"{param}: {error.reason}"
        elif error.param is not None:
            message = re.sub(rf"(?<![\w.\[]){re.escape(error.param)}(?![\w\[])", param or "", message)
        return APIError(
            error.status,
            message,
            param=param,
            code=error.code,
            kind=error.kind,
            retry_after=error.retry_after,
            facts=error.facts,
            reason=error.reason,
        )
