"""What doctor needs from a GGUF file beyond its templates: vocabulary size, embedding rows, BOS policy, stop ids.

The templates, special tokens and eos/eot/eom ids come from :func:`turnkit.template.sources.read_gguf_metadata`
(cached). The rest (how many tokens the vocabulary holds, how many rows ``token_embd`` has, whether llama.cpp adds
BOS to a prompt) is read here from the same header. Tensor *data* is never read: ``GGUFReader`` maps the file and only
the tensor table is looked at. Parsing the header takes seconds for a large vocabulary, so the facts are cached as
JSON in turnkit's cache folder, keyed like the metadata cache (path, size, modification time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnkit.cache import write_atomically
from turnkit.doctor.findings import DoctorInputError
from turnkit.errors import TurnkitError
from turnkit.template.sources import gguf_cache_file, open_gguf, read_gguf_metadata

__all__ = ["GgufFacts", "read_gguf_facts"]


@dataclass(frozen=True)
class GgufFacts:
    """The parts of a GGUF header the checks use."""

    templates: dict[str, str]
    special_tokens: dict[str, str]
    eos_ids: list[int]
    token_count: int | None
    embedding_rows: int | None
    add_bos_token: bool | None
    architecture: str | None


def _value(reader: Any, key: str) -> Any:
    found = reader.fields.get(key)
    return None if found is None else found.contents()


def _read_header(reader: Any) -> dict[str, Any]:
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    rows = None
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            rows = int(tensor.shape[-1])  # GGUF lists dimensions innermost first: (embedding size, vocabulary)
    add_bos = _value(reader, "tokenizer.ggml.add_bos_token")
    return {
        "token_count": None if tokens is None else len(tokens.data),
        "embedding_rows": rows,
        "add_bos_token": None if add_bos is None else bool(add_bos),
    }


def read_gguf_facts(path: Path) -> GgufFacts:
    """The facts of a GGUF file; a truncated or foreign file raises :class:`DoctorInputError` (one line).

    A file seen for the first time is parsed once, for both caches (each parse reads every token and merge)."""
    try:
        cached = gguf_cache_file("doctor-gguf", path)
        if cached.is_file():
            header = json.loads(cached.read_text(encoding="utf-8"))
            metadata = read_gguf_metadata(path)
        else:
            reader = open_gguf(path)
            metadata = read_gguf_metadata(path, reader)
            header = _read_header(reader)
            write_atomically(cached, json.dumps(header).encode())
    except TurnkitError as exc:  # its message names the file and what is wrong with it (truncated, not GGUF ...)
        raise DoctorInputError(str(exc)) from None
    return GgufFacts(
        templates=dict(metadata["templates"]),
        special_tokens=dict(metadata["special_tokens"]),
        eos_ids=list(metadata["eos_ids"]),
        architecture=metadata.get("architecture"),
        **header,
    )
