"""Which engine runs a model: one small table, so that a new engine plugs in with one line.

An engine is a function from a model path (and the server's batching and thread settings) to a
:class:`~.backend.Backend`. ``llama.cpp`` (llama-cpp-python's kernels) runs GGUF files and is their default;
``torch`` (transformers) runs Hugging Face folders and GGUF files (dequantized once); ``vllm`` runs them on vLLM's
engine in process (its own venv: ``./dev.sh vllm-setup``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from turnkit.errors import ServeConfigError
from turnkit.serve.engines.base import Backend
from turnkit.serve.engines.options import DRAFT_MAX, MAX_BATCH, OptionValue, taken_by

__all__ = ["DRAFT_MAX", "ENGINES", "MAX_BATCH", "EngineOptions", "default_engine", "load_backend"]


@dataclass(frozen=True)
class EngineOptions:
    """What every engine is given besides the model (None: the engine's choice).

    ``threads`` decode one stream; ``prefill_threads`` compute prompts and batches (llama.cpp only); ``max_batch``
    requests generate together (None: :data:`MAX_BATCH`, and vLLM's own ``max_num_seqs`` on vLLM) and
    ``max_queue`` more wait, each at most ``queue_timeout`` seconds; ``context`` is the
    longest sequence a request may have (llama.cpp: longer than the model's trained context is RoPE scaled with
    YaRN); ``draft_max`` the longest draft of speculative decoding from the context (llama.cpp; 0: off);
    ``declared``: the other options declared in :mod:`.options` that were given (``kv_tokens``, ``cache_ram_mib``
    ...), by keyword, each handed to the engines its row names.
    """

    threads: int | None = None
    prefill_threads: int | None = None
    max_batch: int | None = None
    max_queue: int = 64
    queue_timeout: float | None = 60.0
    context: int | None = None
    draft_max: int = DRAFT_MAX
    declared: tuple[tuple[str, OptionValue], ...] = ()
    #: vLLM's engine options (``AsyncEngineArgs`` keywords, ``--vllm-arg KEY=VALUE``): the vllm engine only.
    vllm_args: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, values: Mapping[str, OptionValue], **queue: Any) -> EngineOptions:
        """The options from the table's derived ``values`` (:func:`.options.derive`, by keyword): those this class
        has a field for as that field, the others in ``declared``; ``queue``: the other fields (``max_queue`` ...)."""
        typed = {f.name for f in fields(cls)} - {"declared", "vllm_args", "max_queue", "queue_timeout"}
        declared = tuple((keyword, value) for keyword, value in values.items() if keyword not in typed)
        chosen: dict[str, Any] = {keyword: value for keyword, value in values.items() if keyword in typed}
        return cls(**chosen, declared=declared, **queue)

    def keywords(self, *names: str) -> dict[str, Any]:
        """The options ``names`` under their own names (the engines' constructors take them so), with the queue's
        settings that every engine takes: ``max_batch`` (:data:`MAX_BATCH` where unset), ``max_queue`` and
        ``queue_timeout``."""
        chosen = {name: getattr(self, name) for name in (*names, "max_queue", "queue_timeout")}
        return {**chosen, "max_batch": MAX_BATCH if self.max_batch is None else self.max_batch}


#: What a Hugging Face folder holds its weights in, whichever way transformers saved them.
_WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def _check_model_folder(folder: Path) -> None:
    """A folder without ``config.json`` or weights (a tokenizer alone is enough to render and encode) is said to be
    so, in place of transformers' "Unrecognized model ... `model_type`"."""
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    if not any(next(folder.glob(pattern), None) for pattern in _WEIGHTS):
        missing.append("weights (*.safetensors)")
    if missing:
        held = ", ".join(sorted(p.name for p in folder.iterdir())[:6]) or "nothing"
        raise ServeConfigError(
            f"{folder} holds no model to serve: it has no {' and no '.join(missing)} (it holds {held}); give a folder "
            "with config.json and the weights, or a .gguf file (render, encode and prepare need the tokenizer only)"
        )


def _torch(path: Path, options: EngineOptions) -> Backend:
    from turnkit.serve.engines.torch import TorchBackend

    if path.is_dir():
        _check_model_folder(path)
    return TorchBackend.load(path, **options.keywords("threads", "context"))


def _llama_cpp(path: Path, options: EngineOptions) -> Backend:
    if path.suffix != ".gguf" or not path.is_file():
        raise ServeConfigError(f"the llama.cpp engine serves .gguf files; {path} is not one (use the torch engine)")
    from importlib.util import find_spec

    from turnkit.serve.engines.llama_check import check_library
    from turnkit.serve.engines.llama_cpp import LlamaCppBackend

    if find_spec("llama_cpp") is not None:  # else the backend says how to install it
        # One token in a child first: a library built for instructions this CPU refuses dies there, not in here.
        check_library(path, threads=options.threads or 1, prefill_threads=options.prefill_threads)
    return LlamaCppBackend(
        path,
        threads=options.threads or 1,
        speculate=options.draft_max > 0,
        **options.keywords("prefill_threads", "context", "draft_max"),
        **taken_by("llama.cpp", dict(options.declared)),
    )


def _vllm(path: Path, options: EngineOptions) -> Backend:
    from turnkit.serve.engines.vllm import VllmBackend

    if path.is_dir():
        _check_model_folder(path)
    elif path.suffix != ".gguf":
        raise ServeConfigError(f"the vllm engine serves Hugging Face folders and .gguf files; {path} is neither")
    keywords = {**options.keywords("context", "threads"), "max_batch": options.max_batch}  # None: vLLM's default
    return VllmBackend.load(path, engine_args=dict(options.vllm_args), **keywords)


_LOADERS: dict[str, Callable[[Path, EngineOptions], Any]] = {
    "llama.cpp": _llama_cpp,
    "torch": _torch,
    "vllm": _vllm,
}

#: The engine names ``--engine`` and a models file's ``engine`` accept.
ENGINES = tuple(_LOADERS)


def default_engine(path: Path) -> str:
    """The engine a model runs on when none is named: llama.cpp for a GGUF file, torch for a folder."""
    return "llama.cpp" if path.suffix == ".gguf" and path.is_file() else "torch"


def load_backend(path: str | Path, *, engine: str | None = None, options: EngineOptions | None = None) -> Backend:
    """Load ``path`` (a Hugging Face folder or a GGUF file) on ``engine`` (default: :func:`default_engine`)."""
    path = Path(path)
    name = engine or default_engine(path)
    if name not in _LOADERS:
        raise ServeConfigError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")
    return _LOADERS[name](path, options or EngineOptions())
