"""OpenAI's (legacy) Completions API (``POST /v1/completions``): a raw prompt, text or token ids, continued as
written; the body read into a :class:`~.protocol.CompletionRequest`, a session's steps written as ``text_completion``
chunks, and the whole response folded from them (:mod:`.chunks`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

from turnkit.serve.chunks import Chunk, head, step_ids, usage_chunk, whole
from turnkit.serve.protocol import (
    SAMPLING_FIELDS,
    SAMPLING_REFUSALS,
    APIError,
    CompletionRequest,
    Fields,
    is_token_ids,
    read_field,
    read_sampling,
)
from turnkit.serve.session import Session, TokenLogprob

__all__ = ["FIELDS", "completion_chunks", "fold_completion", "parse_completion"]

#: Every top-level field of a completions body (:class:`~.protocol.Fields`).
FIELDS = Fields(
    "Completions",
    read=SAMPLING_FIELDS | {"prompt", "logprobs", "echo"},
    without_effect=frozenset({"user"}),
    refused={
        "best_of": ("best_of is not supported; use n", (1,)),
        "suffix": ("suffix (fill in the middle) is not supported", ("",)),
        **SAMPLING_REFUSALS,
    },
    foreign={
        "max_completion_tokens": "max_tokens",
        "max_output_tokens": "max_tokens",
        "stop_sequences": "stop",
        "messages": "prompt (a raw text continued as written; chat completions take messages)",
        "prompt_token_ids": "prompt (a string, or a list of token ids)",
    },
)


def _prompt(body: dict[str, Any]) -> str | list[int]:
    """The one prompt: a string or token ids (a list holding one of them is that one; several are refused)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if not prompt or not is_token_ids(prompt):
            raise APIError(400, "prompt must be a string, or a non-empty list of token ids", param="prompt")
    elif not isinstance(prompt, str):
        raise APIError(400, "prompt must be a string, or a list of token ids (one prompt per request)", param="prompt")
    return prompt


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    """A completions body: one prompt (a string or token ids), checked field by field."""
    FIELDS.check(body)
    sampling = read_sampling(body, "completions")
    prompt = _prompt(body)
    logprobs = read_field(body, "logprobs", int)
    if logprobs is not None and not 0 <= logprobs <= 20:
        raise APIError(400, "logprobs must be between 0 and 20", param="logprobs")
    return CompletionRequest(
        **sampling,
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        prompt=prompt,
        echo=read_field(body, "echo", bool, False),
    )


async def completion_chunks(session: Session, model: str, *, echo: str = "") -> AsyncGenerator[Chunk, None]:
    """The ``text_completion`` chunks of one reply: the echoed prompt, the text and log-probabilities of each step,
    the finish reason, and the usage. With ``echo`` and log-probabilities, the echo chunk carries the prompt's tokens
    (the first without a log-probability), as OpenAI does; it is sent with the first step, when the backend has
    scored the prompt. ``text_offset`` counts the characters of the tokens before each token (of the echo first).
    When log-probabilities were asked for, the finish chunk carries empty lists, so that even a reply without
    entries folds to lists rather than ``null``. With ``return_token_ids`` each choice carries the ``token_ids`` of
    its chunk (a sampled id on its step's chunk, ``[]`` elsewhere), as chat completions' chunks do, and its first
    chunk the prompt's ids (``prompt_token_ids``: in the choice, where vLLM's completions put them, since a
    completions request may hold several prompts)."""
    shared = head(session, model, chat=False)
    prompt_pending = session.token_ids

    def chunk(text: str, finish: str | None = None, logprobs: Any = None, ids: Any = ()) -> Chunk:
        nonlocal prompt_pending
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}
        if session.token_ids:
            choice["token_ids"] = list(ids)
        if prompt_pending:
            choice["prompt_token_ids"] = list(session.prompt_ids)
            prompt_pending = False
        return {**shared, "choices": [choice]}

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
            ids = step_ids(session, step)
            if text or logprobs or ids:
                yield chunk(text, logprobs=logprobs, ids=ids)
    assert session.reply is not None
    yield chunk(
        "", finish=session.reply.finish_reason, logprobs=_completion_logprobs([], offset) if session.logprobs else None
    )
    yield usage_chunk(shared, session)


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
            if "token_ids" in choice:
                state.setdefault("token_ids", []).extend(choice["token_ids"])
            if "prompt_token_ids" in choice:
                state["prompt_token_ids"] = choice["prompt_token_ids"]
            state["finish"] = choice["finish_reason"] or state["finish"]
    choices = []
    for index, state in sorted(states.items()):
        folded = {
            "index": index,
            "text": "".join(state["text"]),
            "finish_reason": state["finish"],
            "logprobs": state["logprobs"],
        }
        if "token_ids" in state:
            folded["token_ids"] = state["token_ids"]
        if "prompt_token_ids" in state:
            folded["prompt_token_ids"] = state["prompt_token_ids"]
        choices.append(folded)
    return whole(chunks, choices, "text_completion")


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
