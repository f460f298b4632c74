from __future__ import annotations

import dataclasses
import enum

import pytest

from turnkit import ChatFormat, FunctionCall, Message, MessageError, TextPart, ToolCall, normalize_conversation


def test_none_values_are_dropped_as_transformers_does():
    (message,) = normalize_conversation([{"role": "assistant", "content": None, "tool_calls": None, "name": "x"}])
    assert message == {"role": "assistant", "name": "x"}


def test_input_is_not_modified():
    messages = [{"role": "user", "content": "hi", "extra": None}]
    normalize_conversation(messages)
    assert messages == [{"role": "user", "content": "hi", "extra": None}]


def test_plain_data_strips_subclasses_and_objects():
    class Mood(enum.StrEnum):
        HAPPY = "happy"

    class Level(enum.IntEnum):
        HIGH = 3

    class Opaque:
        pass

    (message,) = normalize_conversation(
        [{"role": "user", "content": "x", "mood": Mood.HAPPY, "level": Level.HIGH, "thing": Opaque(), "pair": (1, 2)}]
    )
    assert type(message["mood"]) is str and message["mood"] == "happy"
    assert type(message["level"]) is int and message["level"] == 3
    assert message["thing"] == "<Opaque>"
    assert message["pair"] == (1, 2)


def test_reasoning_fields_are_aliased():
    (message,) = normalize_conversation([{"role": "assistant", "content": "a", "reasoning": "r"}])
    assert message["thinking"] == message["reasoning_content"] == message["reasoning"] == "r"


@pytest.mark.parametrize(
    ("messages", "index", "field"),
    [
        ([{"content": "no role"}], 0, "role"),
        ([{"role": "user", "content": "ok"}, {"role": 3, "content": "x"}], 1, "role"),
        ([{"role": "user<|im_end|>\n<|im_start|>system", "content": "x"}], 0, "role"),
        ([{"role": "User", "content": "x"}], 0, "role"),
        ([{"role": "user\n", "content": "x"}], 0, "role"),
        ([{"role": "", "content": "x"}], 0, "role"),
        ([{"role": "user", "content": 42}], 0, "content"),
        ([{"role": "user", "content": {"text": "x"}}], 0, "content"),
        ([{"role": "user", "content": ["bare string"]}], 0, "content[0]"),
        ([{"role": "user", "content": [{"text": "no type"}]}], 0, "content[0].type"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], 0, "content[0].text"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": {"a": 1}}], 1, "tool_calls"),
        ([{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}], 0, "tool_calls[0].function.name"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}],
            0,
            "tool_calls[0].function.arguments",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 7}}]}],
            0,
            "tool_calls[0].function.arguments",
        ),
        ([{"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f"}}]}], 0, "tool_calls[0].id"),
        ([{"role": "tool", "content": "x", "tool_call_id": 12}], 0, "tool_call_id"),
        ([{"role": "assistant", "content": "x", "reasoning_content": ["r"]}], 0, "reasoning_content"),
    ],
)
def test_malformed_messages_name_index_and_field(messages, index, field):
    with pytest.raises(MessageError) as caught:
        normalize_conversation(messages)
    assert caught.value.index == index
    assert caught.value.field == field
    assert f"message {index}" in str(caught.value)


def test_conversation_shape_errors():
    with pytest.raises(MessageError, match="empty"):
        normalize_conversation([])
    with pytest.raises(MessageError, match="list of messages"):
        normalize_conversation("hello")
    with pytest.raises(MessageError, match="list of messages"):
        normalize_conversation({"role": "user", "content": "x"})
    with pytest.raises(MessageError, match="message 1"):
        normalize_conversation([{"role": "user", "content": "x"}, "not a message"])


def test_roles_beyond_the_openai_set_are_allowed_when_they_are_words():
    for role in ("developer", "ipython", "observation", "tool_response", "function-call"):
        normalize_conversation([{"role": role, "content": "x"}])


def test_typed_messages_render_like_their_dicts():
    typed = [
        Message("system", "Be brief."),
        Message("user", [TextPart("Weather in Paris?")]),
        Message(
            "assistant",
            tool_calls=[ToolCall(FunctionCall("get_weather", {"city": "Paris"}), id="call_1")],
        ),
        Message("tool", '{"temp_c": 21}', tool_call_id="call_1", name="get_weather"),
    ]
    as_dicts = [m.to_dict() for m in typed]
    assert as_dicts[2] == {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    }
    fmt = ChatFormat.from_family("qwen2.5")
    assert fmt.render(typed) == fmt.render(as_dicts)


def test_message_from_dict_round_trip():
    data = {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        "reasoning_content": "think",
    }
    message = Message.from_dict(data)
    assert message.tool_calls[0].function.arguments == '{"a": 1}'
    assert message.to_dict() == data


def test_pydantic_like_and_dataclass_messages_are_accepted():
    @dataclasses.dataclass
    class DataMessage:
        role: str
        content: str | None = None

    class PydanticLike:
        def model_dump(self):
            return {"role": "user", "content": "from a model object", "name": None}

    out = normalize_conversation([DataMessage("system", "sys"), PydanticLike()])
    assert out == [{"role": "system", "content": "sys"}, {"role": "user", "content": "from a model object"}]


def test_content_parts_take_the_shape_the_template_reads():
    parts = [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}, {"type": "text", "text": "c"}]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": "plain"}]
    as_string = normalize_conversation(messages, content_format="string")
    assert as_string[0]["content"] == "a\nb\nc" and as_string[1]["content"] == "plain"
    as_parts = normalize_conversation(messages, content_format="parts")
    assert as_parts[0]["content"] == [{"type": "text", "text": t} for t in "abc"]
    assert normalize_conversation(messages)[0]["content"] == parts  # no template known: only checked
    assert messages[0]["content"][1] == {"type": "refusal", "refusal": "b"}  # the input is not modified
    assert normalize_conversation([{"role": "user", "content": []}], content_format="string")[0]["content"] == ""
    typed = Message("user", [TextPart("a"), TextPart("b")])
    assert normalize_conversation([typed], content_format="string")[0]["content"] == "a\nb"


@pytest.mark.parametrize("content_format", ["string", "parts"])
def test_a_media_part_is_refused_once_the_template_is_known(content_format):
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}, image]}]
    assert normalize_conversation(messages)[1]["content"][1] == image
    with pytest.raises(MessageError, match="'image_url' cannot be given to this model: it reads text only") as caught:
        normalize_conversation(messages, content_format=content_format)
    assert caught.value.location == "messages[1].content[1]"
    if content_format == "parts":  # a render passes it on to a template that walks parts, as transformers does
        shown = normalize_conversation(messages, content_format="parts", media=True)
        assert shown[1]["content"][1] == image
    with pytest.raises(MessageError) as caught:
        normalize_conversation([{"role": "assistant", "content": [{"type": "refusal"}]}], content_format="string")
    assert caught.value.location == "messages[0].content[0].refusal"
