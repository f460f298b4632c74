"""Peer test vectors: llama.cpp's and huggingface.js's expected renders, read as ``../shared/conformance/README.md``
documents them (``peers/llamacpp_cases.json``, ``peers/hfjs_jinja_e2e_cases.json``).

Every case: turnkit equals transformers (the oracle) byte for byte, or both raise. Then transformers (and so turnkit)
equals the peer's expected render, except the cases listed below with the reason, and the lists are exact (a listed
case that starts to match fails, so they cannot go stale). No case is skipped.

The oracle is ``apply_chat_template`` through a tokenizer that holds no special tokens, so the template sees the
variables the case gives and nothing else, as the peers render them.
"""

from __future__ import annotations

import datetime as dt
import warnings
from typing import Any

from corpus import bare_tokenizer, peer_file

from turnkit import ChatFormat, TurnkitError

#: llama.cpp cases whose Jinja expectation transformers does not reproduce, with why. The corpus marks each with
#: ``matches_hf_style_jinja2_render: false`` (or a null expectation), and this list must equal that set.
LLAMACPP_DIFFERENCES = {
    "mistralai/Mistral-7B-Instruct-v0.2 (NOTE: Old pre-v1 without a system prompt)": "the template rejects a "
    "system message (raise_exception); llama.cpp's polyfill merges it into the first user turn",
    "google/gemma-7b-it": "the template raises 'System role not supported'; llama.cpp's polyfill merges the system "
    "message into the first user turn",
    "OrionStarAI/Orion-14B-Chat": "the template ignores the system message; llama.cpp's polyfill prepends it to the "
    "first user turn",
    "Phi-3-mini": "the template drops the system message; llama.cpp's polyfill merges it into the first user turn",
    "Phi-3-medium": "the template drops the system message; llama.cpp's polyfill merges it into the first user turn",
    "yandex/YandexGPT-5-Lite-8B-instruct": "the template ignores the system message; llama.cpp's polyfill merges it",
    "ai-sage/GigaChat-20B-A3B-instruct": "llama.cpp does not run it with Jinja (supported_with_jinja false, no "
    "expectation); the template reads `additional_special_tokens`, which the case does not give, so both raise",
}

#: huggingface.js cases whose expectation transformers does not reproduce, with why.
HFJS_DIFFERENCES = {
    "MadeAgents/Hammer2.1": "huggingface.js prints a list the JavaScript way (JSON), Python's Jinja prints its repr "
    "(the corpus marks it matches_hf_style_jinja2_render: false)",
    "meetkai/functionary-medium-v2.2": "apply_chat_template drops message keys whose value is None (content: null "
    "on a tool-call turn); the template then concatenates the undefined content and raises, in transformers and "
    "turnkit alike, where huggingface.js keeps null",
    "ai21labs/AI21-Jamba-Large-1.6": "the case does not pass add_generation_prompt and the template defaults an "
    "undefined one to true; apply_chat_template always defines it (false), so no generation prompt",
}


def _render_both(template: str, context: dict[str, Any]) -> tuple[str | Exception, str | Exception]:
    """(transformers, turnkit) for ``context``: all template variables, messages/tools/documents included."""
    variables = dict(context)
    messages, tools, documents = (
        variables.pop("messages"),
        variables.pop("tools", None),
        variables.pop("documents", None),
    )
    agp = variables.pop("add_generation_prompt", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            theirs = bare_tokenizer().apply_chat_template(
                messages,
                tools=tools,
                documents=documents,
                chat_template=template,
                tokenize=False,
                add_generation_prompt=agp,
                **variables,
            )
        except Exception as exc:  # noqa: BLE001 - only "it raised" matters
            theirs = exc
    try:
        ours = ChatFormat.from_template(template).render(
            messages, tools=tools, documents=documents, add_generation_prompt=agp, **variables
        )
    except TurnkitError as exc:
        ours = exc
    return theirs, ours


def _problem(name: str, theirs, ours, expected: str | None, differences: dict[str, str]) -> str | None:
    """What is wrong with one case, or None."""
    both_raise = isinstance(theirs, Exception) and isinstance(ours, Exception)
    if not both_raise and not (isinstance(theirs, str) and ours == theirs):
        return f"{name}: transformers {theirs!r:.400} / turnkit {ours!r:.400}"
    if name in differences and theirs == expected:
        return f"{name} now matches the peer's expectation: remove it from the stated differences"
    if name not in differences and theirs != expected:
        return f"{name}: transformers and turnkit {theirs!r:.400} / the peer expects {expected!r:.400}"
    return None


def test_llamacpp_cases():
    """The 36 automated cases of llama.cpp's test-chat-template.cpp: messages = the shared conversation + the case's
    extra_messages, add_generation_prompt and bos/eos from the case."""
    data = peer_file("llamacpp_cases.json")
    assert len(data["cases"]) == 36
    problems = []
    for case in data["cases"]:
        context = {
            "messages": [*data["messages"], *case["extra_messages"]],
            "add_generation_prompt": case["add_generation_prompt"],
            "bos_token": case["bos_token"],
            "eos_token": case["eos_token"],
        }
        theirs, ours = _render_both(case["template"], context)
        problems.append(_problem(case["name"], theirs, ours, case["expected_output"], LLAMACPP_DIFFERENCES))
    assert not any(problems), "\n".join(p for p in problems if p)
    # the corpus's own flag agrees with the list: the differences are the cases jinja2 alone does not reproduce
    assert {c["name"] for c in data["cases"] if not c["matches_hf_style_jinja2_render"]} == set(LLAMACPP_DIFFERENCES)


class _FrozenClock(dt.datetime):
    """``datetime`` whose now() is the corpus's ``now`` (huggingface.js freezes the clock for strftime_now)."""

    frozen: dt.datetime

    @classmethod
    def now(cls, tz=None):
        return cls.frozen if tz is None else cls.frozen.astimezone(tz)


def test_hfjs_cases(monkeypatch):
    """The 53 render cases of huggingface.js's e2e tests: the whole ``context`` as the template variables (a key that
    is absent is not passed), the clock frozen at ``now`` on both sides."""
    import transformers.utils.chat_template_utils as hf_templates

    import turnkit.template.sandbox as sandbox

    data = peer_file("hfjs_jinja_e2e_cases.json")
    assert len(data["cases"]) == 53
    _FrozenClock.frozen = dt.datetime.fromisoformat(data["now"].replace("Z", "+00:00")).replace(tzinfo=None)
    monkeypatch.setattr(hf_templates, "datetime", _FrozenClock)
    monkeypatch.setattr(sandbox, "datetime", _FrozenClock)
    problems = []
    for case in data["cases"]:
        theirs, ours = _render_both(case["template"], case["context"])
        problems.append(_problem(case["name"], theirs, ours, case["expected_output"], HFJS_DIFFERENCES))
    assert not any(problems), "\n".join(p for p in problems if p)
    flagged = {c["name"] for c in data["cases"] if not c["matches_hf_style_jinja2_render"]}
    assert flagged <= set(HFJS_DIFFERENCES)
