"""One request's generation as it runs: the engine's token stream read by the stream parser, its stops, cancellation,
its latencies and its log line; and the :class:`Ledger` of the sessions one HTTP request started.

A :class:`Session` is what every shape of an answer is made from. It yields :class:`Step` objects: the parser's
deltas for each generated token (with the token's log-probability when the request asked for them), and after the
last token the deltas the parser released when it finished. The session owns the backend's generation: the stream
ends when the parser says the reply ended (a stop id, a stop string) or the backend stops (its budget), and the
generation is cancelled on every way out (the reply ended, the client went away, an error), so a slot is never left
generating for nobody. :mod:`.start` makes sessions; nothing here builds a prompt or checks a request.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from turnkit.errors import BackendBusyError, CacheFullError, QueueTimeoutError, ShuttingDownError
from turnkit.format import ChatFormat
from turnkit.parse.reading.parser import StreamParser
from turnkit.parse.reply import Delta, Reply
from turnkit.serve.engines.base import Generation, TokenEvent
from turnkit.serve.protocol import APIError

log = logging.getLogger("turnkit.serve")


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
    """What one generated token (or the prompt's forced prefix, or the parser's finish) added to the reply.
    ``token_id``: the id the engine sampled, for ``return_token_ids`` (None for the forced prefix, which the engine
    was given, and for the finish)."""

    deltas: list[Delta]
    logprob: TokenLogprob | None = None
    token_id: int | None = None


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
    ``prompt_ids``: the ids the engine was given (the prompt, then ``prefix``), which ``return_token_ids`` answers
    as ``prompt_token_ids``; ``token_ids``: whether the request asked for them; ``stop_token_ids``: the request's own
    ids that end the reply (vLLM's field), beside the format's.
    """

    fmt: ChatFormat
    parser: StreamParser
    generation: Generation
    endpoint: str
    prompt_tokens: int
    max_tokens: int
    prefix: list[int] = field(default_factory=list)
    logprobs: bool = False
    token_ids: bool = False
    prompt_ids: list[int] = field(default_factory=list)
    stop_token_ids: frozenset[int] = frozenset()
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
                yield Step(deltas, self._logprob(event), event.token_id)
                if self.parser.ended:
                    break
        except (BackendBusyError, CacheFullError) as exc:  # the engine's reason, for the client to read
            self.stopped(exc)
            raise engine_error(exc) from None
        except BaseException as exc:  # GeneratorExit and cancellation too: the reply stops here, whyever
            self.stopped(exc)
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
        """The token's log-probability entry; none for the stop token, which is not part of the reply's text, unless
        the request asked for the token ids (``return_token_ids``): then every sampled id has its entry, as vLLM
        gives it, since a trainer trains the stop id and needs its log-probability."""
        stop = event.token_id in self.fmt.stop_ids or event.token_id in self.stop_token_ids
        if not self.logprobs or (stop and not self.token_ids):
            return None
        text, raw = self._text(event.token_id)
        top = [(*self._text(token_id), logprob) for token_id, logprob in event.top]
        return TokenLogprob(text, raw, event.logprob, top)

    def _text(self, token_id: int) -> tuple[str, list[int]]:
        table = self.fmt.tokenizer.byte_table
        raw = table.bytes_of(token_id) if table else b""
        return raw.decode("utf-8", errors="replace"), list(raw)

    def stopped(self, exc: BaseException, *, waiting: bool = False) -> None:
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
