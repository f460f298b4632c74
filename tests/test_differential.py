"""Differential tests: turnkit's render equals ``transformers.apply_chat_template(tokenize=False)`` byte for byte,
or both raise, for every real template of the corpus x every conversation x both values of add_generation_prompt."""

from __future__ import annotations

import warnings

import pytest
from conversations import conversations
from corpus import CorpusTemplate, all_templates

from turnkit import ChatFormat, TurnkitError

TEMPLATES = all_templates()


def _oracle(tokenizer, template: CorpusTemplate, messages, tools, add_generation_prompt: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=template.source,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                bos_token=template.bos_token,
                eos_token=template.eos_token,
            )
        except Exception as exc:  # noqa: BLE001 - the oracle may raise anything; we only need "it raised"
            return exc


def _ours(fmt: ChatFormat, messages, tools, add_generation_prompt: bool):
    try:
        return fmt.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)
    except TurnkitError as exc:
        return exc


def test_the_corpus_is_there():
    if not TEMPLATES:
        pytest.skip(
            "no real templates: ../shared/conformance/templates is absent and the llama-cpp-python sdist could not "
            "be fetched from PyPI"
        )
    assert len(TEMPLATES) >= 50


def _clip(value: object) -> str:
    text = repr(value)
    return text if len(text) < 800 else text[:400] + " ... " + text[-400:]


_RESULTS: dict[str, tuple[list[str], int]] = {}


def _compare(template: CorpusTemplate, tokenizer) -> tuple[list[str], int]:
    """(mismatches, number of identical successful renders), computed once per template."""
    if template.name in _RESULTS:
        return _RESULTS[template.name]
    variables = {**tokenizer.special_tokens_map, "bos_token": template.bos_token, "eos_token": template.eos_token}
    fmt = ChatFormat.from_template(template.source, **variables)
    mismatches = []
    rendered = 0
    for name, messages, tools in conversations():
        for add_generation_prompt in (False, True):
            expected = _oracle(tokenizer, template, messages, tools, add_generation_prompt)
            actual = _ours(fmt, messages, tools, add_generation_prompt)
            if isinstance(expected, Exception) and isinstance(actual, Exception):
                continue
            if isinstance(expected, str) and expected == actual:
                rendered += 1
                continue
            mismatches.append(
                f"{name} agp={add_generation_prompt}:\n  transformers: {_clip(expected)}\n  turnkit: {_clip(actual)}"
            )
    _RESULTS[template.name] = (mismatches, rendered)
    return mismatches, rendered


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_render_matches_transformers(template: CorpusTemplate, hf_tokenizer):
    mismatches, _ = _compare(template, hf_tokenizer)
    assert not mismatches, "\n".join(mismatches[:3])


def test_most_templates_render_real_conversations(hf_tokenizer):
    """Guard against a differential test that passes because both sides raise: most templates must render."""
    if not TEMPLATES:
        pytest.skip("no corpus")
    rendered = {t.name: _compare(t, hf_tokenizer)[1] for t in TEMPLATES}
    silent = sorted(name for name, count in rendered.items() if count == 0)
    assert len(silent) <= len(TEMPLATES) // 10, f"templates that rendered no conversation: {silent}"
    assert sum(rendered.values()) >= 10 * len(TEMPLATES)
