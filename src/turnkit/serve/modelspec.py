"""Which models a server offers: ``--model`` arguments, a ``--models`` folder, or a models file, as :class:`ModelSpec`.

A spec is only a description (a name, where the weights are, an optional template or family override, default
sampling values); :mod:`.models` loads it on first use. Three ways to write one:

* ``--model PATH``, ``--model NAME=PATH`` or ``--model NAME=PATH:FAMILY`` (the path ``default`` is the embedded
  model, named ``SmolLM2-135M-Instruct`` unless named otherwise; requests may always call it ``default``);
* ``--models DIR``: every ``.gguf`` file and every Hugging Face folder (one with a ``config.json``) in ``DIR``;
* a models file, TOML or JSON, one table per model::

      [models.small]
      path = "SmolLM2-135M-Instruct.Q4_1.gguf"   # relative to the file's folder; "default" is the embedded model
      family = "chatml"                          # or template = "chatml.jinja"
      temperature = 0.3                          # default sampling values for requests that omit them
      context = 32768                            # the longest request (default: --context, else the model's)

Names must be unique: two specs with one name are an error naming both, not a silent shadowing.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from turnkit import families
from turnkit.embedded import DEFAULT_MODEL
from turnkit.errors import ServeConfigError
from turnkit.serve.sampling import SamplingDefaults

__all__ = ["SAMPLING_KEYS", "ModelSpec", "from_argument", "from_directory", "from_file", "unique"]

#: Sampling values a models file may set per model: the fields of a model's defaults (the request fields of the same
#: names override them).
SAMPLING_KEYS = tuple(default.name for default in fields(SamplingDefaults))
_KEYS = frozenset({"name", "path", "family", "template", "engine", "context", *SAMPLING_KEYS})


@dataclass(frozen=True)
class ModelSpec:
    """One model a server offers. ``path`` is ``"default"`` for the embedded model; ``context`` the longest sequence
    a request may have (None: the server's ``--context``, else the model's own)."""

    name: str
    path: str
    family: str | None = None
    template: str | None = None
    engine: str | None = None
    sampling: Mapping[str, float] = field(default_factory=dict)
    context: int | None = None

    @property
    def embedded(self) -> bool:
        return self.path == "default"


def _check_family(family: str, where: str) -> str:
    if family not in families.names():
        raise ServeConfigError(f"{where}: unknown family {family!r} (known: {', '.join(families.names())})")
    return family


def _default_name(path: str) -> str:
    return (
        DEFAULT_MODEL if path == "default" else (Path(path).stem if path.lower().endswith(".gguf") else Path(path).name)
    )


def from_argument(text: str) -> ModelSpec:
    """``PATH``, ``NAME=PATH`` or ``NAME=PATH:FAMILY``. A ``:FAMILY`` tail is read as a family only when the whole
    text is not an existing path, so a path with a colon in it still works."""
    name, path = None, text
    head, sep, tail = text.partition("=")
    if sep and head and "/" not in head and not Path(text).exists():
        name, path = head, tail
    family = None
    base, colon, suffix = path.rpartition(":")
    if colon and base and "/" not in suffix and not Path(path).exists():
        path, family = base, _check_family(suffix, f"--model {text}")
    if not path:
        raise ServeConfigError(f"--model {text}: no path (write PATH, NAME=PATH or NAME=PATH:FAMILY)")
    return ModelSpec(name or _default_name(path), path, family=family)


def from_directory(folder: str | Path) -> list[ModelSpec]:
    """Every ``.gguf`` file and Hugging Face folder directly in ``folder``, named by file stem or folder name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ServeConfigError(f"--models {folder}: not a folder")
    specs = [
        ModelSpec(_default_name(str(entry)), str(entry))
        for entry in sorted(folder.iterdir())
        if (entry.is_file() and entry.suffix.lower() == ".gguf")
        or (entry.is_dir() and (entry / "config.json").is_file())
    ]
    if not specs:
        raise ServeConfigError(f"--models {folder}: no .gguf file and no Hugging Face folder (with config.json) in it")
    return specs


def from_file(path: str | Path) -> list[ModelSpec]:
    """The models of a TOML or JSON models file: ``{"models": {NAME: {...}}}`` or ``{"models": [{"name": ...}]}``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except OSError as exc:
        raise ServeConfigError(f"cannot read the models file {path}: {exc.strerror}") from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ServeConfigError(
            f"the models file {path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}"
        ) from None
    models = data.get("models") if isinstance(data, dict) else None
    if isinstance(models, dict):
        entries = [{"name": name, **entry} if isinstance(entry, dict) else entry for name, entry in models.items()]
    elif isinstance(models, list):
        entries = models
    else:
        raise ServeConfigError(f"the models file {path} needs a 'models' table (one entry per model)")
    return [_entry(entry, n, path) for n, entry in enumerate(entries)]


def _entry(entry: Any, index: int, source: Path) -> ModelSpec:
    where = f"{source}: models[{index}]"
    if not isinstance(entry, dict):
        raise ServeConfigError(f"{where} must be a table")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ServeConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    for key in ("name", "path", "family", "template", "engine"):
        if key in entry and not isinstance(entry[key], str):
            raise ServeConfigError(f"{where}.{key} must be a string")
    if "path" not in entry:
        raise ServeConfigError(f"{where} has no path")
    if "family" in entry and "template" in entry:
        raise ServeConfigError(f"{where}: give a family or a template, not both")
    sampling = {}
    for key in SAMPLING_KEYS:
        if key in entry:
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ServeConfigError(f"{where}.{key} must be a number")
            sampling[key] = float(value)
    context = entry.get("context")
    if context is not None and (isinstance(context, bool) or not isinstance(context, int) or context < 16):
        raise ServeConfigError(f"{where}.context must be a whole number of tokens (16 or more)")
    raw = entry["path"]
    path = raw if raw == "default" or Path(raw).is_absolute() else str(source.parent / raw)
    template = entry.get("template")
    if template is not None and not Path(template).is_absolute():
        template = str(source.parent / template)
    family = _check_family(entry["family"], where) if "family" in entry else None
    name = entry.get("name") or _default_name(path)
    return ModelSpec(
        name, path, family=family, template=template, engine=entry.get("engine"), sampling=sampling, context=context
    )


def unique(specs: Iterable[ModelSpec]) -> list[ModelSpec]:
    """The specs in order; a name used twice is an error that names it."""
    seen: dict[str, ModelSpec] = {}
    for spec in specs:
        if spec.name in seen:
            raise ServeConfigError(
                f"two models are named {spec.name!r} ({seen[spec.name].path} and {spec.path}); name one with NAME=PATH"
            )
        seen[spec.name] = spec
    return list(seen.values())
