"""The serving peers' parse vectors (``../shared/conformance/peers``, read by ``tests/parse_peers.py``): every case
passes, or differs by a stated decision (docs/guides/parsing.md lists them, "The stated decisions"); the case-by-case
lists are exact, so a listed case that starts to pass fails here and the list cannot go stale.

* llama.cpp's 463 parse cases, each with its template: the format is chosen from the template, as a user gets it;
* vLLM's 11 format fixtures, 401 tool-parser cases and 306 reasoning-parser cases, by parser name;
* openai-harmony's 26 gpt-oss cases, as token ids, with openai-harmony itself as the oracle.
"""

from __future__ import annotations

import pytest
from corpus import PEERS, require
from parse_peers import (
    HARMONY_DECISIONS,
    HARMONY_DIFFERENCES,
    LLAMACPP_DECISIONS,
    LLAMACPP_DIFFERENCES,
    LOADERS,
    VLLM_DECISIONS,
    VLLM_REASONING_DIFFERENCES,
    VLLM_TOOL_DIFFERENCES,
    Result,
)

DECISIONS = {**LLAMACPP_DECISIONS, **VLLM_DECISIONS, **HARMONY_DECISIONS}
LISTED = {
    "llamacpp": LLAMACPP_DIFFERENCES,
    "vllm_format": {},
    "vllm_tool": VLLM_TOOL_DIFFERENCES,
    "vllm_reasoning": VLLM_REASONING_DIFFERENCES,
    "harmony": HARMONY_DIFFERENCES,
}
FILES = {
    "llamacpp": "llamacpp_parse_cases.json",
    "vllm_format": "vllm_tool_format_cases.json",
    "vllm_tool": "vllm_tool_parser_cases.json",
    "vllm_reasoning": "vllm_reasoning_cases.json",
    "harmony": "harmony_parse_cases.json",
}


@pytest.mark.parametrize("source", list(LOADERS))
def test_every_peer_case_passes_or_differs_by_a_stated_decision(source):
    require(PEERS / FILES[source])
    if source == "harmony":
        pytest.importorskip("openai_harmony", reason="openai-harmony is the oracle (the test extra installs it)")
    results: list[Result] = list(LOADERS[source]())
    assert results
    failing = [r for r in results if not r.ok and r.difference is None]
    assert not failing, "\n".join(f"{r.case}: {r.detail}" for r in failing[:10])
    undecided = {r.difference for r in results if r.difference} - set(DECISIONS)
    assert not undecided, f"decisions without a stated reason: {undecided}"
    passing_listed = [r.case for r in results if r.ok and r.case in LISTED[source]]
    assert not passing_listed, f"listed as differing but now passing (drop them from the list): {passing_listed}"
    cases = {r.case for r in results}
    assert set(LISTED[source]) <= cases, f"listed cases the vectors do not hold: {set(LISTED[source]) - cases}"
