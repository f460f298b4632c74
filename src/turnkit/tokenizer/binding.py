"""The tokenizer a ChatFormat encodes with: a ``tokenizers.Tokenizer``, its added tokens, and a twin without them.

Two tokenizers are kept:

* the checkpoint's own (``full``), which turns every added-token string in its input into that token, as
  ``apply_chat_template(tokenize=True)`` does; turnkit gives it only text in which every added-token string was
  written by the template;
* a twin with *no* added tokens at all (``data``), special or not (Qwen's ``<tool_call>`` is an added token that is not
  flagged special). Text that holds added-token strings from data is encoded with it, so ``<|im_end|>`` typed by a
  user becomes the plain text pieces ``<``, ``|``, ``im`` ... and never the control token. For byte-level BPE the twin
  is tiktoken's encoder built from the same vocab, merges and regex when that is provably exact (:mod:`.fast`);
  ``tokenizer_path`` says which path is used.

Token ids of a model family are never hard-coded: every id is resolved from the tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import tokenizers

from turnkit.errors import TokenizerError
from turnkit.tokenizer.bytetable import ByteTable
from turnkit.tokenizer.fast import FastTokenizer, build_fast_tokenizer

__all__ = ["AddedToken", "TokenizerBinding"]


@dataclass(frozen=True, slots=True)
class AddedToken:
    """An added token of the tokenizer: its text, id, whether it is flagged special, and its matching flags."""

    content: str
    id: int
    special: bool
    single_word: bool = False


class _Twin:
    """A data twin and what is derived from it alone, shared by every tokenizer that differs from it only in added
    tokens and post-processor (a template's markers added to a base vocabulary; each ``ChatFormat`` of a corpus of
    templates over one checkpoint's tokenizer): its byte table is built once per process, and its fast path is found
    by its key (:func:`~turnkit.tokenizer.fast.build_fast_tokenizer`)."""

    def __init__(self, key: str, tokenizer: tokenizers.Tokenizer) -> None:
        self.key = key
        self.tokenizer = tokenizer

    @cached_property
    def byte_table(self) -> ByteTable | None:
        """The table of the vocabulary without added tokens; each binding lays its own added tokens over it."""
        return ByteTable.from_tokenizer(self.tokenizer)


def _twin_key(backend: tokenizers.Tokenizer) -> str:
    """The SHA-256 of what the data twin of ``backend`` is made of: its model (the vocabulary and merges), normalizer,
    pre-tokenizer, decoder, truncation and padding; not its added tokens or post-processor. Read from the parts'
    own serialized state (about 20 ms for a 50k vocabulary), not by writing out and parsing the whole tokenizer.json
    (about 90 ms)."""
    digest = hashlib.sha256(backend.model.__getstate__())
    for part in (backend.normalizer, backend.pre_tokenizer, backend.decoder):
        digest.update(b"\0" + (b"-" if part is None else part.__getstate__()))
    digest.update(b"\0" + repr((backend.truncation, backend.padding)).encode())
    return digest.hexdigest()


def _state(part: Any) -> Any:
    """A tokenizer part (normalizer, pre-tokenizer, decoder) as its ``tokenizer.json`` entry, or None."""
    return None if part is None else json.loads(part.__getstate__())


#: Data twins built in this process by :func:`_twin_key`, oldest first (`TokenizerBinding.data_tokenizer`).
_TWINS: dict[str, _Twin] = {}
_TWINS_KEPT = 8


class TokenizerBinding:
    """A ``tokenizers.Tokenizer`` prepared for safe chat encoding.

    Build it from a ``transformers`` tokenizer, a ``tokenizers.Tokenizer``, or a folder with ``tokenizer.json``.
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, eos_ids: Iterable[int] = (), origin: str = "") -> None:
        self.backend = backend
        self.origin = origin
        self._added_tokens = backend.get_added_tokens_decoder()
        self.added: dict[str, AddedToken] = {}
        for token_id, token in sorted(self._added_tokens.items()):
            content = str(token.content)
            if content and content not in self.added:
                self.added[content] = AddedToken(content, token_id, bool(token.special), bool(token.single_word))
        self.by_id = {t.id: t for t in self.added.values()}
        self.eos_ids = frozenset(eos_ids)
        longest_first = sorted(self.added.values(), key=lambda t: len(t.content), reverse=True)
        alternatives = [
            rf"(?<!\w){re.escape(t.content)}(?!\w)" if t.single_word else re.escape(t.content) for t in longest_first
        ]
        #: Matches any added-token string, leftmost-longest, as the tokenizer's added vocabulary matches them.
        self.added_pattern = re.compile("|".join(alternatives) or "(?!)")

    # -- construction ---------------------------------------------------------------------------------------------

    @classmethod
    def from_any(cls, tokenizer: Any, *, eos_ids: Iterable[int] = ()) -> TokenizerBinding:
        """From a ``transformers`` (fast) tokenizer, a ``tokenizers.Tokenizer`` or a ``TokenizerBinding``."""
        if isinstance(tokenizer, TokenizerBinding):
            return tokenizer
        if isinstance(tokenizer, tokenizers.Tokenizer):
            return cls(tokenizer, eos_ids=eos_ids, origin="tokenizers.Tokenizer")
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if isinstance(backend, tokenizers.Tokenizer):
            ids = set(eos_ids)
            eos = getattr(tokenizer, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            return cls(backend, eos_ids=ids, origin=str(getattr(tokenizer, "name_or_path", type(tokenizer).__name__)))
        raise TokenizerError(
            f"cannot encode with a {type(tokenizer).__name__}: give a fast transformers tokenizer (with a "
            "backend_tokenizer) or a tokenizers.Tokenizer"
        )

    @classmethod
    def from_gguf(cls, path: str | Path) -> TokenizerBinding:
        """The tokenizer of a GGUF file, as transformers reads it, converted once and cached.

        transformers needs seconds to rebuild a tokenizer from GGUF metadata; the ``tokenizer.json`` it produces is
        kept in the cache (keyed by the file's path, size and modification time) and later loads read it directly.
        """
        from turnkit.cache import build_folder, cache_dir, file_key
        from turnkit.template.sources import read_gguf_metadata

        path = Path(path).resolve()
        eos_ids = set(read_gguf_metadata(path)["eos_ids"])

        def convert(scratch: Path) -> None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise TokenizerError("reading a tokenizer out of a GGUF file needs transformers") from None
            try:
                loaded = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            except Exception as exc:  # noqa: BLE001 - transformers raises many types for unusable files
                raise TokenizerError(f"cannot read the tokenizer of {path}: {exc}") from None
            loaded.save_pretrained(scratch)

        folder = build_folder(cache_dir() / "tokenizers" / file_key(path), convert)
        backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        return cls(backend, eos_ids=eos_ids, origin=str(path))

    @classmethod
    def from_folder(cls, folder: str | Path, *, gguf_file: str | None = None) -> TokenizerBinding:
        """Load a tokenizer the way transformers loads it (``AutoTokenizer``), for a folder or a GGUF file.

        transformers is used when installed because it adjusts some backends on load (prefix spaces, legacy
        flags); without it, ``tokenizer.json`` is read directly.
        """
        folder = Path(folder)
        eos_ids = _generation_eos_ids(folder)
        try:
            from transformers import AutoTokenizer
        except ImportError:
            have_transformers = False
        else:
            have_transformers = True
        if have_transformers:
            try:
                kwargs = {"gguf_file": gguf_file} if gguf_file else {}
                loaded = AutoTokenizer.from_pretrained(folder, **kwargs)
            except Exception as exc:  # noqa: BLE001 - transformers raises many types for unusable folders
                raise TokenizerError(f"cannot load the tokenizer of {folder / (gguf_file or '')}: {exc}") from None
            return cls.from_any(loaded, eos_ids=eos_ids)
        if gguf_file:
            raise TokenizerError("reading a tokenizer out of a GGUF file needs transformers (pip install transformers)")
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{folder} has no tokenizer.json (and transformers is not installed)")
        return cls(tokenizers.Tokenizer.from_file(str(path)), eos_ids=eos_ids, origin=str(folder))

    # -- the two tokenizers ---------------------------------------------------------------------------------------

    @cached_property
    def tokenizer_json(self) -> dict[str, Any]:
        """The backend's ``tokenizer.json``, parsed (a 50k vocabulary takes about 55 ms of CPU to write out and
        parse); read only where a data twin is first built."""
        return json.loads(self.backend.to_str())

    @cached_property
    def _twin(self) -> _Twin:
        key = _twin_key(self.backend)
        twin = _TWINS.get(key)
        if twin is None:
            if len(_TWINS) >= _TWINS_KEPT:
                del _TWINS[next(iter(_TWINS))]
            text = json.dumps({**self.tokenizer_json, "added_tokens": [], "post_processor": None})
            twin = _TWINS[key] = _Twin(key, tokenizers.Tokenizer.from_str(text))
        return twin

    @cached_property
    def data_tokenizer(self) -> tokenizers.Tokenizer:
        """The twin with no added tokens, as a ``tokenizers.Tokenizer``: encodes any text as plain text.

        Copies of one tokenizer that differ only in added tokens (a template's markers added to a base vocabulary)
        have the same twin, so it is built once per process (about 100 ms for a 50k vocabulary) and shared, as the
        fast path and the byte table built from it are; nothing here changes a twin after it is built."""
        return self._twin.tokenizer

    @cached_property
    def _fast(self) -> tuple[FastTokenizer | None, str]:
        return build_fast_tokenizer(self._twin.tokenizer, key=self._twin.key)

    @property
    def data(self) -> FastTokenizer | tokenizers.Tokenizer:
        """What encodes data text (every added token disabled): the exact fast path when the tokenizer has one,
        else the ``tokenizers`` twin. Both have ``encode``/``encode_batch(texts, add_special_tokens=False)``."""
        return self._fast[0] or self.data_tokenizer

    @property
    def fast_path(self) -> FastTokenizer | None:
        """The tiktoken path for data text, or None when it is not provably exact for this tokenizer."""
        return self._fast[0]

    @property
    def tokenizer_path(self) -> str:
        """Which path encodes data text, and why: ``tiktoken (...)`` or ``tokenizers (reason)``."""
        return self._fast[1]

    @cached_property
    def byte_table(self) -> ByteTable | None:
        """The bytes of every token id, for decoding a stream in constant time per token (None if unsupported)."""
        table = self._twin.byte_table
        if table is None:
            return None
        return table.with_added({token_id: str(token.content) for token_id, token in self._added_tokens.items()})

    def encode(self, text: str) -> tokenizers.Encoding:
        """Encode text in which every added-token string is meant as that token (template text)."""
        return self.backend.encode(text, add_special_tokens=False)

    def encode_as_text(self, text: str) -> Any:
        """Encode text with every added token disabled: nothing in it can become a control token (an object with
        ``ids`` and ``char_to_token``, from the fast path or ``tokenizers``)."""
        return self.data.encode(text, add_special_tokens=False)

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        found = self.added.get(token)
        return found.id if found else self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    @cached_property
    def segment_safe(self) -> bool:
        """Whether text may be cut at added tokens and encoded piece by piece with the same result.

        The tokenizer itself splits its input at added tokens before anything else, so this holds unless an added
        token swallows neighbouring whitespace (lstrip/rstrip) or the pre-tokenizer treats the start of the input
        specially (a Metaspace "first" prefix, a prefix space added to every input).
        """
        if any(token.lstrip or token.rstrip for token in self._added_tokens.values()):
            return False
        text = json.dumps(_state(self.backend.pre_tokenizer)) + json.dumps(_state(self.backend.normalizer))
        return '"prepend_scheme": "first"' not in text and '"add_prefix_space": true' not in text


def _generation_eos_ids(folder: Path) -> set[int]:
    """The ``eos_token_id`` of ``generation_config.json`` (an int or a list), which often lists end-of-turn ids."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return set()
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int)}
    return set()
