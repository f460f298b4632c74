"""The HTTP app: one route per endpoint, each a thin translation onto the one path.

A generating route reads its body with its API's module (:mod:`..chat`, :mod:`..completions`), picks the model's
format and backend from the registry, starts :class:`~turnkit.serve.session.Session` s, and answers with that API's
chunks: streamed as server-sent events (:mod:`.sse`) or folded into one response. The API key is :mod:`.auth`'s, the
error objects :mod:`.errors`', the playground page :mod:`.ui`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from turnkit.errors import TurnkitError
from turnkit.format import ChatFormat
from turnkit.serve import structured
from turnkit.serve.app import ui
from turnkit.serve.app.auth import Authenticate
from turnkit.serve.app.body import read_body
from turnkit.serve.app.errors import EXCEPTION_HANDLERS, answering
from turnkit.serve.app.sse import event_stream
from turnkit.serve.chat import chat_chunks, fold_chat, parse_chat
from turnkit.serve.chunks import Chunk, choices, collect
from turnkit.serve.completions import completion_chunks, fold_completion, parse_completion
from turnkit.serve.engines.base import Backend
from turnkit.serve.models import ModelRegistry
from turnkit.serve.protocol import APIError, ChatInput, Sampling, parse_detokenize, parse_tokenize
from turnkit.serve.session import (
    Session,
    chat_prompt_ids,
    check_tools_readable,
    check_tools_shown,
    start_chat,
    start_completion,
)

__all__ = ["Server"]


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
        self.created = int(time.time())

    def app(self) -> Starlette:
        routes = [
            Route("/health", answering(self.health), methods=["GET"]),
            Route("/v1/models", answering(self.list_models), methods=["GET"]),
            Route("/v1/chat/completions", answering(self.chat), methods=["POST"]),
            Route("/v1/completions", answering(self.completions), methods=["POST"]),
            Route("/tokenize", answering(self.tokenize), methods=["POST"]),
            Route("/detokenize", answering(self.detokenize), methods=["POST"]),
        ]
        if self.ui:
            fmt = self.models.format(None)
            routes += [Route(path, answering(handler), methods=[method]) for path, method, handler in ui.pages(fmt)]
        middleware = [Middleware(Authenticate, key=self.api_key)] if self.api_key else []
        return Starlette(routes=routes, exception_handlers=dict(EXCEPTION_HANDLERS), middleware=middleware)

    # -- simple endpoints ---------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        """``ok``, the default model, what generates and waits (all models together), and each model's state."""
        models = self.models.status()
        body: dict[str, Any] = {
            "status": "ok",
            "model": self.models.default_name,
            "generating": sum(m.get("generating", 0) for m in models),
            "waiting": sum(m.get("waiting", 0) for m in models),
            "loaded": [m["id"] for m in models if m["loaded"]],
            "max_loaded": self.models.max_loaded,
            "models": models,
        }
        return JSONResponse(body)

    async def list_models(self, request: Request) -> Response:
        """Every model, loaded or not, with its sampling defaults (``metadata``) and, once loaded, its context."""
        data = []
        for name, spec in self.models.specs.items():
            card: dict[str, Any] = {"id": name, "object": "model", "created": self.created, "owned_by": "turnkit"}
            loaded = self.models.loaded(name)
            if loaded is not None:
                card["max_model_len"] = loaded.backend.context_length
            card["metadata"] = {
                "loaded": loaded is not None,
                "default": name == self.models.default_name,
                "family": spec.family,
                "template": spec.template,
                "sampling_defaults": self.models.defaults(name).to_dict(),
            }
            data.append(card)
        return JSONResponse({"object": "list", "data": data})

    async def tokenize(self, request: Request) -> Response:
        req = parse_tokenize(await read_body(request))
        base = self.models.format(req.model)
        if req.chat_input is not None:
            fmt = self._format_for(base, req.chat_input)
            tokens = chat_prompt_ids(fmt, req.chat_input, add_generation_prompt=req.add_generation_prompt)
        else:
            tokens = base.tokenizer.encode(req.prompt or "").ids
        body: dict[str, Any] = {"count": len(tokens), "tokens": tokens}
        loaded = self.models.loaded(self.models.spec(req.model).name)
        if loaded is not None:
            body["max_model_len"] = loaded.backend.context_length
        return JSONResponse(body)

    async def detokenize(self, request: Request) -> Response:
        req = parse_detokenize(await read_body(request))
        fmt = self.models.format(req.model)
        _check_vocabulary(fmt, req.tokens, "tokens")
        return JSONResponse({"prompt": fmt.tokenizer.decode(req.tokens)})

    # -- generating endpoints -------------------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        req = parse_chat(await read_body(request))
        base = self.models.format(req.model)  # 404 before anything loads
        fmt = self._format_for(base, req.chat_input)
        _check_vocabulary(fmt, list(req.logit_bias), "logit_bias")
        check_tools_shown(fmt, req.chat_input)
        check_tools_readable(fmt, req.chat_input)
        constraint = None
        if req.response_format is not None:  # the grammar's tokenizer takes a second to build the first time
            constraint = await asyncio.to_thread(structured.constraint_for, fmt, req.response_format)
        model = await self.models.acquire(req.model)
        sessions = start_chat(
            fmt,
            model.backend,
            req,
            default_max_tokens=self.default_max_tokens,
            defaults=model.defaults,
            constraint=constraint,
        )
        chunks = choices(sessions, model.name, chat_chunks)
        if req.response_format is not None:
            chunks = structured.checked(chunks)
        return await _reply(chunks, fold_chat, req)

    async def completions(self, request: Request) -> Response:
        req = parse_completion(await read_body(request))
        fmt = self.models.format(req.model)
        _check_vocabulary(fmt, list(req.logit_bias), "logit_bias")
        if isinstance(req.prompt, str):
            prompt = fmt.tokenizer.encode(req.prompt).ids  # a raw prompt is the caller's own formatting
        else:
            _check_vocabulary(fmt, req.prompt, "prompt")
            prompt = req.prompt
        model = await self.models.acquire(req.model)
        sessions = start_completion(
            fmt, model.backend, req, prompt, default_max_tokens=self.default_max_tokens, defaults=model.defaults
        )
        echo = fmt.tokenizer.decode(prompt) if req.echo else ""

        def chunks(session: Session, name: str) -> AsyncGenerator[Chunk, None]:
            return completion_chunks(session, name, echo=echo)

        return await _reply(choices(sessions, model.name, chunks), fold_completion, req)

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


def _check_vocabulary(fmt: ChatFormat, ids: Sequence[int], param: str) -> None:
    """Token ids a client sends must name tokens of this vocabulary (the ids are non-negative by protocol)."""
    if not ids:
        return
    size = fmt.tokenizer.backend.get_vocab_size(with_added_tokens=True)
    if any(t >= size for t in ids):
        raise APIError(400, f"token ids must be between 0 and {size - 1}", param=param)


async def _reply(chunks: AsyncGenerator[Chunk, None], fold: Callable[[list[Chunk]], Chunk], req: Sampling) -> Response:
    """The chunks as a stream of server-sent events, or folded into one response: the same chunks either way."""
    if req.stream:
        return StreamingResponse(event_stream(chunks, include_usage=req.include_usage), media_type="text/event-stream")
    return JSONResponse(fold(await collect(chunks)))
