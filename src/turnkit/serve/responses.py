"""The OpenAI shapes of an answer: chunks for a stream, and the whole response folded from those same chunks.

There is one code path per endpoint: :func:`chat_chunks` and :func:`completion_chunks` turn a session's steps into
the chunk objects a stream sends (``chat.completion.chunk``, ``text_completion``), ending with a usage chunk. A
streamed reply writes them as server-sent events (:func:`event_stream`); a whole reply is :func:`fold_chat` or
:func:`fold_completion` of the very same chunks. So a streamed and a non-streamed answer to the same generation can
never disagree (content, reasoning, tool calls, stop strings, log-probabilities, finish reason, usage): the fold is
what a client that accumulates the stream computes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

from turnkit.parse.reply import Delta
from turnkit.serve.protocol import APIError
from turnkit.serve.session import Session, TokenLogprob

__all__ = [
    "Chunk",
    "chat_chunks",
    "choices",
    "collect",
    "completion_chunks",
    "event_stream",
    "fold_chat",
    "fold_completion",
]

log = logging.getLogger("turnkit.serve")

Chunk = dict[str, Any]


def _head(session: Session, model: str, *, chat: bool) -> Chunk:
    """The fields every chunk of one answer shares (and the whole response too)."""
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{session.request_id}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": session.created,
        "model": model,
    }


def _usage_chunk(head: Chunk, session: Session) -> Chunk:
    """The last chunk: no choices, the real token counts (sent in a stream only with ``include_usage``).

    ``cached_tokens``: prompt tokens the engine reused from its cache (a shared system prompt, the conversation so
    far) rather than computed."""
    usage = {
        "prompt_tokens": session.prompt_tokens,
        "completion_tokens": session.completion_tokens,
        "total_tokens": session.prompt_tokens + session.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": min(session.generation.cached_tokens, session.prompt_tokens)},
    }
    return {**head, "choices": [], "usage": usage}


# -- chat completions ----------------------------------------------------------------------------------------------


async def chat_chunks(session: Session, model: str) -> AsyncGenerator[Chunk, None]:
    """The ``chat.completion.chunk`` objects of one reply: the role, the deltas of each step (a token's
    log-probability rides on the first chunk of its step, or on an empty delta when the step shows no text yet), the
    finish reason, and the usage.

    ``content`` appears in the chunks exactly when the message has content as a string: OpenAI's message has
    ``content: null`` for a reply that is only tool calls, and ``""`` for an empty reply. So the role chunk carries no
    content, and a reply that ended with neither text nor a call says ``content: ""`` in its finish chunk. Likewise
    the role chunk carries ``logprobs: {"content": []}`` when they were asked for (a reply may have no entries). A
    client that accumulates the chunks then holds the very message of the whole response.
    """
    head = _head(session, model, chat=True)

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> Chunk:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}

    yield chunk({"role": "assistant"}, logprobs={"content": []} if session.logprobs else None)
    has_content = False
    async with aclosing(session.steps()) as steps:
        async for step in steps:
            logprobs = {"content": [_chat_logprob(step.logprob)]} if step.logprob else None
            for n, delta in enumerate(_merge(step.deltas) or ([{}] if logprobs else [])):
                has_content = has_content or "content" in delta
                yield chunk(delta, logprobs=logprobs if n == 0 else None)
    assert session.reply is not None
    last = {} if has_content or session.reply.tool_calls else {"content": ""}
    yield chunk(last, finish=session.reply.finish_reason)
    yield _usage_chunk(head, session)


def fold_chat(chunks: Sequence[Chunk]) -> Chunk:
    """The ``chat.completion`` that the chunks add up to, folded as a client accumulates a stream (per choice
    index when ``n`` asked for several)."""
    states: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            state = states.setdefault(
                choice["index"],
                {"message": {"role": "assistant", "content": None}, "calls": {}, "logprobs": None, "finish": None},
            )
            message, calls = state["message"], state["calls"]
            for key in ("content", "reasoning_content"):
                if key in choice["delta"]:
                    message[key] = (message.get(key) or "") + choice["delta"][key]
            for piece in choice["delta"].get("tool_calls", ()):
                call = calls.setdefault(piece["index"], {"id": None, "type": "function", "name": "", "arguments": ""})
                call["id"] = piece.get("id", call["id"])
                call["name"] += piece["function"].get("name", "")
                call["arguments"] += piece["function"].get("arguments", "")
            if choice["logprobs"] is not None:
                state["logprobs"] = state["logprobs"] or {"content": []}
                state["logprobs"]["content"].extend(choice["logprobs"]["content"])
            state["finish"] = choice["finish_reason"] or state["finish"]
    choices = []
    for index, state in sorted(states.items()):
        message, calls = state["message"], state["calls"]
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": c["type"], "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(calls.items())
            ]
        choices.append(
            {"index": index, "message": message, "finish_reason": state["finish"], "logprobs": state["logprobs"]}
        )
    return _whole(chunks, choices, "chat.completion")


def _chat_logprob(entry: TokenLogprob) -> dict[str, Any]:
    top = [{"token": text, "logprob": logprob, "bytes": raw} for text, raw, logprob in entry.top]
    return {"token": entry.token, "logprob": entry.logprob, "bytes": entry.bytes, "top_logprobs": top}


def _merge(deltas: Sequence[Delta]) -> list[dict[str, Any]]:
    """Deltas of one step as chunk payloads: text joined, tool-call pieces kept in order."""
    out: list[dict[str, Any]] = []
    for delta in deltas:
        payload = delta.to_dict()
        if out and "tool_calls" not in payload and "tool_calls" not in out[-1] and set(payload) == set(out[-1]):
            for key, value in payload.items():
                out[-1][key] += value
        else:
            out.append(payload)
    return out


# -- completions ---------------------------------------------------------------------------------------------------


async def completion_chunks(session: Session, model: str, *, echo: str = "") -> AsyncGenerator[Chunk, None]:
    """The ``text_completion`` chunks of one reply: the echoed prompt, the text and log-probabilities of each step,
    the finish reason, and the usage. With ``echo`` and log-probabilities, the echo chunk carries the prompt's tokens
    (the first without a log-probability), as OpenAI does; it is sent with the first step, when the backend has
    scored the prompt. ``text_offset`` counts the characters of the tokens before each token (of the echo first).
    When log-probabilities were asked for, the finish chunk carries empty lists, so that even a reply without
    entries folds to lists rather than ``null``."""
    head = _head(session, model, chat=False)

    def chunk(text: str, finish: str | None = None, logprobs: Any = None) -> Chunk:
        return {**head, "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}]}

    pending = echo if session.logprobs else ""
    if echo and not pending:
        yield chunk(echo)
    offset = len(echo)
    async with aclosing(session.steps()) as steps:
        async for step in steps:
            if pending:
                yield chunk(pending, logprobs=_completion_logprobs(session.prompt_logprobs(), 0))
                pending = ""
            text = "".join(d.content or "" for d in step.deltas)
            logprobs = None
            if step.logprob:
                logprobs = _completion_logprobs([step.logprob], offset)
                offset += len(step.logprob.token)
            if text or logprobs:
                yield chunk(text, logprobs=logprobs)
    assert session.reply is not None
    yield chunk(
        "", finish=session.reply.finish_reason, logprobs=_completion_logprobs([], offset) if session.logprobs else None
    )
    yield _usage_chunk(head, session)


def fold_completion(chunks: Sequence[Chunk]) -> Chunk:
    """The ``text_completion`` that the chunks add up to (per choice index)."""
    states: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            state = states.setdefault(choice["index"], {"text": [], "logprobs": None, "finish": None})
            state["text"].append(choice["text"])
            if choice["logprobs"] is not None:
                state["logprobs"] = state["logprobs"] or _completion_logprobs([], 0)
                for key, values in state["logprobs"].items():
                    values.extend(choice["logprobs"][key])
            state["finish"] = choice["finish_reason"] or state["finish"]
    choices = [
        {
            "index": index,
            "text": "".join(state["text"]),
            "finish_reason": state["finish"],
            "logprobs": state["logprobs"],
        }
        for index, state in sorted(states.items())
    ]
    return _whole(chunks, choices, "text_completion")


def _completion_logprobs(entries: Sequence[TokenLogprob], offset: int) -> dict[str, list[Any]]:
    """The completions shape: parallel lists, ``text_offset`` starting at ``offset``."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [
            None if entry.logprob is None else {text: logprob for text, _, logprob in entry.top} for entry in entries
        ],
        "text_offset": offsets,
    }


# -- whole and streamed ----------------------------------------------------------------------------------------------


def _whole(chunks: Sequence[Chunk], choices: list[Chunk], kind: str) -> Chunk:
    """The whole response: the chunks' shared fields, the folded choices, and the usage of the last chunk."""
    last = chunks[-1]
    return {
        "id": last["id"],
        "object": kind,
        "created": last["created"],
        "model": last["model"],
        "choices": choices,
        "usage": last["usage"],
    }


async def choices(
    sessions: Sequence[Session], model: str, chunks: Callable[[Session, str], AsyncGenerator[Chunk, None]]
) -> AsyncGenerator[Chunk, None]:
    """The chunks of ``n`` choices, one after the other, each with its own ``index``, then one usage chunk: the
    prompt counted once, the completions summed (as OpenAI counts). Every generation is cancelled on the way out,
    so a client that leaves early frees the slots of the choices not yet sent too."""
    completion, usage, first_usage = 0, None, None
    try:
        for index, session in enumerate(sessions):
            async with aclosing(chunks(session, model)) as stream:
                async for chunk in stream:
                    if not chunk["choices"]:
                        usage = chunk
                        first_usage = first_usage or chunk["usage"]
                        completion += chunk["usage"]["completion_tokens"]
                        continue
                    if index:
                        chunk = {**chunk, "choices": [{**c, "index": index} for c in chunk["choices"]]}
                    yield chunk
    finally:
        for session in sessions:
            session.generation.cancel()
    assert usage is not None and first_usage is not None
    prompt = usage["usage"]["prompt_tokens"]
    total = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    total["prompt_tokens_details"] = first_usage["prompt_tokens_details"]  # the prompt is read once: the first's
    yield {**usage, "usage": total}


async def collect(chunks: AsyncGenerator[Chunk, None]) -> list[Chunk]:
    """Every chunk of an answer, for folding into a whole response."""
    async with aclosing(chunks):
        return [chunk async for chunk in chunks]


async def event_stream(chunks: AsyncGenerator[Chunk, None], *, include_usage: bool) -> AsyncIterator[str]:
    """The chunks as server-sent events, then ``[DONE]``; the usage chunk only when the client asked for it.

    The status line has gone out before the first chunk, so a failure while generating cannot become an HTTP error:
    it is sent as an OpenAI error object in the stream (as vLLM does), and the stream still ends with ``[DONE]``.
    """
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                if chunk["choices"] or include_usage:
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    except Exception as exc:
        error = exc if isinstance(exc, APIError) else APIError(500, "the server failed while generating; see its log")
        if not isinstance(exc, APIError):
            log.exception("unexpected error while streaming")
        yield f"data: {json.dumps(error.body(), ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
