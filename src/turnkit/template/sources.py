"""Where chat templates come from: a Hugging Face model folder, a GGUF file, or text.

A checkpoint can carry several templates. They are read exactly as transformers reads them:

* ``chat_template.jinja`` at the folder root is the template named ``default``; every
  ``additional_chat_templates/<name>.jinja`` is added under ``<name>``. When any such file exists, the
  ``chat_template`` entry of ``tokenizer_config.json`` is ignored.
* Otherwise ``tokenizer_config.json``'s ``chat_template`` is used: a string, or a legacy list of
  ``{"name": ..., "template": ...}``.
* A GGUF file keeps its template in the metadata key ``tokenizer.chat_template`` (and named ones, as llama.cpp writes
  them, in ``tokenizer.chat_template.<name>``); its special tokens are token ids that are looked up in
  ``tokenizer.ggml.tokens``.

Selection (:meth:`TemplateSet.select`): an explicit name wins, else ``tool_use`` when tools are passed, else
``default``, else an error that lists the names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnkit.errors import TemplateNotFoundError

__all__ = [
    "SPECIAL_TOKEN_NAMES",
    "TemplateSet",
    "gguf_cache_file",
    "load_gguf",
    "load_hf_folder",
    "open_gguf",
    "read_gguf_metadata",
    "special_tokens_of",
]

#: The named special tokens transformers passes to every template as variables (``special_tokens_map``).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

_GGUF_TOKEN_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


@dataclass(frozen=True)
class TemplateSet:
    """The chat templates of one checkpoint: one unnamed template, or several named ones."""

    templates: Mapping[str, str]
    single: bool = True
    origin: str = "<text>"
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"TemplateSet(origin={self.origin!r}, names={self.names})"

    @property
    def names(self) -> list[str]:
        return sorted(self.templates)

    def select(self, name: str | None = None, *, tools: object = None) -> tuple[str, str]:
        """``(name, source)`` of the template to render, chosen as transformers chooses."""
        if name is not None:
            if name in self.templates:
                return name, self.templates[name]
            raise TemplateNotFoundError(f"{self.origin} has no chat template named {name!r}; it has {self.names}")
        if self.single:
            ((only_name, source),) = self.templates.items()
            return only_name, source
        if tools is not None and "tool_use" in self.templates:
            return "tool_use", self.templates["tool_use"]
        if "default" in self.templates:
            return "default", self.templates["default"]
        raise TemplateNotFoundError(
            f"{self.origin} has several chat templates and none is named 'default'; pass template_name= one of "
            f"{self.names}"
        )


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]  # a serialised AddedToken
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TemplateNotFoundError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise TemplateNotFoundError(f"{path} does not hold a JSON object")
    return data


def _special_tokens_of_folder(folder: Path, config: Mapping[str, Any]) -> dict[str, str]:
    tokens = {name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name))) is not None}
    legacy_map = folder / "special_tokens_map.json"
    if "added_tokens_decoder" not in config and legacy_map.is_file():
        # Older folders: transformers merges special_tokens_map.json over the config in this case only.
        for name, value in _read_json(legacy_map).items():
            if name in SPECIAL_TOKEN_NAMES and (text := _token_text(value)) is not None:
                tokens[name] = text
    return tokens


def special_tokens_of(path: str | Path) -> dict[str, str]:
    """The named special tokens (``bos_token``, ``eos_token`` ...) of a Hugging Face folder or a GGUF file, whether
    or not it has a chat template: what a template from elsewhere is rendered with over that checkpoint's tokenizer
    (``turnkit doctor TEMPLATE.jinja --tokenizer PATH``)."""
    path = Path(path)
    if path.is_dir():
        config_path = path / "tokenizer_config.json"
        return _special_tokens_of_folder(path, _read_json(config_path) if config_path.is_file() else {})
    return dict(read_gguf_metadata(path)["special_tokens"])


def load_hf_folder(folder: str | Path) -> TemplateSet:
    """The templates and special tokens of a Hugging Face model (or tokenizer) folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TemplateNotFoundError(f"{folder} is not a folder")
    config_path = folder / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}

    files: dict[str, str] = {}
    default_file = folder / "chat_template.jinja"
    if default_file.is_file():
        files["default"] = default_file.read_text(encoding="utf-8")
    extra_dir = folder / "additional_chat_templates"
    if extra_dir.is_dir():
        for path in sorted(extra_dir.glob("*.jinja")):
            files[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")

    origin = str(folder)
    if files:
        templates, single = files, list(files) == ["default"]
    else:
        raw = config.get("chat_template")
        if isinstance(raw, str):
            templates, single = {"default": raw}, True
        elif isinstance(raw, list) and all(isinstance(t, Mapping) for t in raw):
            templates, single = {t["name"]: t["template"] for t in raw}, False
        else:
            raise TemplateNotFoundError(
                f"{folder} has no chat template (no chat_template.jinja, no additional_chat_templates/, and no "
                "chat_template in tokenizer_config.json); pass one with ChatFormat.from_template or pick a family"
            )
    return TemplateSet(
        templates=templates,
        single=single,
        origin=origin,
        special_tokens=_special_tokens_of_folder(folder, config),
        metadata={"kind": "hf", "path": origin},
    )


def _gguf_value(reader: Any, key: str) -> Any:
    field_ = reader.fields.get(key)
    return None if field_ is None else field_.contents()


_SAMPLING_PREFIX = "general.sampling."


def open_gguf(path: str | Path) -> Any:
    """A ``GGUFReader`` over ``path``, or one error line saying why the file cannot be read as GGUF.

    The ``gguf`` package reads whatever bytes it is given: a file cut inside its header makes it fail with an
    ``IndexError``, a ``ValueError`` about numpy dtypes or a reshape, depending on where the cut falls, none of
    which says "truncated". So the magic is checked first (a file that is not GGUF at all is told so), and any
    failure of the reader after it is reported as a cut or corrupt file, with its size and the reader's own words.

    Raises:
        TemplateNotFoundError: The file cannot be opened, is not GGUF, or is truncated or corrupt.
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            magic = file.read(4)
        size = path.stat().st_size
    except OSError as exc:
        raise TemplateNotFoundError(f"cannot read {path}: {exc.strerror}") from None
    if magic != b"GGUF":
        if not magic:
            raise TemplateNotFoundError(f"{path} is not a GGUF file: it is empty")
        if b"GGUF".startswith(magic):
            raise TemplateNotFoundError(f"{path} is not a readable GGUF file: it is truncated ({size} bytes)")
        raise TemplateNotFoundError(f"{path} is not a GGUF file: it starts with {magic!r}, not b'GGUF'")
    from gguf import GGUFReader  # imported here: it pulls in numpy, and most renders never need it

    try:
        return GGUFReader(path)
    except Exception as exc:  # noqa: BLE001 - the reader fails on cut bytes with whatever numpy raises first
        raise TemplateNotFoundError(
            f"{path} is not a readable GGUF file: it is truncated or corrupt ({size:,} bytes; the gguf reader "
            f"stopped with {type(exc).__name__}: {exc})"
        ) from None


def gguf_cache_file(folder: str, path: Path) -> Path:
    """Where what is read from the GGUF file ``path`` is cached: a JSON file in ``folder`` of turnkit's cache, keyed
    by the file's path, size and modification time; a file that cannot be read is :class:`TemplateNotFoundError`."""
    from turnkit.cache import cache_dir, file_key

    try:
        return cache_dir() / folder / f"{file_key(path)}.json"
    except OSError as exc:
        raise TemplateNotFoundError(f"cannot read {path}: {exc.strerror}") from None


def read_gguf_metadata(path: str | Path, reader: Any = None) -> dict[str, Any]:
    """What turnkit needs from a GGUF file's metadata: templates, special tokens, end-of-turn ids, names.

    The ``gguf`` package parses the whole file (every token and merge) in seconds, so the result is cached as JSON in
    turnkit's cache folder, keyed by the file's path, size and modification time. A caller that has the file open
    already (:func:`open_gguf`) passes its ``reader``, which is read instead of parsing the file a second time.
    """
    from turnkit.cache import write_atomically

    path = Path(path)
    cached = gguf_cache_file("gguf-metadata", path)
    if cached.is_file():
        metadata = json.loads(cached.read_text(encoding="utf-8"))
        if "sampling" in metadata:  # else written by an earlier version: read the file again
            return metadata
    if reader is None:
        reader = open_gguf(path)
    templates: dict[str, str] = {}
    default = _gguf_value(reader, "tokenizer.chat_template")
    if isinstance(default, str):
        templates["default"] = default
    prefix = "tokenizer.chat_template."
    for key in reader.fields:
        if key.startswith(prefix) and isinstance(text := _gguf_value(reader, key), str):
            templates[key[len(prefix) :]] = text
    special: dict[str, str] = {}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    eos_ids = []
    if tokens is not None:
        for name, key in _GGUF_TOKEN_IDS.items():
            token_id = _gguf_value(reader, key)
            if isinstance(token_id, int) and 0 <= token_id < len(tokens.data):
                special[name] = bytes(tokens.parts[tokens.data[token_id]]).decode("utf-8", errors="replace")
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            if isinstance(token_id := _gguf_value(reader, key), int):
                eos_ids.append(token_id)
    metadata = {
        "templates": templates,
        "special_tokens": special,
        "eos_ids": eos_ids,
        "architecture": _gguf_value(reader, "general.architecture"),
        "name": _gguf_value(reader, "general.name"),
        #: llama.cpp's recommended sampling (``general.sampling.temp``, ``.top_p`` ...), where the file carries it.
        "sampling": {
            key.removeprefix(_SAMPLING_PREFIX): value
            for key in reader.fields
            if key.startswith(_SAMPLING_PREFIX)
            and isinstance(value := _gguf_value(reader, key), int | float)
            and not isinstance(value, bool)
        },
    }
    write_atomically(cached, json.dumps(metadata).encode("utf-8"))
    return metadata


def load_gguf(path: str | Path) -> TemplateSet:
    """The templates and special tokens of a GGUF file (read with the ``gguf`` package)."""
    path = Path(path)
    metadata = read_gguf_metadata(path)
    templates = metadata["templates"]
    if not templates:
        raise TemplateNotFoundError(f"{path} has no tokenizer.chat_template in its metadata")
    return TemplateSet(
        templates=templates,
        single=list(templates) == ["default"],
        origin=str(path),
        special_tokens=metadata["special_tokens"],
        metadata={
            "kind": "gguf",
            "path": str(path),
            "architecture": metadata["architecture"],
            "name": metadata["name"],
            "eos_ids": metadata["eos_ids"],
        },
    )
