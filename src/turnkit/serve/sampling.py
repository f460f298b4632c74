"""Sampling values: a model's defaults, and what a request asks for on top of them.

A request that omits a sampling field gets the model's default, not OpenAI's: a small chat model sampled at
temperature 1.0 answers with gibberish. The defaults come, in this order, from the models file (per model), the
model's own recommendation (a folder's ``generation_config.json`` as transformers reads it, ``do_sample: false``
meaning greedy; a GGUF file's ``general.sampling.*`` metadata as llama.cpp reads it), and for the embedded SmolLM2,
recognised by its content wherever the file lies, the values its model card recommends (temperature 0.2, top_p 0.9).
``/v1/models`` shows them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from turnkit.serve.request_fields import SamplerValues, samplers

__all__ = ["EMBEDDED_DEFAULTS", "NEUTRAL", "SamplingDefaults", "model_defaults", "read_generation_config"]

log = logging.getLogger("turnkit.serve")


@dataclass(frozen=True, kw_only=True)
class SamplingDefaults(SamplerValues):
    """The sampler values a request gets for each sampler it leaves out (every sampler declared in
    :mod:`turnkit.serve.request_fields` has one). The neutral values change nothing."""

    def to_dict(self) -> dict[str, float]:
        """The samplers by name, in their declaration's order (``/v1/models`` shows a model's defaults so)."""
        return {name: getattr(self, name) for name, _ in samplers()}

    def updated(self, values: Mapping[str, Any]) -> SamplingDefaults:
        """These defaults with ``values`` (only samplers; None is left as it is) laid over them, each as its neutral
        value's type (``top_k`` a whole number)."""
        neutral = SamplerValues()
        known = {
            name: type(getattr(neutral, name))(values[name]) for name, _ in samplers() if values.get(name) is not None
        }
        return replace(self, **known)


#: OpenAI's own defaults: nothing changed.
NEUTRAL = SamplingDefaults()

#: SmolLM2-135M-Instruct's model card: "temperature=0.2, top_p=0.9".
EMBEDDED_DEFAULTS = SamplingDefaults(temperature=0.2, top_p=0.9)


def read_generation_config(path: str | Path) -> dict[str, Any]:
    """The sampling values of a model folder's ``generation_config.json`` (none for a GGUF file or a missing file).

    ``do_sample: false`` makes transformers decode greedily whatever the temperature says, so it reads as
    temperature 0. A file that cannot be read is logged and ignored: it is an optional hint, not the model.
    """
    config = Path(path) / "generation_config.json"
    if not config.is_file():
        return {}
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", config, exc)
        return {}
    if not isinstance(data, dict):
        return {}
    out = {
        key: data[key]
        for key in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
        if isinstance(data.get(key), int | float) and not isinstance(data.get(key), bool)
    }
    if data.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


#: llama.cpp's ``general.sampling.*`` GGUF keys, by the request field each sets.
_GGUF_KEYS = {
    "temp": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "penalty_repeat": ("repetition_penalty"),
}


def read_gguf_sampling(path: str | Path) -> dict[str, Any]:
    """The sampling values a GGUF file recommends in its metadata (none when it carries none)."""
    from turnkit.template.sources import read_gguf_metadata

    recommended = read_gguf_metadata(path).get("sampling") or {}
    return {field: recommended[key] for key, field in _GGUF_KEYS.items() if key in recommended}


def model_defaults(path: Path | None, *, embedded: bool = False) -> SamplingDefaults:
    """The sampling defaults of the model at ``path``: what it recommends itself, over the embedded model's card
    values when it is the embedded model (``embedded``, or the same file by content), else over the neutral ones."""
    from turnkit.embedded import is_embedded_file

    if path is None:
        return EMBEDDED_DEFAULTS if embedded else NEUTRAL
    start = EMBEDDED_DEFAULTS if embedded or is_embedded_file(path) else NEUTRAL
    if path.is_dir():
        return start.updated(read_generation_config(path))
    if path.suffix.lower() == ".gguf" and path.is_file():
        return start.updated(read_gguf_sampling(path))
    return start
