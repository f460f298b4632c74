"""The models a server offers, by name: formats at hand, weights loaded on first use, the least recently used unloaded.

A :class:`ModelRegistry` holds :class:`~.modelspec.ModelSpec` objects. A model's *format* (template and tokenizer,
cheap) is built the first time anything needs it, so ``/tokenize`` and ``/v1/models`` never load weights. Its
*backend* (the weights) is loaded on the first generating request, in a worker thread so that the other models keep
answering, and at most ``max_loaded`` backends stay loaded: loading one more unloads the least recently used. An
unloaded backend is closed only once its running generations have finished, so unloading never cuts a reply short.

``default`` names the embedded model when it is served, else the first model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from turnkit.embedded import resolve_model
from turnkit.errors import ServeConfigError, ShuttingDownError, TurnkitError
from turnkit.format import ChatFormat
from turnkit.serve.engines import EngineOptions, load_backend
from turnkit.serve.engines.base import Backend, Load
from turnkit.serve.modelspec import ModelSpec, unique
from turnkit.serve.protocol import APIError
from turnkit.serve.sampling import NEUTRAL, SamplingDefaults, model_defaults
from turnkit.template.switches import ThinkingSwitch

__all__ = ["LoadedModel", "ModelRegistry"]

log = logging.getLogger("turnkit.serve")

Loader = Callable[[ModelSpec, Path], Backend]


@dataclass
class LoadedModel:
    """A model ready to generate: its spec, format, backend and sampling defaults."""

    spec: ModelSpec
    fmt: ChatFormat
    backend: Backend
    defaults: SamplingDefaults
    last_used: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.spec.name


class ModelRegistry:
    """Models by name. ``load`` builds a backend for a spec (default: :func:`~.engines.load_backend`)."""

    def __init__(
        self,
        specs: Iterable[ModelSpec],
        *,
        max_loaded: int = 2,
        load: Loader | None = None,
        options: EngineOptions | None = None,
    ) -> None:
        self.specs = {spec.name: spec for spec in unique(specs)}
        if not self.specs:
            raise ServeConfigError("no model to serve")
        if max_loaded < 1:
            raise ServeConfigError(f"--max-loaded must be at least 1, got {max_loaded}")
        self.max_loaded = max_loaded
        self.options = options or EngineOptions()
        self._load = load or self._load_backend
        self._formats: dict[str, ChatFormat] = {}
        self._switches: dict[str, ThinkingSwitch] = {}
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()  # least recently used first
        self._locks: dict[str, asyncio.Lock] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._fixed: set[str] = set()  # models given already loaded: never unloaded
        self.refusal: ShuttingDownError | None = None  # set when the server drains: no more requests, no loading

    def _load_backend(self, spec: ModelSpec, path: Path) -> Backend:
        options = self.options if spec.context is None else replace(self.options, context=spec.context)
        return load_backend(path, engine=spec.engine, options=options)

    @classmethod
    def single(
        cls, fmt: ChatFormat, backend: Backend, *, name: str, defaults: SamplingDefaults = NEUTRAL
    ) -> ModelRegistry:
        """One model given already loaded (tests, and programs that build their own backend)."""
        spec = ModelSpec(name, f"<{name}>")
        registry = cls([spec], max_loaded=1, load=_never)
        registry._formats[name] = fmt
        registry._loaded[name] = LoadedModel(spec, fmt, backend, defaults)
        registry._fixed.add(name)
        return registry

    # -- names -----------------------------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    @property
    def default_name(self) -> str:
        embedded = [spec.name for spec in self.specs.values() if spec.embedded]
        return embedded[0] if embedded else next(iter(self.specs))

    def spec(self, name: str | None) -> ModelSpec:
        """The spec a request's ``model`` names (``None`` or ``default``: the default model); 404 for no such model."""
        if name is None or (name == "default" and "default" not in self.specs):
            name = self.default_name
        if name not in self.specs:
            raise APIError(
                404,
                f"the model {name!r} does not exist; this server serves {', '.join(map(repr, self.specs))}",
                param="model",
                code="model_not_found",
            )
        return self.specs[name]

    # -- formats and defaults (no weights) ---------------------------------------------------------------------------

    def format(self, name: str | None) -> ChatFormat:
        """The model's chat format with its tokenizer, built once; a template or family override replaces the
        checkpoint's template and keeps its tokenizer."""
        spec = self.spec(name)
        if spec.name not in self._formats:
            try:
                self._formats[spec.name] = _build_format(spec)
            except (TurnkitError, OSError) as exc:
                raise APIError(
                    503, f"the model {spec.name!r} cannot be used: {exc}", code="model_unavailable"
                ) from None
        return self._formats[spec.name]

    def thinking_switch(self, name: str | None) -> ThinkingSwitch:
        """The model's thinking switch, read from its template alone: no tokenizer is loaded for it, so ``/v1/models``
        stays cheap for models not used yet."""
        spec = self.spec(name)
        if spec.name not in self._switches:
            fmt = self._formats.get(spec.name)
            try:
                self._switches[spec.name] = (fmt or _template_only(spec)).thinking_switch()
            except (TurnkitError, OSError):
                self._switches[spec.name] = ThinkingSwitch()
        return self._switches[spec.name]

    def defaults(self, name: str | None) -> SamplingDefaults:
        """What a request to this model gets for the sampling fields it omits (see :mod:`.sampling`)."""
        spec = self.spec(name)
        if spec.name in self._loaded:
            return self._loaded[spec.name].defaults
        return _defaults(spec)

    # -- backends (weights) ------------------------------------------------------------------------------------------

    async def acquire(self, name: str | None) -> LoadedModel:
        """The loaded model, loading it first (and unloading the least recently used) when it is not."""
        spec = self.spec(name)
        if self.refusal is not None:
            raise APIError(503, str(self.refusal), code="server_shutting_down", retry_after=self.refusal.retry_after)
        lock = self._locks.setdefault(spec.name, asyncio.Lock())
        async with lock:
            model = self._loaded.get(spec.name)
            if model is None:
                fmt = self.format(spec.name)
                self._make_room()
                started = time.perf_counter()
                try:
                    backend = await asyncio.to_thread(self._load_warm, spec, fmt)
                except Exception as exc:  # any engine failure is this model's, reported to the client
                    log.exception("loading %s failed", spec.name)
                    raise APIError(
                        503, f"the model {spec.name!r} failed to load: {exc}", code="model_unavailable"
                    ) from None
                log.info("loaded %s in %.1fs", spec.name, time.perf_counter() - started)
                model = LoadedModel(spec, fmt, backend, _defaults(spec))
                self._loaded[spec.name] = model
        model.last_used = time.monotonic()
        if spec.name in self._loaded:
            self._loaded.move_to_end(spec.name)
        return model

    def preload(self, name: str | None) -> LoadedModel:
        """Load a model now, outside any event loop (the server's start, before it answers)."""
        spec = self.spec(name)
        if spec.name not in self._loaded:
            fmt = self.format(spec.name)
            backend = self._load_warm(spec, fmt)
            self._loaded[spec.name] = LoadedModel(spec, fmt, backend, _defaults(spec))
        return self._loaded[spec.name]

    def _load_warm(self, spec: ModelSpec, fmt: ChatFormat) -> Backend:
        """The spec's backend, loaded, with the format warmed (:func:`_warm`)."""
        backend = self._load(spec, resolve_model(spec.path))
        _warm(fmt)
        return backend

    def _make_room(self) -> None:
        """Unload least recently used models until one more fits (models given already loaded stay)."""
        while len(self._loaded) >= self.max_loaded:
            victim = next((n for n in self._loaded if n not in self._fixed), None)
            if victim is None:
                return
            model = self._loaded.pop(victim)
            log.info("unloading %s (at most %d models stay loaded)", victim, self.max_loaded)
            task = asyncio.get_running_loop().create_task(_close_when_idle(model.backend))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    def loads(self) -> dict[str, Load]:
        """What each loaded model's engine is doing, read once per model (``/health`` and ``/metrics`` both show
        these readings)."""
        return {name: model.backend.load_now() for name, model in self._loaded.items()}

    def drain(self, refusal: ShuttingDownError) -> None:
        """Stop admitting: new requests (and loading a model) are refused with ``refusal``; running ones go on."""
        self.refusal = refusal
        for model in self._loaded.values():
            model.backend.stop_admitting(refusal)

    def abort(self, error: ShuttingDownError) -> None:
        """End every queued and running request of every model with ``error`` (and refuse every new one with it)."""
        self.refusal = error
        for model in self._loaded.values():
            model.backend.abort(error)

    def loaded(self, name: str) -> LoadedModel | None:
        return self._loaded.get(name)

    def close(self) -> None:
        """Close every loaded backend (the server is stopping)."""
        for model in self._loaded.values():
            model.backend.close()
        self._loaded.clear()


def _never(spec: ModelSpec, path: Path) -> Backend:
    raise ServeConfigError(f"the model {spec.name!r} was given loaded and cannot be reloaded")


async def _close_when_idle(backend: Backend, poll: float = 0.1, patience: float = 3600.0) -> None:
    """Close an unloaded backend once nothing generates or waits on it (or after ``patience`` seconds)."""
    deadline = time.monotonic() + patience
    while (load := backend.load_now()).running + load.waiting and time.monotonic() < deadline:
        await asyncio.sleep(poll)
    await asyncio.to_thread(backend.close)


def _warm(fmt: ChatFormat) -> None:
    """Build now what the first reply would otherwise build while its client waits (about 0.25 s on the embedded
    model, against 0.05 s for a later request's first token): the tokenizer's byte table (every token's bytes, for
    the stream parser), the reply parser's tables, and the encoder's data tokenizer. A template that refuses the
    one-message conversation used here only leaves its part for the first request."""
    if fmt.tokenizer_loader is None:
        return
    fmt.tokenizer.byte_table  # noqa: B018 (a cached property, built here on purpose)
    fmt.stream_parser()
    with contextlib.suppress(TurnkitError):
        fmt.encode([{"role": "user", "content": "warm"}], add_generation_prompt=True)


def _template_only(spec: ModelSpec) -> ChatFormat:
    """The model's templates without its tokenizer (which a GGUF file takes seconds to give)."""
    if spec.family is not None:
        return ChatFormat.from_family(spec.family)
    if spec.template is not None:
        return ChatFormat.from_template(Path(spec.template).read_text(encoding="utf-8"))
    return ChatFormat.from_pretrained(resolve_model(spec.path))


def _build_format(spec: ModelSpec) -> ChatFormat:
    base = ChatFormat.from_pretrained(resolve_model(spec.path))
    if spec.family is not None:
        return ChatFormat.from_family(spec.family, tokenizer=base.tokenizer)
    if spec.template is not None:
        text = Path(spec.template).read_text(encoding="utf-8")
        return base.with_template(text)
    return base


def _defaults(spec: ModelSpec) -> SamplingDefaults:
    path = resolve_model(spec.path) if not spec.embedded else None
    return model_defaults(path, embedded=spec.embedded).updated(spec.sampling)
