"""A streamed and a non-streamed answer to the same generation agree, field by field.

The server builds a whole response by folding the chunks (or events) it would stream; these tests hold it to that
from the client's side, for every API. The official clients accumulate the stream (``chat.completions.stream``,
``responses.stream``, anthropic's ``messages.stream``: their own folds) and the result is compared with the whole
answer. The model is the replay backend playing scripted token ids
through the real SmolLM2 tokenizer under Qwen3's real template (a 135M model does not call tools or reason on cue):
reasoning, two tool calls, a call whose JSON is broken, forced calls, stop strings that span tokens, the token budget,
characters split across tokens, and log-probabilities.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from corpus import template_text, tokenizer_with_markers
from serve_harness import TOOLS, serving

from turnkit import ChatFormat
from turnkit.serve import ReplayBackend

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'
# what the scripted model answers, picked by a word of the last user message
REPLIES = {
    "weather": "<think>\nThe user wants the weather.\n</think>\n\nLet me look.\n" + CALL % "Paris" + CALL % "Lyon",
    "broken": '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>',
    "ponder": "<think>\nOnly thinking.\n</think>\n\n",
    "silence": "",
    "story": "Once upon a time, the end was near. Thé end 🌍, truly.",
}
# after a forced call's start, which the server writes for the model
FORCED = {
    '{"name": "': 'get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '"arguments": ': '{"city": "Paris"}}\n</tool_call>',
}


@pytest.fixture(scope="module")
def url(smollm2_hf_folder):
    from turnkit.serve.app.routes import Server

    template = template_text("Qwen-Qwen3-0.6B.jinja")
    tokenizer = tokenizer_with_markers(smollm2_hf_folder, ["<think>", "</think>", "<tool_call>", "</tool_call>"])
    fmt = ChatFormat.from_template(template, tokenizer=tokenizer, eos_token="<|im_end|>")
    assert fmt.reply_format.name == "qwen3"

    def script(prompt_ids):
        prompt = fmt.tokenizer.decode(list(prompt_ids))
        reply = next((v for k, v in FORCED.items() if prompt.endswith(k)), None)
        if reply is None:
            last = prompt.rpartition("<|im_start|>user\n")[2]
            reply = next(v for k, v in REPLIES.items() if k in last)
        return fmt.tokenizer.encode(reply + "<|im_end|>").ids

    backend = ReplayBackend(script, name="scripted")
    with serving(Server(fmt, backend, model_id="scripted").app()) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _ask(word: str) -> list[dict]:
    return [{"role": "user", "content": f"Tell me: {word}"}]


CHAT_CASES = {
    "reasoning and two calls": {"messages": _ask("weather"), "tools": TOOLS},
    "two calls with log-probabilities": {
        "messages": _ask("weather"),
        "tools": TOOLS,
        "logprobs": True,
        "top_logprobs": 2,
    },
    "tools declined": {"messages": _ask("weather"), "tools": TOOLS, "tool_choice": "none"},
    "a call whose JSON is broken": {"messages": _ask("broken"), "tools": TOOLS},
    "a required call": {"messages": _ask("story"), "tools": TOOLS, "tool_choice": "required"},
    "a named call": {
        "messages": _ask("story"),
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "logprobs": True,
    },
    "only reasoning": {"messages": _ask("ponder"), "logprobs": True},
    "an empty reply": {"messages": _ask("silence"), "tools": TOOLS, "logprobs": True},
    "a stop string across tokens": {"messages": _ask("story"), "stop": ["end was"], "logprobs": True},
    "stop strings that never match": {"messages": _ask("story"), "stop": ["xyzzy", "🌍 no"]},
    "the token budget": {"messages": _ask("story"), "max_tokens": 9, "logprobs": True, "top_logprobs": 3},
    "characters split across tokens": {"messages": _ask("story"), "logprobs": True, "top_logprobs": 1},
}


def _calls(message) -> list[tuple[str, str, str]]:
    return [(c.type, c.function.name, c.function.arguments) for c in message.tool_calls or []]


@pytest.mark.parametrize("case", CHAT_CASES)
def test_chat_streamed_and_whole_agree(client, case):
    request = {"model": "scripted", **CHAT_CASES[case]}
    whole = client.chat.completions.create(**request)
    with client.chat.completions.stream(**request, stream_options={"include_usage": True}) as stream:
        streamed = stream.until_done().current_completion_snapshot  # the client's own fold of the chunks
    got, want = streamed.choices[0], whole.choices[0]
    assert got.finish_reason == want.finish_reason
    assert got.message.content == want.message.content
    assert getattr(got.message, "reasoning_content", None) == getattr(want.message, "reasoning_content", None)
    assert _calls(got.message) == _calls(want.message)
    calls = [*(got.message.tool_calls or []), *(want.message.tool_calls or [])]
    assert all(c.id and c.id.startswith("call_") for c in calls)
    assert (got.logprobs is None) == (want.logprobs is None) == ("logprobs" not in request)
    if want.logprobs is not None:
        assert [e.model_dump() for e in got.logprobs.content] == [e.model_dump() for e in want.logprobs.content]
        top = request.get("top_logprobs", 0)
        assert all(len(e.top_logprobs) == top for e in want.logprobs.content)
    assert streamed.usage.model_dump() == whole.usage.model_dump()


def test_what_the_cases_cover(client):
    """The cases above are not vacuous: each shows the behaviour it is named for."""
    weather = client.chat.completions.create(model="scripted", **CHAT_CASES["reasoning and two calls"]).choices[0]
    assert weather.message.reasoning_content == "The user wants the weather."
    assert weather.message.content == "Let me look." and weather.finish_reason == "tool_calls"
    assert [json.loads(c.function.arguments)["city"] for c in weather.message.tool_calls] == ["Paris", "Lyon"]
    broken = client.chat.completions.create(model="scripted", **CHAT_CASES["a call whose JSON is broken"]).choices[0]
    assert broken.finish_reason == "stop" and broken.message.tool_calls[0].function.name == "get_weather"
    for case in ("a required call", "a named call"):
        forced = client.chat.completions.create(model="scripted", **CHAT_CASES[case]).choices[0]
        assert forced.finish_reason == "tool_calls"
        assert json.loads(forced.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    ponder = client.chat.completions.create(model="scripted", **CHAT_CASES["only reasoning"]).choices[0].message
    assert (ponder.content, ponder.reasoning_content) == ("", "Only thinking.")
    silence = client.chat.completions.create(model="scripted", **CHAT_CASES["an empty reply"]).choices[0]
    assert (silence.message.content, silence.message.tool_calls, silence.logprobs.content) == ("", None, [])
    stopped = client.chat.completions.create(model="scripted", **CHAT_CASES["a stop string across tokens"])
    assert stopped.choices[0].message.content == "Once upon a time, the "
    assert "".join(e.token for e in stopped.choices[0].logprobs.content).startswith("Once upon a time, the end")
    budget = client.chat.completions.create(model="scripted", **CHAT_CASES["the token budget"])
    assert budget.choices[0].finish_reason == "length" and budget.usage.completion_tokens == 9
    split = client.chat.completions.create(model="scripted", **CHAT_CASES["characters split across tokens"])
    entries = split.choices[0].logprobs.content
    assert any("\ufffd" in e.token for e in entries)  # 🌍 is more than one token
    assert bytes(b for e in entries for b in e.bytes).decode() == split.choices[0].message.content


COMPLETION_CASES = {
    "plain": {"prompt": "Tell me: story"},
    "echo and log-probabilities": {"prompt": "Tell me: story", "echo": True, "logprobs": 2},
    "a stop string": {"prompt": "Tell me: story", "stop": ["end was"], "logprobs": 0},
    "token ids and a budget": {"prompt": "Tell me: story", "max_tokens": 7, "logprobs": 1, "as_ids": True},
}


def _sse(response: httpx.Response) -> list[dict]:
    lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("case", COMPLETION_CASES)
def test_completions_streamed_and_whole_agree(url, case):
    request = {"model": "scripted", **COMPLETION_CASES[case]}
    if request.pop("as_ids", False):
        request["prompt"] = httpx.post(url + "/tokenize", json={"prompt": request["prompt"]}).json()["tokens"]
    whole = httpx.post(url + "/v1/completions", json=request).json()
    stream_request = {**request, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=stream_request) as response:
        chunks = _sse(response)
    assert len({(c["id"], c["created"], c["model"], c["object"]) for c in chunks}) == 1
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    (want,) = whole["choices"]
    assert "".join(c["text"] for c in choices) == want["text"]
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == [want["finish_reason"]]
    assert chunks[-1]["usage"] == whole["usage"]
    if "logprobs" not in request:
        assert want["logprobs"] is None and all(c["logprobs"] is None for c in choices)
        return
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    assert {k: [v for c in choices if c["logprobs"] for v in c["logprobs"][k]] for k in keys} == want["logprobs"]
    tokens, offsets = want["logprobs"]["tokens"], want["logprobs"]["text_offset"]
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]  # echoed prompt tokens come first
    ended_by_a_stop_id = want["finish_reason"] == "stop" and "stop" not in request  # the stop id has no entry
    echoed = whole["usage"]["prompt_tokens"] if request.get("echo") else 0
    assert len(tokens) == echoed + whole["usage"]["completion_tokens"] - ended_by_a_stop_id


# The same scripted replies through the Messages and Responses APIs: (request fields, what the reply must show).
TOOL_ANTHROPIC = {
    "name": "get_weather",
    "description": "Get the weather.",
    "input_schema": TOOLS[0]["function"]["parameters"],
}
TOOL_RESPONSES = {"type": "function", **TOOLS[0]["function"]}
AGENT_CASES = {
    "reasoning and two calls": ({"word": "weather", "tools": True}, "calls"),
    "a call whose JSON is broken": ({"word": "broken", "tools": True}, "broken"),
    "a required call": ({"word": "story", "tools": True, "forced": True}, "calls"),
    "only reasoning": ({"word": "ponder"}, "reasoning"),
    "an empty reply": ({"word": "silence", "tools": True}, "empty"),
    "a stop string across tokens": ({"word": "story", "stop": ["end was"]}, "stop"),
    "the token budget": ({"word": "story", "max_tokens": 9}, "length"),
}


def _plain(items) -> list:
    """Output items as data, without their per-request ids and the client's own parsed copies."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("id", "call_id", "parsed_arguments", "parsed")}
        return [strip(v) for v in value] if isinstance(value, list) else value

    return [strip(item.model_dump()) for item in items]


@pytest.fixture(scope="module")
def claude(url):
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("case", AGENT_CASES)
def test_messages_streamed_and_whole_agree(claude, case):
    spec, shows = AGENT_CASES[case]
    request = {"model": "scripted", "max_tokens": spec.get("max_tokens", 200), "messages": _ask(spec["word"])}
    if spec.get("tools"):
        request["tools"] = [TOOL_ANTHROPIC]
    if spec.get("forced"):
        request["tool_choice"] = {"type": "any"}
    if "stop" in spec:
        request["stop_sequences"] = spec["stop"]
    whole = claude.messages.create(**request)
    with claude.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [
        b.model_dump(exclude={"id"}) for b in whole.content
    ]
    assert (streamed.stop_reason, streamed.stop_sequence) == (whole.stop_reason, whole.stop_sequence)
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    kinds = [b.type for b in whole.content]
    expected = {
        "calls": ("tool_use", lambda: kinds.count("tool_use") >= 1),
        "broken": ("end_turn", lambda: kinds == ["text"] and "Paris" in whole.content[0].text),
        "reasoning": ("end_turn", lambda: kinds == ["thinking"] and whole.content[0].thinking == "Only thinking."),
        "empty": ("end_turn", lambda: kinds == []),
        "stop": ("stop_sequence", lambda: whole.content[0].text == "Once upon a time, the "),
        "length": ("max_tokens", lambda: whole.usage.output_tokens == 9),
    }[shows]
    assert whole.stop_reason == expected[0] and expected[1](), whole
    if case == "reasoning and two calls":
        assert kinds == ["thinking", "text", "tool_use", "tool_use"]
        assert [b.input["city"] for b in whole.content[2:]] == ["Paris", "Lyon"]


@pytest.mark.parametrize("case", [c for c, (spec, _) in AGENT_CASES.items() if "stop" not in spec])  # no stop field
def test_responses_streamed_and_whole_agree(client, case):
    spec, shows = AGENT_CASES[case]
    request = {"model": "scripted", "input": _ask(spec["word"]), "max_output_tokens": spec.get("max_tokens", 200)}
    if spec.get("tools"):
        request["tools"] = [TOOL_RESPONSES]
    if spec.get("forced"):
        request["tool_choice"] = "required"
    whole = client.responses.create(**request)
    with client.responses.stream(**request) as stream:
        events = list(stream)
    # the last event carries the response the client built from the events (the client's get_final_response()
    # knows only response.completed, not the response.incomplete that a spent max_output_tokens ends with)
    streamed = events[-1].response
    assert events[-1].type == ("response.incomplete" if shows == "length" else "response.completed")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert _plain(streamed.output) == _plain(whole.output)
    assert (streamed.status, streamed.usage.output_tokens) == (whole.status, whole.usage.output_tokens)
    kinds = [o.type for o in whole.output]
    if shows == "calls":
        assert kinds.count("function_call") >= 1
    if case == "reasoning and two calls":
        assert kinds == ["reasoning", "message", "function_call", "function_call"]
        assert whole.output[0].content[0].text == "The user wants the weather."
        assert [json.loads(o.arguments)["city"] for o in whole.output[2:]] == ["Paris", "Lyon"]
    if shows == "length":
        assert whole.status == "incomplete" and whole.usage.output_tokens == 9
