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

    kind = "llama.cpp"  # stands for a model's engine: takes every sampler (the replay underneath ignores them)

    def __init__(self, replay: ReplayBackend, fmt: ChatFormat) -> None:
        self.replay, self.fmt = replay, fmt
        self.name, self.context_length = replay.name, replay.context_length

    def __getattr__(self, name: str) -> Any:  # the rest of the engine interface (load_now, abort ...): the replay's
        return getattr(self.replay, name)

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
    # the very body a client will send counts as it will be sent (its sampling fields are taken without effect)
    whole_body = {**CHAT, "max_tokens": 4, "temperature": 0, "stream": True, "logprobs": True, "n": 2}
    assert httpx.post(url + "/tokenize", json=whole_body).json()["count"] == plain["count"]
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


# -- one validation per concept, in each API's own words (issue 34 items 10, 11, 13) ----------------------------------


def _clients(url: str) -> tuple[openai.OpenAI, Any]:
    import anthropic

    return (
        openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0),
        anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0),
    )


def test_a_misspelt_or_foreign_field_is_a_400_naming_it_and_the_right_name(url):
    """OpenAI's answer to a field it does not know, on every API, through the official clients' extra_body: the
    field named, with the nearest known name or this API's name for another API's field (``max_token: 5`` had run
    to the 512-token default)."""
    import anthropic

    client, claude = _clients(url)
    cases = [
        (client.chat.completions.create, {"messages": QUESTION}, "max_token", "'max_tokens'"),
        (client.chat.completions.create, {"messages": QUESTION}, "temprature", "'temperature'"),
        (client.chat.completions.create, {"messages": QUESTION}, "stop_sequences", "it is stop"),
        (client.chat.completions.create, {"messages": QUESTION}, "frobnicate", "has no such field"),
        (client.completions.create, {"prompt": "x"}, "max_completion_tokens", "it is max_tokens"),
        (client.responses.create, {"input": "x"}, "max_tokens", "it is max_output_tokens"),
        (client.responses.create, {"input": "x"}, "messages", "it is input"),
        (client.responses.create, {"input": "x"}, "seed", "does not have"),
    ]
    for create, body, name, hint in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            create(model="replay", **body, extra_body={name: 5})
        error = caught.value.body
        assert (error["param"], error["code"]) == (name, "unknown_parameter"), error
        assert repr(name) in error["message"] and hint in error["message"], error
    for name, hint in (("seed", "does not have"), ("stop", "it is stop_sequences"), ("max_token", "'max_tokens'")):
        with pytest.raises(anthropic.BadRequestError) as refused:
            claude.messages.create(model="replay", max_tokens=8, messages=QUESTION, extra_body={name: 1})
        message = refused.value.body["error"]["message"]
        assert f"unknown parameter {name!r}" in message and hint in message, message
    with pytest.raises(anthropic.BadRequestError, match="frobnicate"):
        claude.messages.count_tokens(model="replay", messages=QUESTION, extra_body={"frobnicate": 1})
    answer = httpx.post(url + "/tokenize", json={"messages": QUESTION, "add_special_token": True})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "add_special_token"
    # a field this server knows and does not do keeps its own answer
    with pytest.raises(openai.BadRequestError) as unsupported:
        client.chat.completions.create(model="replay", messages=QUESTION, extra_body={"ignore_eos": True})
    assert (unsupported.value.body["param"], unsupported.value.body["code"]) == ("ignore_eos", "unsupported_parameter")


def test_what_real_clients_send_is_accepted(url):
    """The fields the OpenAI SDK, Codex and Claude Code send that do not change the reply pass on each API (and a
    field sent as null asks for nothing)."""
    client, claude = _clients(url)
    chat = client.chat.completions.create(
        model="replay",
        messages=QUESTION,
        store=False,
        metadata={"run": "1"},
        user="me",
        safety_identifier="someone",
        prompt_cache_key="k",
        service_tier="auto",
        parallel_tool_calls=True,
        stream_options=None,
        modalities=["text"],
        extra_body={"prompt_cache_retention": "in-memory", "frobnicate": None, "top_k": 5, "min_p": 0.1},
    )
    assert chat.choices[0].message.content == "Paris."
    response = client.responses.create(
        model="replay",
        input="What is the capital of France?",
        instructions="Be brief.",
        store=False,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="session-1",
        parallel_tool_calls=True,
        reasoning={"summary": "auto"},
        text={"verbosity": "medium"},
        truncation="disabled",
        service_tier="auto",
        safety_identifier="someone",
        metadata={"a": "b"},
        user="me",
        extra_body={"client_metadata": {"x-codex-window-id": "w"}},
    )
    assert response.output_text == "Paris."
    message = claude.messages.create(
        model="replay",
        max_tokens=8,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]}
        ],
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        metadata={"user_id": "someone"},
        service_tier="auto",
        thinking={"type": "adaptive"},
        extra_body={
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "cache_control": {"type": "ephemeral"},
            "inference_geo": "us",
            "speed": "standard",
        },
    )
    assert message.content[0].text == "Paris."


def test_chat_refuses_a_role_no_api_has(url):
    """``bot`` was rendered into the prompt by chat completions and /tokenize, where Responses and Messages refuse
    theirs."""
    client, _ = _clients(url)
    for role in ("bot", "hacker", "function"):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="replay", messages=[*QUESTION, {"role": role, "content": "x"}])
        assert caught.value.body["param"] == "messages[1].role" and repr(role) in caught.value.body["message"]
        answer = httpx.post(url + "/tokenize", json={"messages": [{"role": role, "content": "x"}]})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages[0].role"
    developer = [{"role": "developer", "content": "Be brief."}, *QUESTION]
    assert client.chat.completions.create(model="replay", messages=developer).choices[0].message.content == "Paris."


def test_responses_errors_name_input_and_max_output_tokens(url):
    """Errors found once the input became a chat request name the Responses API's own fields and items."""
    client, _ = _clients(url)
    cases = [
        ({"input": "word " * 9000, "max_output_tokens": 4}, "input", "context"),
        ({"input": "Hi", "max_output_tokens": 10**6}, "max_output_tokens", "max_output_tokens is 1000000"),
        (
            {
                "input": [
                    {"type": "message", "role": "user", "content": "Weather?"},
                    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{bad"},
                ],
            },
            "input[1].arguments",
            "not valid JSON",
        ),
        (
            {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
            "text.format",
            "text.format",
        ),
    ]
    for body, param, words in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model="replay", **body)
        error = caught.value.body
        assert error["param"] == param and words in error["message"], error
        assert "max_tokens" not in error["message"] and "messages" not in error["message"], error


def test_messages_errors_name_the_blocks(url):
    """A Messages conversation is translated into chat messages; an error found in them names the block it came
    from, in Anthropic's shape."""
    import anthropic

    _, claude = _clients(url)
    calls = [
        *QUESTION,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:  # a prefill that calls a tool cannot be continued
        claude.messages.create(model="replay", max_tokens=8, messages=calls, tools=[_WEATHER])
    message = caught.value.body["error"]["message"]
    assert message.startswith("messages[1].content:") and "cannot be continued" in message, message


_WEATHER = {"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}


def test_a_function_call_output_must_answer_a_call(url):
    """OpenAI answers 400 to a function_call_output whose call_id no earlier function_call has (in input, or in the
    response previous_response_id names); a matching one passes."""
    client, _ = _clients(url)
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    asked = {"type": "message", "role": "user", "content": "Weather in Paris?"}
    answered = client.responses.create(
        model="replay",
        input=[asked, call, {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}],
        tools=[{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}],
    )
    assert answered.status == "completed"
    first = client.responses.create(model="replay", input="Hi")
    for body in (
        {"input": [asked, call, {"type": "function_call_output", "call_id": "call_2", "output": "Sunny"}]},
        {"input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}, call]},  # before its call
        {
            "previous_response_id": first.id,
            "input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}],
        },
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model="replay", **body)
        assert caught.value.body["param"].endswith(".call_id") and "no function call" in caught.value.body["message"]


def test_a_tool_message_must_answer_a_call_in_chat_and_messages(url):
    """A chat ``tool`` message whose ``tool_call_id`` no earlier assistant call has was rendered as an orphan result,
    where Responses refuses the same (above) and OpenAI answers 400: now a 400 naming the message and field, in chat
    completions, ``/tokenize`` and Messages (a ``tool_result`` naming no earlier ``tool_use``), through the official
    clients; a result that answers its call passes (issue 45)."""
    import anthropic

    client, claude = _clients(url)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    made = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}]
    answered = client.chat.completions.create(
        model="replay", messages=[*made, {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}], tools=TOOLS
    )
    assert answered.choices[0].message.content == "Paris."
    for messages, index in (
        ([*made, {"role": "tool", "tool_call_id": "call_2", "content": "Sunny"}], 2),
        ([*QUESTION, {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}], 1),  # no call at all
        ([{"role": "tool", "tool_call_id": "call_1", "content": "x"}, *made], 0),  # before its call
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="replay", messages=messages, tools=TOOLS)
        error = caught.value.body
        assert error["param"] == f"messages[{index}].tool_call_id", error
        assert (
            error["message"].startswith(f"messages[{index}].tool_call_id: 'call_")
            and "answers no tool call" in (error["message"])
        )
        answer = httpx.post(url + "/tokenize", json={"messages": messages, "tools": TOOLS})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == f"messages[{index}].tool_call_id"
    used = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]}
    result = {"type": "tool_result", "tool_use_id": "toolu_2", "content": "Sunny"}
    orphan = [*QUESTION, used, {"role": "user", "content": [result]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model="replay", max_tokens=8, messages=orphan, tools=[_WEATHER])
    message = caught.value.body["error"]["message"]
    assert message.startswith("messages[2].content[0].tool_use_id: 'toolu_2' answers no tool call"), message
    reply = claude.messages.create(
        model="replay",
        max_tokens=8,
        messages=[*QUESTION, used, {"role": "user", "content": [{**result, "tool_use_id": "toolu_1"}]}],
        tools=[_WEATHER],
    )
    assert reply.content[0].text == "Paris."


def test_every_counting_endpoint_refuses_tools_the_template_does_not_show(smollm2_hf_folder):
    """SmolLM2's own template renders no tools: chat, count_tokens and /tokenize all refuse them alike (/tokenize had
    counted the prompt without them)."""
    from turnkit.serve.app.routes import Server

    fmt = ChatFormat.from_pretrained(smollm2_hf_folder)
    server = Server(fmt, ReplayBackend(lambda ids: fmt.tokenizer.encode("Paris.<|im_end|>").ids), model_id="replay")
    with serving(server.app()) as base:
        client, claude = _clients(base)
        with pytest.raises(openai.BadRequestError) as chat:
            client.chat.completions.create(model="replay", messages=QUESTION, tools=TOOLS)
        import anthropic

        with pytest.raises(anthropic.BadRequestError, match="does not support tools"):
            claude.messages.count_tokens(model="replay", messages=QUESTION, tools=[_WEATHER])
        tokenized = httpx.post(base + "/tokenize", json={"messages": QUESTION, "tools": TOOLS})
        assert tokenized.status_code == 400
        assert tokenized.json()["error"]["code"] == chat.value.body["code"] == "tools_not_supported"
        declined = httpx.post(base + "/tokenize", json={"messages": QUESTION, "tools": TOOLS, "tool_choice": "none"})
        assert declined.status_code == 200  # tools declined are not rendered, as in chat


def _asks(base: str, extra: dict[str, Any]) -> list[Any]:
    """The same question to chat completions, Responses, Messages and count_tokens, each through its official
    client with ``extra`` in ``extra_body``, unsent."""
    client, claude = _clients(base)
    return [
        lambda: client.chat.completions.create(model="replay", messages=QUESTION, extra_body=extra),
        lambda: client.responses.create(model="replay", input=QUESTION[0]["content"], extra_body=extra),
        lambda: claude.messages.create(model="replay", max_tokens=8, messages=QUESTION, extra_body=extra),
        lambda: claude.messages.count_tokens(model="replay", messages=QUESTION, extra_body=extra),
    ]


def test_the_family_override_reaches_every_chat_api(smollm2_hf_folder):
    """``family`` per request (on a server started with --allow-template-override) picks the template on chat
    completions, Responses, Messages and /tokenize alike: their prompts count the same tokens (Messages and Responses
    had ignored it); a server without the flag refuses it on each."""
    import anthropic

    from turnkit.serve.app.routes import Server

    fmt = ChatFormat.from_pretrained(smollm2_hf_folder)
    reply = fmt.tokenizer.encode("Paris.<|im_end|>").ids
    chatml = {"family": "chatml"}  # SmolLM2's own template adds a system prompt; chatml does not
    for allowed in (True, False):
        server = Server(fmt, ReplayBackend(lambda ids: reply), model_id="replay", allow_template_override=allowed)
        with serving(server.app()) as base:
            if not allowed:
                for ask in _asks(base, chatml):
                    with pytest.raises((openai.BadRequestError, anthropic.BadRequestError), match="--allow-template"):
                        ask()
                continue
            ids = httpx.post(base + "/tokenize", json={"messages": QUESTION, **chatml}).json()["tokens"]
            own = httpx.post(base + "/tokenize", json={"messages": QUESTION}).json()["tokens"]
            assert len(ids) < len(own)
            chat, response, message, counted = (ask() for ask in _asks(base, chatml))
            assert chat.usage.prompt_tokens == response.usage.input_tokens == counted.input_tokens == len(ids)
            assert message.usage.input_tokens + message.usage.cache_read_input_tokens == len(ids)
