"""The OpenAI-compatible HTTP API: chat completions, completions, models, health, tokenize and detokenize.

Everything goes through turnkit: prompts come from ``ChatFormat.encode`` (safe by default: a user who types
``<|im_end|>`` cannot open a turn), replies from the stream parser (tool calls, reasoning, stop strings with
hold-back), and the stop set from the checkpoint's declared ids.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from turnkit.errors import MessageError, TurnkitError
from turnkit.format import ChatFormat
from turnkit.parse.parser import StreamParser
from turnkit.parse.reply import Delta, Reply
from turnkit.serve import ui
from turnkit.serve.backend import Backend, BackendBusyError, GenerationRequest, TokenEvent
from turnkit.serve.protocol import APIError, ChatRequest, CompletionRequest, parse_chat, parse_completion, read_json

__all__ = ["Server"]

log = logging.getLogger("turnkit.serve")


@dataclass
class _Run:
    """One request being answered: its parser, counters and the log-probabilities collected."""

    request_id: str
    parser: StreamParser
    prompt_tokens: int
    max_tokens: int
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    completion_tokens: int = 0
    logprobs: list[dict[str, Any]] = field(default_factory=list)


class Server:
    """Serves one chat format and one backend.

    Args:
        fmt: The chat format (with its tokenizer) that renders prompts and parses replies.
        backend: The model.
        model_id: The name clients use (``GET /v1/models``); ``default`` is accepted too.
        api_key: When set, every request but ``/health`` needs ``Authorization: Bearer <key>``.
        allow_template_override: Let requests bring their own ``chat_template`` or ``family``.
        default_max_tokens: The reply budget when a request sets none.
        ui: Serve the playground page at ``/`` (:mod:`turnkit.serve.ui`).
    """

    def __init__(
        self,
        fmt: ChatFormat,
        backend: Backend,
        *,
        model_id: str,
        api_key: str | None = None,
        allow_template_override: bool = False,
        default_max_tokens: int = 512,
        ui: bool = True,
    ) -> None:
        self.fmt = fmt
        self.backend = backend
        self.model_id = model_id
        self.api_key = api_key
        self.allow_template_override = allow_template_override
        self.default_max_tokens = default_max_tokens
        self.ui = ui
        self.stop_ids = frozenset(fmt.stop_ids)
        self.created = int(time.time())

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            *(ui.routes(self.fmt) if self.ui else []),
        ]
        handlers = {APIError: _api_error, HTTPException: _http_error, Exception: _unexpected}
        middleware = [Middleware(_Authenticate, key=self.api_key)] if self.api_key else []
        return Starlette(routes=routes, exception_handlers=handlers, middleware=middleware)  # type: ignore[arg-type]

    # -- simple endpoints ---------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        body: dict[str, Any] = {"status": "ok", "model": self.model_id}
        load = getattr(self.backend, "load_now", None)
        if load is not None:
            body["generating"], body["waiting"] = load
        return JSONResponse(body)

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "turnkit",
            "max_model_len": self.backend.context_length,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def tokenize(self, request: Request) -> Response:
        body = read_json(await request.body())
        self._check_model(body.get("model"), required=False)
        if "messages" in body:
            try:
                encoding = self.fmt.encode(
                    body["messages"],
                    tools=body.get("tools"),
                    add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                    turns="none",
                    **(body.get("chat_template_kwargs") or {}),
                )
            except TurnkitError as exc:
                raise _as_api_error(exc) from None
            tokens = encoding.input_ids.tolist()
        elif isinstance(body.get("prompt"), str):
            tokens = self.fmt.tokenizer.encode(body["prompt"]).ids
        else:
            raise APIError(400, "give 'prompt' (a string) or 'messages'", param="prompt")
        return JSONResponse({"count": len(tokens), "max_model_len": self.backend.context_length, "tokens": tokens})

    async def detokenize(self, request: Request) -> Response:
        body = read_json(await request.body())
        self._check_model(body.get("model"), required=False)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise APIError(400, "tokens must be a list of token ids", param="tokens")
        size = self.fmt.tokenizer.backend.get_vocab_size(with_added_tokens=True)
        if any(not 0 <= t < size for t in tokens):
            raise APIError(400, f"token ids must be between 0 and {size - 1}", param="tokens")
        return JSONResponse({"prompt": self.fmt.tokenizer.decode(tokens)})

    # -- chat completions -----------------------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        req = parse_chat(read_json(await request.body()))
        self._check_model(req.model)
        fmt = self._format_for(req)
        parse_tools = req.tools is not None and req.tool_choice != "none"
        try:
            encoding = fmt.encode(
                req.messages,
                tools=req.tools if parse_tools else None,
                add_generation_prompt=True,
                turns="none",
                **req.template_kwargs,
            )
        except TurnkitError as exc:
            raise _as_api_error(exc) from None
        prompt = encoding.input_ids.tolist()
        reply_format = fmt.reply_format.name
        if not parse_tools:  # no tools offered: tool-call syntax is not parsed, reasoning still is
            reply_format = "reasoning" if fmt.reply_format.reasoning else "plain"
        parser = fmt.stream_parser(
            prompt=prompt, stop=req.stop, tools=req.tools if parse_tools else None, reply_format=reply_format
        )
        prefix = self._forced_call(fmt, req) if parse_tools else []
        run = self._start(prompt, prefix, req, parser)
        if req.stream:
            return StreamingResponse(self._chat_stream(run, req, prefix), media_type="text/event-stream")
        return JSONResponse(await self._chat_whole(run, req, prefix))

    def _format_for(self, req: ChatRequest) -> ChatFormat:
        if req.chat_template is None and req.family is None:
            return self.fmt
        if not self.allow_template_override:
            raise APIError(
                400,
                "per-request chat_template and family are disabled on this server (start it with "
                "--allow-template-override)",
                param="chat_template" if req.chat_template else "family",
            )
        try:
            if req.chat_template is not None:
                return ChatFormat.from_template(
                    req.chat_template, tokenizer=self.fmt.tokenizer, **self.fmt.special_tokens
                )
            return ChatFormat.from_family(req.family or "", tokenizer=self.fmt.tokenizer)
        except TurnkitError as exc:
            raise APIError(400, str(exc), param="chat_template" if req.chat_template else "family") from None

    def _forced_call(self, fmt: ChatFormat, req: ChatRequest) -> list[int]:
        """For tool_choice 'required' or a named function: the start of the call, written for the model."""
        if req.tool_choice == "auto":
            return []
        spec = fmt.reply_format
        if spec.tool_syntax != "tagged_json" or spec.tool_start not in fmt.tokenizer.added:
            raise APIError(
                400,
                f"tool_choice {req.tool_choice!r} is not supported for the {spec.name!r} reply format of this model",
                param="tool_choice",
            )
        if isinstance(req.tool_choice, dict):
            text = '\n{"name": ' + json.dumps(req.tool_choice["function"]["name"]) + ', "arguments": '
        else:
            text = '\n{"name": "'
        return [fmt.tokenizer.added[spec.tool_start].id, *fmt.tokenizer.encode_as_text(text).ids]

    def _start(self, prompt: list[int], prefix: list[int], req: Any, parser: StreamParser) -> tuple[_Run, Any]:
        context = self.backend.context_length
        full = prompt + prefix
        if len(full) >= context:
            raise APIError(
                400,
                f"the prompt is {len(full)} tokens; the model's context is {context} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        room = context - len(full)
        if req.max_tokens is not None and req.max_tokens > room:
            raise APIError(
                400,
                f"too many tokens requested: the prompt is {len(full)} tokens and max_tokens is "
                f"{req.max_tokens}, over the model's context of {context}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        max_tokens = req.max_tokens if req.max_tokens is not None else min(self.default_max_tokens, room)
        generation_request = GenerationRequest(
            prompt_ids=full,
            max_tokens=max_tokens,
            stop_ids=self.stop_ids,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            top_logprobs=req.top_logprobs if req.logprobs else None,
        )
        try:
            generation = self.backend.submit(generation_request, asyncio.get_running_loop())
        except BackendBusyError as exc:
            raise APIError(429, str(exc), code="server_busy") from None
        run = _Run(f"{uuid.uuid4().hex[:24]}", parser, len(prompt), max_tokens)
        return run, generation

    async def _events(self, started: tuple[_Run, Any]) -> AsyncIterator[tuple[TokenEvent, list[Delta]]]:
        """The backend's tokens through the parser; the generation is cancelled when the reply ends or on exit."""
        run, generation = started
        try:
            async for event in generation:
                if run.first_token is None:
                    run.first_token = time.perf_counter()
                run.completion_tokens += 1
                deltas = run.parser.feed((event.token_id,))
                yield event, deltas
                if run.parser.ended:
                    break
        finally:
            generation.cancel()

    def _logprob_entry(self, event: TokenEvent) -> dict[str, Any]:
        def text(token_id: int) -> tuple[str, list[int]]:
            raw = self.fmt.tokenizer.byte_table.bytes_of(token_id) if self.fmt.tokenizer.byte_table else b""
            return raw.decode("utf-8", errors="replace"), list(raw)

        token, raw = text(event.token_id)
        top = []
        for token_id, logprob in event.top:
            alt, alt_raw = text(token_id)
            top.append({"token": alt, "logprob": logprob, "bytes": alt_raw})
        return {"token": token, "logprob": event.logprob, "bytes": raw, "top_logprobs": top}

    def _finish(self, run: _Run, endpoint: str) -> tuple[Reply, list[Delta]]:
        reply = run.parser.finish(length=not run.parser.ended and run.completion_tokens >= run.max_tokens)
        elapsed = time.perf_counter() - run.started
        ttft = (run.first_token - run.started) * 1000 if run.first_token else float("nan")
        log.info(
            "%s %s prompt=%d completion=%d ttft=%.0fms total=%.0fms finish=%s",
            run.request_id,
            endpoint,
            run.prompt_tokens,
            run.completion_tokens,
            ttft,
            elapsed * 1000,
            reply.finish_reason,
        )
        return reply, run.parser.final_deltas

    def _usage(self, run: _Run) -> dict[str, int]:
        return {
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "total_tokens": run.prompt_tokens + run.completion_tokens,
        }

    async def _chat_whole(self, started: tuple[_Run, Any], req: ChatRequest, prefix: list[int]) -> dict[str, Any]:
        run = started[0]
        run.parser.feed(prefix)
        async for event, _ in self._events(started):
            if req.logprobs and event.token_id not in self.stop_ids:
                run.logprobs.append(self._logprob_entry(event))
        reply, _ = self._finish(run, "chat")
        choice: dict[str, Any] = {
            "index": 0,
            "message": reply.message(),
            "finish_reason": reply.finish_reason,
            "logprobs": {"content": run.logprobs} if req.logprobs else None,
        }
        return {
            "id": f"chatcmpl-{run.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": [choice],
            "usage": self._usage(run),
        }

    async def _chat_stream(self, started: tuple[_Run, Any], req: ChatRequest, prefix: list[int]) -> AsyncIterator[str]:
        run = started[0]
        head = {
            "id": f"chatcmpl-{run.request_id}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model_id,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
            return f"data: {json.dumps({**head, 'choices': [choice]}, ensure_ascii=False)}\n\n"

        yield chunk({"role": "assistant", "content": ""})
        for delta in _merge(run.parser.feed(prefix)):
            yield chunk(delta)
        async for event, deltas in self._events(started):
            logprobs = None
            if req.logprobs and event.token_id not in self.stop_ids:
                logprobs = {"content": [self._logprob_entry(event)]}
            for n, delta in enumerate(_merge(deltas) or ([{}] if logprobs else [])):
                yield chunk(delta, logprobs=logprobs if n == 0 else None)
        reply, final = self._finish(run, "chat-stream")
        for delta in _merge(final):
            yield chunk(delta)
        yield chunk({}, finish=reply.finish_reason)
        if req.include_usage:
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': self._usage(run)})}\n\n"
        yield "data: [DONE]\n\n"

    # -- completions ----------------------------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        req = parse_completion(read_json(await request.body()))
        self._check_model(req.model)
        if isinstance(req.prompt, str):
            prompt = self.fmt.tokenizer.encode(req.prompt).ids  # a raw prompt is the caller's own formatting
        else:
            size = self.fmt.tokenizer.backend.get_vocab_size(with_added_tokens=True)
            if any(t >= size for t in req.prompt):
                raise APIError(400, f"token ids must be below {size}", param="prompt")
            prompt = list(req.prompt)
        parser = self.fmt.stream_parser(stop=req.stop, reply_format="plain")
        started = self._start(prompt, [], req, parser)
        echo = self.fmt.tokenizer.decode(prompt) if req.echo else ""
        if req.stream:
            return StreamingResponse(self._completion_stream(started, req, echo), media_type="text/event-stream")
        return JSONResponse(await self._completion_whole(started, req, echo))

    def _completion_logprobs(self, events: Sequence[TokenEvent], offset: int) -> dict[str, Any]:
        tokens, values, tops, offsets = [], [], [], []
        for event in events:
            entry = self._logprob_entry(event)
            offsets.append(offset)
            offset += len(entry["token"])
            tokens.append(entry["token"])
            values.append(entry["logprob"])
            tops.append({alt["token"]: alt["logprob"] for alt in entry["top_logprobs"]})
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    async def _completion_whole(self, started: tuple[_Run, Any], req: CompletionRequest, echo: str) -> dict[str, Any]:
        run = started[0]
        events = [event async for event, _ in self._events(started) if event.token_id not in self.stop_ids]
        reply, _ = self._finish(run, "completion")
        choice = {
            "index": 0,
            "text": echo + reply.content,
            "finish_reason": reply.finish_reason,
            "logprobs": self._completion_logprobs(events, len(echo)) if req.logprobs else None,
        }
        return {
            "id": f"cmpl-{run.request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": [choice],
            "usage": self._usage(run),
        }

    async def _completion_stream(
        self, started: tuple[_Run, Any], req: CompletionRequest, echo: str
    ) -> AsyncIterator[str]:
        run = started[0]
        head = {
            "id": f"cmpl-{run.request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
        }

        def chunk(text: str, finish: str | None = None, logprobs: Any = None) -> str:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}
            return f"data: {json.dumps({**head, 'choices': [choice]}, ensure_ascii=False)}\n\n"

        if echo:
            yield chunk(echo)
        offset = len(echo)
        async for event, deltas in self._events(started):
            text = "".join(d.content or "" for d in deltas)
            logprobs = None
            if req.logprobs and event.token_id not in self.stop_ids:
                logprobs = self._completion_logprobs([event], offset)
            if text or logprobs:
                yield chunk(text, logprobs=logprobs)
            offset += len(text)
        reply, final = self._finish(run, "completion-stream")
        tail = "".join(d.content or "" for d in final)
        yield chunk(tail, finish=reply.finish_reason)
        if req.include_usage:
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': self._usage(run)})}\n\n"
        yield "data: [DONE]\n\n"

    # -- helpers --------------------------------------------------------------------------------------------------

    def _check_model(self, model: Any, *, required: bool = True) -> None:
        if model is None and not required:
            return
        if model not in (self.model_id, "default"):
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves {self.model_id!r}",
                param="model",
                code="model_not_found",
            )


class _Authenticate:
    """Every request but ``/health`` needs ``Authorization: Bearer <key>`` (a plain ASGI middleware: it leaves
    streaming responses and client disconnects alone)."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and scope["path"] not in ui.PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(401, "a valid API key is required (Authorization: Bearer <key>)", code="bad_api_key")
                await JSONResponse(error.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


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


def _as_api_error(exc: TurnkitError) -> APIError:
    if isinstance(exc, MessageError):
        where = "messages" if exc.index is None else f"messages[{exc.index}]"
        return APIError(400, str(exc), param=f"{where}.{exc.field}" if exc.field else where)
    return APIError(400, str(exc))


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = APIError(exc.status_code, str(exc.detail))
    return JSONResponse(error.body(), status_code=exc.status_code)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error answering %s", request.url.path)
    error = APIError(500, "the server failed to answer this request; see its log")
    return JSONResponse(error.body(), status_code=500)
