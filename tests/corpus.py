"""Real chat templates for differential tests, read from outside the repository (third-party data is never copied in).

Two sources, both optional, each skipped with a reason when unavailable:

* ``../shared/conformance/templates/*.jinja`` (and ``extra/``), with ``manifest.json`` for bos/eos;
* llama.cpp's collection of real model templates (``models/templates/*.jinja``), read out of the
  ``llama-cpp-python`` source distribution on PyPI, fetched once with ``pip download`` into the test cache.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from turnkit.cache import cache_dir

SHARED = Path(__file__).resolve().parents[2] / "shared"
CONFORMANCE = SHARED / "conformance"
LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"


@dataclass(frozen=True)
class CorpusTemplate:
    name: str
    source: str
    bos_token: str
    eos_token: str

    def __repr__(self) -> str:
        return self.name


# Where no manifest says, guess bos/eos from the markers a template writes; the exact values only need to be the
# same on both sides of a differential test, but realistic ones exercise realistic renders.
_BOS_GUESSES = ("<|begin_of_text|>", "<｜begin▁of▁sentence｜>", "<bos>", "[gMASK]", "<s>")
_EOS_GUESSES = (
    "<|eot_id|>",
    "<|im_end|>",
    "<｜end▁of▁sentence｜>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
    "<|endoftext|>",
)


def _guess(source: str, options: tuple[str, ...], default: str) -> str:
    return next((o for o in options if o in source), default)


def _token(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def conformance_templates() -> list[CorpusTemplate]:
    folder = CONFORMANCE / "templates"
    if not folder.is_dir():
        return []
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        manifest_path = CONFORMANCE / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    entries = manifest.get("templates", manifest) if isinstance(manifest, dict) else manifest
    if isinstance(entries, list):  # a list of records naming their template file
        entries = {str(e.get("file") or e.get("name") or e.get("id")): e for e in entries if isinstance(e, dict)}
    if not isinstance(entries, dict):
        entries = {}
    out = []
    for path in sorted([*folder.glob("*.jinja"), *folder.glob("extra/*.jinja")]):
        source = path.read_text(encoding="utf-8")
        relative = str(path.relative_to(folder))
        info = entries.get(path.stem) or entries.get(path.name) or entries.get(relative) or {}
        info = info if isinstance(info, dict) else {}
        out.append(
            CorpusTemplate(
                f"conformance/{path.relative_to(folder)}",
                source,
                _token(info.get("bos_token")) or _guess(source, _BOS_GUESSES, "<s>"),
                _token(info.get("eos_token")) or _guess(source, _EOS_GUESSES, "</s>"),
            )
        )
    return out


def llamacpp_template_dir() -> Path | None:
    """llama.cpp's real templates, extracted once from the llama-cpp-python sdist (None when it cannot be fetched)."""
    target = cache_dir() / "test-corpus" / "llama.cpp-templates"
    if target.is_dir() and any(target.glob("*.jinja")):
        return target
    download = cache_dir() / "test-corpus" / "download"
    download.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q"]
    result = subprocess.run([*command, "-d", str(download), LLAMA_CPP_SDIST], capture_output=True, timeout=900)
    archives = sorted(download.glob("llama_cpp_python-*.tar.gz"))
    if result.returncode != 0 or not archives:
        return None
    partial = target.with_name("llama.cpp-templates.partial")
    partial.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archives[-1]) as archive:
        for member in archive.getmembers():
            if "/models/templates/" in member.name and member.name.endswith(".jinja") and member.isfile():
                data = archive.extractfile(member).read()
                (partial / Path(member.name).name).write_bytes(data)
    partial.rename(target)
    for archive_path in archives:
        archive_path.unlink()
    return target


def llamacpp_templates() -> list[CorpusTemplate]:
    folder = llamacpp_template_dir()
    if folder is None:
        return []
    out = []
    for path in sorted(folder.glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        out.append(
            CorpusTemplate(
                f"llama.cpp/{path.name}",
                source,
                _guess(source, _BOS_GUESSES, "<s>"),
                _guess(source, _EOS_GUESSES, "</s>"),
            )
        )
    return out


def all_templates() -> list[CorpusTemplate]:
    return conformance_templates() + llamacpp_templates()


_MARKER = re.compile(
    r"<\|[A-Za-z0-9_.\-]{1,40}\|>|<｜[^｜\s]{1,40}｜>|\[/?[A-Z][A-Z_]{2,30}\]|</?s>"
    r"|<(?:start_of_turn|end_of_turn|bos|eos|tool_call|/tool_call|tool_response|/tool_response|think|/think"
    r"|START_OF_TURN_TOKEN|END_OF_TURN_TOKEN|USER_TOKEN|CHATBOT_TOKEN|SYSTEM_TOKEN)>"
)
#: Marker strings that real tokenizers hold as added tokens that are *not* special (Qwen's tool tags, reasoning tags).
NON_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


def template_markers(template: CorpusTemplate) -> list[str]:
    """The control-marker strings a template writes (plus its bos/eos), to add to a test tokenizer."""
    found = set(_MARKER.findall(template.source)) | {template.bos_token, template.eos_token}
    return sorted(m for m in found if m)


def tokenizer_with_markers(folder: Path, markers: list[str]):
    """A copy of the SmolLM2 tokenizer that also holds ``markers`` as added tokens (special unless NON_SPECIAL)."""
    from transformers import AddedToken, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    new = [AddedToken(m, special=m not in NON_SPECIAL, normalized=False) for m in markers]
    tokenizer.add_tokens(new, special_tokens=False)
    return tokenizer


def smollm2_tokenizer_folder() -> Path:
    """The SmolLM2 tokenizer as a Hugging Face folder, converted from the embedded GGUF by transformers once: loading
    a GGUF tokenizer takes seconds, a tokenizer.json milliseconds."""
    from turnkit.cache import build_folder
    from turnkit.embedded import default_model_path

    def convert(scratch: Path) -> None:
        from transformers import AutoTokenizer

        gguf = default_model_path()
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(scratch)

    return build_folder(cache_dir() / "test-corpus" / "smollm2-tokenizer", convert)
