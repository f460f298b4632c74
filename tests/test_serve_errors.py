"""Every endpoint checks its whole body the same way, and no answer, not even a failure, costs the client its
connection.

The server runs the real app under uvicorn on loopback with the real SmolLM2 tokenizer. Bad requests go through one
keep-alive connection (``http.client``, so that a dropped connection is seen rather than silently reopened), and the
connection must still answer a good request afterwards. For the server's own failures the model is a stand-in: the
replay backend, except that on cue it fails as a real engine can (at submit, or after a few tokens); the real engine
cannot be made to fail on demand.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import httpx
import openai
import pytest
from corpus import tokenizer_with_markers
from serve_harness import TOOLS, serving

from turnkit import ChatFormat
from turnkit.serve import Generation, ReplayBackend, TokenEvent

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


class _FailingOnCue:
    """The replay backend, but a prompt that says ``explode`` fails at submit and one that says ``derail`` fails
    after two tokens."""

    def __init__(self, replay: ReplayBackend, fmt: ChatFormat) -> None:
        self.replay, self.fmt = replay, fmt
        self.name, self.context_length = replay.name, replay.context_length

    def submit(self, request: Any, loop: Any) -> Generation:
        prompt = self.fmt.tokenizer.decode(list(request.prompt_ids))
        if "explode" in prompt:
            raise RuntimeError("the device is gone")
        if "derail" not in prompt:
            return self.replay.submit(request, loop)
        generation = Generation(loop)
        for token_id in self.fmt.tokenizer.encode("Paris is").ids[:2]:
            generation.put(TokenEvent(token_id))
        generation.close(RuntimeError("the device is gone"))
        return generation

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def url(smollm2_hf_folder):
    from turnkit.serve.app.routes import Server

    tokenizer = tokenizer_with_markers(smollm2_hf_folder, ["<tool_call>", "</tool_call>"])
    fmt = ChatFormat.from_family("qwen2.5", tokenizer=tokenizer)
    reply = fmt.tokenizer.encode("Paris.<|im_end|>").ids
    backend = _FailingOnCue(ReplayBackend(lambda prompt_ids: reply), fmt)
    with serving(Server(fmt, backend, model_id="replay").app()) as base:
        yield base


def _connection(url: str) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def _exchange(connection: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    connection.request(method, path, body=raw, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    assert not response.will_close, "the server asked to close the connection"
    return response.status, json.loads(data) if data.startswith(b"{") else data


def _ok(connection: http.client.HTTPConnection) -> None:
    status, body = _exchange(connection, "POST", "/v1/chat/completions", {"model": "replay", "messages": QUESTION})
    assert status == 200 and body["choices"][0]["message"]["content"] == "Paris."


CHAT = {"model": "replay", "messages": QUESTION}
BAD = [
    # /tokenize reads messages, tools and chat_template_kwargs with the checks chat completions use
    ("/tokenize", {"messages": QUESTION, "chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ("/tokenize", {"messages": QUESTION, "chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ("/tokenize", {"messages": QUESTION, "tools": "x"}, "tools"),
    ("/tokenize", {"messages": QUESTION, "tools": [5]}, "tools[0]"),
    ("/tokenize", {"messages": QUESTION, "tools": [{"function": {"name": ""}}]}, "tools[0]"),
    ("/tokenize", {"messages": QUESTION, "tool_choice": 5}, "tool_choice"),
    ("/tokenize", {"messages": QUESTION, "add_generation_prompt": "yes"}, "add_generation_prompt"),
    ("/tokenize", {"messages": "hello"}, "messages"),
    ("/tokenize", {"messages": [5]}, "messages[0]"),
    ("/tokenize", {"messages": QUESTION, "chat_template": "{{ 'x' }}"}, "chat_template"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "x", "model": 5}, "model"),
    # template variables cannot reach the encoder's own options (trust_data would let text forge control tokens)
    (
        "/tokenize",
        {"messages": QUESTION, "chat_template_kwargs": {"trust_data": True}},
        "chat_template_kwargs.trust_data",
    ),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"trust_data": True}}, "chat_template_kwargs.trust_data"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"turns": "all"}}, "chat_template_kwargs.turns"),
    # nor replace what the request itself sets, past its checks
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    (
        "/tokenize",
        {"messages": QUESTION, "chat_template_kwargs": {"add_generation_prompt": False}},
        "chat_template_kwargs.add_generation_prompt",
    ),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ("/v1/chat/completions", {**CHAT, "tools": {"name": "f"}}, "tools"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice"),
    ("/v1/completions", {"model": "replay", "prompt": [10**9]}, "prompt"),
    # a seed outside 64 bits is the client's mistake, whole or streamed (it was a 500)
    ("/v1/chat/completions", {**CHAT, "seed": 2**64}, "seed"),
    ("/v1/chat/completions", {**CHAT, "seed": -(2**63) - 1}, "seed"),
    ("/v1/chat/completions", {**CHAT, "seed": 2**64, "stream": True}, "seed"),
    ("/v1/completions", {"model": "replay", "prompt": "x", "seed": 10**30}, "seed"),
    ("/v1/completions", {"model": "replay", "prompt": {"text": "x"}}, "prompt"),
    ("/detokenize", {"tokens": "x"}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [True]}, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ("/detokenize", {"tokens": [1], "model": ["replay"]}, "model"),
]


def test_bad_bodies_are_400s_that_name_the_field_and_keep_the_connection(url):
    connection = _connection(url)
    _ok(connection)
    socket = connection.sock
    for path, body, param in BAD:
        status, answer = _exchange(connection, "POST", path, body)
        assert status == 400, (path, body, answer)
        assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == param, answer
    for raw in (b"\xff\xfe{", b"[1, 2]", b'{"a": ' * 5 + b"1" + b"}" * 5 + b"x"):
        status, answer = _exchange(connection, "POST", "/tokenize", raw)
        assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    _ok(connection)
    assert connection.sock is socket  # one connection throughout


def test_every_64_bit_seed_is_served_with_every_n(url):
    """The ends of the seed range, with n choices whose seeds run past 2**64 - 1 (they wrap), on both APIs."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    for seed in (2**64 - 1, -(2**63), 0, -1):
        reply = client.chat.completions.create(model="replay", messages=QUESTION, seed=seed, n=2, temperature=1.0)
        assert [c.message.content for c in reply.choices] == ["Paris.", "Paris."]
        stream = client.chat.completions.create(model="replay", messages=QUESTION, seed=seed, n=2, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Paris.Paris."
        completion = client.completions.create(model="replay", prompt="France:", seed=seed, n=2, max_tokens=3)
        assert len(completion.choices) == 2


def test_tokenize_counts_what_chat_renders(url):
    body = {"messages": QUESTION, "tools": TOOLS, "chat_template_kwargs": {"date_string": "today"}}
    with_tools = httpx.post(url + "/tokenize", json=body).json()
    declined = httpx.post(url + "/tokenize", json={**body, "tool_choice": "none"}).json()
    plain = httpx.post(url + "/tokenize", json={"messages": QUESTION}).json()
    assert with_tools["count"] > plain["count"] == declined["count"]  # tool_choice none renders no tools, as chat
    chat = httpx.post(url + "/v1/chat/completions", json={**CHAT, "tools": TOOLS}).json()
    assert chat["usage"]["prompt_tokens"] == with_tools["count"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("GET", "/v1/chat/completions", "POST"), ("POST", "/v1/models", "GET"), ("PUT", "/tokenize", "POST")],
)
def test_a_wrong_method_is_a_405_openai_error(url, method, path, allowed):
    response = httpx.request(method, url + path, json={})
    assert response.status_code == 405 and allowed in response.headers["allow"]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and method in error["message"] and allowed in error["message"]


def test_the_official_client_sees_405_and_404(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.get("/chat/completions", cast_to=object)
    assert caught.value.status_code == 405 and caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        client.get("/nothing", cast_to=object)


def test_a_failure_is_a_500_openai_error_and_the_connection_stays(url):
    connection = _connection(url)
    _ok(connection)
    socket = connection.sock
    for stream in (False, True):
        body = {**CHAT, "messages": [{"role": "user", "content": "explode"}], "stream": stream}
        status, answer = _exchange(connection, "POST", "/v1/chat/completions", body)
        assert status == 500 and answer["error"]["type"] == "server_error"
        assert "device" not in answer["error"]["message"]  # the cause goes to the log, not to the client
        _ok(connection)
    derail = {**CHAT, "messages": [{"role": "user", "content": "derail"}]}
    status, answer = _exchange(connection, "POST", "/v1/chat/completions", derail)
    assert status == 500 and answer["error"]["type"] == "server_error"
    _ok(connection)
    assert connection.sock is socket
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(**derail)


def test_a_failure_while_streaming_ends_the_stream_with_an_error_event(url):
    body = {**CHAT, "messages": [{"role": "user", "content": "derail"}], "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200  # the status went out with the first chunk
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "device" not in error["message"]
    shown = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert shown == "Paris is"
    assert httpx.post(url + "/v1/chat/completions", json=CHAT).status_code == 200
