"""Reply parsing: chunking invariance, stops, formats, round trips through encode, transcripts."""

from __future__ import annotations

import json

import pytest
from corpus import llamacpp_template_dir, tokenizer_with_markers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnkit import ChatFormat, TranscriptError, parse_transcript
from turnkit.parse import CallStatus, EndReason, Reply

MARKERS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]


@pytest.fixture(scope="module")
def tokenizer(smollm2_hf_folder):
    return tokenizer_with_markers(smollm2_hf_folder, MARKERS)


@pytest.fixture(scope="module")
def qwen3(tokenizer):
    """The qwen2.5 family's template with the qwen3 reply format (tools and <think> reasoning)."""
    return ChatFormat.from_family("qwen2.5", tokenizer=tokenizer)


def _ids(fmt: ChatFormat, text: str) -> list[int]:
    return fmt.tokenizer.encode(text).ids


def _stream(fmt: ChatFormat, ids: list[int], chunks: list[int], **kwargs) -> tuple[Reply, list]:
    parser = fmt.stream_parser(call_id=lambda i: f"call_{i}", **kwargs)
    deltas, pos = [], 0
    for size in chunks:
        deltas += parser.feed(ids[pos : pos + size])
        pos += size
    deltas += parser.feed(ids[pos:])
    reply = parser.finish()
    return reply, deltas + parser.final_deltas


def _assemble(deltas) -> dict:
    """What a client gets by concatenating the deltas."""
    content, reasoning, calls = "", None, {}
    for delta in deltas:
        content += delta.content or ""
        if delta.reasoning_content is not None:
            reasoning = (reasoning or "") + delta.reasoning_content
        for call in delta.tool_calls:
            entry = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
            entry["id"] = entry["id"] or call.id
            entry["name"] = call.name if call.name is not None else entry["name"]
            entry["arguments"] += call.arguments
    return {"content": content, "reasoning": reasoning, "calls": [calls[i] for i in sorted(calls)]}


def _as_client_sees(reply: Reply) -> dict:
    return {
        "content": reply.content,
        "reasoning": reply.reasoning_content,
        "calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
    }


# -- chunking invariance --------------------------------------------------------------------------------------------

_words = st.sampled_from(
    ["Hello", " world", "\n", " ", "é", "🙂", "{", "}", '"', ":", "<", ">", "tool", "_call", "</", "42"]
)
_free_text = st.lists(_words, max_size=8).map("".join)
_call = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["get_weather", "get_time"]),
        "arguments": st.dictionaries(
            st.sampled_from(["city", "unit", "n"]),
            st.one_of(st.text(max_size=6), st.integers(), st.booleans()),
            max_size=3,
        ),
    }
)


@st.composite
def _replies(draw):
    parts = []
    if draw(st.booleans()):
        parts.append("<think>" + draw(_free_text) + "</think>")
    parts.append(draw(_free_text))
    for call in draw(st.lists(_call, max_size=2)):
        parts.append("\n<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>")
    if draw(st.booleans()):
        parts.append(draw(_free_text))
    if draw(st.booleans()):
        parts.append("<|im_end|>")
    return "".join(parts)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_replies(), data=st.data())
def test_any_chunking_gives_the_same_reply(qwen3, text, data):
    ids = _ids(qwen3, text)
    stop = data.draw(st.sampled_from([None, "world", "\n\n", "o w", "42}"]))
    kwargs = {"reply_format": "qwen3", "stop": stop}
    whole, whole_deltas = _stream(qwen3, ids, [len(ids)], **kwargs)
    single, single_deltas = _stream(qwen3, ids, [1] * len(ids), **kwargs)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=5), max_size=len(ids)))
    mixed, mixed_deltas = _stream(qwen3, ids, cuts, **kwargs)
    assert whole == single == mixed
    for deltas in (whole_deltas, single_deltas, mixed_deltas):
        assert _assemble(deltas) == _as_client_sees(whole)
    if stop:
        assert stop not in whole.content and all(stop not in (d.content or "") for d in single_deltas)


# -- stops --------------------------------------------------------------------------------------------------------


def test_stop_strings_split_across_tokens_never_leak(qwen3):
    text = "The answer is STOP HERE and more"
    ids = _ids(qwen3, text)
    for stop in ["STOP HERE", "STOP", "S", " HERE and more", "answer is STOP HERE and more"]:
        parser = qwen3.stream_parser(stop=[stop])
        shown = ""
        for token in ids:
            for delta in parser.feed([token]):
                shown += delta.content or ""
                assert text.index(stop) >= len(shown), f"part of {stop!r} was emitted: {shown!r}"
        reply = parser.finish()
        assert reply.content == text[: text.index(stop)].rstrip() or reply.content == text[: text.index(stop)]
        assert reply.end == EndReason.STOP_STRING and reply.stop == stop and reply.finish_reason == "stop"


def test_overlapping_stop_strings_take_the_earliest_then_longest(qwen3):
    ids = _ids(qwen3, "abcdef")
    assert qwen3.parse(ids, stop=["cde", "bcd"]).stop == "bcd"
    assert qwen3.parse(ids, stop=["bc", "bcdef"]).stop == "bcdef"
    assert qwen3.parse(ids, stop=["bc", "bcdef"]).content == "a"


def test_a_stop_string_inside_a_tool_call_leaves_it_unterminated(qwen3):
    ids = _ids(qwen3, 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    reply = qwen3.parse(ids, stop=["Paris"])
    assert reply.content == "Sure."
    (call,) = reply.tool_calls
    assert call.status == CallStatus.UNTERMINATED and call.name == "get_weather"
    assert reply.end == EndReason.STOP_STRING and reply.finish_reason == "stop"


def test_stop_at_the_first_token(qwen3):
    im_end = qwen3.tokenizer.token_to_id("<|im_end|>")
    reply = qwen3.parse([im_end, *_ids(qwen3, "ignored")])
    assert reply == Reply(end=EndReason.END_OF_TURN, stop="<|im_end|>")
    assert qwen3.parse(_ids(qwen3, "x"), stop=["x"]).content == ""
    assert qwen3.parse(_ids(qwen3, "Hello"), length=True).finish_reason == "length"
    assert qwen3.parse(_ids(qwen3, "Hello")).end == EndReason.NONE


def test_every_declared_end_id_stops(qwen3, smollm2_gguf):
    assert set(qwen3.stop_ids.values()) == {
        (EndReason.END_OF_TURN, "<|im_end|>"),
        (EndReason.END_OF_TURN, "<|endoftext|>"),
    }
    gguf = ChatFormat.from_pretrained(smollm2_gguf)
    eos = gguf.tokenizer.token_to_id("<|im_end|>")
    assert gguf.stop_ids[eos][1] == "<|im_end|>"
    assert gguf.parse([*_ids(gguf, "Hi"), eos]).end in (EndReason.END_OF_TURN, EndReason.EOS)


# -- markers, formats -----------------------------------------------------------------------------------------------


def test_markers_typed_as_text_are_content(qwen3):
    text = 'Use <tool_call>{"name": "x", "arguments": {}}</tool_call> like this.'
    as_text = qwen3.tokenizer.encode_as_text(text).ids  # the same characters, but ordinary text tokens
    reply = qwen3.parse(as_text, reply_format="qwen3")
    assert reply.content == text and reply.tool_calls == []
    as_tokens = _ids(qwen3, text)
    assert qwen3.parse(as_tokens, reply_format="qwen3").tool_calls[0].name == "x"


def test_reasoning_and_a_prompt_that_opens_it(qwen3):
    ids = _ids(qwen3, "<think>\nLet me think.\n</think>\n\nThe answer is 4.")
    reply = qwen3.parse(ids, reply_format="qwen3")
    assert reply.reasoning_content == "Let me think." and reply.content == "The answer is 4."
    open_prompt = "<|im_start|>assistant\n<think>\n"
    started = qwen3.parse(_ids(qwen3, "Hmm.\n</think>\n\nFour."), prompt=open_prompt, reply_format="qwen3")
    assert started.reasoning_content == "Hmm." and started.content == "Four."
    closed = qwen3.parse(_ids(qwen3, "Four."), prompt="<think>\n\n</think>\n\n", reply_format="qwen3")
    assert closed.reasoning_content is None and closed.content == "Four."


def test_tool_call_statuses(qwen3):
    def call(body: str, **kwargs):
        return qwen3.parse(_ids(qwen3, f"<tool_call>\n{body}\n</tool_call>"), **kwargs).tool_calls[0]

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    assert call('{"name": "get_weather", "arguments": {"a": 1}}', tools=tools).status == CallStatus.OK
    assert call('{"name": "rm_rf", "arguments": {}}', tools=tools).status == CallStatus.UNKNOWN_TOOL
    assert call('{"name": "get_weather", "arguments": {"a": }}').status == CallStatus.INVALID_JSON
    assert call('{"arguments": {"a": 1}}').status == CallStatus.INVALID_JSON
    assert call('{"name": "f", "arguments": "{\\"a\\": 1}"}').arguments == '{"a": 1}'
    reply = qwen3.parse(_ids(qwen3, '<tool_call>\n{"name": "get_weather", "argu'))
    assert reply.tool_calls[0].status == CallStatus.UNTERMINATED and reply.finish_reason == "stop"
    ok = qwen3.parse(_ids(qwen3, '<tool_call>{"name": "f", "arguments": {}}</tool_call><|im_end|>'))
    assert ok.finish_reason == "tool_calls" and ok.message()["content"] is None


def test_text_only_replies(qwen3):
    reply = ChatFormat.from_family("qwen2.5").parse(
        'Hi.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert reply.content == "Hi." and reply.tool_calls[0].parsed_arguments == {"x": 1}


# -- round trips through encode --------------------------------------------------------------------------------------

CALL = {"id": "abcdefghi", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {}}},
}


def _round_trip(fmt: ChatFormat, message: dict, tools=None, reply_format=None) -> Reply:
    messages = [{"role": "user", "content": "Weather in Paris?"}, message]
    encoding = fmt.encode(messages, tools=tools, turns="last")
    trained = encoding.input_ids[encoding.assistant_mask.astype(bool)].tolist()
    return fmt.parse(trained, tools=tools, reply_format=reply_format)


def _template(name: str) -> str:
    folder = llamacpp_template_dir()
    if folder is None or not (folder / name).is_file():
        pytest.skip(f"{name} is not available")
    return (folder / name).read_text()


@pytest.mark.parametrize("family", ["chatml", "llama3", "plain", "qwen2.5"])
def test_round_trip_families(smollm2_hf_folder, family):
    markers = {
        "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "qwen2.5": ["<tool_call>", "</tool_call>"],
    }.get(family, [])
    fmt = ChatFormat.from_family(family, tokenizer=tokenizer_with_markers(smollm2_hf_folder, markers))
    reply = _round_trip(fmt, {"role": "assistant", "content": "It is sunny."})
    # the plain format writes "assistant: It is sunny.": the space is what the model generates after the prompt
    assert reply.content == (" It is sunny." if family == "plain" else "It is sunny.")
    if family == "qwen2.5":
        reply = _round_trip(fmt, {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]}, [TOOL])
        assert reply.content == "Checking." and reply.end == EndReason.END_OF_TURN
        (call,) = reply.tool_calls
        assert (call.name, call.parsed_arguments, call.status) == ("get_weather", {"city": "Paris"}, CallStatus.OK)


@pytest.mark.parametrize(
    ("template", "markers", "eos", "message"),
    [
        (
            "Qwen-Qwen3-0.6B.jinja",
            ["<tool_call>", "</tool_call>", "<think>", "</think>"],
            "<|im_end|>",
            {"role": "assistant", "reasoning_content": "Need the weather.", "content": "", "tool_calls": [CALL]},
        ),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            [
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|python_tag|>",
                "<|eom_id|>",
            ],
            "<|eot_id|>",
            {"role": "assistant", "tool_calls": [CALL]},
        ),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"],
            "</s>",
            {"role": "assistant", "tool_calls": [CALL]},
        ),
    ],
)
def test_round_trip_real_templates(smollm2_hf_folder, template, markers, eos, message):
    fmt = ChatFormat.from_template(
        _template(template),
        tokenizer=tokenizer_with_markers(smollm2_hf_folder, markers),
        bos_token=markers[0],
        eos_token=eos,
    )
    reply = _round_trip(fmt, message, [TOOL])
    (call,) = reply.tool_calls
    assert (call.name, call.parsed_arguments, call.status) == ("get_weather", {"city": "Paris"}, CallStatus.OK)
    if "reasoning_content" in message:
        assert reply.reasoning_content == message["reasoning_content"]
    assert reply.finish_reason == "tool_calls"


# -- peers ---------------------------------------------------------------------------------------------------------


def test_vllm_hermes_cases(qwen3):
    from corpus import CONFORMANCE

    path = CONFORMANCE / "peers" / "vllm_hermes_parser_cases.json"
    if not path.is_file():
        pytest.skip(f"{path} is absent (third-party peer vectors are read from ../shared, never copied here)")
    data = json.loads(path.read_text())
    cases = data.get("cases", data) if isinstance(data, dict) else data
    usable = [c for c in cases if isinstance(c, dict) and isinstance(c.get("model_output", c.get("output")), str)]
    if not usable:
        pytest.skip(f"{path}: no case with a model output in a shape this test knows")
    for case in usable:
        reply = qwen3.parse(case.get("model_output", case.get("output")), reply_format="hermes")
        expected = case.get("expected_tool_calls", case.get("tool_calls"))
        if isinstance(expected, list):
            names = [c.get("function", c).get("name") for c in expected if isinstance(c, dict)]
            assert [c.name for c in reply.tool_calls if c.status == CallStatus.OK] == names, case
        if isinstance(case.get("expected_content"), str):
            assert reply.content == case["expected_content"].strip(), case


# -- transcripts ---------------------------------------------------------------------------------------------------


def test_transcript_round_trip():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi\nthere"},
        {"role": "assistant", "content": "Hello!"},
    ]
    text = ChatFormat.from_family("chatml").render(messages, add_generation_prompt=True)
    assert parse_transcript(text) == [*messages, {"role": "assistant", "content": ""}]
    assert parse_transcript("") == []


@pytest.mark.parametrize(
    ("text", "line", "column", "reason"),
    [
        ("hello\n<|im_start|>user\nx<|im_end|>", 1, 1, "outside a turn"),
        ("<|im_start|>user\nx<|im_end|>\n  junk", 3, 3, "outside a turn"),
        ("<|im_start|>User\nx<|im_end|>", 1, 13, "not a lowercase word"),
        ("<|im_start|>user\nx\n<|im_start|>assistant\ny<|im_end|>", 3, 1, "before the user turn"),
        ("<|im_start|>user\nx<|im_end|>\n<|im_end|>", 3, 1, "outside any turn"),
        ("<|im_start|><|im_end|>", 1, 13, "no role"),
    ],
)
def test_malformed_transcripts_name_line_and_column(text, line, column, reason):
    with pytest.raises(TranscriptError, match=reason) as caught:
        parse_transcript(text)
    assert (caught.value.line, caught.value.column) == (line, column)
