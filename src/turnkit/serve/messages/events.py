"""A reply as Anthropic's stream events (``message_start``, the content blocks' ``content_block_start``/``_delta``/
``_stop``, ``message_delta``, ``message_stop``), and a whole message as those events folded, as the official client
folds a stream."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

from turnkit.parse.reply import CallStatus, EndReason
from turnkit.serve.protocol import DroppedTool
from turnkit.serve.session import Session

__all__ = ["PING", "Event", "fold_message", "message_events"]

Event = dict[str, Any]
#: The event Anthropic's API sends after ``message_start`` and in a stream's silences (a keep-alive its clients skip).
PING: Event = {"type": "ping"}


async def message_events(
    session: Session, model: str, *, show_thinking: bool = True, dropped_tools: Sequence[DroppedTool] = ()
) -> AsyncGenerator[Event, None]:
    """The stream events of one reply: ``message_start`` (its message names the ``dropped_tools`` in
    ``turnkit_dropped_tools``, a field Anthropic's clients keep and ignore), a ``ping``, the content blocks as the text
    and thinking grow, then the tool calls (each one ``tool_use`` block), ``message_delta`` (stop reason, usage) and
    ``message_stop``."""
    start: Event = {
        "type": "message_start",
        "message": {
            "id": f"msg_{session.request_id}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": session.prompt_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        },
    }
    if dropped_tools:
        start["message"]["turnkit_dropped_tools"] = [tool.to_dict() for tool in dropped_tools]
    yield start
    yield PING
    blocks = _Blocks()
    async with aclosing(session.steps()) as steps:
        async for step in steps:
            for delta in step.deltas:
                if delta.reasoning_content:
                    for event in blocks.grow("thinking", delta.reasoning_content if show_thinking else ""):
                        yield event
                if delta.content:
                    for event in blocks.grow("text", delta.content):
                        yield event
    reply = session.reply
    assert reply is not None
    for event in blocks.close():
        yield event
    for call in reply.tool_calls:
        if call.status == CallStatus.OK:
            block = {"type": "tool_use", "id": _tool_use_id(call.id), "name": call.name, "input": {}}
            for event in blocks.whole(block, {"type": "input_json_delta", "partial_json": call.arguments or "{}"}):
                yield event
        else:  # a call that did not parse cannot be a tool_use block: it is what the model wrote
            for event in blocks.grow("text", call.raw or call.arguments):
                yield event
            for event in blocks.close():
                yield event
    cached = min(session.generation.cached_tokens, session.prompt_tokens)
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": _stop_reason(session), "stop_sequence": reply.stop if _stopped(session) else None},
        "usage": {
            "input_tokens": session.prompt_tokens - cached,
            "output_tokens": session.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        },
    }
    yield {"type": "message_stop"}


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _stopped(session: Session) -> bool:
    return session.reply is not None and session.reply.end == EndReason.STOP_STRING


def _stop_reason(session: Session) -> str:
    reply = session.reply
    assert reply is not None
    if reply.finish_reason == "length":
        return "max_tokens"
    if reply.finish_reason == "tool_calls":
        return "tool_use"
    return "stop_sequence" if _stopped(session) else "end_turn"


class _Blocks:
    """The content blocks of a reply being streamed: one block is open at a time, and a delta of another kind closes
    it and opens the next."""

    def __init__(self) -> None:
        self.count = 0
        self.open: str | None = None

    def grow(self, kind: str, text: str) -> list[Event]:
        out = []
        if self.open != kind:
            out += self.close()
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text"}
            if kind == "text":
                block["text"] = ""
            out.append({"type": "content_block_start", "index": self.count, "content_block": block})
            self.open = kind
        if text:
            delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta"}
            if kind == "text":
                delta["text"] = text
            out.append({"type": "content_block_delta", "index": self.count, "delta": delta})
        return out

    def whole(self, block: dict[str, Any], delta: dict[str, Any]) -> list[Event]:
        out = self.close()
        out.append({"type": "content_block_start", "index": self.count, "content_block": block})
        out.append({"type": "content_block_delta", "index": self.count, "delta": delta})
        out.append({"type": "content_block_stop", "index": self.count})
        self.count += 1
        return out

    def close(self) -> list[Event]:
        if self.open is None:
            return []
        self.open = None
        self.count += 1
        return [{"type": "content_block_stop", "index": self.count - 1}]


def fold_message(events: Sequence[Event]) -> dict[str, Any]:
    """The whole ``message`` that the events add up to, folded as the official client folds a stream."""
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for event in events:
        kind = event["type"]
        if kind == "message_start":
            message = json.loads(json.dumps(event["message"]))
        elif kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop" and event["index"] in partial:
            message["content"][event["index"]]["input"] = json.loads(partial.pop(event["index"]) or "{}")
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"].update(event["usage"])
    return message
