"""OpenAI's Chat Completions API (``POST /v1/chat/completions``): the request body read into a
:class:`~.protocol.ChatRequest`, a session's steps written as ``chat.completion.chunk`` objects, and the whole
``chat.completion`` folded from those chunks (:mod:`.chunks`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

from turnkit.parse.reply import Delta
from turnkit.serve.chunks import Chunk, head, step_ids, usage_chunk, whole
from turnkit.serve.protocol import (
    CHAT_INPUT_FIELDS,
    SAMPLING_FIELDS,
    SAMPLING_REFUSALS,
    APIError,
    ChatInput,
    ChatRequest,
    DroppedTool,
    Fields,
    read_chat_input,
    read_field,
    read_response_format,
    read_sampling,
)
from turnkit.serve.session import Session, TokenLogprob

__all__ = ["FIELDS", "chat_chunks", "fold_chat", "parse_chat"]

_SYSTEM_MESSAGE = "a message with role 'system' in messages"

#: Every top-level field of a chat completions body (:class:`~.protocol.Fields`). Refused: what this server does not
#: do (audio, predicted outputs, the legacy functions, ...), where the value asks for something.
FIELDS = Fields(
    "Chat Completions",
    read=SAMPLING_FIELDS
    | CHAT_INPUT_FIELDS
    | {
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "response_format",
        "web_search_options",
        "prompt_token_ids",
    },
    without_effect=frozenset(
        {
            "store",
            "metadata",
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "service_tier",
            "parallel_tool_calls",
        }
    ),
    refused={
        "best_of": ("best_of is not supported; use n", (1,)),
        "suffix": ("suffix (fill in the middle) is not supported", ("",)),
        "audio": ("audio output is not supported", ()),
        "modalities": ("only the text modality is supported", (["text"],)),
        "prediction": ("predicted outputs are not supported", ()),
        "functions": ("the legacy functions field is not supported; use tools", ()),
        "function_call": ("the legacy function_call field is not supported; use tool_choice", ()),
        "verbosity": ("verbosity other than 'medium' is not supported", ("medium",)),
        "echo": ("echo is not supported in chat completions", (False,)),
        **SAMPLING_REFUSALS,
    },
    foreign={
        "stop_sequences": "stop",
        "max_output_tokens": "max_tokens",
        "input": "messages",
        "prompt": "messages",
        "system": _SYSTEM_MESSAGE,
        "instructions": _SYSTEM_MESSAGE,
        "reasoning": "reasoning_effort",
        "thinking": "reasoning_effort",
        "output_config": "response_format",
        "text": "response_format",
    },
)


#: Why ``web_search_options`` cannot be honoured: chat completions' one built-in tool, as Responses' hosted ones.
_WEB_SEARCH = "a hosted tool: OpenAI runs it on its own servers, and this server has nothing to run it"


def _web_search(body: dict[str, Any], refuse: bool) -> tuple[DroppedTool, ...]:
    """``web_search_options`` (the search models' web search) treated as the Responses and Messages APIs treat a
    hosted tool: the request is served without it and the response names it (``turnkit-dropped-tools``,
    ``turnkit_dropped_tools``), or with ``refuse`` (``turnkit serve --refuse-builtin-tools``) it is a 400. It was a
    400 here whatever the server was told, while Responses served Codex's ``web_search`` without it: one rule now."""
    if read_field(body, "web_search_options", dict) is None:
        return ()
    if refuse:
        raise APIError(
            400,
            f"web_search_options is not supported: {_WEB_SEARCH} (this server refuses such requests; without turnkit "
            "serve --refuse-builtin-tools it leaves web search out and says so)",
            param="web_search_options",
            code="unsupported_parameter",
        )
    return (DroppedTool("web_search", "web_search_options", _WEB_SEARCH),)


def parse_chat(body: dict[str, Any], *, refuse_builtin: bool = False) -> ChatRequest:
    """A chat completions body, checked field by field (400s name the field). ``web_search_options`` is left out
    and named in ``dropped_tools`` (with ``refuse_builtin``, a 400)."""
    FIELDS.check(body)
    dropped = _web_search(body, refuse_builtin)
    sampling = read_sampling(body, "chat")
    chat_input = read_chat_input(body)
    logprobs = read_field(body, "logprobs", bool, False)
    top_logprobs = read_field(body, "top_logprobs", int, 0)
    if not 0 <= top_logprobs <= 20:
        raise APIError(400, "top_logprobs must be between 0 and 20", param="top_logprobs")
    if top_logprobs and not logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    chat_input.prompt_ids = _prompt_token_ids(body, chat_input)
    response_format = read_response_format(body)
    if response_format is not None and chat_input.offers_tools:
        raise APIError(
            400,
            "response_format and tools cannot be combined: a reply is either JSON of the schema or tool calls",
            param="response_format",
        )
    return ChatRequest(
        **sampling,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        chat_input=chat_input,
        response_format=response_format,
        dropped_tools=dropped,
    )


def _prompt_token_ids(body: dict[str, Any], chat_input: ChatInput) -> list[int] | None:
    """``prompt_token_ids`` (the name vLLM PR #55771 gives it): the prompt as ids, instead of the render of
    ``messages``, so that an agent-RL loop sends turn N the very ids of turn N-1 (its prompt, the ids the engine
    sampled, the delta of a tool or user turn) and never a re-encoding of their text. Each id is checked to be one
    here, and against the model's vocabulary where the request is started (only the model knows it);
    ``continue_final_message`` is refused with them: it changes only a render, which the ids replace."""
    ids = read_field(body, "prompt_token_ids", list)
    if ids is None:
        return None
    if not ids:
        raise APIError(400, "prompt_token_ids must be a non-empty list of token ids", param="prompt_token_ids")
    for index, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            place = f"prompt_token_ids[{index}]"
            raise APIError(400, f"{place} must be a token id (an integer from 0), got {token!r}", param=place)
    if chat_input.continue_final:
        raise APIError(
            400,
            "continue_final_message cannot be combined with prompt_token_ids: it changes how messages are rendered, "
            "and the ids are the prompt (end them where the continued message ends)",
            param="continue_final_message",
        )
    return ids


async def chat_chunks(session: Session, model: str) -> AsyncGenerator[Chunk, None]:
    """The ``chat.completion.chunk`` objects of one reply: the role, the deltas of each step (a token's
    log-probability rides on the first chunk of its step, or on an empty delta when the step shows no text yet), the
    finish reason, and the usage.

    ``content`` appears in the chunks exactly when the message has content as a string: OpenAI's message has
    ``content: null`` for a reply that is only tool calls, and ``""`` for an empty reply. So the role chunk carries no
    content, and a reply that ended with neither text nor a call says ``content: ""`` in its finish chunk. Likewise
    the role chunk carries ``logprobs: {"content": []}`` when they were asked for (a reply may have no entries). A
    client that accumulates the chunks then holds the very message of the whole response.

    With ``return_token_ids`` every choice carries ``token_ids``: a sampled id rides on the first chunk of its step
    (an empty delta where the step shows no text yet: the stop id, a marker the parser holds back), every other chunk
    has ``[]``; so the concatenation is the reply's ids, as the whole response's ``token_ids`` is.
    """
    shared = head(session, model, chat=True)

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, ids: Any = ()) -> Chunk:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        if session.token_ids:
            choice["token_ids"] = list(ids)
        return {**shared, "choices": [choice]}

    yield chunk({"role": "assistant"}, logprobs={"content": []} if session.logprobs else None)
    has_content = False
    async with aclosing(session.steps()) as steps:
        async for step in steps:
            logprobs = {"content": [_chat_logprob(step.logprob)]} if step.logprob else None
            ids = step_ids(session, step)
            for n, delta in enumerate(_merge(step.deltas) or ([{}] if logprobs or ids else [])):
                has_content = has_content or "content" in delta
                yield chunk(delta, logprobs=logprobs if n == 0 else None, ids=ids if n == 0 else ())
    assert session.reply is not None
    last = {} if has_content or session.reply.tool_calls else {"content": ""}
    yield chunk(last, finish=session.reply.finish_reason)
    yield usage_chunk(shared, session)


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
            if "token_ids" in choice:
                state.setdefault("token_ids", []).extend(choice["token_ids"])
            state["finish"] = choice["finish_reason"] or state["finish"]
    choices = []
    for index, state in sorted(states.items()):
        message, calls = state["message"], state["calls"]
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": c["type"], "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(calls.items())
            ]
        choice = {"index": index, "message": message, "finish_reason": state["finish"], "logprobs": state["logprobs"]}
        if "token_ids" in state:
            choice["token_ids"] = state["token_ids"]
        choices.append(choice)
    return whole(chunks, choices, "chat.completion")


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
