"""Helpers for reply-parsing tests: stream ids in chosen chunk sizes, and what a client assembles from the deltas."""

from __future__ import annotations

from turnkit import ChatFormat
from turnkit.parse import Reply


def ids_of(fmt: ChatFormat, text: str) -> list[int]:
    return fmt.tokenizer.encode(text).ids


def stream(fmt: ChatFormat, ids: list[int], chunks: list[int], **kwargs) -> tuple[Reply, list]:
    parser = fmt.stream_parser(call_id=lambda i: f"call_{i}", **kwargs)
    deltas, pos = [], 0
    for size in chunks:
        deltas += parser.feed(ids[pos : pos + size])
        pos += size
    deltas += parser.feed(ids[pos:])
    reply = parser.finish()
    return reply, deltas + parser.final_deltas


def assemble(deltas) -> dict:
    """What a client gets by concatenating the deltas."""
    content, reasoning, calls = "", None, {}
    for delta in deltas:
        content += delta.content or ""
        if delta.reasoning_content is not None:
            reasoning = (reasoning or "") + delta.reasoning_content
        for call in delta.tool_calls:
            entry = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
            entry["id"] = entry["id"] or call.id
            entry["name"] = call.name if call.name is not None else entry["name"]
            entry["arguments"] += call.arguments
    return {"content": content, "reasoning": reasoning, "calls": [calls[i] for i in sorted(calls)]}


def as_client_sees(reply: Reply) -> dict:
    return {
        "content": reply.content,
        "reasoning": reply.reasoning_content,
        "calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
    }
