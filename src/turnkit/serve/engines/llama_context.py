"""The llama.cpp engine's set-up: a GGUF file opened as one llama.cpp context, and llama.cpp's own log lines.

Why a module of its own: these are decisions made once, at the start, that the step loop (:mod:`.llama_cpp`) and the
slots' bookkeeping (:mod:`.llama_slots`) only read. The key/value cache is one unified buffer of ``kv_tokens`` cells
with one sequence id a slot (a prefix copied between slots only tags the same cells again), its size chosen by
:func:`default_kv_tokens`; a llama batch holds ``batch`` tokens; ``threads`` serve one-token batches and
``prefill_threads`` every bigger one; flash attention is on (cells masked off for a sequence then cost nothing); past
the model's trained context the RoPE is scaled with YaRN, as llama-server's ``-c N --rope-scaling yarn
--yarn-orig-ctx TRAINED``. A reader who wants to know what llama.cpp was given reads this file alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnkit.errors import EngineError

__all__ = ["MEMORY_SHARE", "LlamaContext", "default_kv_tokens", "open_context"]

#: The share of the machine's memory the key/value cache takes by default (when every slot's whole context needs more).
MEMORY_SHARE = 1 / 16


def default_kv_tokens(slots: int, context: int, bytes_per_token: int, memory: int | None = None) -> int:
    """Every slot a whole context, or what :data:`MEMORY_SHARE` of the machine's ``memory`` holds if that is less;
    at least one context, in whole multiples of 256 (llama.cpp's cache granule)."""
    if memory is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    fits = int(memory * MEMORY_SHARE) // max(1, bytes_per_token)
    return max(context, min(slots * context, fits)) // 256 * 256 or 256


@dataclass
class LlamaContext:
    """An opened model and its context: the handles the engine calls llama.cpp with, and what was chosen.

    ``ll`` is the ``llama_cpp`` module; ``memory`` the context's key/value cache; ``batch`` one ``llama_batch`` of
    ``batch_size`` tokens, reused by every step. ``context_length`` is the longest sequence one request may have:
    the context asked for, unless the whole cache is smaller.
    """

    ll: Any
    model: Any
    ctx: Any
    memory: Any
    batch: Any
    batch_size: int
    n_vocab: int
    trained_context: int
    context_length: int
    kv_tokens: int
    rope_scaling: float | None
    threads: int
    prefill_threads: int

    def describe(self, slots: int) -> str:
        """What was chosen, in one line for the server's start."""
        cache = self.kv_tokens * bytes_per_token(self.ll, self.model) / 2**30
        line = (
            f"context {self.context_length} tokens per request, key/value cache {self.kv_tokens} tokens "
            f"({cache:.1f} GiB) shared by {slots} slots; threads: {self.threads} decoding, "
            f"{self.prefill_threads} prefill"
        )
        if self.rope_scaling is not None:
            line += (
                f"; RoPE scaled with YaRN {self.rope_scaling:g}x past the model's trained {self.trained_context} "
                "tokens (quality may drop on long inputs)"
            )
        return line

    def free(self) -> None:
        """Free the batch, the context and the model (once the thread that uses them has ended)."""
        self.ll.llama_batch_free(self.batch)
        self.ll.llama_free(self.ctx)
        self.ll.llama_model_free(self.model)


def open_context(
    path: Path,
    *,
    slots: int,
    context: int | None,
    kv_tokens: int | None,
    batch: int,
    threads: int,
    prefill_threads: int,
) -> LlamaContext:
    """Load ``path`` and create its context for ``slots`` sequences: ``context`` tokens a request (default: the
    model's trained context), a cache of ``kv_tokens`` (default: :func:`default_kv_tokens`), batches of ``batch``
    tokens. :class:`~turnkit.errors.EngineError` names what failed: llama-cpp-python missing, the model, the context."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise EngineError(
            "the llama.cpp engine needs llama-cpp-python: pip install 'turnkit[llama]' (it compiles for minutes "
            "on first install; on CPUs where the native build crashes set CMAKE_ARGS=-DGGML_NATIVE=OFF), or use "
            "--engine torch"
        ) from exc
    _route_llama_logs(llama_cpp)
    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
    if not model:
        raise EngineError(f"llama.cpp could not load the model {path}")
    trained_context = int(llama_cpp.llama_model_n_ctx_train(model)) or 4096
    context = context or trained_context
    n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = kv_tokens or default_kv_tokens(slots, context, bytes_per_token(llama_cpp, model))
    params.n_batch = params.n_ubatch = batch
    params.n_seq_max = slots
    params.n_threads, params.n_threads_batch = threads, prefill_threads
    params.kv_unified = True  # prefix copies share cells; masked cells cost nothing with flash attention
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    params.no_perf = True
    rope_scaling = context / trained_context if context > trained_context else None
    if rope_scaling is not None:  # as llama-server's -c N --rope-scaling yarn --yarn-orig-ctx TRAINED
        params.rope_scaling_type = llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN
        params.rope_freq_scale = trained_context / context
        params.yarn_orig_ctx = trained_context
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        llama_cpp.llama_model_free(model)
        raise EngineError(f"llama.cpp could not create a context of {params.n_ctx} tokens for {path}")
    cells = int(llama_cpp.llama_n_ctx(ctx))
    return LlamaContext(
        ll=llama_cpp,
        model=model,
        ctx=ctx,
        memory=llama_cpp.llama_get_memory(ctx),
        batch=llama_cpp.llama_batch_init(int(params.n_batch), 0, 1),
        batch_size=int(params.n_batch),
        n_vocab=n_vocab,
        trained_context=trained_context,
        context_length=min(context, cells),
        kv_tokens=cells,
        rope_scaling=rope_scaling,
        threads=threads,
        prefill_threads=prefill_threads,
    )


def bytes_per_token(ll: Any, model: Any) -> int:
    """Key/value cache bytes per token (f16 keys and values of every layer)."""
    head = ll.llama_model_n_embd(model) // max(1, ll.llama_model_n_head(model))
    return int(ll.llama_model_n_layer(model) * 2 * head * ll.llama_model_n_head_kv(model) * 2)


# llama.cpp's log levels (ggml.h's enum ggml_log_level) as Python's; CONT continues the previous message.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_llama_log = logging.getLogger("turnkit.serve.llama_cpp")
_log_state: dict[str, Any] = {}


def _route_llama_logs(llama_cpp: Any) -> None:
    """Send llama.cpp's own log lines to Python logging (``turnkit.serve.llama_cpp``: its warnings and errors show,
    its loading chatter only at debug level), once per process. One warning is dropped: with one cache shared by the
    slots, llama.cpp reports the whole cache as each sequence's context (``n_ctx_seq > n_ctx_train``), but a request
    here never gets more than ``context`` tokens; :meth:`LlamaContext.describe` says what was chosen instead."""
    if _log_state:
        return
    level = [logging.DEBUG]

    @llama_cpp.llama_log_callback
    def route(ggml_level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if ggml_level != 5:
            level[0] = _LEVELS.get(ggml_level, logging.DEBUG)
        line = text.decode("utf-8", errors="replace").rstrip()
        if line and "possible training context overflow" not in line:
            _llama_log.log(level[0], "%s", line)

    _log_state["callback"] = route  # kept alive as long as llama.cpp may call it
    llama_cpp.llama_log_set(route, ctypes.c_void_p(0))
