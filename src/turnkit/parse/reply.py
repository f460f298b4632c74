"""What parsing produces: a finished :class:`Reply`, and the :class:`Delta` events of a stream."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CallStatus", "Delta", "EndReason", "ParsedToolCall", "Reply", "ToolCallDelta"]


class EndReason(enum.StrEnum):
    """Why a reply ended."""

    END_OF_TURN = "end_of_turn"  # the template's end-of-turn marker (<|im_end|>, <|eot_id|>)
    EOS = "eos"  # another end-of-sequence id the checkpoint declares
    STOP_STRING = "stop_string"  # a stop string of the request
    STOP_TOKEN = "stop_token"  # a stop token id of the request (vLLM's stop_token_ids)
    LENGTH = "length"  # the token budget ran out
    NONE = "none"  # the stream ended without any of these


_CLEAN_ENDS = frozenset({EndReason.END_OF_TURN, EndReason.EOS, EndReason.STOP_STRING, EndReason.STOP_TOKEN})


class CallStatus(enum.StrEnum):
    """Whether a tool call parsed: a reply can end cleanly and still hold a call that failed to parse."""

    OK = "ok"
    INVALID_JSON = "invalid_json"
    UNKNOWN_TOOL = "unknown_tool"
    UNTERMINATED = "unterminated"


@dataclass
class ParsedToolCall:
    """A tool call, in OpenAI shape: ``arguments`` is the JSON text the model wrote.

    A call that failed to parse is kept, never dropped nor turned back into content: ``status`` says how it failed,
    ``error`` why, and ``raw`` holds the text the model wrote for it (between its markers; for a Mistral list of
    calls, the whole list), so nothing the model wrote is lost.
    """

    id: str
    name: str
    arguments: str
    status: CallStatus = CallStatus.OK
    error: str | None = None
    raw: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @property
    def parsed_arguments(self) -> Any:
        """The arguments as Python data (raises ``ValueError`` for a call whose JSON is invalid)."""
        return json.loads(self.arguments) if self.arguments else {}


@dataclass
class Reply:
    """A parsed assistant reply.

    Attributes:
        content: The visible text.
        reasoning_content: The reasoning (``None`` when the reply has none).
        tool_calls: The tool calls, each with its parse status.
        end: Why the reply ended; ``stop`` holds the stop string or the token text that ended it.
        problems: Text that does not read as the reply format says, and what was done with it (a Harmony header
            with no ``<|message|>`` is read as its message's text): such a reply did not end cleanly.
    """

    content: str = ""
    reasoning_content: str | None = None
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    end: EndReason = EndReason.NONE
    stop: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        """The OpenAI ``finish_reason``: ``tool_calls``, ``stop`` or ``length``.

        An API must answer one of these, so a reply that never ended (``end`` is ``none``: no end-of-turn marker, EOS
        id or stop string, and no ``length``) is ``stop`` here too; :attr:`end` and :attr:`ended_cleanly` tell it
        apart (``turnkit parse`` shows ``finish_reason: null`` for it, and says why)."""
        if self.end == EndReason.LENGTH:
            return "length"
        if any(call.status == CallStatus.OK for call in self.tool_calls):
            return "tool_calls"
        return "stop"

    @property
    def ok(self) -> bool:
        """True when every tool call parsed."""
        return all(call.status == CallStatus.OK for call in self.tool_calls)

    @property
    def ended_cleanly(self) -> bool:
        """True when the reply ended where the model meant it to (an end-of-turn marker, an EOS id, a stop string)
        and every tool call parsed: the split a trainer or an agent loop needs between replies to trust and replies
        that were cut off by the token budget (``length``), ended without any end (``none``), or hold a failed call.
        ``strict=True`` parsing raises :class:`~turnkit.errors.ReplyParseError` exactly when this is False."""
        return self.end in _CLEAN_ENDS and self.ok and not self.problems

    def message(self) -> dict[str, Any]:
        """The reply as an OpenAI assistant message (content ``None`` when there is only a tool call)."""
        out: dict[str, Any] = {
            "role": "assistant",
            "content": self.content if self.content or not self.tool_calls else None,
        }
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        return out


@dataclass
class ToolCallDelta:
    """A piece of a streamed tool call: its index always, the id and name once, then argument fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_dict(self) -> dict[str, Any]:
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.name is not None:
            function["name"] = self.name
        out: dict[str, Any] = {"index": self.index, "function": function}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        return out


@dataclass
class Delta:
    """One streamed event, in the shape of an OpenAI ``chat.completion.chunk`` delta."""

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.content is not None:
            out["content"] = self.content
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        return out
