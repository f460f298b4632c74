"""Tool calls through the server, in the syntax the template writes: the embedded SmolLM2 model served with a
Qwen3-Coder-style template override (``<tool_call>\\n<function=NAME>\\n<parameter=KEY>...``), the reply format chosen
from that template, a call forced with ``tool_choice`` and parsed from what the model generates, whole and streamed,
through the official openai client. And the 400 for a template whose tool calls nothing reads."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from serve_harness import turnkit_serve

#: Qwen3-Coder's tool syntax on ChatML (the shape of Qwen3.5's template, small enough to read).
QWEN3_CODER_STYLE = """{%- for message in messages %}
{%- if message.role == 'system' or (loop.first and tools) %}<|im_start|>system
{% if message.role == 'system' %}{{ message.content }}{% endif %}
{%- if tools %}
You may call these tools, written as <tool_call>
<function=NAME>
<parameter=KEY>
VALUE
</parameter>
</function>
</tool_call>:
{% for tool in tools %}{{ tool.function | tojson }}
{% endfor %}{% endif %}<|im_end|>
{% endif %}
{%- if message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}
<tool_call>
<function={{ call.function.name }}>
{% for key, value in call.function.arguments.items() %}<parameter={{ key }}>
{{ value if value is string else value | tojson }}
</parameter>
{% endfor %}</function>
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role != 'system' %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

#: A template that shows the tools and writes a call as its name and indented ``key = value`` lines, with nothing
#: that marks where an argument starts: a syntax no reading can follow (``CALL NAME WITH {json}``, say, is derived).
UNREADABLE = QWEN3_CODER_STYLE.replace(
    "<tool_call>\n<function={{ call.function.name }}>\n{% for key, value in call.function.arguments.items() %}"
    "<parameter={{ key }}>\n{{ value if value is string else value | tojson }}\n</parameter>\n{% endfor %}"
    "</function>\n</tool_call>",
    "{{ call.function.name }}:\n{% for key, value in call.function.arguments.items() %}  {{ key }} = {{ value }}\n"
    "{% endfor %}",
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    with turnkit_serve(
        "--model",
        str(smollm2_gguf),
        "--threads",
        "1",
        "--model-id",
        "smollm2",
        "--allow-template-override",
        name="serve-tools",
    ) as (url, log):
        yield url, log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


def _request(client, **kwargs):
    return client.chat.completions.create(
        model="smollm2",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=FORCED,
        temperature=0,
        max_tokens=48,
        extra_body={"chat_template": QWEN3_CODER_STYLE},
        **kwargs,
    )


def test_a_forced_call_is_parsed_in_the_templates_syntax_whole_and_streamed(client):
    whole = _request(client)
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.id
    stream = _request(client, stream=True)
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            entry = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = entry["id"] or piece.id
            entry["name"] += (piece.function.name or "") if piece.function else ""
            entry["arguments"] += (piece.function.arguments or "") if piece.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [(call.function.name, call.function.arguments)]
    assert content == (whole.choices[0].message.content or "") and finish == whole.choices[0].finish_reason
    if whole.choices[0].finish_reason == "tool_calls":  # the model completed the call: its arguments are an object
        assert isinstance(json.loads(call.function.arguments), dict)


def test_the_reply_format_read_from_the_template_is_the_one_served():
    from turnkit import ChatFormat

    fmt = ChatFormat.from_template(QWEN3_CODER_STYLE)
    assert fmt.reply_format.name == "qwen3_coder", fmt.reply_format.reason
    reply = fmt.parse(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        tools=TOOLS,
    )
    (call,) = reply.tool_calls
    assert (call.name, json.loads(call.arguments), call.status) == ("get_weather", {"city": "Paris"}, "ok")


def test_tools_a_template_writes_in_an_unreadable_syntax_are_a_400(server):
    body = {"model": "smollm2", "messages": MESSAGES, "tools": TOOLS, "chat_template": UNREADABLE}
    response = httpx.post(server[0] + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "tools_not_readable" and "cannot read back" in error["message"]
    without_tools = {**body, "tools": None, "max_tokens": 4}
    del without_tools["tools"]
    assert httpx.post(server[0] + "/v1/chat/completions", json=without_tools, timeout=60).status_code == 200
