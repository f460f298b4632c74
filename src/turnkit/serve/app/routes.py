"""The HTTP app: one route per endpoint, each a thin translation onto the one path.

A generating route reads its body with its API's module (:mod:`..chat`, :mod:`..completions`) through
:func:`.body.read_request` (a large body is decoded off the event loop), picks the model's format and backend from the
registry, awaits :func:`~turnkit.serve.session.start_chat` (which encodes off the loop and returns once the engine
admitted the request, or raises the 429/503 with ``Retry-After``), and answers with that API's chunks: streamed as
server-sent events (:mod:`.sse`) or folded into one response. A new route (the Responses or Messages API) gets the rest
without writing it: :mod:`.inflight` stops its generation when its client leaves and hands its sessions to
:mod:`.metrics`; the drain refuses and ends its requests through the engines. The API key is :mod:`.auth`'s, the error
objects :mod:`.errors`', the playground page :mod:`.ui`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from turnkit.errors import ShuttingDownError, TurnkitError
from turnkit.format import ChatFormat
from turnkit.serve import structured
from turnkit.serve.app import ui
from turnkit.serve.app.auth import Authenticate
from turnkit.serve.app.body import read_request
from turnkit.serve.app.errors import EXCEPTION_HANDLERS, answering
from turnkit.serve.app.inflight import InFlight
from turnkit.serve.app.metrics import Metrics
from turnkit.serve.app.sse import event_stream, typed_event_stream
from turnkit.serve.chat import chat_chunks, fold_chat, parse_chat
from turnkit.serve.chunks import Chunk, choices, collect, prompt_ids
from turnkit.serve.completions import completion_chunks, fold_completion, parse_completion
from turnkit.serve.engines.base import Backend, Load, serving_on
from turnkit.serve.engines.options import taken_flags
from turnkit.serve.messages import PING, error_body, fold_message, message_events, parse_messages
from turnkit.serve.models import ModelRegistry
from turnkit.serve.protocol import (
    DROPPED_TOOLS_HEADER,
    APIError,
    ChatInput,
    ChatRequest,
    DroppedTool,
    Sampling,
    parse_detokenize,
    parse_tokenize,
)
from turnkit.serve.request_fields import honoured_fields
from turnkit.serve.responses import ResponseEvents, ResponseStore, parse_responses
from turnkit.serve.session import (
    Session,
    chat_prompt_ids,
    check_tools_readable,
    check_tools_shown,
    start_chat,
    start_completion,
)

__all__ = ["Server"]

log = logging.getLogger("turnkit.serve")


class Server:
    """Serves the models of a :class:`~.models.ModelRegistry`, each with its own chat format and backend.

    Args:
        models: The models by name (or, for one model already loaded, its chat format; then give ``backend`` and
            ``model_id`` too).
        backend: With a chat format as ``models``: its backend.
        model_id: With a chat format as ``models``: the name clients use (``default`` is accepted too).
        api_key: When set, every request but ``/health`` (and the playground page itself) needs
            ``Authorization: Bearer <key>``.
        allow_template_override: Let requests bring their own ``chat_template`` or ``family``.
        default_max_tokens: The reply budget when a request sets none.
        ui: Serve the playground page at ``/`` (:mod:`.ui`), which tokenizes with the default model.
        metrics_public: Serve ``/metrics`` without the API key (for a Prometheus that has none).
        refuse_builtin_tools: Answer a 400 to a Responses or Messages request that offers one of the provider's
            built-in tools (``web_search`` ...), instead of serving it without them (the default: the response names
            them in a ``turnkit-dropped-tools`` header and a ``turnkit_dropped_tools`` field, and the log says so).
    """

    def __init__(
        self,
        models: ModelRegistry | ChatFormat,
        backend: Backend | None = None,
        *,
        model_id: str | None = None,
        api_key: str | None = None,
        allow_template_override: bool = False,
        default_max_tokens: int = 512,
        ui: bool = True,
        metrics_public: bool = False,
        refuse_builtin_tools: bool = False,
    ) -> None:
        if isinstance(models, ChatFormat):
            if backend is None or model_id is None:
                raise TypeError("a Server of one chat format needs its backend and model_id")
            models = ModelRegistry.single(models, backend, name=model_id)
        self.models = models
        self.api_key = api_key
        self.allow_template_override = allow_template_override
        self.default_max_tokens = default_max_tokens
        self.ui = ui
        self.metrics_public = metrics_public
        self.refuse_builtin_tools = refuse_builtin_tools
        self._dropped_seen: set[tuple[str, str]] = set()  # (path, tool type) already warned about
        self.created = int(time.time())
        self.metrics: Metrics | None = None
        self.inflight: InFlight | None = None
        self.stored = ResponseStore()

    def app(self) -> InFlight:
        """The ASGI app: the routes, behind :class:`~.inflight.InFlight` (clients that leave, requests in flight)."""
        routes = [
            Route("/health", answering(self.health), methods=["GET"]),
            Route("/metrics", answering(self.metrics_page), methods=["GET"]),
            Route("/v1/models", answering(self.list_models), methods=["GET"]),
            Route("/v1/models/{model_id:path}", answering(self.retrieve_model), methods=["GET"]),
            Route("/v1/chat/completions", answering(self.chat), methods=["POST"]),
            Route("/v1/completions", answering(self.completions), methods=["POST"]),
            Route("/v1/messages", answering(self.messages), methods=["POST"]),
            Route("/v1/messages/count_tokens", answering(self.count_tokens), methods=["POST"]),
            Route("/v1/responses", answering(self.responses), methods=["POST"]),
            Route("/v1/responses/{response_id}", answering(self.stored_response), methods=["GET", "DELETE"]),
            Route("/tokenize", answering(self.tokenize), methods=["POST"]),
            Route("/detokenize", answering(self.detokenize), methods=["POST"]),
        ]
        if self.ui:
            fmt = self.models.format(None)
            routes += [Route(path, answering(handler), methods=[method]) for path, method, handler in ui.pages(fmt)]
        public = {"/metrics"} if self.metrics_public else set()
        middleware = [Middleware(Authenticate, key=self.api_key, public=public)] if self.api_key else []
        app = Starlette(
            routes=routes, exception_handlers=dict(EXCEPTION_HANDLERS), middleware=middleware, lifespan=_lifespan
        )
        self.metrics = Metrics(self.models, [route.path for route in routes])
        self.inflight = InFlight(app, on_done=self.metrics.record)
        return self.inflight

    async def drain(self, seconds: float, *, grace: float) -> None:
        """Shut down with a deadline (:mod:`.lifecycle` calls this on SIGTERM or SIGINT): refuse new requests (503
        with ``Retry-After``), let running ones end for up to ``seconds``, then end the rest with an error naming the
        shutdown. Returns once nothing is in flight (or ``grace`` seconds after the deadline: the time the runner
        gives those errors to go out)."""
        self.models.drain(
            ShuttingDownError(
                "the server is shutting down; retry on another replica, or once it has restarted",
                retry_after=max(1.0, seconds),
            )
        )
        inflight = self.inflight
        if inflight is None:
            return
        try:
            await asyncio.wait_for(inflight.wait_idle(), seconds)
            return
        except TimeoutError:
            pass
        running = sum(load.running + load.waiting for load in self.models.loads().values())
        log.warning("drain deadline (%g s): ending the %d requests still running with an error", seconds, running)
        self.models.abort(
            ShuttingDownError(
                f"the server shut down before this reply ended (its drain deadline is {seconds:g} s)",
                retry_after=1.0,
            )
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(inflight.wait_idle(), grace)

    # -- simple endpoints ---------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        """``ok`` (or ``draining``, with a 503, while the server shuts down), the default model, what generates and
        waits (all models together), and each model's state with its key/value cache, and its engine
        (:func:`_engine_body`)."""
        loads = self.models.loads()
        models = []
        for name in self.models.specs:
            entry: dict[str, Any] = {"id": name, "loaded": name in loads}
            if name in loads:
                entry.update(_load_body(loads[name]))
                loaded = self.models.loaded(name)
                if loaded is not None:
                    entry["engine"] = _engine_body(loaded.backend)
            models.append(entry)
        draining = self.models.refusal is not None
        body: dict[str, Any] = {
            "status": "draining" if draining else "ok",
            "model": self.models.default_name,
            "generating": sum(load.running for load in loads.values()),
            "waiting": sum(load.waiting for load in loads.values()),
            "aborted": self.metrics.aborted_total() if self.metrics is not None else 0,
            "loaded": list(loads),
            "max_loaded": self.models.max_loaded,
            "models": models,
        }
        return JSONResponse(body, status_code=503 if draining else 200)

    async def metrics_page(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus' text format (:mod:`.metrics`)."""
        assert self.metrics is not None
        return await self.metrics.endpoint_metrics(request)

    async def list_models(self, request: Request) -> Response:
        """Every model, loaded or not, with its sampling defaults and thinking switch (``metadata``) and, once loaded,
        its context; in Anthropic's shape for Anthropic's clients (they send ``anthropic-version``)."""
        names = list(self.models.specs)
        if _from_anthropic(request):
            cards = [self._anthropic_card(name) for name in names]
            first, last = (names[0], names[-1]) if names else (None, None)
            return JSONResponse({"data": cards, "has_more": False, "first_id": first, "last_id": last})
        return JSONResponse({"object": "list", "data": [self._card(name) for name in names]})

    async def retrieve_model(self, request: Request) -> Response:
        """``GET /v1/models/{id}``: one model's card (``models.retrieve`` of both SDKs), a 404 in the client's API's
        shape for a model this server does not serve."""
        anthropic = _from_anthropic(request)
        try:
            name = self.models.spec(request.path_params["model_id"]).name
        except APIError as error:
            if not anthropic:
                raise
            return JSONResponse(error_body(error), status_code=error.status)
        return JSONResponse(self._anthropic_card(name) if anthropic else self._card(name))

    def _card(self, name: str) -> dict[str, Any]:
        """A model in OpenAI's shape, with turnkit's facts in ``metadata``."""
        spec = self.models.specs[name]
        card: dict[str, Any] = {"id": name, "object": "model", "created": self.created, "owned_by": "turnkit"}
        loaded = self.models.loaded(name)
        if loaded is not None:
            card["max_model_len"] = loaded.backend.context_length
        card["metadata"] = {
            "loaded": loaded is not None,
            "kv_cache_tokens": loaded.backend.load_now().kv_capacity if loaded is not None else None,
            "default": name == self.models.default_name,
            "family": spec.family,
            "template": spec.template,
            "sampling_defaults": self.models.defaults(name).to_dict(),
            "thinking_switch": switch.to_dict() if (switch := self.models.thinking_switch(name)) else None,
        }
        return card

    def _anthropic_card(self, name: str) -> dict[str, Any]:
        """A model in Anthropic's shape (``type``, ``id``, ``display_name``, ``created_at`` as RFC 3339)."""
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created))
        return {"type": "model", "id": name, "display_name": name, "created_at": created}

    async def tokenize(self, request: Request) -> Response:
        req = await read_request(request, parse_tokenize)
        base = self.models.format(req.model)
        if req.chat_input is not None:
            fmt = self._format_for(base, req.chat_input)
            tokens = await asyncio.to_thread(
                _counted_prompt, fmt, req.chat_input, add_generation_prompt=req.add_generation_prompt
            )
        else:
            tokens = (await asyncio.to_thread(base.tokenizer.encode, req.prompt or "")).ids
        body: dict[str, Any] = {"count": len(tokens), "tokens": tokens}
        loaded = self.models.loaded(self.models.spec(req.model).name)
        if loaded is not None:
            body["max_model_len"] = loaded.backend.context_length
        return JSONResponse(body)

    async def detokenize(self, request: Request) -> Response:
        req = await read_request(request, parse_detokenize)
        fmt = self.models.format(req.model)
        _check_vocabulary(fmt, req.tokens, "tokens")
        return JSONResponse({"prompt": fmt.tokenizer.decode(req.tokens)})

    # -- generating endpoints -------------------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        refuse = self.refuse_builtin_tools
        req = await read_request(request, lambda body: parse_chat(body, refuse_builtin=refuse))
        headers = self._dropped(request, req.dropped_tools)
        sessions, name = await self._start_chat(req)
        chunks = choices(sessions, name, chat_chunks)
        if req.response_format is not None:
            chunks = structured.checked(chunks)
        extra = prompt_ids(sessions)
        if req.dropped_tools:
            extra["turnkit_dropped_tools"] = [tool.to_dict() for tool in req.dropped_tools]
        return await _reply(chunks, fold_chat, req, extra=extra, headers=headers)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API on the same sessions (:mod:`..messages`)."""
        refuse = self.refuse_builtin_tools
        parsed = await read_request(request, lambda body: parse_messages(body, refuse_builtin=refuse))
        headers = self._dropped(request, parsed.dropped_tools)
        sessions, name = await self._start_chat(parsed.chat)
        events = message_events(
            sessions[0], name, show_thinking=parsed.show_thinking, dropped_tools=parsed.dropped_tools
        )
        if parsed.chat.stream:
            stream = typed_event_stream(events, on_error=error_body, keep_alive=PING)
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        return JSONResponse(fold_message(await collect(events)), headers=headers)

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API on the same sessions (:mod:`..responses`); stored responses are kept in memory."""
        refuse = self.refuse_builtin_tools
        req = await read_request(request, lambda body: parse_responses(body, self.stored, refuse_builtin=refuse))
        headers = self._dropped(request, req.dropped_tools)
        sessions, name = await self._start_chat(req.chat)
        built = ResponseEvents(sessions[0], name, req)
        if req.store:
            built.on_done = lambda response: self.stored.put(response, built.conversation())
        if req.chat.stream:
            stream = typed_event_stream(built.events(), on_error=built.error_event)
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        await collect(built.events())
        return JSONResponse(built.response, headers=headers)

    async def stored_response(self, request: Request) -> Response:
        """``GET`` a stored response, or ``DELETE`` it."""
        response_id = request.path_params["response_id"]
        if request.method == "DELETE":
            self.stored.found(response_id)
            self.stored.delete(response_id)
            return JSONResponse({"id": response_id, "object": "response", "deleted": True})
        return JSONResponse(self.stored.found(response_id).response)

    async def count_tokens(self, request: Request) -> Response:
        """The prompt tokens a Messages request would have (its ``usage.input_tokens``, nothing cached)."""
        refuse = self.refuse_builtin_tools
        parsed = await read_request(request, lambda body: parse_messages(body, counting=True, refuse_builtin=refuse))
        chat, headers = parsed.chat, self._dropped(request, parsed.dropped_tools)
        try:
            fmt = self._format_for(self.models.format(chat.model), chat.chat_input)
            prompt = await asyncio.to_thread(_counted_prompt, fmt, chat.chat_input)
        except APIError as error:
            raise chat.wording.reword(error) from None
        body: dict[str, Any] = {"input_tokens": len(prompt)}
        if parsed.dropped_tools:
            body["turnkit_dropped_tools"] = [tool.to_dict() for tool in parsed.dropped_tools]
        return JSONResponse(body, headers=headers)

    def _dropped(self, request: Request, tools: Sequence[DroppedTool]) -> dict[str, str]:
        """The built-in tools a request offered and the prompt leaves out: one log line for the request (a warning
        the first time this endpoint drops a tool of that type, then info), and the response header naming them."""
        if not tools:
            return {}
        path = request.url.path
        new = {(path, tool.type) for tool in tools} - self._dropped_seen
        self._dropped_seen |= new
        log.log(
            logging.WARNING if new else logging.INFO,
            "%s: served without the built-in tools the request offered, which this server cannot run: %s "
            "(--refuse-builtin-tools answers such requests with a 400)",
            path,
            "; ".join(f"{tool.param} {tool.type} ({tool.reason})" for tool in tools),
        )
        return {DROPPED_TOOLS_HEADER: ", ".join(dict.fromkeys(tool.type for tool in tools))}

    async def _start_chat(self, req: ChatRequest) -> tuple[list[Session], str]:
        """The one path of every chat-shaped API: the model's format (or the request's own template), the checks,
        the grammar of ``response_format`` or of a forced tool call, the model's weights, and the sessions, admitted
        by the engine (a refusal is an :class:`APIError` with ``Retry-After``, raised before any byte is sent). Its
        errors name the fields of the API the request came in (``req.wording``)."""
        try:
            return await self._start_sessions(req)
        except APIError as error:
            raise req.wording.reword(error) from None

    async def _start_sessions(self, req: ChatRequest) -> tuple[list[Session], str]:
        base = self.models.format(req.model)  # 404 before anything loads
        fmt = self._format_for(base, req.chat_input)
        _check_vocabulary(fmt, list(req.logit_bias), "logit_bias")
        _check_vocabulary(fmt, req.stop_token_ids, "stop_token_ids", each=True)
        _check_vocabulary(fmt, req.chat_input.prompt_ids or [], "prompt_token_ids", each=True)
        await asyncio.to_thread(check_tools_shown, fmt, req.chat_input)  # renders twice: off the event loop
        await asyncio.to_thread(check_tools_readable, fmt, req.chat_input)  # probe renders, the first time
        # the grammar's tokenizer takes a second to build the first time
        constraint = await asyncio.to_thread(structured.constraint_for, fmt, req)
        model = await self.models.acquire(req.model)
        sessions = await start_chat(fmt, model, req, default_max_tokens=self.default_max_tokens, constraint=constraint)
        return sessions, model.name

    async def completions(self, request: Request) -> Response:
        req = await read_request(request, parse_completion)
        fmt = self.models.format(req.model)
        _check_vocabulary(fmt, list(req.logit_bias), "logit_bias")
        _check_vocabulary(fmt, req.stop_token_ids, "stop_token_ids", each=True)
        if isinstance(req.prompt, str):
            # a raw prompt is the caller's own formatting; tokenized off the event loop (it may be long)
            prompt = (await asyncio.to_thread(fmt.tokenizer.encode, req.prompt)).ids
        else:
            _check_vocabulary(fmt, req.prompt, "prompt")
            prompt = req.prompt
        model = await self.models.acquire(req.model)
        sessions = await start_completion(model, req, prompt, default_max_tokens=self.default_max_tokens)
        echo = fmt.tokenizer.decode(prompt) if req.echo else ""

        def chunks(session: Session, name: str) -> AsyncGenerator[Chunk, None]:
            return completion_chunks(session, name, echo=echo)

        return await _reply(choices(sessions, model.name, chunks), fold_completion, req, extra=prompt_ids(sessions))

    # -- checks ---------------------------------------------------------------------------------------------------

    def _format_for(self, base: ChatFormat, chat_input: ChatInput) -> ChatFormat:
        """The model's format, or the request's own ``chat_template`` / ``family`` where the server allows it."""
        if chat_input.chat_template is None and chat_input.family is None:
            return base
        param = "chat_template" if chat_input.chat_template is not None else "family"
        if not self.allow_template_override:
            raise APIError(
                400,
                "per-request chat_template and family are disabled on this server (start it with "
                "--allow-template-override)",
                param=param,
            )
        try:
            if chat_input.chat_template is not None:
                return base.with_template(chat_input.chat_template)
            return ChatFormat.from_family(chat_input.family or "", tokenizer=base.tokenizer)
        except TurnkitError as exc:
            raise APIError(400, str(exc), param=param) from None


@contextlib.asynccontextmanager
async def _lifespan(_app: Starlette) -> AsyncIterator[None]:
    """The loop the app starts on runs it until it stops: an engine whose client binds to one loop (vLLM's) runs there,
    and its tokens reach replies without a second thread's wake-up (:func:`~.engines.base.serving_on`). Asking anyio
    for this loop's backend here loads it now: streamed replies run in anyio task groups, and its first use otherwise
    adds ~50 ms to the first reply's first token."""
    anyio.get_cancelled_exc_class()
    with serving_on(asyncio.get_running_loop()):
        yield


def _counted_prompt(fmt: ChatFormat, chat_input: ChatInput, *, add_generation_prompt: bool = True) -> list[int]:
    """The prompt ids a chat input would have, for the endpoints that count without generating (``/tokenize``,
    ``count_tokens``): refused as the generating routes refuse it where tools are offered that the template does not
    show (the count would leave them out). Renders: call it off the event loop."""
    check_tools_shown(fmt, chat_input)
    return chat_prompt_ids(fmt, chat_input, add_generation_prompt=add_generation_prompt)


def _from_anthropic(request: Request) -> bool:
    """Whether an Anthropic client sent the request (its SDKs and Claude Code send ``anthropic-version`` always)."""
    return "anthropic-version" in request.headers


def _load_body(load: Load) -> dict[str, Any]:
    """A model's :class:`~..engines.base.Load` as ``/health`` shows it: what generates and waits, and its key/value
    cache in tokens (``used``: promised to running requests, ``free``: what admission can still promise, ``cached``:
    finished requests' prefixes kept for reuse, freed when needed)."""
    body: dict[str, Any] = {"generating": load.running, "waiting": load.waiting}
    if load.kv_capacity is not None:
        body["kv_cache"] = {
            "tokens": load.kv_capacity,
            "used": load.kv_reserved,
            "free": load.kv_free,
            "cached": load.kv_cached,
        }
    return body


def _engine_body(backend: Backend) -> dict[str, Any]:
    """A loaded model's engine as ``/health`` shows it: its name, the request fields it honours and the engine
    options it takes, both from their declarations (:mod:`~turnkit.serve.request_fields`,
    :mod:`~turnkit.serve.engines.options`), then what it says it was given (``engine_info()``: vLLM's release and
    engine options)."""
    body: dict[str, Any] = {
        "engine": backend.kind,
        "honours": honoured_fields(backend.kind),
        "options": taken_flags(backend.kind),
    }
    return {**body, **(backend.engine_info() or {})}


def _check_vocabulary(fmt: ChatFormat, ids: Sequence[int], param: str, *, each: bool = False) -> None:
    """Token ids a client sends must name tokens of this vocabulary (the ids are non-negative by protocol). With
    ``each``, the error names the first id outside it (``prompt_token_ids[3]``): a trajectory of thousands of ids is
    otherwise hard to mend."""
    if not ids:
        return
    size = fmt.tokenizer.backend.get_vocab_size(with_added_tokens=True)
    outside = next((index for index, t in enumerate(ids) if t >= size), None)
    if outside is None:
        return
    if each:
        place = f"{param}[{outside}]"
        raise APIError(400, f"{place} is {ids[outside]}, not a token id of this model (0 to {size - 1})", param=place)
    raise APIError(400, f"token ids must be between 0 and {size - 1}", param=param)


async def _reply(
    chunks: AsyncGenerator[Chunk, None],
    fold: Callable[[list[Chunk]], Chunk],
    req: Sampling,
    *,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """The chunks as a stream of server-sent events, or folded into one response: the same chunks either way.
    ``extra``: turnkit's own fields of the answer (``turnkit_dropped_tools``), on a stream's first chunk and on the
    whole response, which clients keep and ignore."""
    if req.stream:
        if extra:
            chunks = _first_with(chunks, extra)
        stream = event_stream(chunks, include_usage=req.include_usage)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
    return JSONResponse({**fold(await collect(chunks)), **(extra or {})}, headers=headers)


async def _first_with(chunks: AsyncGenerator[Chunk, None], extra: dict[str, Any]) -> AsyncGenerator[Chunk, None]:
    """The chunks, the first one carrying ``extra`` too."""
    first = True
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            yield {**chunk, **extra} if first else chunk
            first = False
