"""One request's generation: its prompt, the backend's token stream, the stream parser, stops and cancellation.

A :class:`Session` is what every shape of an answer is made from. It yields :class:`Step` objects: the parser's
deltas for each generated token (with the token's log-probability when the request asked for them), and after the
last token the deltas the parser released when it finished. Each wire API (:mod:`.chat`, :mod:`.completions`) turns
the steps into its own chunks; a streamed reply sends those chunks, a whole reply is the chunks folded together.
Nothing here knows a wire shape, and no wire API knows the backend or the parser.

The session owns the backend's generation: the stream ends when the parser says the reply ended (a stop id, a stop
string) or the backend stops (its budget), and the generation is cancelled on every way out (the reply ended, the
client went away, an error), so a slot is never left generating for nobody.

Prompts: chat prompts come from ``ChatFormat.encode`` (safe by default: a user who types ``<|im_end|>`` cannot open a
turn), the same for every API, with what every API may ask of them:

* prefill (``continue_final``): a conversation that ends with an assistant message continues it; the prompt is the
  template's own text for that open turn (``continue_final_message``), its text encoded as data, and the reply is
  only the continuation;
* the thinking switch (``thinking``, and ``chat_template_kwargs`` named like a switch): set through the variable this
  template reads (:mod:`turnkit.template.switches`); a switch the template does not have is a 400;
* ``tool_choice`` ``required`` or a named function: the start of the call is written for the model and the rest
  decoded under the tool's schema (:func:`~.structured.forced_call`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, replace
from typing import Any

from turnkit.encode import EncodeOptions
from turnkit.errors import TurnkitError
from turnkit.format import ChatFormat
from turnkit.parse.parser import StreamParser
from turnkit.parse.reply import Delta, Reply
from turnkit.serve.engines.base import (
    Backend,
    BackendBusyError,
    CacheFullError,
    Generation,
    GenerationRequest,
    QueueTimeoutError,
    ShuttingDownError,
    TokenEvent,
)
from turnkit.serve.models import LoadedModel
from turnkit.serve.protocol import APIError, ChatInput, ChatRequest, CompletionRequest, Sampling, as_api_error
from turnkit.serve.sampling import SamplingDefaults
from turnkit.serve.structured import forced_call
from turnkit.template.switches import SwitchError

__all__ = [
    "Choices",
    "Ledger",
    "Session",
    "Step",
    "Timing",
    "TokenLogprob",
    "chat_prompt_ids",
    "check_tools_readable",
    "check_tools_shown",
    "choices_timing",
    "engine_error",
    "forced_call_ids",
    "generation_request",
    "recording",
    "start_chat",
    "start_completion",
    "template_variables",
]

log = logging.getLogger("turnkit.serve")

# ``chat_template_kwargs`` are template variables. A key named like a variable the request itself sets (``messages``,
# ``tools``, ``add_generation_prompt``) would replace that checked field in the template, and one named like an encode
# option (``trust_data``, ``turns``) reads as a request for that option, which a client may not make: both are 400s
# rather than silently doing something else than what was asked.
_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt"}) | frozenset(
    option.name for option in fields(EncodeOptions)
)


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's text, bytes and log-probability, with the likeliest alternatives (text, bytes, logprob).

    ``bytes`` are the token's own bytes: a token that holds part of a UTF-8 character has text with a replacement
    character, and its bytes let a client rebuild the character, as OpenAI's ``bytes`` field intends."""

    token: str
    bytes: list[int]
    logprob: float | None
    top: list[tuple[str, list[int], float]]


@dataclass(frozen=True)
class Step:
    """What one generated token (or the prompt's forced prefix, or the parser's finish) added to the reply."""

    deltas: list[Delta]
    logprob: TokenLogprob | None = None


def template_variables(fmt: ChatFormat, chat_input: ChatInput) -> dict[str, Any]:
    """The template variables of a request: its ``chat_template_kwargs`` and its thinking request, each switch set
    through the variable this template reads.

    A key named like a variable the request itself sets (``messages``, ``tools``, ``add_generation_prompt``) or like
    an encode option (``trust_data``, ``turns``) is a 400; so is a thinking switch the template does not have, and a
    thinking field that contradicts a ``chat_template_kwargs`` switch."""
    reserved = sorted(_RESERVED.intersection(chat_input.template_kwargs))
    if reserved:
        raise APIError(
            400,
            f"chat_template_kwargs may not set {reserved[0]!r}: it is set by the request and the server, not a "
            "template variable",
            param=f"chat_template_kwargs.{reserved[0]}",
        )
    try:
        switch = fmt.thinking_switch(tools=chat_input.tools if chat_input.offers_tools else None)
    except TurnkitError as exc:
        raise as_api_error(exc) from None
    try:
        variables = switch.translate(chat_input.template_kwargs)
    except SwitchError as exc:
        raise APIError(400, str(exc), param="chat_template_kwargs", code="unsupported_thinking_switch") from None
    thinking = chat_input.thinking
    try:
        if thinking.effort_is_hint:
            asked = switch.variables(thinking.enabled)
            if switch.effort and thinking.effort and thinking.enabled is not False:
                asked[switch.effort] = thinking.effort
        else:
            asked = switch.variables(thinking.enabled, thinking.effort)
    except SwitchError as exc:
        raise APIError(
            400, f"{thinking.param}: {exc}", param=thinking.param, code="unsupported_thinking_switch"
        ) from None
    for name, value in asked.items():
        if name in variables and variables[name] != value:
            raise APIError(
                400,
                f"{thinking.param} asks for {name}={value!r} but chat_template_kwargs sets {name}={variables[name]!r}",
                param=thinking.param,
            )
    return {**variables, **asked}


def check_tools_shown(fmt: ChatFormat, chat_input: ChatInput) -> None:
    """Tools offered to a template that does not show them are a 400: rendering with and without the tools gives
    the same prompt, so the model would never see them and its plain reply would read as if it had."""
    if not chat_input.offers_tools:
        return
    kwargs = template_variables(fmt, chat_input)
    try:
        shown = fmt.render(chat_input.messages, tools=chat_input.tools, add_generation_prompt=True, **kwargs)
        bare = fmt.render(chat_input.messages, add_generation_prompt=True, **kwargs)
    except TurnkitError as exc:
        raise as_api_error(exc) from None
    if shown == bare:
        raise APIError(
            400,
            "this model's chat template does not support tools: it renders the same prompt with and without them, "
            "so the model would never see them (serve it with a family or template that shows tools, e.g. "
            "--model NAME=PATH:qwen2.5)",
            param="tools",
            code="tools_not_supported",
        )


def chat_prompt_ids(fmt: ChatFormat, chat_input: ChatInput, *, add_generation_prompt: bool = True) -> list[int]:
    """The prompt ids of a chat input, as every chat-shaped API and ``/tokenize`` compute them."""
    variables = template_variables(fmt, chat_input)
    options = EncodeOptions(
        tools=chat_input.tools if chat_input.offers_tools else None,
        add_generation_prompt=add_generation_prompt and not chat_input.continue_final,
        continue_final_message=_continued_field(chat_input) if chat_input.continue_final else False,
        turns="none",
        template_kwargs=variables,
    )
    try:
        encoding = fmt.encode(chat_input.messages, options)
    except TurnkitError as exc:
        raise as_api_error(exc) from None
    assert not isinstance(encoding, list)  # one encoding: split_turns is off
    return encoding.input_ids.tolist()


def check_tools_readable(fmt: ChatFormat, chat_input: ChatInput) -> None:
    """Tools offered to a template whose tool calls turnkit cannot read back are a 400: the model's calls would
    come back as text, the failure every agent loop trips over. (The template's reply format says why.)"""
    if not chat_input.offers_tools:
        return
    choice = fmt.reply_choice
    if choice.tools_unreadable or not choice.format.reads_tools:
        raise APIError(
            400,
            "this model's chat template writes tool calls in a syntax turnkit cannot read back, so its calls would "
            f"come back as text ({choice.format.reason}); serve it with a template override or a family whose tool "
            "syntax turnkit reads",
            param="tools",
            code="tools_not_readable",
        )


def _continued_field(chat_input: ChatInput) -> str:
    """The field a prefill continues: the final assistant message's text, or its reasoning when it has only that."""
    index = len(chat_input.messages) - 1
    final = chat_input.messages[-1] if chat_input.messages else None
    if not isinstance(final, dict) or final.get("role") != "assistant":
        raise APIError(
            400,
            "continuing the final message needs a conversation that ends with an assistant message",
            param=f"messages[{index}].role",
        )
    if final.get("tool_calls"):
        raise APIError(
            400,
            "the final assistant message calls tools, so it cannot be continued: send the tool results instead",
            param=f"messages[{index}].tool_calls",
        )
    if not final.get("content"):
        reasoning = next((f for f in ("reasoning_content", "thinking", "reasoning") if final.get(f)), None)
        if reasoning is not None:
            return reasoning
    return "content"


def forced_call_ids(fmt: ChatFormat, chat_input: ChatInput) -> list[int]:
    """For ``tool_choice`` ``required`` or a named function: the start of the call, as ids written for the model
    (the rest is decoded under the grammar of :func:`~.structured.forced_call`)."""
    forced = forced_call(fmt, chat_input)
    if forced is None:
        return []
    if chat_input.continue_final:
        raise APIError(
            400,
            "a forced tool call cannot continue the final assistant message: the call is written after a new "
            "assistant turn's header",
            param="tool_choice",
        )
    if isinstance(forced.start, int):
        return [forced.start, *_ids_with_markers(fmt, forced.text)]
    return _ids_with_markers(fmt, forced.start + forced.text)


def _ids_with_markers(fmt: ChatFormat, text: str) -> list[int]:
    """Text to ids where the tokenizer's added tokens written in it are those tokens and the rest is plain text."""
    binding = fmt.tokenizer
    ids: list[int] = []
    pos = 0
    for match in binding.added_pattern.finditer(text) if binding.added else ():
        if match.start() > pos:
            ids += binding.encode_as_text(text[pos : match.start()]).ids
        ids.append(binding.added[match.group(0)].id)
        pos = match.end()
    if pos < len(text):
        ids += binding.encode_as_text(text[pos:]).ids
    return ids


@dataclass(frozen=True)
class Timing:
    """A reply's latencies in seconds, from its submission to the engine (queue wait included): to the first token,
    per token after it (the mean gap), and to the end; None where the reply did not get that far."""

    first_token: float | None
    per_token: float | None
    total: float | None


@dataclass(eq=False)
class Choices:
    """The sessions of one request that asked for ``n`` > 1 choices: one request, so one log line (not one a choice),
    written when the last choice has ended, or at once when one stopped short (the client left, an error); and one
    :meth:`timing` for the metrics. The choices are generated together and read one after the other."""

    sessions: list[Session]
    logged: bool = False

    def timing(self) -> Timing:
        """The request's latencies: to its first token (the earliest choice's), per token (the time from the first
        token to the end over the longest choice's tokens, the choices being generated side by side) and to its end
        (the last choice's)."""
        return choices_timing(self.sessions)

    def finished(self) -> None:
        """A choice's reply ended: once every choice's has, the request's line."""
        if self.logged or any(session.outcome != "finished" for session in self.sessions):
            return
        self.logged = True
        first, timing = self.sessions[0], self.timing()
        log.info(
            "%s %s prompt=%d completion=%d ttft=%.0fms total=%.0fms finish=%s choices=%d",
            first.request_id,
            first.endpoint,
            first.prompt_tokens,
            sum(session.completion_tokens for session in self.sessions),
            (timing.first_token or float("nan")) * 1000,
            (timing.total or float("nan")) * 1000,
            ",".join(str(session.reply.finish_reason if session.reply else None) for session in self.sessions),
            len(self.sessions),
        )

    def stopped(self, session: Session, exc: BaseException) -> None:
        """A choice stopped short: the request's line says how, with the tokens of every choice so far."""
        if self.logged:
            return
        self.logged = True
        assert session.ended is not None
        log.info(
            "%s %s %s after %d tokens prompt=%d total=%.0fms choices=%d%s",
            session.request_id,
            session.endpoint,
            session.outcome,
            sum(choice.completion_tokens for choice in self.sessions),
            session.prompt_tokens,
            (session.ended - session._started) * 1000,
            len(self.sessions),
            f": {exc}" if isinstance(exc, Exception) else "",
        )


def choices_timing(sessions: Sequence[Session]) -> Timing:
    """The latencies of the sessions of one request (its ``n`` choices) taken as one request (see
    :meth:`Choices.timing`); one session's own."""
    timings = [session.timing() for session in sessions]
    firsts = [t.first_token for t in timings if t.first_token is not None]
    totals = [t.total for t in timings if t.total is not None]
    first = min(firsts) if firsts else None
    total = max(totals) if totals else None
    longest = max((session.completion_tokens for session in sessions), default=0)
    per_token = None
    if first is not None and total is not None and longest > 1:
        per_token = (total - first) / (longest - 1)
    return Timing(first, per_token, total)


@dataclass
class Ledger:
    """The sessions one HTTP request started (its ``n`` choices), for whoever counts requests once they are over."""

    sessions: list[Session] = field(default_factory=list)


#: The ledger of the request being answered. The HTTP app opens one per request (:func:`recording`, in
#: :mod:`.app.inflight`), every :class:`Session` writes itself into it, and the app reads it when the request is over:
#: so every route that starts sessions is counted (metrics, aborted replies) without passing anything along.
_ledger: ContextVar[Ledger | None] = ContextVar("turnkit_ledger", default=None)


@contextmanager
def recording() -> Iterator[Ledger]:
    """A fresh :class:`Ledger` for the sessions started in this context (and in tasks created inside it)."""
    ledger = Ledger()
    token = _ledger.set(ledger)
    try:
        yield ledger
    finally:
        _ledger.reset(token)


@dataclass
class Session:
    """One request being answered. Iterate :meth:`steps` once; afterwards ``reply`` and the token counts are set.

    ``prompt_tokens`` counts the prompt without ``prefix`` (the forced start of a tool call, which the parser reads as
    the reply's own text); ``completion_tokens`` counts what the backend generated, the stop id included.
    """

    fmt: ChatFormat
    parser: StreamParser
    generation: Generation
    endpoint: str
    prompt_tokens: int
    max_tokens: int
    prefix: list[int] = field(default_factory=list)
    logprobs: bool = False
    request_id: str = field(init=False, default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(init=False, default_factory=lambda: int(time.time()))
    completion_tokens: int = field(init=False, default=0)
    reply: Reply | None = field(init=False, default=None)
    #: ``running`` until the reply ends: then ``finished``, ``aborted`` (closed before its end: the client left) or
    #: ``failed`` (an error ended it); ``refused`` when the engine refused it while it waited (its client may also
    #: leave while it waits: ``aborted``, with ``admitted`` false).
    outcome: str = field(init=False, default="running")
    admitted: bool = field(init=False, default=False)  # the engine took it (its prompt was, or is being, computed)
    model: str = field(init=False, default="")  # the model's name, as clients use it
    ended: float | None = field(init=False, default=None)  # time.perf_counter() when the outcome was decided
    #: With ``n`` > 1: the request's choices, which log one line together.
    choices: Choices | None = field(init=False, default=None)
    _started: float = field(init=False, default_factory=time.perf_counter)
    _first_token: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        ledger = _ledger.get()
        if ledger is not None:
            ledger.sessions.append(self)

    async def steps(self) -> AsyncGenerator[Step, None]:
        """The reply as it grows. The generation is cancelled when the reply ends, and on any other way out; a reply
        that does not reach its end (the client left, the request failed) is logged as such, once."""
        try:
            if self.prefix:
                yield Step(self.parser.feed(self.prefix))
            async for event in self.generation:
                if self._first_token is None:
                    self._first_token = time.perf_counter()
                self.completion_tokens += 1
                deltas = self.parser.feed((event.token_id,))
                yield Step(deltas, self._logprob(event))
                if self.parser.ended:
                    break
        except (BackendBusyError, CacheFullError) as exc:  # the engine's reason, for the client to read
            self._stopped(exc)
            raise engine_error(exc) from None
        except BaseException as exc:  # GeneratorExit and cancellation too: the reply stops here, whyever
            self._stopped(exc)
            raise
        finally:
            self.generation.cancel()
        length = not self.parser.ended and self.completion_tokens >= self.max_tokens
        self.reply = self.parser.finish(length=length)
        self.ended = time.perf_counter()
        self.outcome = "finished"
        self._log(self.reply)
        yield Step(self.parser.final_deltas)

    def timing(self) -> Timing:
        """How long the reply took, in seconds (the metrics' latencies)."""
        first = None if self._first_token is None else self._first_token - self._started
        total = None if self.ended is None else self.ended - self._started
        per_token = None
        if self._first_token is not None and self.ended is not None and self.completion_tokens > 1:
            per_token = (self.ended - self._first_token) / (self.completion_tokens - 1)
        return Timing(first, per_token, total)

    def prompt_logprobs(self) -> list[TokenLogprob]:
        """The prompt's tokens with their log-probabilities (``echo`` with ``logprobs``), once generating started."""
        out = []
        for event in self.generation.prompt or ():
            text, raw = self._text(event.token_id)
            top = [(*self._text(token_id), logprob) for token_id, logprob in event.top]
            out.append(TokenLogprob(text, raw, event.logprob, top))
        return out

    def _logprob(self, event: TokenEvent) -> TokenLogprob | None:
        """The token's log-probability entry; none for the stop token, which is not part of the reply's text."""
        if not self.logprobs or event.token_id in self.fmt.stop_ids:
            return None
        text, raw = self._text(event.token_id)
        top = [(*self._text(token_id), logprob) for token_id, logprob in event.top]
        return TokenLogprob(text, raw, event.logprob, top)

    def _text(self, token_id: int) -> tuple[str, list[int]]:
        table = self.fmt.tokenizer.byte_table
        raw = table.bytes_of(token_id) if table else b""
        return raw.decode("utf-8", errors="replace"), list(raw)

    def _stopped(self, exc: BaseException, *, waiting: bool = False) -> None:
        """The reply ended before its end: ``aborted`` (the client left, the answer was closed), ``refused`` (by the
        engine, while it waited for admission) or ``failed``; one log line says which."""
        self.ended = time.perf_counter()
        if not isinstance(exc, Exception):
            self.outcome = "aborted"
        else:
            self.outcome = "refused" if waiting and isinstance(exc, BackendBusyError) else "failed"
        if self.choices is not None and not waiting:
            self.choices.stopped(self, exc)
            return
        where = "while waiting for admission" if waiting else f"after {self.completion_tokens} tokens"
        log.info(
            "%s %s %s %s prompt=%d total=%.0fms%s",
            self.request_id,
            self.endpoint,
            self.outcome,
            where,
            self.prompt_tokens,
            (self.ended - self._started) * 1000,
            f": {exc}" if isinstance(exc, Exception) else "",
        )

    def _log(self, reply: Reply) -> None:
        if self.choices is not None:
            self.choices.finished()
            return
        elapsed = time.perf_counter() - self._started
        ttft = (self._first_token - self._started) * 1000 if self._first_token else float("nan")
        log.info(
            "%s %s prompt=%d completion=%d ttft=%.0fms total=%.0fms finish=%s",
            self.request_id,
            self.endpoint,
            self.prompt_tokens,
            self.completion_tokens,
            ttft,
            elapsed * 1000,
            reply.finish_reason,
        )


async def start_chat(
    fmt: ChatFormat, model: LoadedModel, req: ChatRequest, *, default_max_tokens: int, constraint: Any = None
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
        return fmt.stream_parser(prompt=prompt, stop=req.stop, tools=tools, reply_format=reply_format)

    return await _start(fmt, model, req, prompt, prefix, parser, endpoint, default_max_tokens, constraint)


async def start_completion(
    model: LoadedModel, req: CompletionRequest, prompt: Sequence[int], *, default_max_tokens: int
) -> list[Session]:
    """Start generating after a raw prompt: the caller's own formatting, so the reply is parsed as plain text."""
    endpoint = "completion-stream" if req.stream else "completion"
    fmt = model.fmt

    def parser() -> StreamParser:
        return fmt.stream_parser(stop=req.stop, reply_format="plain")

    return await _start(fmt, model, req, list(prompt), [], parser, endpoint, default_max_tokens, None)


def generation_request(
    req: Sampling, defaults: SamplingDefaults, *, prompt_ids: list[int], max_tokens: int, stop_ids: frozenset[int]
) -> GenerationRequest:
    """The backend's request: the request's sampling values, the model's defaults for those it left out."""

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    return GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        stop_ids=stop_ids,
        temperature=pick(req.temperature, defaults.temperature),
        top_p=pick(req.top_p, defaults.top_p),
        seed=req.seed,
        top_logprobs=req.top_logprobs if req.logprobs else None,
        top_k=pick(req.top_k, defaults.top_k),
        min_p=pick(req.min_p, defaults.min_p),
        repetition_penalty=pick(req.repetition_penalty, defaults.repetition_penalty),
        presence_penalty=pick(req.presence_penalty, defaults.presence_penalty),
        frequency_penalty=pick(req.frequency_penalty, defaults.frequency_penalty),
        logit_bias=dict(req.logit_bias),
        prompt_logprobs=req.top_logprobs if req.logprobs and getattr(req, "echo", False) else None,
    )


def _check_supported(backend: Backend, req: Sampling) -> None:
    """A field the engine cannot honour is a 400 naming it, never silently ignored. ``unsupported_fields`` names
    :class:`~.backend.GenerationRequest` fields; ``constraint`` is asked for by ``response_format`` and
    ``prompt_logprobs`` by ``echo`` with ``logprobs``."""
    unsupported: frozenset[str] = getattr(backend, "unsupported_fields", frozenset())
    for name in sorted(unsupported):
        param, value = name, getattr(req, name, None)
        if name in ("constraint", "response_format"):
            param, value = "response_format", getattr(req, "response_format", None)
        elif name == "prompt_logprobs":
            param, value = "echo", True if req.logprobs and getattr(req, "echo", False) else None
        if value not in (None, {}) and not (name == "n" and value == 1):
            what = "echo with logprobs" if name == "prompt_logprobs" else param
            raise APIError(
                400,
                f"{what} is not supported by this model's engine ({type(backend).__name__})",
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
    constraint: Any,
) -> list[Session]:
    """Check the prompt and budget against the context, submit ``req.n`` generations, and wait until the engine
    admitted every one of them: a request it refuses (every place taken: 429; its queue deadline passed, or the server
    is shutting down: 503; both with ``Retry-After``) is answered with that status before any byte of a reply, so a
    route that awaits this never starts a response it cannot give. Every route that starts sessions gets admission
    this way."""
    backend = model.backend
    _check_supported(backend, req)
    context = backend.context_length
    full = prompt + prefix
    if len(full) >= context:
        raise APIError(
            400,
            f"the prompt is {len(full)} tokens; the model's context is {context} tokens",
            param="messages",
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
    base = generation_request(req, model.defaults, prompt_ids=full, max_tokens=max_tokens, stop_ids=fmt.stops.ids)
    sessions: list[Session] = []
    loop = asyncio.get_running_loop()
    try:
        for index in range(req.n):
            seed = None if req.seed is None else (req.seed + index) % 2**64
            request = replace(base, seed=seed, constraint=constraint() if constraint is not None else None)
            generation = backend.submit(request, loop)
            session = Session(fmt, parser(), generation, endpoint, len(prompt), max_tokens, prefix, req.logprobs)
            session.model = model.name
            sessions.append(session)
        for session in sessions:
            await session.generation.started()
    except BaseException as exc:
        for session in sessions:
            session.generation.cancel()
        if sessions:  # one line for the request: refused by the engine, or left (or failed) while it waited
            sessions[0]._stopped(exc, waiting=True)
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


def engine_error(exc: Exception) -> APIError:
    """What an engine's refusal or failure means to the client: the status, a code naming the reason, and when to
    retry. A failure that is not one of these is the server's own (a 500, its cause in the log)."""
    if isinstance(exc, ShuttingDownError):
        return APIError(503, str(exc), code="server_shutting_down", retry_after=exc.retry_after)
    if isinstance(exc, QueueTimeoutError):
        return APIError(503, str(exc), code="queue_timeout", retry_after=exc.retry_after)
    if isinstance(exc, BackendBusyError):
        return APIError(429, str(exc), code="server_busy", retry_after=exc.retry_after)
    if isinstance(exc, CacheFullError):
        return APIError(503, str(exc), code="kv_cache_full")
    return APIError(500, "the server failed while generating; see its log")
