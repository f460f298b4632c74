"""Built-in tools of OpenAI and Anthropic (``web_search``, ``web_search_20250305``, ``bash_20250124`` ...), which this
server cannot run: a request that offers one is served without it (the prompt is the one without that tool), and the
response says so in the ``turnkit-dropped-tools`` header and a ``turnkit_dropped_tools`` field; ``turnkit serve
--refuse-builtin-tools`` answers the 400 naming the tool instead. Tool types that are no one's stay a 400 either way.

Through the official ``openai`` (Responses API) and ``anthropic`` (Messages API) clients, whole and streamed, against
the server in this process on a replay backend that records each prompt it is given (qwen2.5's template over the
embedded model's tokenizer, which shows tools); and ``turnkit serve`` itself for the flag and the log line.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from corpus import tokenizer_with_markers
from serve_harness import serving, turnkit_serve

from turnkit import ChatFormat
from turnkit.serve import ReplayBackend

HEADER = "turnkit-dropped-tools"
QUESTION = "What is the weather in Paris?"
FUNCTION = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
#: What Codex sends after its function tools when its config does not turn web search off.
WEB_SEARCH = {"type": "web_search", "external_web_access": False}
CUSTOM = {
    "name": "get_weather",
    "description": "Get the weather in a city.",
    "input_schema": FUNCTION["parameters"],
}
COMPUTER = {"type": "computer_use_preview", "display_width": 800, "display_height": 600, "environment": "linux"}
SERVER_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}


class Recorder:
    """A replay script that answers "Sunny." and keeps every prompt it is given."""

    def __init__(self, fmt: ChatFormat) -> None:
        self.ids = fmt.tokenizer.encode("Sunny.<|im_end|>").ids
        self.prompts: list[list[int]] = []

    def __call__(self, prompt) -> list[int]:
        self.prompts.append(list(prompt))
        return self.ids


@pytest.fixture(scope="module")
def fmt(smollm2_hf_folder):
    return ChatFormat.from_family("qwen2.5", tokenizer=tokenizer_with_markers(smollm2_hf_folder, ["<tool_call>"]))


@pytest.fixture(scope="module")
def servers(fmt):
    """(url, recorder) of the default server and of one that refuses built-in tools."""
    from turnkit.serve.app.routes import Server

    lenient, strict = Recorder(fmt), Recorder(fmt)
    with (
        serving(Server(fmt, ReplayBackend(lenient), model_id="smollm2").app()) as lenient_url,
        serving(Server(fmt, ReplayBackend(strict), model_id="smollm2", refuse_builtin_tools=True).app()) as strict_url,
    ):
        yield {"lenient": (lenient_url, lenient), "strict": (strict_url, strict)}


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _claude(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def _prompt(fmt: ChatFormat, tools: list[dict] | None) -> list[int]:
    conversation = [{"role": "user", "content": QUESTION}]
    return fmt.encode(conversation, tools=tools, add_generation_prompt=True, turns="none").input_ids.tolist()


def _function(tool: dict) -> dict:
    """A Responses function tool as chat's function tool (what the template is given)."""
    return {"type": "function", "function": {k: tool[k] for k in ("name", "parameters", "description")}}


# -- Responses --------------------------------------------------------------------------------------------------------


def test_responses_serves_without_web_search_and_says_so(servers, fmt):
    url, recorder = servers["lenient"]
    client = _openai(url)
    raw = client.responses.with_raw_response.create(
        model="smollm2", input=QUESTION, tools=[FUNCTION, WEB_SEARCH], max_output_tokens=16
    )
    assert raw.http_response.status_code == 200 and raw.headers[HEADER] == "web_search"
    response = raw.parse()
    assert response.status == "completed" and response.output_text == "Sunny."
    (dropped,) = response.model_extra["turnkit_dropped_tools"]
    assert dropped["type"] == "web_search" and dropped["param"] == "tools[1]" and "hosted" in dropped["reason"]
    # the model was shown the function tool, not the hosted one
    assert recorder.prompts[-1] == _prompt(fmt, [_function(FUNCTION)]) != _prompt(fmt, None)
    assert response.usage.input_tokens == len(recorder.prompts[-1])
    assert client.responses.retrieve(response.id).model_extra["turnkit_dropped_tools"] == [dropped]
    plain = client.responses.with_raw_response.create(model="smollm2", input=QUESTION, tools=[FUNCTION])
    assert HEADER not in plain.headers and "turnkit_dropped_tools" not in plain.parse().model_extra


def test_responses_streamed_says_so_in_the_header_and_the_events(servers):
    url, _ = servers["lenient"]
    stream = _openai(url).responses.create(
        model="smollm2", input=QUESTION, tools=[WEB_SEARCH], max_output_tokens=16, stream=True
    )
    assert stream.response.headers[HEADER] == "web_search"
    events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    for event in (events[0], events[-1]):
        assert [t["type"] for t in event.response.model_extra["turnkit_dropped_tools"]] == ["web_search"]
    assert events[-1].response.output_text == "Sunny."


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ({"type": "web_search_preview_2025_03_11"}, "hosted"),
        ({"type": "file_search", "vector_store_ids": ["vs_1"]}, "hosted"),
        ({"type": "code_interpreter", "container": {"type": "auto"}}, "hosted"),
        ({"type": "image_generation"}, "hosted"),
        ({"type": "mcp", "server_label": "docs", "server_url": "https://example.com/mcp"}, "hosted"),
        ({"type": "local_shell"}, "built into OpenAI's models"),
        (COMPUTER, "built into OpenAI's models"),
        ({"type": "custom", "name": "apply_patch", "description": "Apply a patch."}, "built into OpenAI's models"),
    ],
    ids=lambda value: value.get("type") if isinstance(value, dict) else None,
)
def test_responses_leaves_out_each_builtin_tool_or_refuses_it_on_a_strict_server(servers, tool, why):
    lenient = _openai(servers["lenient"][0])
    raw = lenient.responses.with_raw_response.create(
        model="smollm2", input=QUESTION, tools=[FUNCTION, tool], max_output_tokens=16
    )
    assert raw.headers[HEADER] == tool["type"]
    (dropped,) = raw.parse().model_extra["turnkit_dropped_tools"]
    assert dropped["type"] == tool["type"] and why in dropped["reason"]
    url, recorder = servers["strict"]
    seen = len(recorder.prompts)
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(url).responses.create(model="smollm2", input=QUESTION, tools=[FUNCTION, tool], max_output_tokens=16)
    error = caught.value.body
    assert error["param"] == "tools[1].type" and error["code"] == "unsupported_parameter"
    assert repr(tool["type"]) in error["message"] and "--refuse-builtin-tools" in error["message"]
    assert len(recorder.prompts) == seen


def test_a_tool_type_that_is_no_ones_is_a_400_on_either_server(servers):
    for url, _ in servers.values():
        for tool, param in (({"type": "websearch"}, "tools[0].type"), ({"name": "f"}, "tools[0].type")):
            with pytest.raises(openai.BadRequestError) as caught:
                _openai(url).responses.create(model="smollm2", input=QUESTION, tools=[tool], max_output_tokens=4)
            assert caught.value.body["param"] == param
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.type"):
        _claude(servers["lenient"][0]).messages.create(
            model="smollm2",
            max_tokens=4,
            messages=[{"role": "user", "content": QUESTION}],
            tools=[{**CUSTOM, "type": "function"}],
        )


def test_forcing_a_left_out_tool_is_a_400(servers):
    """A tool left out cannot be called: tool_choice required with only built-in tools has nothing to call."""
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(servers["lenient"][0]).responses.create(
            model="smollm2", input=QUESTION, tools=[WEB_SEARCH], tool_choice="required", max_output_tokens=4
        )
    assert caught.value.body["param"] == "tool_choice"


# -- Chat Completions -------------------------------------------------------------------------------------------------


def test_chat_serves_without_web_search_options_and_says_so_as_responses_does(servers, fmt):
    """``web_search_options`` was a 400 on chat while Responses served Codex's ``web_search`` without it: one rule
    now, whole and streamed, and the 400 on a strict server (issue 45)."""
    url, recorder = servers["lenient"]
    messages = [{"role": "user", "content": QUESTION}]
    client = _openai(url)
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2", messages=messages, web_search_options={"search_context_size": "low"}, max_tokens=16
    )
    assert raw.http_response.status_code == 200 and raw.headers[HEADER] == "web_search"
    completion = raw.parse()
    assert completion.choices[0].message.content == "Sunny."
    (dropped,) = completion.model_extra["turnkit_dropped_tools"]
    assert dropped["param"] == "web_search_options" and "hosted" in dropped["reason"]
    assert recorder.prompts[-1] == _prompt(fmt, None)  # the prompt of the same request without it
    stream = client.chat.completions.create(
        model="smollm2", messages=messages, web_search_options={}, max_tokens=16, stream=True
    )
    assert stream.response.headers[HEADER] == "web_search"
    chunks = list(stream)
    assert chunks[0].model_extra["turnkit_dropped_tools"] == [dropped]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Sunny."
    plain = client.chat.completions.with_raw_response.create(model="smollm2", messages=messages, max_tokens=4)
    assert HEADER not in plain.headers and "turnkit_dropped_tools" not in (plain.parse().model_extra or {})
    strict_url, strict = servers["strict"]
    seen = len(strict.prompts)
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(strict_url).chat.completions.create(
            model="smollm2", messages=messages, web_search_options={}, max_tokens=4
        )
    error = caught.value.body
    assert error["param"] == "web_search_options" and error["code"] == "unsupported_parameter"
    assert "--refuse-builtin-tools" in error["message"] and len(strict.prompts) == seen
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="smollm2", messages=messages, web_search_options="yes", max_tokens=4)
    assert caught.value.body["param"] == "web_search_options"


# -- Messages ---------------------------------------------------------------------------------------------------------


def test_messages_serves_without_server_tools_and_says_so(servers, fmt):
    url, recorder = servers["lenient"]
    claude = _claude(url)
    request = {
        "model": "smollm2",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [CUSTOM, SERVER_SEARCH],
    }
    raw = claude.messages.with_raw_response.create(**request)
    assert raw.http_response.status_code == 200 and raw.headers[HEADER] == "web_search_20250305"
    message = raw.parse()
    assert message.content[0].text == "Sunny."
    (dropped,) = message.model_extra["turnkit_dropped_tools"]
    assert dropped["param"] == "tools[1]" and "Anthropic runs it" in dropped["reason"]
    assert recorder.prompts[-1] == _prompt(fmt, [_function(FUNCTION)]) != _prompt(fmt, None)  # the same tool
    with claude.messages.stream(**request) as stream:
        assert stream.response.headers[HEADER] == "web_search_20250305"
        final = stream.get_final_message()
    assert final.content[0].text == "Sunny." and final.model_extra["turnkit_dropped_tools"] == [dropped]
    counted = claude.messages.with_raw_response.count_tokens(
        model="smollm2", messages=request["messages"], tools=request["tools"]
    )
    assert counted.headers[HEADER] == "web_search_20250305"
    assert counted.parse().input_tokens == len(recorder.prompts[-1])
    assert counted.parse().model_extra["turnkit_dropped_tools"] == [dropped]


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ({"type": "web_fetch_20250910", "name": "web_fetch"}, "Anthropic runs it"),
        ({"type": "code_execution_20250825", "name": "code_execution"}, "Anthropic runs it"),
        ({"type": "bash_20250124", "name": "bash"}, "built into Anthropic's models"),
        ({"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}, "built into Anthropic's models"),
        ({"type": "web_search_20990101", "name": "web_search"}, "Anthropic runs it"),  # a version not yet out
        ({"type": "holodeck_20990101", "name": "holodeck"}, "a tool Anthropic defines"),
    ],
    ids=lambda value: value.get("type") if isinstance(value, dict) else None,
)
def test_messages_leaves_out_each_anthropic_tool_or_refuses_it_on_a_strict_server(servers, tool, why):
    request = {
        "model": "smollm2",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": QUESTION}],
        "extra_body": {"tools": [CUSTOM, tool]},
    }
    raw = _claude(servers["lenient"][0]).messages.with_raw_response.create(**request)
    assert raw.headers[HEADER] == tool["type"]
    assert why in raw.parse().model_extra["turnkit_dropped_tools"][0]["reason"]
    url, recorder = servers["strict"]
    seen = len(recorder.prompts)
    with pytest.raises(anthropic.BadRequestError) as caught:
        _claude(url).messages.create(**request)
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith("tools[1].type: ")
    assert "--refuse-builtin-tools" in error["message"] and len(recorder.prompts) == seen


# -- turnkit serve ----------------------------------------------------------------------------------------------------


def test_turnkit_serve_logs_each_request_that_drops_a_tool_and_refuses_with_the_flag(smollm2_gguf):
    body = {"model": "default", "input": "Hi", "max_output_tokens": 2, "tools": [WEB_SEARCH]}
    with turnkit_serve("--lazy", "--no-ui", name="serve-builtin") as (url, log):
        for _ in range(2):
            answer = httpx.post(url + "/v1/responses", json=body, timeout=600)
            assert answer.status_code == 200 and answer.headers[HEADER] == "web_search", answer.text
        lines = [line for line in log.read_text().splitlines() if "built-in tools" in line]
    assert len(lines) == 2, lines  # one line per request
    said = "/v1/responses: served without the built-in tools the request offered, which this server cannot run: "
    assert all(said + "tools[0] web_search (a hosted tool: OpenAI runs it" in line for line in lines), lines
    with turnkit_serve("--lazy", "--no-ui", "--refuse-builtin-tools", name="serve-builtin-strict") as (url, _):
        answer = httpx.post(url + "/v1/responses", json=body, timeout=600)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "tools[0].type"
        assert HEADER not in answer.headers
        loaded = json.loads(httpx.get(url + "/health").text)["loaded"]
        assert loaded == []  # refused before any model was read
