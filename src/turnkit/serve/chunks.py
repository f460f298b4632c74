"""The chunk stream that OpenAI's Chat Completions and Completions share: the fields every chunk of an answer carries,
the usage chunk that ends it, ``n`` choices sent one after the other, and the whole response folded from the chunks.

There is one code path per endpoint: :mod:`.chat` and :mod:`.completions` turn a session's steps into the chunk
objects a stream sends, ending with a usage chunk. A streamed reply writes them as server-sent events; a whole reply
is the very same chunks folded (``fold_chat``, ``fold_completion``). So a streamed and a non-streamed answer to the
same generation can never disagree (content, reasoning, tool calls, stop strings, log-probabilities, finish reason,
usage): the fold is what a client that accumulates the stream computes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Any

from turnkit.serve.session import Session, Step

__all__ = ["Chunk", "choices", "collect", "head", "prompt_ids", "step_ids", "usage_chunk", "whole"]

Chunk = dict[str, Any]


def head(session: Session, model: str, *, chat: bool) -> Chunk:
    """The fields every chunk of one answer shares (and the whole response too)."""
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{session.request_id}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": session.created,
        "model": model,
    }


def step_ids(session: Session, step: Step) -> list[int]:
    """The id the engine sampled for ``step``, where the request asked for ids (``return_token_ids``): what a choice's
    ``token_ids`` carries in the chunk of that step. Every sampled id, the stop id included when the engine sampled
    one (every engine here reports it); never the forced start of a tool call, which the engine was given."""
    return [step.token_id] if session.token_ids and step.token_id is not None else []


def prompt_ids(sessions: Sequence[Session]) -> dict[str, Any]:
    """The answer's ``prompt_token_ids`` where the request asked for ids: the ids the engine was given (one prompt
    for all ``n`` choices), on a stream's first chunk and the whole response, as vLLM sends them; else nothing."""
    return {"prompt_token_ids": list(sessions[0].prompt_ids)} if sessions and sessions[0].token_ids else {}


def usage_chunk(shared: Chunk, session: Session) -> Chunk:
    """The last chunk: no choices, the real token counts (sent in a stream only with ``include_usage``).

    ``cached_tokens``: prompt tokens the engine reused from its cache (a shared system prompt, the conversation so
    far) rather than computed."""
    usage = {
        "prompt_tokens": session.prompt_tokens,
        "completion_tokens": session.completion_tokens,
        "total_tokens": session.prompt_tokens + session.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": min(session.generation.cached_tokens, session.prompt_tokens)},
    }
    return {**shared, "choices": [], "usage": usage}


def whole(chunks: Sequence[Chunk], choices: list[Chunk], kind: str) -> Chunk:
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
