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

__all__ = ["SPECIAL_TOKEN_NAMES", "TemplateSet", "load_gguf", "load_hf_folder"]

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


def _gguf_string(reader: Any, key: str) -> str | None:
    field_ = reader.fields.get(key)
    if field_ is None:
        return None
    value = field_.contents()
    return value if isinstance(value, str) else None


def _gguf_int(reader: Any, key: str) -> int | None:
    field_ = reader.fields.get(key)
    if field_ is None:
        return None
    value = field_.contents()
    return int(value) if isinstance(value, int) else None


def load_gguf(path: str | Path) -> TemplateSet:
    """The templates and special tokens of a GGUF file (read with the ``gguf`` package)."""
    from gguf import GGUFReader  # imported here: it pulls in numpy, and most renders never need it

    path = Path(path)
    try:
        reader = GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise TemplateNotFoundError(f"cannot read {path} as a GGUF file: {exc}") from None

    templates: dict[str, str] = {}
    default = _gguf_string(reader, "tokenizer.chat_template")
    if default is not None:
        templates["default"] = default
    prefix = "tokenizer.chat_template."
    for key in reader.fields:
        if key.startswith(prefix) and (text := _gguf_string(reader, key)) is not None:
            templates[key[len(prefix) :]] = text
    if not templates:
        raise TemplateNotFoundError(f"{path} has no tokenizer.chat_template in its metadata")

    special: dict[str, str] = {}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        for name, key in _GGUF_TOKEN_IDS.items():
            token_id = _gguf_int(reader, key)
            if token_id is not None and 0 <= token_id < len(tokens.data):
                special[name] = bytes(tokens.parts[tokens.data[token_id]]).decode("utf-8", errors="replace")
    metadata = {
        "kind": "gguf",
        "path": str(path),
        "architecture": _gguf_string(reader, "general.architecture"),
        "name": _gguf_string(reader, "general.name"),
    }
    return TemplateSet(
        templates=templates,
        single=list(templates) == ["default"],
        origin=str(path),
        special_tokens=special,
        metadata=metadata,
    )
