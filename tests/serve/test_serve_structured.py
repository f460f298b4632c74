"""Requests the server must honour or refuse, never answer as if honoured: structured output (``response_format``
``json_object`` and ``json_schema`` through llguidance's grammar-constrained decoding: every reply parses and
validates against its schema, with ``jsonschema`` as the judge) and ``tools`` on a template that cannot show them.
On ``turnkit serve`` with the real embedded SmolLM2 and the official openai client."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from serve_harness import TOOLS, turnkit_serve

MODEL = "SmolLM2-135M-Instruct"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Rome", "Madrid"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person as JSON with name, age and city."}]


def _schema_format(schema=PERSON):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    with turnkit_serve(
        "--threads",
        "1",
        "--no-ui",
        "--model",
        f"{MODEL}=default",
        "--model",
        "qwen-tools=default:qwen2.5",
        name="serve-structured",
    ) as (url, _log):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_json_schema_replies_always_validate(client):
    replies = []
    for seed in range(4):
        response = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            response_format=_schema_format(),
            n=4,
            temperature=1.0,
            seed=seed,
            max_tokens=60,
        )
        replies += [choice.message.content for choice in response.choices]
        assert all(choice.finish_reason == "stop" for choice in response.choices)
    assert len(replies) == 16
    for reply in replies:
        jsonschema.validate(json.loads(reply), PERSON)
    assert len(set(replies)) > 1  # sampled, not one forced string


def test_json_object_is_a_json_object(client):
    for seed in (1, 2):
        response = client.chat.completions.create(
            model=MODEL, messages=ASK, response_format={"type": "json_object"}, seed=seed, max_tokens=80
        )
        reply = response.choices[0].message.content
        if response.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(reply), dict)


def test_streamed_json_parses(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, response_format=_schema_format(), seed=3, max_tokens=60, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_a_reply_cut_short_is_a_400_not_invalid_json(client, server):
    with pytest.raises(openai.BadRequestError, match="cut short by max_tokens") as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, response_format=_schema_format(), max_tokens=3)
    assert caught.value.code == "incomplete_json"
    body = {"model": MODEL, "messages": ASK, "response_format": _schema_format(), "max_tokens": 3, "stream": True}
    events = httpx.post(server + "/v1/chat/completions", json=body, timeout=120).text
    assert '"code": "incomplete_json"' in events and events.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("response_format", "needle"),
    [
        ({"type": "xml"}, "response_format type must be"),
        ({"type": "json_schema"}, "needs json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}, "response_format"),
    ],
)
def test_bad_response_formats_are_400s(server, response_format, needle):
    body = {"model": MODEL, "messages": ASK, "response_format": response_format, "max_tokens": 3}
    response = httpx.post(server + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 400 and needle in response.json()["error"]["message"]


def test_response_format_with_tools_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="cannot be combined"):
        client.chat.completions.create(
            model="qwen-tools", messages=ASK, response_format={"type": "json_object"}, tools=TOOLS
        )


def test_tools_on_a_template_that_ignores_them_are_a_400(client, server):
    # SmolLM2's own template renders the same prompt with or without tools: the model would never see them
    with pytest.raises(openai.BadRequestError, match="does not support tools") as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=3)
    assert caught.value.code == "tools_not_supported" and caught.value.param == "tools"
    # tool_choice none offers no tools, so there is nothing to refuse
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=2)
    assert reply.choices[0].finish_reason == "length"
    # the same weights with a template that shows tools accept them
    shown = client.chat.completions.create(model="qwen-tools", messages=ASK, tools=TOOLS, max_tokens=2)
    assert shown.choices[0].finish_reason in ("length", "stop", "tool_calls")


#: An ordinary tool schema: it names its keys and says nothing of others (JSON Schema leaves the object open).
OPEN_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "maximum": 7}},
            "required": ["city"],
        },
    },
}


def test_sampled_forced_calls_of_an_ordinary_schema_add_no_keys(client):
    """A forced call decodes an object schema as OpenAI's strict mode does: no key the schema does not name. Sampled,
    such calls had grown keys of their own (``{"city": "Oslo", "temperature": {"temperature": ...``) until the budget
    cut them, arguments not JSON."""
    closed = {**OPEN_WEATHER["function"]["parameters"], "additionalProperties": False}
    reply = client.chat.completions.create(
        model="qwen-tools",
        messages=[{"role": "user", "content": "What is the weather in Oslo this week?"}],
        tools=[OPEN_WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=1.0,
        seed=11,
        n=8,
        max_tokens=96,
    )
    for choice in reply.choices:
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), closed)
        assert choice.finish_reason in ("tool_calls", "stop"), choice


def test_strict_objects_closes_what_names_its_keys_and_nothing_else():
    from turnkit.serve.structured import strict_objects

    item = {"type": "object", "properties": {"x": {"type": "number"}}}
    schema = {
        "type": "object",
        "properties": {
            "point": item,
            "points": {"type": "array", "items": item},
            "either": {"anyOf": [item, {"type": "string"}]},
            "ref": {"$ref": "#/$defs/thing"},
            "open": {"type": "object"},
            "mapping": {"type": "object", "additionalProperties": item},
            "said": {**item, "additionalProperties": True},
            "merged": {"allOf": [item, {"properties": {"y": {"type": "number"}}}]},
        },
        "$defs": {"thing": item},
    }
    out = strict_objects(schema)
    closed = {**item, "additionalProperties": False}
    props = out["properties"]
    assert out["additionalProperties"] is False and out["$defs"]["thing"] == closed
    assert props["point"] == closed and props["points"]["items"] == closed and props["either"]["anyOf"][0] == closed
    assert props["open"] == {"type": "object"}  # it asked for any object
    assert props["mapping"]["additionalProperties"] == closed and "properties" not in props["mapping"]
    assert props["said"]["additionalProperties"] is True  # what a schema says stands
    assert all("additionalProperties" not in member for member in props["merged"]["allOf"])  # each names a share
    assert schema["properties"]["point"] == item  # the caller's schema is not changed
