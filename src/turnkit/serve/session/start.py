"""Starting a request's generations: the checks against the model's context and its engine, the engine's request
(the request's sampling values over the model's defaults), submission of ``n`` choices, and admission.

A route awaits :func:`start_chat` or :func:`start_completion`, which return once the engine admitted every choice; a
refusal (every place taken: 429; its queue deadline passed, or the server shutting down: 503; both with
``Retry-After``) is raised before any byte of a reply, so a route never starts a response it cannot give.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from turnkit.errors import BackendBusyError
from turnkit.format import ChatFormat
from turnkit.parse.reading.parser import StreamParser
from turnkit.serve.engines.base import Backend, GenerationRequest, TokenConstraint
from turnkit.serve.models import LoadedModel
from turnkit.serve.protocol import APIError, ChatRequest, CompletionRequest, Sampling
from turnkit.serve.request_fields import ENGINE_FIELDS
from turnkit.serve.sampling import SamplingDefaults
from turnkit.serve.session.generation import Choices, Session, engine_error
from turnkit.serve.session.prompt import chat_prompt_ids, forced_call_ids

#: What makes one grammar matcher per choice (:func:`turnkit.serve.structured.constraint_for`).
Grammar = Callable[[], TokenConstraint]


async def start_chat(
    fmt: ChatFormat, model: LoadedModel, req: ChatRequest, *, default_max_tokens: int, constraint: Grammar | None = None
) -> list[Session]:
    """Encode the conversation (in a worker thread: a long one takes a while, and the event loop has other clients),
    set up a parser per choice for its tools and reasoning, and start generating (``req.n`` generations, batched by
    the backend); returns once the engine admitted them (see :func:`_start`). ``fmt`` is the model's format or the
    request's own template over it; ``constraint`` makes one grammar matcher per choice."""
    chat_input = req.chat_input
    prompt = await asyncio.to_thread(chat_prompt_ids, fmt, chat_input)
    tools = chat_input.tools if chat_input.offers_tools else None
    reply_format = fmt.reply_format
    if tools is None:  # no tools offered: tool-call syntax is not parsed, reasoning still is
        reply_format = reply_format.without_tools()
    prefix = forced_call_ids(fmt, chat_input)
    endpoint = "chat-stream" if req.stream else "chat"

    def parser() -> StreamParser:
        return fmt.stream_parser(
            prompt=prompt, stop=req.stop, stop_token_ids=req.stop_token_ids, tools=tools, reply_format=reply_format
        )

    where = "messages" if chat_input.prompt_ids is None else "prompt_token_ids"
    return await _start(fmt, model, req, prompt, prefix, parser, endpoint, default_max_tokens, constraint, where)


async def start_completion(
    model: LoadedModel, req: CompletionRequest, prompt: Sequence[int], *, default_max_tokens: int
) -> list[Session]:
    """Start generating after a raw prompt: the caller's own formatting, so the reply is parsed as plain text."""
    endpoint = "completion-stream" if req.stream else "completion"
    fmt = model.fmt

    def parser() -> StreamParser:
        return fmt.stream_parser(stop=req.stop, stop_token_ids=req.stop_token_ids, reply_format="plain")

    return await _start(fmt, model, req, list(prompt), [], parser, endpoint, default_max_tokens, None)


def generation_request(
    req: Sampling, defaults: SamplingDefaults, *, prompt_ids: list[int], max_tokens: int, stop_ids: frozenset[int]
) -> GenerationRequest:
    """The backend's request: the samplers the request sets, the model's defaults for those it left out."""
    request = GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        stop_ids=stop_ids,
        seed=req.seed,
        top_logprobs=req.top_logprobs if req.logprobs else None,
        logit_bias=dict(req.logit_bias),
        prompt_logprobs=req.prompt_logprobs,
    )
    samplers: dict[str, Any] = defaults.updated(req.samplers).to_dict()  # each sampler's declared type
    return replace(request, **samplers)


def _check_supported(backend: Backend, req: Sampling) -> None:
    """A field the engine cannot honour is a 400 naming the request's field, never silently ignored: which engines
    honour each is declared once, in :data:`~turnkit.serve.request_fields.ENGINE_FIELDS`."""
    kind = backend.kind
    for engine_field in sorted(ENGINE_FIELDS, key=lambda each: each.name):
        if kind in engine_field.engines or not req.asks_for(engine_field.name):
            continue
        param = engine_field.param or engine_field.name
        raise APIError(
            400,
            f"{engine_field.what or param} is not supported by this model's engine ({type(backend).__name__})",
            param=param,
            code="unsupported_parameter",
        )


async def _start(
    fmt: ChatFormat,
    model: LoadedModel,
    req: Sampling,
    prompt: list[int],
    prefix: list[int],
    parser: Callable[[], StreamParser],
    endpoint: str,
    default_max_tokens: int,
    constraint: Grammar | None,
    where: str = "messages",
) -> list[Session]:
    """Check the prompt and budget against the context, submit ``req.n`` generations, and wait until the engine
    admitted every one of them: a request it refuses (every place taken: 429; its queue deadline passed, or the server
    is shutting down: 503; both with ``Retry-After``) is answered with that status before any byte of a reply, so a
    route that awaits this never starts a response it cannot give. Every route that starts sessions gets admission
    this way. ``where``: the field a prompt too long for the context is named by (``messages``, or the
    ``prompt_token_ids`` that replaced their render)."""
    backend = model.backend
    _check_supported(backend, req)
    context = backend.context_length
    full = prompt + prefix
    if len(full) >= context:
        raise APIError(
            400,
            f"the prompt is {len(full)} tokens; the model's context is {context} tokens",
            param=where,
            code="context_length_exceeded",
            facts={"prompt_tokens": len(full), "context": context},
        )
    room = context - len(full)
    if req.max_tokens is not None and req.max_tokens > room:
        raise APIError(
            400,
            f"too many tokens requested: the prompt is {len(full)} tokens and max_tokens is "
            f"{req.max_tokens}, over the model's context of {context}",
            param="max_tokens",
            code="context_length_exceeded",
            facts={"prompt_tokens": len(full), "max_tokens": req.max_tokens, "context": context},
        )
    max_tokens = req.max_tokens if req.max_tokens is not None else min(default_max_tokens, room)
    stop_ids = fmt.stops.ids | frozenset(req.stop_token_ids)  # the template's end ids and the request's
    base = generation_request(req, model.defaults, prompt_ids=full, max_tokens=max_tokens, stop_ids=stop_ids)
    sessions: list[Session] = []
    loop = asyncio.get_running_loop()
    try:
        for index in range(req.n):
            seed = None if req.seed is None else (req.seed + index) % 2**64
            request = replace(base, seed=seed, constraint=constraint() if constraint is not None else None)
            generation = backend.submit(request, loop)
            session = Session(
                fmt,
                parser(),
                generation,
                endpoint,
                len(prompt),
                max_tokens,
                prefix,
                req.logprobs,
                token_ids=req.return_token_ids,
                prompt_ids=full,
                stop_token_ids=frozenset(req.stop_token_ids),
            )
            session.model = model.name
            sessions.append(session)
        for session in sessions:
            await session.generation.started()
    except BaseException as exc:
        for session in sessions:
            session.generation.cancel()
        if sessions:  # one line for the request: refused by the engine, or left (or failed) while it waited
            sessions[0].stopped(exc, waiting=True)
        for session in sessions[1:]:
            session.outcome, session.ended = sessions[0].outcome, sessions[0].ended
        if isinstance(exc, BackendBusyError):
            raise engine_error(exc) from None
        raise
    for session in sessions:
        session.admitted = True
    for session in sessions[1:]:  # the choices of one answer share its id
        session.request_id, session.created = sessions[0].request_id, sessions[0].created
    if len(sessions) > 1:
        choices = Choices(sessions)
        for session in sessions:
            session.choices = choices
    return sessions
