"""Reply parsing: chunking invariance, stops, formats, round trips through encode, transcripts."""

from __future__ import annotations

import json

import pytest
from corpus import PEERS, require, template_text, tokenizer_with_markers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replies import as_client_sees, assemble, ids_of, stream

from turnkit import ChatFormat, TranscriptError, parse_transcript
from turnkit.errors import ReplyParseError, TokenizerError
from turnkit.parse import REPLY_FORMATS, CallStatus, EndReason, Reply, StreamParser

MARKERS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]


@pytest.fixture(scope="module")
def tokenizer(smollm2_hf_folder):
    return tokenizer_with_markers(smollm2_hf_folder, MARKERS)


@pytest.fixture(scope="module")
def qwen3(tokenizer):
    """The qwen2.5 family's template with the qwen3 reply format (tools and <think> reasoning)."""
    return ChatFormat.from_family("qwen2.5", tokenizer=tokenizer)


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
    ids = ids_of(qwen3, text)
    stop = data.draw(st.sampled_from([None, "world", "\n\n", "o w", "42}"]))
    kwargs = {"reply_format": "qwen3", "stop": stop}
    whole, whole_deltas = stream(qwen3, ids, [len(ids)], **kwargs)
    single, single_deltas = stream(qwen3, ids, [1] * len(ids), **kwargs)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=5), max_size=len(ids)))
    mixed, mixed_deltas = stream(qwen3, ids, cuts, **kwargs)
    assert whole == single == mixed
    for deltas in (whole_deltas, single_deltas, mixed_deltas):
        assert assemble(deltas) == as_client_sees(whole)
    if stop:
        assert stop not in whole.content and all(stop not in (d.content or "") for d in single_deltas)


# -- stops --------------------------------------------------------------------------------------------------------


def test_stop_strings_split_across_tokens_never_leak(qwen3):
    text = "The answer is STOP HERE and more"
    ids = ids_of(qwen3, text)
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
    ids = ids_of(qwen3, "abcdef")
    assert qwen3.parse(ids, stop=["cde", "bcd"]).stop == "bcd"
    assert qwen3.parse(ids, stop=["bc", "bcdef"]).stop == "bcdef"
    assert qwen3.parse(ids, stop=["bc", "bcdef"]).content == "a"


def test_a_stop_string_inside_a_tool_call_leaves_it_unterminated(qwen3):
    ids = ids_of(qwen3, 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    reply = qwen3.parse(ids, stop=["Paris"])
    assert reply.content == "Sure."
    (call,) = reply.tool_calls
    assert call.status == CallStatus.UNTERMINATED and call.name == "get_weather"
    assert reply.end == EndReason.STOP_STRING and reply.finish_reason == "stop"


def test_stop_at_the_first_token(qwen3):
    im_end = qwen3.tokenizer.token_to_id("<|im_end|>")
    reply = qwen3.parse([im_end, *ids_of(qwen3, "ignored")])
    assert reply == Reply(end=EndReason.END_OF_TURN, stop="<|im_end|>")
    assert qwen3.parse(ids_of(qwen3, "x"), stop=["x"]).content == ""
    assert qwen3.parse(ids_of(qwen3, "Hello"), length=True).finish_reason == "length"
    assert qwen3.parse(ids_of(qwen3, "Hello")).end == EndReason.NONE


def test_every_declared_end_id_stops(qwen3, smollm2_gguf):
    assert set(qwen3.stop_ids.values()) == {
        (EndReason.END_OF_TURN, "<|im_end|>"),
        (EndReason.END_OF_TURN, "<|endoftext|>"),
    }
    gguf = ChatFormat.from_pretrained(smollm2_gguf)
    eos = gguf.tokenizer.token_to_id("<|im_end|>")
    assert gguf.stop_ids[eos][1] == "<|im_end|>"
    assert gguf.parse([*ids_of(gguf, "Hi"), eos]).end in (EndReason.END_OF_TURN, EndReason.EOS)


def test_a_request_stop_token_id_ends_the_reply_whole_and_streamed(qwen3):
    """vLLM's ``stop_token_ids`` (issue 46): a template whose reply ends at the next role's marker (GLM) is read to
    that id, whole and streamed alike, as a clean end (``finish_reason`` ``stop``); its text is not the reply's."""
    im_start, im_end = qwen3.tokenizer.token_to_id("<|im_start|>"), qwen3.tokenizer.token_to_id("<|im_end|>")
    ids = [*ids_of(qwen3, "Hello there"), im_start, *ids_of(qwen3, "user\nmore")]
    whole = qwen3.parse(ids, stop_token_ids=[im_start])
    assert whole == Reply(content="Hello there", end=EndReason.STOP_TOKEN, stop="<|im_start|>")
    assert whole.finish_reason == "stop" and whole.ended_cleanly
    streamed, deltas = stream(qwen3, ids, [1] * len(ids), stop_token_ids=[im_start])
    assert as_client_sees(streamed) == as_client_sees(whole) and streamed.end == EndReason.STOP_TOKEN
    assert assemble(deltas)["content"] == "Hello there"
    assert qwen3.parse(ids).end == EndReason.NONE  # without it, the marker does not end the reply
    # the format's own end ids keep their reason when a request names them too
    assert qwen3.parse([im_end], stop_token_ids=[im_end]).end == EndReason.END_OF_TURN
    with pytest.raises(TypeError, match="stop_token_ids"):
        qwen3.stream_parser(text=True, stop_token_ids=[im_start])


# -- ids the tokenizer has no token for (issue 34 item 8) ------------------------------------------------------------


def test_an_id_outside_the_vocabulary_is_an_error_naming_it(qwen3):
    """Such an id stands for no text: it was dropped and the reply read as clean with text missing. The server refuses
    the same ids in a prompt; here the whole parse and the stream both say which id it was, and where."""
    size = qwen3.tokenizer.backend.get_vocab_size(with_added_tokens=True)
    im_end = qwen3.tokenizer.token_to_id("<|im_end|>")
    hello = ids_of(qwen3, "Hello")
    for wrong in (size, 10**9, -1):
        with pytest.raises(TokenizerError, match=rf"token id {wrong} \(token {len(hello) + 1} of the reply\)"):
            qwen3.parse([*hello, wrong, im_end])
        parser = qwen3.stream_parser()
        parser.feed(hello)  # the position counts across chunks
        with pytest.raises(TokenizerError, match=rf"token id {wrong} \(token {len(hello) + 1} of the reply\) is not "):
            parser.feed([wrong])
    # the last id of the vocabulary (an added marker) is a token, and ids after the reply ended are not read
    marker = qwen3.tokenizer.token_to_id("</think>")
    assert marker == size - 1
    assert qwen3.parse([*hello, marker, im_end]).end == EndReason.END_OF_TURN
    assert qwen3.parse([*hello, im_end, size]).ended_cleanly


def test_a_token_numbered_past_the_count_is_a_token(smollm2_hf_folder):
    """A vocabulary may leave a gap in its ids, so its last id is past its count: that id is still a token."""
    from tokenizers import Tokenizer

    from turnkit.tokenizer import TokenizerBinding

    spec = json.loads((smollm2_hf_folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    (moved,) = [token for token, token_id in vocab.items() if token_id == 500]
    vocab[moved] = 60_000
    binding = TokenizerBinding(Tokenizer.from_str(json.dumps(spec)))
    assert binding.backend.get_vocab_size(with_added_tokens=True) < 60_000
    fmt = ChatFormat.from_family("chatml", tokenizer=binding)
    reply = fmt.parse([*ids_of(fmt, "Hi"), 60_000, fmt.tokenizer.token_to_id("<|im_end|>")])
    assert reply.content == "Hi" + moved and reply.ended_cleanly
    with pytest.raises(TokenizerError, match="token id 500 "):
        fmt.parse([500])


def test_finish_reason_of_a_reply_that_never_ended():
    """An API must answer one of its reasons, so the library says stop; end and ended_cleanly tell it apart."""
    reply = ChatFormat.from_family("chatml").parse("Hello, wor")
    assert (reply.end, reply.finish_reason, reply.ended_cleanly) == (EndReason.NONE, "stop", False)


# -- markers, formats -----------------------------------------------------------------------------------------------


def test_markers_typed_as_text_are_content(qwen3):
    text = 'Use <tool_call>{"name": "x", "arguments": {}}</tool_call> like this.'
    as_text = qwen3.tokenizer.encode_as_text(text).ids  # the same characters, but ordinary text tokens
    reply = qwen3.parse(as_text, reply_format="qwen3")
    assert reply.content == text and reply.tool_calls == []
    as_tokens = ids_of(qwen3, text)
    assert qwen3.parse(as_tokens, reply_format="qwen3").tool_calls[0].name == "x"


def test_reasoning_and_a_prompt_that_opens_it(qwen3):
    ids = ids_of(qwen3, "<think>\nLet me think.\n</think>\n\nThe answer is 4.")
    reply = qwen3.parse(ids, reply_format="qwen3")
    assert reply.reasoning_content == "Let me think." and reply.content == "The answer is 4."
    open_prompt = "<|im_start|>assistant\n<think>\n"
    started = qwen3.parse(ids_of(qwen3, "Hmm.\n</think>\n\nFour."), prompt=open_prompt, reply_format="qwen3")
    assert started.reasoning_content == "Hmm." and started.content == "Four."
    closed = qwen3.parse(ids_of(qwen3, "Four."), prompt="<think>\n\n</think>\n\n", reply_format="qwen3")
    assert closed.reasoning_content is None and closed.content == "Four."


def test_a_marker_data_spells_in_the_prompt_does_not_open_reasoning(qwen3):
    """A tool result or user turn that holds ``<think>`` is text pieces, not the control id: a prompt given as ids
    whose data spells it leaves the reply outside reasoning; the same prompt with the template's own ``<think>`` id
    opens it."""
    chat = [{"role": "user", "content": "Print the tag <think> for me."}]
    forged = qwen3.encode(chat, add_generation_prompt=True).input_ids.tolist()
    assert qwen3.tokenizer.added["<think>"].id not in forged
    reply = qwen3.parse(ids_of(qwen3, "Here it is."), prompt=forged, reply_format="qwen3")
    assert reply.reasoning_content is None and reply.content == "Here it is."
    opened = [*forged, qwen3.tokenizer.added["<think>"].id]
    started = qwen3.parse(ids_of(qwen3, "Hmm.</think>Four."), prompt=opened, reply_format="qwen3")
    assert started.reasoning_content == "Hmm." and started.content == "Four."


def test_tool_call_statuses(qwen3):
    def call(body: str, **kwargs):
        return qwen3.parse(ids_of(qwen3, f"<tool_call>\n{body}\n</tool_call>"), **kwargs).tool_calls[0]

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    assert call('{"name": "get_weather", "arguments": {"a": 1}}', tools=tools).status == CallStatus.OK
    assert call('{"name": "rm_rf", "arguments": {}}', tools=tools).status == CallStatus.UNKNOWN_TOOL
    assert call('{"name": "get_weather", "arguments": {"a": }}').status == CallStatus.INVALID_JSON
    assert call('{"arguments": {"a": 1}}').status == CallStatus.INVALID_JSON
    assert call('{"name": "f", "arguments": "{\\"a\\": 1}"}').arguments == '{"a": 1}'
    reply = qwen3.parse(ids_of(qwen3, '<tool_call>\n{"name": "get_weather", "argu'))
    assert reply.tool_calls[0].status == CallStatus.UNTERMINATED and reply.finish_reason == "stop"
    ok = qwen3.parse(ids_of(qwen3, '<tool_call>{"name": "f", "arguments": {}}</tool_call><|im_end|>'))
    assert ok.finish_reason == "tool_calls" and ok.message()["content"] is None


def test_text_only_replies(qwen3):
    reply = ChatFormat.from_family("qwen2.5").parse(
        'Hi.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert reply.content == "Hi." and reply.tool_calls[0].parsed_arguments == {"x": 1}


def test_markers_written_in_text_count(qwen3):
    """A reply that exists only as text has no ids to go by: its end-of-turn markers end it. With ids, only the id
    counts: the same characters written as ordinary text tokens stay content."""
    for fmt in (ChatFormat.from_family("chatml"), ChatFormat.from_family("qwen2.5")):
        reply = fmt.parse("Hi<|im_end|>more")
        assert (reply.content, reply.end, reply.stop) == ("Hi", EndReason.END_OF_TURN, "<|im_end|>")
        assert reply.ended_cleanly
    assert qwen3.parse(ids_of(qwen3, "Hi<|im_end|>more")).content == "Hi"
    as_text = qwen3.tokenizer.encode_as_text("Hi<|im_end|>more").ids
    assert qwen3.parse(as_text).content == "Hi<|im_end|>more"


def test_mistral_calls_written_in_text():
    fmt = ChatFormat.from_template(
        template_text("mistralai-Mistral-Nemo-Instruct-2407.jinja"), bos_token="<s>", eos_token="</s>"
    )
    reply = fmt.parse('Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]</s>')
    assert (reply.content, reply.end, reply.stop) == ("Checking.", EndReason.END_OF_TURN, "</s>")
    (call,) = reply.tool_calls
    assert (call.name, call.parsed_arguments, call.status) == ("get_weather", {"city": "Paris"}, CallStatus.OK)
    assert reply.finish_reason == "tool_calls" and reply.ended_cleanly


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
        template_text(template),
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


HERMES_CASES = PEERS / "vllm_hermes_parser_cases.json"

#: Where turnkit deliberately differs from vLLM's Hermes parser. vLLM gives up on a call whose JSON is broken and
#: returns the whole output, markup included, as content. turnkit keeps it as a failed call instead: status
#: ``unterminated`` (the reply ends inside the JSON; ``invalid_json`` when ``</tool_call>`` closes it incomplete),
#: the model's text in ``raw``, no markup in the content, ``finish_reason`` ``stop`` (not ``tool_calls``, like vLLM's
#: tools_called=False) and ``ended_cleanly`` False; ``strict=True`` raises. A client never shows tool-call markup as
#: prose, and nothing the model wrote is lost.
VLLM_DIFFERENCES = {"non_streaming_invalid_json": CallStatus.UNTERMINATED}


def _hermes_cases() -> list:
    if not HERMES_CASES.is_file():
        return [pytest.param(None, id="absent")]
    cases = json.loads(HERMES_CASES.read_text(encoding="utf-8"))["cases"]
    return [pytest.param(case, id=case["name"]) for case in cases]


@pytest.mark.parametrize("case", _hermes_cases())
def test_vllm_hermes_cases(qwen3, case):
    """Every case of vLLM's Hermes parser tests, as text through ``fmt.parse`` and as ids streamed 1, 2, 3, 5 and 8
    tokens per chunk and at the case's own ``stream_intervals`` (and vLLM's own text deltas where the case gives
    them): all agree, and match vLLM's expectations except where VLLM_DIFFERENCES says otherwise."""
    if case is None:
        require(HERMES_CASES)
    text, call_id = case["model_output"], (lambda i: f"call_{i}")
    reply = qwen3.parse(text, reply_format="hermes", call_id=call_id)
    ids = ids_of(qwen3, text)
    assert qwen3.parse(ids, reply_format="hermes", call_id=call_id) == reply
    for size in sorted({1, 2, 3, 5, 8, len(ids), *(case.get("stream_intervals") or [])}):  # and vLLM's own
        streamed, deltas = stream(qwen3, ids, [size] * (len(ids) // size), reply_format="hermes")
        assert streamed == reply, size
        assert assemble(deltas) == as_client_sees(reply), size
    if "stream_chunks" in case:
        parser = StreamParser(REPLY_FORMATS["hermes"], call_id=call_id)  # vLLM's own text deltas
        deltas = [d for chunk in case["stream_chunks"] for d in parser.feed_text(chunk)]
        assert parser.finish() == reply and assemble(deltas + parser.final_deltas) == as_client_sees(reply)

    if case["name"] in VLLM_DIFFERENCES:
        assert not case["tools_called"] and case["expected_content"] == text  # vLLM: no call, the text as content
        (call,) = reply.tool_calls
        assert call.status == VLLM_DIFFERENCES[case["name"]] and "<tool_call>" + call.raw == text
        assert reply.content == "" and reply.finish_reason == "stop" and not reply.ended_cleanly
        with pytest.raises(ReplyParseError):
            qwen3.parse(text, reply_format="hermes", strict=True)
        return
    assert reply.ok, reply.tool_calls
    assert reply.finish_reason == ("tool_calls" if case["tools_called"] else "stop")
    expected = case["expected_tool_calls"]
    assert [c.name for c in reply.tool_calls] == [e["name"] for e in expected]
    for call, want in zip(reply.tool_calls, expected, strict=True):
        assert json.loads(call.arguments) == want["arguments"]
        if "arguments_json" in want:
            assert call.arguments == want["arguments_json"]
    if case["expected_content"] is not None:
        assert reply.content == case["expected_content"]


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


def test_transcript_calls_get_ids_numbered_across_it_of_the_shape_given():
    """A call written without an id gets one numbered across the transcript, not ``call_0`` in every turn, of the
    shape a format's ``replies.call_ids`` says (Mistral's templates take only nine letters and digits back)."""
    from turnkit.parse.choice.call_ids import CallIds

    turn = '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>\n'
    text = f"<|im_start|>user\nGo<|im_end|>\n{turn}<|im_start|>tool\nok<|im_end|>\n{turn}"

    def ids(call_ids: CallIds | None = None) -> list[str]:
        messages = parse_transcript(text, reply_format="hermes", call_ids=call_ids)
        return [call["id"] for m in messages for call in m.get("tool_calls", [])]

    assert ids() == ["call_0", "call_1"]
    assert ids(CallIds("nine")) == ["call00000", "call00001"]


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
