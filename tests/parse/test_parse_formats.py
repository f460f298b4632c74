"""Every reply format of the catalog, on replies built from its own markers and the characters its syntaxes use:
the parser always finishes, the reply is the same however the text is cut into pieces, the deltas add up to it, an
``ok`` call's arguments are JSON, and the engine's safety net (a state it cannot leave) never fires.

Also the formats' data itself: patterns, and a few syntaxes checked by hand."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replies import as_client_sees, assemble

from turnkit.parse import REPLY_FORMATS, Arguments, Hole, Lit, ReplyFormat, StreamParser, tool_syntax
from turnkit.parse.reply import CallStatus, Reply

_SNIPPETS = [
    "{", "}", '"', ":", ",", "=", "(", ")", "[", "]", "<", ">", "\n", " ", "x", "get_weather", "city", "42",
    "true", "null", "é", "\\", "'", "Paris", '{"name": "f", "arguments": {"a": 1}}', "f(a=1)", "<|\"|>",
]  # fmt: skip


def _pieces(fmt: ReplyFormat) -> list[str]:
    found = [*fmt.markers, *fmt.end_texts, *_SNIPPETS]
    for syntax in fmt.tools:
        found.append(syntax.trigger)
    return sorted(set(found))


def _parse(fmt: ReplyFormat, chunks: list[str]) -> tuple[Reply, list]:
    parser = StreamParser(fmt.ending_with(("<|im_end|>",)), call_id=lambda i: f"call_{i}")
    deltas = []
    for chunk in chunks:
        deltas += parser.feed_text(chunk)
    reply = parser.finish()
    return reply, deltas + parser.final_deltas


@pytest.mark.parametrize("name", sorted(REPLY_FORMATS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_reply_any_chunking(name, data):
    fmt = REPLY_FORMATS[name]
    text = "".join(data.draw(st.lists(st.sampled_from(_pieces(fmt)), max_size=24), label="pieces"))
    whole, whole_deltas = _parse(fmt, [text])
    cuts = sorted(data.draw(st.sets(st.integers(0, max(len(text), 1)), max_size=8), label="cuts"))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    streamed, deltas = _parse(fmt, chunks)
    assert streamed == whole
    assert assemble(deltas) == as_client_sees(whole) == assemble(whole_deltas)
    assert not any("could not follow" in p for p in whole.problems)
    for call in whole.tool_calls:
        if call.status == CallStatus.OK:
            json.loads(call.arguments)


def test_patterns_are_literals_and_holes():
    syntax = tool_syntax(
        "<tool_call>\n<function={name}>\n{args}</function>",
        Arguments("tagged"),
        param="<parameter={key}>{value}</parameter>",
    )
    assert syntax.call[:3] == (Lit("<tool_call>\n<function="), Hole("name"), Lit(">\n"))
    assert syntax.arguments.param == (Lit("<parameter="), Hole("key"), Lit(">"), Hole("value"), Lit("</parameter>"))
    assert syntax.trigger == "<tool_call>"
    with pytest.raises(ValueError, match="unknown hole"):
        tool_syntax("{nope}", Arguments("json"))


@pytest.mark.parametrize(
    ("name", "text", "calls"),
    [
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\n</tool_call>",
         [("f", {"a": "x"})]),
        ("glm45", "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>x</arg_value>\n</tool_call>",
         [("f", {"a": "x"})]),
        ("deepseek_v32", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n'
         '<｜DSML｜parameter name="n" string="false">3</｜DSML｜parameter>\n'
         "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
         [("f", {"n": 3})]),
        ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}"
         "<|tool_call_end|><|tool_calls_section_end|>", [("f", {})]),
        ("pythonic", '[f(a=1, b="x"), g()]', [("f", {"a": 1, "b": "x"}), ("g", {})]),
        ("gemma4", '<|tool_call>call:f{a:<|"|>x<|"|>,n:2}<tool_call|>', [("f", {"a": "x", "n": 2})]),
        ("harmony", '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>',
         [("f", {"a": 1})]),
    ],
)  # fmt: skip
def test_syntaxes_by_hand(name, text, calls):
    reply, _ = _parse(REPLY_FORMATS[name], [text])
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == calls
    assert reply.content == "" and reply.ok


@pytest.mark.parametrize("chunk", [None, 1, 3])
def test_a_bare_object_without_a_name_is_content(chunk):
    """A reply that opens as a bare call (Llama 3's ``{"name": ...}``) but whose object holds no name was no call:
    its text is content, whole and streamed (the parser once failed an assertion here: the object's end moved a call
    on that had already fallen back to content)."""
    text = '{"foo": 1} and more'
    chunks = [text] if chunk is None else [text[i : i + chunk] for i in range(0, len(text), chunk)]
    reply, deltas = _parse(REPLY_FORMATS["llama3"], chunks)
    assert reply.content == text and reply.tool_calls == [] and reply.problems == []
    assert "".join(d.content or "" for d in deltas) == text
