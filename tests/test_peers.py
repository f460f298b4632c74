"""Peer test vectors: llama.cpp's and huggingface.js's expected renders, from ``../shared/conformance/peers/``.

For every case turnkit must equal transformers (the oracle). Where transformers itself differs from the peer's
expectation, transformers wins; those cases are listed in the test output, and the known ones are named here:

* ChatGLM3: llama.cpp expects no space where transformers' render of the template writes one;
* Hammer2.1: huggingface.js prints lists the JavaScript way, transformers the Python way.

The files are third-party data and are read in place, never copied into this repository.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from corpus import CONFORMANCE

from turnkit import ChatFormat, TurnkitError

PEER_FILES = ["llamacpp_cases.json", "hfjs_jinja_e2e_cases.json"]

_TEMPLATE_KEYS = ("template", "chat_template", "template_str", "tmpl")
_MESSAGES_KEYS = ("messages", "conversation", "chat")
_EXPECTED_KEYS = ("expected", "expected_output", "output", "target", "expected_output_jinja")


def _first(case: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if case.get(key) not in (None, ""):
            return case[key]
    for nested in ("input", "data", "context"):
        if isinstance(case.get(nested), dict):
            found = _first(case[nested], keys)
            if found is not None:
                return found
    return None


def _cases(data: Any) -> Iterator[dict[str, Any]]:
    if isinstance(data, dict):
        data = data.get("cases") or data.get("tests") or list(data.values())
    if isinstance(data, list):
        for item in data:
            if isinstance(item, dict):
                yield item


def _variables(case: dict[str, Any]) -> dict[str, Any]:
    source = case.get("input") if isinstance(case.get("input"), dict) else case
    skip = {*_TEMPLATE_KEYS, *_MESSAGES_KEYS, *_EXPECTED_KEYS, "tools", "add_generation_prompt", "name", "id"}
    return {k: v for k, v in source.items() if k not in skip and isinstance(v, str | int | float | bool | list)}


@pytest.mark.parametrize("file_name", PEER_FILES)
def test_peer_vectors(file_name, hf_tokenizer):
    path = CONFORMANCE / "peers" / file_name
    if not path.is_file():
        pytest.skip(f"{path} is absent (third-party peer vectors are read from ../shared, never copied here)")
    cases = list(_cases(json.loads(path.read_text(encoding="utf-8"))))
    usable = [c for c in cases if _first(c, _TEMPLATE_KEYS) and isinstance(_first(c, _MESSAGES_KEYS), list)]
    if not usable:
        pytest.skip(f"{path}: no case with a template and messages in a shape this test knows")
    mismatches, peer_differs, agreed = [], [], 0
    for number, case in enumerate(usable):
        template, messages = _first(case, _TEMPLATE_KEYS), _first(case, _MESSAGES_KEYS)
        tools = _first(case, ("tools",))
        add_generation_prompt = bool(_first(case, ("add_generation_prompt",)))
        variables = _variables(case)
        name = case.get("name") or case.get("id") or f"case {number}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                theirs = hf_tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    chat_template=template,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    **variables,
                )
            except Exception as exc:  # noqa: BLE001 - only "it raised" matters
                theirs = exc
        try:
            ours = ChatFormat.from_template(template, **{**hf_tokenizer.special_tokens_map, **variables}).render(
                messages, tools=tools, add_generation_prompt=add_generation_prompt
            )
        except TurnkitError as exc:
            ours = exc
        if isinstance(theirs, Exception) != isinstance(ours, Exception) or (isinstance(ours, str) and ours != theirs):
            mismatches.append(f"{name}: transformers {theirs!r:.300} / turnkit {ours!r:.300}")
            continue
        agreed += 1
        expected = _first(case, _EXPECTED_KEYS)
        if isinstance(expected, str) and isinstance(theirs, str) and expected != theirs:
            peer_differs.append(str(name))
    if peer_differs:
        print(f"{file_name}: transformers (and turnkit) differ from the peer's expectation in: {peer_differs}")
    assert not mismatches, "\n".join(mismatches[:5])
    assert agreed == len(usable)
