"""What doctor audits: a checkpoint read from disk without its weights.

A target is a Hugging Face model folder, a ``.gguf`` file, ``default`` (the embedded model, a GGUF file) or a PEFT
adapter folder (``adapter_config.json``). Only configs, the tokenizer and the templates are read: ``config.json`` gives
the embedding size, so no weights file is ever opened (for a GGUF, only its header).

Everything that can fail on bad input fails here, with one line naming the file, so that the checks themselves only
ever meet a readable target: a JSON file that does not parse, a folder with no tokenizer, a truncated GGUF.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnkit.doctor.findings import DoctorInputError
from turnkit.doctor.gguf_facts import GgufFacts, read_gguf_facts
from turnkit.embedded import resolve_model
from turnkit.errors import TemplateError, TemplateNotFoundError, TurnkitError
from turnkit.format import ChatFormat

__all__ = [
    "NEEDS_IDS",
    "TEMPLATE_SUFFIXES",
    "Adapter",
    "JsonFile",
    "Target",
    "TemplateSource",
    "load_target",
    "read_json_file",
]

#: Files that hold a vocabulary; a folder with none of them has no tokenizer to audit.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tokenizer.tiktoken")


@dataclass(frozen=True)
class JsonFile:
    """A JSON config file: its label in messages (relative to the target when inside it) and its content."""

    label: str
    path: Path
    data: dict[str, Any]


@dataclass(frozen=True)
class TemplateSource:
    """One place a checkpoint keeps its default chat template, and the text there."""

    file: str
    text: str
    #: The JSON key holding it, for a template inside a JSON file.
    key: str | None = None

    @property
    def label(self) -> str:
        return f"{self.file}'s {self.key}" if self.key else self.file


@dataclass(frozen=True)
class Adapter:
    """A PEFT adapter: its ``adapter_config.json`` and, when it is a local folder, its base model."""

    config: JsonFile
    base: Path | None
    base_why: str | None = None
    #: The base model's tokenizer binding (its vocabulary is what the adapter's new tokens are compared with).
    base_tokenizer: Any = None


@dataclass(frozen=True)
class Target:
    """A checkpoint as doctor reads it."""

    given: str
    path: Path
    kind: str  # "hf", "gguf", "adapter" or "template" (a .jinja file, with a tokenizer from elsewhere or none)
    fmt: ChatFormat | None
    #: Why there is no usable template (``fmt`` is None): none found, or one that does not compile.
    no_template: str | None
    template_invalid: bool = False
    template_sources: list[TemplateSource] = field(default_factory=list)
    #: The tokenizer binding (``fmt.tokenizer``), or None for a GGUF without a template.
    tokenizer: Any = None
    tokenizer_config: JsonFile | None = None
    config: JsonFile | None = None
    generation_config: JsonFile | None = None
    gguf: GgufFacts | None = None
    adapter: Adapter | None = None

    @property
    def description(self) -> str:
        if self.kind == "template":
            return "chat template file" + (" and a tokenizer" if self.tokenizer is not None else ", no tokenizer")
        return {"hf": "Hugging Face folder", "gguf": "GGUF file", "adapter": "PEFT adapter"}[self.kind]

    def label(self, path: Path) -> str:
        """How a file is named in messages: relative to the target folder when inside it."""
        root = self.path if self.path.is_dir() else self.path.parent
        try:  # absolute, not resolved: a symlinked file inside the folder keeps its name here
            return Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()
        except ValueError:
            return str(path)


def read_json_file(path: Path, label: str) -> JsonFile:
    """A JSON object from a file, or :class:`DoctorInputError` naming the file, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DoctorInputError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DoctorInputError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(data, dict):
        raise DoctorInputError(f"{path} does not hold a JSON object")
    return JsonFile(label, path, data)


def _optional_json(folder: Path, name: str, label: str) -> JsonFile | None:
    path = folder / name
    return read_json_file(path, label) if path.is_file() else None


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def _auto_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer as transformers loads it (``tokenizers`` reads ``tokenizer.json`` without it)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        import tokenizers

        if not (folder / "tokenizer.json").is_file():
            raise DoctorInputError(f"{folder} has no tokenizer.json (and transformers is not installed)") from None
        return tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for unusable folders
        raise DoctorInputError(f"cannot load the tokenizer of {folder}: {exc}") from None


def _bare_tokenizer(folder: Path) -> Any:
    """The tokenizer binding of a folder that has no chat template (a base model), reached through a ChatFormat."""
    return ChatFormat.from_template("", tokenizer=_auto_tokenizer(folder)).tokenizer


def _template_sources(folder: Path, tokenizer_config: JsonFile | None, label: Any) -> list[TemplateSource]:
    """Every place a folder keeps a default template: the ``.jinja`` file, the JSON configs, a GGUF beside it."""
    sources = []
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        sources.append(TemplateSource(label(jinja), jinja.read_text(encoding="utf-8")))
    if tokenizer_config is not None and (text := _default_of(tokenizer_config.data.get("chat_template"))):
        sources.append(TemplateSource(tokenizer_config.label, text, "chat_template"))
    processor = _optional_json(folder, "chat_template.json", label(folder / "chat_template.json"))
    if processor is not None and (text := _default_of(processor.data.get("chat_template"))):
        sources.append(TemplateSource(processor.label, text, "chat_template"))
    for gguf in sorted(folder.glob("*.gguf")):
        facts = read_gguf_facts(gguf)
        if "default" in facts.templates:
            sources.append(TemplateSource(label(gguf), facts.templates["default"]))
    return sources


def _default_of(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item.get("name") == "default" and isinstance(item.get("template"), str):
                return item["template"]
    return None


def _format_of(folder: Path) -> tuple[ChatFormat | None, str | None, bool]:
    """``(format, why none, invalid)``: the folder's template as transformers selects it."""
    try:
        return ChatFormat.from_pretrained(folder), None, False
    except TemplateNotFoundError as exc:
        return None, str(exc), False
    except TemplateError as exc:
        return None, f"the chat template does not compile: {exc}", True


def _tokenizer_of(fmt: ChatFormat | None, folder: Path) -> Any:
    try:
        return fmt.tokenizer if fmt is not None else _bare_tokenizer(folder)
    except DoctorInputError:
        raise
    except TurnkitError as exc:
        raise DoctorInputError(f"cannot load the tokenizer of {folder}: {exc}") from None


#: The file names a chat template alone is given under (``chat_template.jinja``, a template kept beside a repo's code).
TEMPLATE_SUFFIXES = (".jinja", ".j2")


def load_target(given: str | Path, *, base: str | Path | None = None, tokenizer: str | Path | None = None) -> Target:
    """Read a checkpoint for auditing; :class:`DoctorInputError` (or another ``TurnkitError``) on bad input.

    ``base`` is a PEFT adapter's base model folder, in place of its ``base_model_name_or_path`` (a hub name there
    cannot be read: doctor reads no hub). A ``.jinja`` file is a template checked before it is released:
    ``tokenizer`` (a model folder or a ``.gguf`` file) gives it token ids and special tokens; without one, the checks
    that need ids are listed as not evaluated, saying so, and the rest run (``--runtimes`` compares the text).
    """
    path = resolve_model(given)
    if not path.exists():
        raise DoctorInputError(
            f"{path} does not exist (give a Hugging Face model folder, a .gguf file, a PEFT adapter folder, a .jinja "
            "template, or default)"
        )
    if path.is_file() and path.suffix.lower() in TEMPLATE_SUFFIXES:
        return _load_template(str(given), path, None if tokenizer is None else Path(tokenizer))
    if tokenizer is not None:
        raise DoctorInputError(
            f"--tokenizer goes with a .jinja template (turnkit doctor TEMPLATE.jinja --tokenizer PATH); {path} has "
            "its own tokenizer"
        )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise DoctorInputError(f"{path} is neither a model folder, a .gguf file nor a .jinja template")
        return _load_gguf(str(given), path)
    if (path / "adapter_config.json").is_file():
        return _load_adapter(str(given), path, Path(base) if base is not None else None)
    if base is not None:
        raise DoctorInputError(f"--base goes with a PEFT adapter folder; {path} has no adapter_config.json")
    return _load_folder(str(given), path)


def _load_gguf(given: str, path: Path) -> Target:
    facts = read_gguf_facts(path)
    fmt, why, invalid = None, None, False
    if facts.templates:
        try:
            fmt = ChatFormat.from_pretrained(path)
        except TemplateError as exc:
            why, invalid = f"the chat template does not compile: {exc}", True
    else:
        why = f"{path.name} has no tokenizer.chat_template in its metadata"
    tokenizer = None
    if fmt is not None:
        try:
            tokenizer = fmt.tokenizer
        except TurnkitError as exc:
            raise DoctorInputError(f"cannot read the tokenizer of {path}: {exc}") from None
    sources = [TemplateSource(path.name, facts.templates["default"])] if "default" in facts.templates else []
    return Target(given, path, "gguf", fmt, why, invalid, sources, tokenizer, gguf=facts)


#: Why a check did not run on a template given without a tokenizer (``Context.tokenizer`` raises it).
NEEDS_IDS = "needs token ids, and a template alone has none: add --tokenizer PATH (a model folder or a .gguf file)"


def _load_template(given: str, path: Path, tokenizer_path: Path | None) -> Target:
    """A chat template file, with the special tokens and the tokenizer of ``tokenizer_path`` where given."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DoctorInputError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    special: dict[str, Any] = {}  # template variables by name (Any: the keywords of from_template they fill)
    binding = tokenizer_config = None
    if tokenizer_path is not None:
        from turnkit.template.sources import special_tokens_of
        from turnkit.tokenizer import TokenizerBinding

        tokenizer_path = resolve_model(str(tokenizer_path))
        is_gguf = tokenizer_path.is_file() and tokenizer_path.suffix.lower() == ".gguf"
        if not tokenizer_path.exists():
            raise DoctorInputError(f"--tokenizer {tokenizer_path} does not exist (give a model folder or a .gguf file)")
        if not (tokenizer_path.is_dir() and _has_tokenizer(tokenizer_path)) and not is_gguf:
            raise DoctorInputError(
                f"--tokenizer {tokenizer_path} is neither a model folder with a tokenizer nor a .gguf file"
            )
        try:
            special = special_tokens_of(tokenizer_path)
            binding = (
                TokenizerBinding.from_gguf(tokenizer_path) if is_gguf else TokenizerBinding.from_folder(tokenizer_path)
            )
        except TurnkitError as exc:
            raise DoctorInputError(f"cannot load the tokenizer of {tokenizer_path}: {exc}") from None
        if not is_gguf:
            config_path = tokenizer_path / "tokenizer_config.json"
            tokenizer_config = read_json_file(config_path, str(config_path)) if config_path.is_file() else None
    fmt, why, invalid = None, None, False
    try:
        fmt = ChatFormat.from_template(text, tokenizer=binding, **special)
    except TemplateError as exc:
        why, invalid = f"the chat template does not compile: {exc}", True
    sources = [TemplateSource(path.name, text)]
    return Target(given, path, "template", fmt, why, invalid, sources, binding, tokenizer_config)


def _load_folder(given: str, folder: Path) -> Target:
    if not _has_tokenizer(folder):
        raise DoctorInputError(
            f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES[:3])}): not a model folder doctor can audit"
        )
    draft = Target(given, folder, "hf", None, None)
    tokenizer_config = _optional_json(folder, "tokenizer_config.json", "tokenizer_config.json")
    config = _optional_json(folder, "config.json", "config.json")
    generation = _optional_json(folder, "generation_config.json", "generation_config.json")
    _optional_json(folder, "special_tokens_map.json", "special_tokens_map.json")  # unreadable: say so now
    sources = _template_sources(folder, tokenizer_config, draft.label)
    fmt, why, invalid = _format_of(folder)
    tokenizer = _tokenizer_of(fmt, folder)
    return Target(given, folder, "hf", fmt, why, invalid, sources, tokenizer, tokenizer_config, config, generation)


def _base_folder(adapter_folder: Path, name: Any, given: Path | None) -> tuple[Path | None, str | None]:
    if given is not None:
        if not given.is_dir():
            raise DoctorInputError(f"--base {given} is not a folder (give the base model's Hugging Face folder)")
        return given, None
    if not isinstance(name, str) or not name:
        return None, "adapter_config.json names no base_model_name_or_path"
    for candidate in (Path(name), adapter_folder / name):
        if candidate.is_dir():
            return candidate, None
    return None, f"base_model_name_or_path {name!r} is not a local folder (doctor reads no hub)"


def _has_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "additional_chat_templates").is_dir():
        return True
    config = _optional_json(folder, "tokenizer_config.json", "tokenizer_config.json")
    return config is not None and "chat_template" in config.data


def _load_adapter(given: str, folder: Path, base_given: Path | None) -> Target:
    """An adapter's own tokenizer and template when it saved them, else its base's; configs from the base."""
    draft = Target(given, folder, "adapter", None, None)
    adapter_config = read_json_file(folder / "adapter_config.json", "adapter_config.json")
    base, base_why = _base_folder(folder, adapter_config.data.get("base_model_name_or_path"), base_given)
    tokenizer_folder = folder if _has_tokenizer(folder) else base
    if tokenizer_folder is None or not _has_tokenizer(tokenizer_folder):
        raise DoctorInputError(
            f"the adapter {folder} has no tokenizer files and its base has none either ({base_why or base}); save "
            "the tokenizer next to the adapter"
        )
    template_folder = folder if _has_template(folder) or base is None else base

    def first(name: str, *folders: Path | None) -> JsonFile | None:
        for where in folders:
            if where is not None and (where / name).is_file():
                return read_json_file(where / name, draft.label(where / name))
        return None

    tokenizer_config = first("tokenizer_config.json", tokenizer_folder)
    template_config = first("tokenizer_config.json", template_folder)
    sources = _template_sources(template_folder, template_config, draft.label)
    fmt, why, invalid = _format_of(template_folder)
    if fmt is not None and template_folder != tokenizer_folder:
        fmt = fmt.with_tokenizer(_auto_tokenizer(tokenizer_folder))
    tokenizer = _tokenizer_of(fmt, tokenizer_folder)
    base_tokenizer = None
    if base is not None and _has_tokenizer(base):
        base_tokenizer = tokenizer if base == tokenizer_folder else _tokenizer_of(None, base)
    return Target(
        given,
        folder,
        "adapter",
        fmt,
        why,
        invalid,
        sources,
        tokenizer,
        tokenizer_config,
        first("config.json", folder, base),
        first("generation_config.json", folder, base),
        adapter=Adapter(adapter_config, base, base_why, base_tokenizer),
    )
