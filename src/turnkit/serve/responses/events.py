"""A response as the Responses stream's events (``response.created`` ... ``response.completed``), every event with
its ``sequence_number``, and the whole response those events build, so a streamed and a whole answer cannot
disagree."""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from turnkit.parse.reply import CallStatus, EndReason
from turnkit.serve.protocol import APIError
from turnkit.serve.responses.request import ResponsesRequest
from turnkit.serve.session import Session

__all__ = ["Event", "ResponseEvents"]

Event = dict[str, Any]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseEvents:
    """The events of one response and the response they build. Iterate :meth:`events` once; ``response`` is then the
    whole response (the very object ``response.completed`` carries), and ``on_done`` has been called with it."""

    def __init__(
        self,
        session: Session,
        model: str,
        req: ResponsesRequest,
        on_done: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.session, self.req, self.on_done = session, req, on_done
        self.sequence = 0
        self.response: dict[str, Any] = {
            "id": f"resp_{session.request_id}",
            "object": "response",
            "created_at": session.created,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "model": model,
            "output": [],
            "usage": None,
            "store": req.store,
            **req.echo,
        }
        self._open: dict[str, Any] | None = None  # the output item being streamed
        self._calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its function_call item
        self._reasoning_tokens = 0

    def _event(self, kind: str, **fields: Any) -> Event:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def error_event(self, error: APIError) -> Event:
        """A failure after the stream started, as the Responses stream's ``error`` event."""
        return self._event("error", code=error.code or error.kind, message=error.message, param=error.param)

    async def events(self) -> AsyncGenerator[Event, None]:
        yield self._event("response.created", response=copy.deepcopy(self.response))
        yield self._event("response.in_progress", response=copy.deepcopy(self.response))
        async with aclosing(self.session.steps()) as steps:
            async for step in steps:
                if any(d.reasoning_content for d in step.deltas):
                    self._reasoning_tokens += 1
                for delta in step.deltas:
                    if delta.reasoning_content:
                        for event in self._text("reasoning", delta.reasoning_content):
                            yield event
                    if delta.content:
                        for event in self._text("message", delta.content):
                            yield event
                    for piece in delta.tool_calls:
                        for event in self._call(piece.index, piece.id, piece.name, piece.arguments):
                            yield event
        for event in self._close():
            yield event
        yield self._finish()

    def _add(self, item: dict[str, Any]) -> list[Event]:
        out = self._close()
        self.response["output"].append(item)
        self._open = item
        out.append(self._event("response.output_item.added", output_index=self._index, item=copy.deepcopy(item)))
        return out

    @property
    def _index(self) -> int:
        return len(self.response["output"]) - 1

    def _text(self, kind: str, text: str) -> list[Event]:
        out: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            if kind == "message":
                item: dict[str, Any] = {"type": "message", "id": _new_id("msg"), "status": "in_progress"}
                item["role"] = "assistant"
                part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"type": "reasoning", "id": _new_id("rs"), "summary": [], "status": "in_progress"}
                part = {"type": "reasoning_text", "text": ""}
            item["content"] = [part]
            out += self._add(item)
            where = {"item_id": item["id"], "output_index": self._index, "content_index": 0}
            out.append(self._event("response.content_part.added", **where, part=copy.deepcopy(part)))
        assert self._open is not None
        self._open["content"][0]["text"] += text
        where = {"item_id": self._open["id"], "output_index": self._index, "content_index": 0}
        if kind == "message":
            out.append(self._event("response.output_text.delta", **where, delta=text, logprobs=[]))
        else:
            out.append(self._event("response.reasoning_text.delta", **where, delta=text))
        return out

    def _call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[Event]:
        out: list[Event] = []
        item = self._calls.get(index)
        if item is None:
            item = {
                "type": "function_call",
                "id": _new_id("fc"),
                "call_id": call_id or "",
                "name": name or "",
                "arguments": "",
                "status": "in_progress",
            }
            if item["name"] in self.req.namespaces:
                item["namespace"] = self.req.namespaces[item["name"]]
            self._calls[index] = item
            out += self._add(item)
        if arguments:
            item["arguments"] += arguments
            where = {"item_id": item["id"], "output_index": self.response["output"].index(item)}
            out.append(self._event("response.function_call_arguments.delta", **where, delta=arguments))
        return out

    def _close(self) -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": self.response["output"].index(item)}
        out: list[Event] = []
        if item["type"] == "function_call":
            done = {"arguments": item["arguments"], "name": item["name"]}
            out.append(self._event("response.function_call_arguments.done", **where, **done))
        else:
            part = item["content"][0]
            kind = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            extra: dict[str, Any] = {"logprobs": []} if item["type"] == "message" else {}
            out.append(self._event(kind, **where, content_index=0, text=part["text"], **extra))
            out.append(self._event("response.content_part.done", **where, content_index=0, part=copy.deepcopy(part)))
        item["status"] = "incomplete" if self._cut(item) else "completed"
        out.append(
            self._event("response.output_item.done", output_index=where["output_index"], item=copy.deepcopy(item))
        )
        return out

    def _cut(self, item: dict[str, Any]) -> bool:
        """Whether the token budget ran out inside ``item``: its status is then ``incomplete``, as OpenAI marks it.

        Known only once the reply is parsed whole, which is when the last item closes (an item closed earlier was
        followed by more of the reply). Text and reasoning the budget ended are cut; a function call only when it was
        still open (its arguments are not whole JSON), not when the budget ran out right after it."""
        reply = self.session.reply
        if reply is None or reply.end != EndReason.LENGTH:
            return False
        if item["type"] != "function_call":
            return True
        index = next(i for i, call in self._calls.items() if call is item)
        return index < len(reply.tool_calls) and reply.tool_calls[index].status == CallStatus.UNTERMINATED

    def _finish(self) -> Event:
        session, reply = self.session, self.session.reply
        assert reply is not None
        cached = min(session.generation.cached_tokens, session.prompt_tokens)
        self.response["usage"] = {
            "input_tokens": session.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": session.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": self._reasoning_tokens},
            "total_tokens": session.prompt_tokens + session.completion_tokens,
        }
        if reply.finish_reason == "length":
            self.response["status"] = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
        else:
            self.response["status"] = "completed"
        if self.on_done is not None:
            self.on_done(self.response)
        kind = "response.completed" if self.response["status"] == "completed" else "response.incomplete"
        return self._event(kind, response=copy.deepcopy(self.response))

    def conversation(self) -> list[dict[str, Any]]:
        """The conversation this response continues, with its own reply: what ``previous_response_id`` picks up."""
        reply = self.session.reply
        assert reply is not None
        return [*self.req.conversation, reply.message()]
