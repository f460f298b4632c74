"""Reply parsing rules: arguments text, markers inside JSON strings, clean and failed endings, strict parsing, and the
format's own stop strings. Each rule is checked on token ids (single-token markers), on text, and streamed."""

from __future__ import annotations

import json

import pytest
from corpus import tokenizer_with_markers
from replies import as_client_sees, assemble, ids_of, stream

from turnkit import ChatFormat, TurnkitError
from turnkit.errors import ReplyParseError
from turnkit.parse import CallStatus, EndReason

MARKERS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
IDS = lambda i: f"call_{i}"  # noqa: E731 - deterministic call ids, so replies compare equal


@pytest.fixture(scope="module")
def qwen3(smollm2_hf_folder):
    """qwen2.5 with the hermes/qwen3 markers as single tokens."""
    return ChatFormat.from_family("qwen2.5", tokenizer=tokenizer_with_markers(smollm2_hf_folder, MARKERS))


@pytest.fixture(scope="module")
def untagged(smollm2_hf_folder):
    """qwen2.5 over the bare SmolLM2 tokenizer: <tool_call> is ordinary text there, matched as a text marker."""
    return ChatFormat.from_family("qwen2.5", tokenizer=tokenizer_with_markers(smollm2_hf_folder, []))


@pytest.fixture(scope="module")
def plain(smollm2_hf_folder):
    return ChatFormat.from_family("plain", tokenizer=tokenizer_with_markers(smollm2_hf_folder, []))


def _every_way(fmt: ChatFormat, text: str, **kwargs):
    """The reply parsed from text, and from ids whole and one token at a time: asserted equal, deltas included."""
    as_text = fmt.parse(text, call_id=IDS, **kwargs)
    ids = ids_of(fmt, text)
    whole = fmt.parse(ids, call_id=IDS, **kwargs)
    single, deltas = stream(fmt, ids, [1] * len(ids), **kwargs)
    assert whole == single
    assert assemble(deltas) == as_client_sees(whole)
    assert as_client_sees(as_text) == as_client_sees(whole)
    return whole


# -- arguments text -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "arguments"),
    [
        ('"hello"', '"hello"'),  # a JSON string that is not itself JSON stays a JSON string (as vLLM does)
        ('"[oops"', '"[oops"'),
        ('"[1, 2]"', '"[1, 2]"'),  # only a serialized *object* is unwrapped
        ('"{\\"a\\": 1}"', '{"a": 1}'),  # a serialized object is not encoded twice
        ('{"a": "x"}', '{"a": "x"}'),
        ("42", "42"),
    ],
)
def test_arguments_are_always_json_text(qwen3, written, arguments):
    text = f'<tool_call>\n{{"name": "f", "arguments": {written}}}\n</tool_call><|im_end|>'
    (call,) = _every_way(qwen3, text).tool_calls
    assert (call.status, call.arguments) == (CallStatus.OK, arguments)
    json.loads(call.arguments)


@pytest.mark.parametrize(
    ("reply_format", "text"),
    [
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": "hello"}]'),
        ("mistral", '[TOOL_CALLS]f[ARGS]"hello"'),
        ("llama3", '{"name": "f", "parameters": "hello"}'),
    ],
)
def test_buffered_formats_follow_the_same_arguments_rule(reply_format, text):
    (call,) = ChatFormat.from_family("chatml").parse(text, reply_format=reply_format).tool_calls
    assert (call.name, call.arguments, call.status) == ("f", '"hello"', CallStatus.OK)


# -- markers inside JSON strings ------------------------------------------------------------------------------------

IN_STRINGS = [
    {"s": "</tool_call> inside"},
    {"s": 'a \\" quote, then </tool_call>', "t": "<tool_call>"},
    {"</tool_call>": 1, "<think>": "</think>"},
]


@pytest.mark.parametrize("fixture", ["qwen3", "untagged"])
@pytest.mark.parametrize("arguments", IN_STRINGS)
def test_a_marker_inside_a_json_string_is_text(request, fixture, arguments):
    fmt = request.getfixturevalue(fixture)
    body = json.dumps({"name": "f", "arguments": arguments}, ensure_ascii=False)
    reply = _every_way(fmt, f"<tool_call>\n{body}\n</tool_call>After.<|im_end|>", reply_format="qwen3")
    (call,) = reply.tool_calls
    assert (call.status, call.parsed_arguments) == (CallStatus.OK, arguments)
    assert reply.content == "After." and reply.ended_cleanly


def test_a_marker_inside_the_name_string_is_text(qwen3):
    (call,) = _every_way(qwen3, '<tool_call>{"name": "a</tool_call>b", "arguments": {}}</tool_call>').tool_calls
    assert (call.name, call.status) == ("a</tool_call>b", CallStatus.OK)


# -- failed calls ---------------------------------------------------------------------------------------------------


def test_a_call_closed_before_its_json_is_complete_is_invalid_json(qwen3):
    body = '\n{"name": "f", "arguments": {"a": 1}\n'
    reply = _every_way(qwen3, f"<tool_call>{body}</tool_call><|im_end|>")
    (call,) = reply.tool_calls
    assert call.status == CallStatus.INVALID_JSON and call.raw == body and "not complete" in call.error
    assert reply.finish_reason == "stop" and not reply.ended_cleanly
    cut = _every_way(qwen3, f"<tool_call>{body}")  # the reply ends inside the call instead
    assert cut.tool_calls[0].status == CallStatus.UNTERMINATED and cut.tool_calls[0].raw == body


def test_a_failed_call_keeps_the_text_the_model_wrote(qwen3):
    body = '{"name": "f", "arguments": {"a": }}'
    (call,) = _every_way(qwen3, f"Sure.<tool_call>{body}</tool_call>").tool_calls
    assert call.status == CallStatus.INVALID_JSON and call.raw == body
    (listed,) = ChatFormat.from_family("chatml").parse("[TOOL_CALLS][{oops}]", reply_format="mistral").tool_calls
    assert listed.status == CallStatus.INVALID_JSON and listed.raw == "{oops}"


# -- ended_cleanly and strict ---------------------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
CALL = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'


@pytest.mark.parametrize(
    ("text", "kwargs", "clean", "match"),
    [
        ("Hi<|im_end|>", {}, True, None),
        ("Hi<|endoftext|>", {}, True, None),
        ("Hi there", {"stop": [" there"]}, True, None),
        (CALL + "<|im_end|>", {"tools": TOOLS}, True, None),
        ("Hi", {"length": True}, False, "token budget"),
        ("Hi", {}, False, "no end-of-turn marker"),
        ('<tool_call>{"name": "f", "argu', {"length": True}, False, "inside tool call 0"),
        ('<tool_call>{"name": "f", "arguments": {"a": }}</tool_call><|im_end|>', {}, False, "tool call 0: 'f' .*JSON"),
        ('<tool_call>{"name": "rm", "arguments": {}}</tool_call><|im_end|>', {"tools": TOOLS}, False, "unknown_tool"),
    ],
)
def test_ended_cleanly_and_strict(qwen3, text, kwargs, clean, match):
    ids = ids_of(qwen3, text)
    reply = qwen3.parse(ids, call_id=IDS, **kwargs)
    assert reply.ended_cleanly is clean
    assert qwen3.parse(text, call_id=IDS, **kwargs).ended_cleanly is clean
    if clean:
        assert qwen3.parse(ids, call_id=IDS, strict=True, **kwargs) == reply
        return
    with pytest.raises(ReplyParseError, match=match) as caught:
        qwen3.parse(ids, call_id=IDS, strict=True, **kwargs)
    assert isinstance(caught.value, TurnkitError) and caught.value.reply == reply


def test_a_strict_stream_still_streams_then_raises_at_finish(qwen3):
    ids = ids_of(qwen3, 'Sure.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    parser = qwen3.stream_parser(call_id=IDS, strict=True)
    deltas = parser.feed(ids)
    assert assemble(deltas)["content"] == "Sure." and assemble(deltas)["calls"][0]["name"] == "f"
    with pytest.raises(ReplyParseError, match="did not end") as caught:
        parser.finish()
    assert caught.value.call_index is None and caught.value.reply.tool_calls[0].status == CallStatus.OK


# -- the format's own stop strings ----------------------------------------------------------------------------------


def test_the_plain_familys_stop_string_ends_the_reply(plain):
    text = " It is sunny.\nuser: And tomorrow?\nassistant: Rain."
    reply = _every_way(plain, text)
    assert (reply.content, reply.end, reply.stop) == (" It is sunny.", EndReason.END_OF_TURN, "\nuser:")
    assert reply.ended_cleanly and reply.finish_reason == "stop"
    parser = plain.stream_parser()
    deltas = [d for token in ids_of(plain, text) for d in parser.feed([token])]
    parser.finish()
    assert assemble(deltas + parser.final_deltas)["content"] == " It is sunny."  # nothing after the stop is emitted
    both = plain.parse(ids_of(plain, text), stop=["sunny"])  # the request's stops apply as well
    assert (both.content, both.end, both.stop) == (" It is ", EndReason.STOP_STRING, "sunny")


def test_families_without_stop_strings_do_not_stop_there(smollm2_hf_folder):
    chatml = ChatFormat.from_family("chatml", tokenizer=tokenizer_with_markers(smollm2_hf_folder, []))
    text = "Sunny.\nuser: more"
    assert chatml.parse(ids_of(chatml, text)).content == text
