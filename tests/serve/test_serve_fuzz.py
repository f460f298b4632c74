"""A bounded fuzz test of the server: a few hundred mutated requests over every endpoint (wrong types in every field,
invalid UTF-8, huge and deeply nested bodies, wrong methods) against the real app and the real embedded model over
real HTTP with one keep-alive connection. Nothing may answer 5xx (nor send a server error inside a stream), nothing may
hang, and the server must answer a normal request afterwards on the same connection.

The mutations are drawn from a seeded generator, so a failure names the seed and request number that reproduce it.
"""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from serve_harness import TOOLS, serving

from turnkit.serve.app.body import MAX_BODY_BYTES
from turnkit.serve.app.routes import Server
from turnkit.serve.engines import EngineOptions
from turnkit.serve.models import ModelRegistry
from turnkit.serve.modelspec import ModelSpec

MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello", "tool_calls": None},
    {"role": "user", "content": [{"type": "text", "text": "Say hi"}]},
]
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 3,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 1,
        "stop": ["\n"],
        "stream": False,
        "logprobs": True,
        "top_logprobs": 2,
        "n": 1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "logit_bias": {"42": 1},
        "tool_choice": "none",
        "tools": TOOLS,
        "chat_template_kwargs": {"x": 1},
        "response_format": {"type": "text"},
        "stream_options": {"include_usage": True},
        "user": "me",
    },
    "/v1/completions": {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 3,
        "echo": True,
        "logprobs": 2,
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "stream": False,
    },
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 3,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "user", "content": [{"type": "text", "text": "Say hi"}]},
        ],
        "stop_sequences": ["\n"],
        "temperature": 0.5,
        "stream": False,
        "metadata": {"user_id": "me"},
        "thinking": {"type": "adaptive"},
        "tool_choice": {"type": "none"},
    },
    "/v1/messages/count_tokens": {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
    "/v1/responses": {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
        "max_output_tokens": 3,
        "temperature": 0.5,
        "stream": False,
        "store": False,
        "reasoning": {"summary": "auto"},
    },
    "/tokenize": {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "add_generation_prompt": True},
    "/detokenize": {"model": MODEL, "tokens": [1, 2, 3]},
    "/ui/tokens": {"tokens": [1, 2, 3], "messages": MESSAGES},
}
ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    3,
    2**63,
    -(2**70),
    1e308,
    -0.0,
    0.5,
    "",
    "x",
    "\x00\ud7ff",
    "<|im_end|>",
    [],
    [None],
    [1, "a"],
    {},
    {"type": "function"},
    {"role": "user"},
    {"function": {"name": 5}},
    "a" * 10000,
    [[[[[]]]]],
    {"include_usage": "yes"},
]


def _mutate(value: Any, rng: random.Random, depth: int = 0) -> Any:
    """``value`` with one part replaced by an odd value (or, inside containers, a part dropped or duplicated)."""
    if depth > 3 or not isinstance(value, dict | list) or not value or rng.random() < 0.3:
        return rng.choice(ODD_VALUES)
    value = json.loads(json.dumps(value))
    if isinstance(value, dict):
        key = rng.choice(sorted(value))
        if rng.random() < 0.15:
            del value[key]
        else:
            value[key] = _mutate(value[key], rng, depth + 1)
    else:
        index = rng.randrange(len(value))
        if rng.random() < 0.15:
            value.append(value[index])
        else:
            value[index] = _mutate(value[index], rng, depth + 1)
    return value


def _request(rng: random.Random) -> tuple[str, str, bytes]:
    """(method, path, body) of one fuzzed request."""
    path = rng.choice([*BASES, "/v1/models", "/health", "/v1/nothing"])
    base = BASES.get(path, {"model": MODEL})
    roll = rng.random()
    if path in ("/v1/models", "/health") and roll > 0.05:
        return "GET", path, b""
    if roll < 0.05:
        return rng.choice(["GET", "PUT", "DELETE", "POST"]), path, b"{}"
    if roll < 0.10:
        return "POST", path, rng.choice([b"\xff\xfe{", b'{"model": "\xc3\x28"}', b"\x00" * 10, b"{" * 3 + b"]"])
    if roll < 0.13:
        return "POST", path, b'{"a":' * 5000 + b"1" + b"}" * 5000
    if roll < 0.15:
        return "POST", path, json.dumps({**base, "messages": [{"role": "user", "content": "x"}] * 5000}).encode()
    if roll < 0.17:
        return "POST", path, b'{"prompt": "' + b"a" * (MAX_BODY_BYTES + 10) + b'"}'
    if roll < 0.20:
        return "POST", path, rng.choice([b"[]", b"null", b"5", b'"text"', b"NaN", b'{"model": NaN}'])
    body = base
    for _ in range(rng.choice([1, 1, 2, 3])):
        body = _mutate(body, rng)
    if not isinstance(body, dict):
        body = {"model": MODEL, "messages": body}
    if rng.random() < 0.2 and path in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"):
        body = {**body, "stream": True}
    return "POST", path, json.dumps(body).encode()


@pytest.fixture(scope="module")
def base_url(smollm2_gguf):
    import torch

    torch.set_num_threads(1)
    registry = ModelRegistry([ModelSpec(MODEL, "default")], options=EngineOptions(threads=1, max_batch=4))
    registry.preload(MODEL)
    server = Server(registry, default_max_tokens=3)
    try:
        with serving(server.app()) as url:
            yield url
    finally:
        registry.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzzed_requests_never_5xx_nor_hang(base_url, seed):
    rng = random.Random(seed)
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for number in range(150):
            method, path, body = _request(rng)
            response = client.request(method, path, content=body, headers={"content-type": "application/json"})
            where = f"seed {seed} request {number}: {method} {path} {body[:300]!r}"
            assert response.status_code < 500, f"{where} -> {response.status_code} {response.text[:300]}"
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                assert "server_error" not in response.text, f"{where} -> {response.text[:500]}"
                assert "api_error" not in response.text, f"{where} -> {response.text[:500]}"
                ends = {"/v1/messages": "event: message_stop\n", "/v1/responses": "event: response."}
                last = response.text.rstrip("\n").split("\n\n")[-1]
                assert last.startswith(ends[path]) if path in ends else last == "data: [DONE]", where
            elif response.status_code >= 400:
                error = response.json()["error"]
                assert error["message"] and error["type"], where
        # the same keep-alive connection answers a normal request afterwards
        normal = client.post("/v1/chat/completions", json={"model": "default", "messages": MESSAGES[:2]})
        assert normal.status_code == 200 and normal.json()["choices"][0]["message"]["content"] is not None
        assert client.get("/health").json()["generating"] == 0
    assert statuses.get(200, 0) > 5 and sum(v for k, v in statuses.items() if k >= 400) > 50  # both kinds were tried
    assert 413 in statuses or 400 in statuses


def test_body_limits(base_url):
    with httpx.Client(base_url=base_url, timeout=60) as client:
        huge = b'{"prompt": "' + b"a" * (MAX_BODY_BYTES + 10) + b'"}'
        declared = client.post("/tokenize", content=huge)
        assert declared.status_code == 413 and declared.json()["error"]["code"] == "request_too_large"

        def chunks():  # no Content-Length: the limit holds while reading
            yield huge[: MAX_BODY_BYTES // 2]
            yield huge[MAX_BODY_BYTES // 2 :]

        streamed = client.post("/tokenize", content=chunks())
        assert streamed.status_code == 413
        deep = client.post("/tokenize", content=b'{"prompt": "x", "a": ' + b"[" * 100 + b"]" * 100 + b"}")
        assert deep.status_code == 400 and deep.json()["error"]["code"] == "too_deep"
        deeper = client.post("/v1/chat/completions", content=b"[" * 100000 + b"]" * 100000)
        assert deeper.status_code == 400
        assert client.post("/tokenize", json={"prompt": "still here"}).status_code == 200
