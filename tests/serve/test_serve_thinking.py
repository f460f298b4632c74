"""Thinking switches and prefill: found from the template, set through the variable it reads, and the same through
every API; the prompt of a continued assistant message is the template's own text for that open turn, encoded safely.

The switch is read from real templates of llama.cpp's corpus; the server tests run the app in this process on a
replay backend (the prompt is what is checked, through ``/tokenize`` and ``count_tokens``) under Qwen3's template with
the real SmolLM2 tokenizer.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest
from corpus import template_text, tokenizer_with_markers
from serve_harness import serving

from turnkit import ChatFormat
from turnkit.errors import SwitchError
from turnkit.serve import ReplayBackend
from turnkit.template.switches import ThinkingSwitch, thinking_switch

SWITCHES = {
    "Qwen-Qwen3-0.6B.jinja": ThinkingSwitch(toggle="enable_thinking"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ThinkingSwitch(toggle="enable_thinking"),  # reads thinking, aliased
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ThinkingSwitch(toggle="thinking"),
    "MiniMax-M3.jinja": ThinkingSwitch(toggle="thinking_mode"),
    "openai-gpt-oss-120b.jinja": ThinkingSwitch(effort="reasoning_effort"),
    "Kimi-K3.jinja": ThinkingSwitch(toggle="thinking", effort="thinking_effort"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ThinkingSwitch(),
}


@pytest.mark.parametrize("name", SWITCHES)
def test_the_switch_is_found_in_the_template(name):
    assert thinking_switch(template_text(name)) == SWITCHES[name]


def test_a_request_sets_the_variable_the_template_reads():
    assert ThinkingSwitch(toggle="enable_thinking").variables(enabled=False) == {"enable_thinking": False}
    assert ThinkingSwitch(toggle="thinking_mode").variables(enabled=True) == {"thinking_mode": "enabled"}
    assert ThinkingSwitch(effort="reasoning_effort").variables(effort="low") == {"reasoning_effort": "low"}
    both = ThinkingSwitch(toggle="thinking", effort="thinking_effort")
    assert both.variables(effort="high") == {"thinking": True, "thinking_effort": "high"}
    assert ThinkingSwitch().variables() == {}
    with pytest.raises(SwitchError, match="no thinking switch"):
        ThinkingSwitch().variables(enabled=True)
    with pytest.raises(SwitchError, match="cannot turn thinking off"):
        ThinkingSwitch(effort="reasoning_effort").variables(enabled=False)
    # the vLLM habit, chat_template_kwargs {"enable_thinking": false}, reaches a template that reads "thinking"
    assert ThinkingSwitch(toggle="thinking").translate({"enable_thinking": False, "x": 1}) == {
        "thinking": False,
        "x": 1,
    }
    with pytest.raises(SwitchError, match="does not read the thinking switch 'enable_thinking'"):
        ThinkingSwitch().translate({"enable_thinking": False})


def test_the_switch_changes_the_render():
    fmt = ChatFormat.from_template(template_text("MiniMax-M3.jinja"))
    chat = [{"role": "user", "content": "Hi"}]
    on, off = (
        fmt.render(chat, add_generation_prompt=True, **fmt.thinking_switch().variables(enabled=e))
        for e in (True, False)
    )
    assert on != off


@pytest.fixture(scope="module")
def qwen3(smollm2_hf_folder):
    tokenizer = tokenizer_with_markers(smollm2_hf_folder, ["<think>", "</think>", "<tool_call>", "</tool_call>"])
    return ChatFormat.from_template(template_text("Qwen-Qwen3-0.6B.jinja"), tokenizer=tokenizer, eos_token="<|im_end|>")


@pytest.fixture(scope="module")
def url(qwen3):
    from turnkit.serve.app.routes import Server

    backend = ReplayBackend(lambda prompt: qwen3.tokenizer.encode("Fine.<|im_end|>").ids, name="scripted")
    with serving(Server(qwen3, backend, model_id="qwen3").app()) as base:
        yield base


CHAT = [{"role": "user", "content": "Hi"}]


def _tokens(url: str, **body) -> list[int]:
    answer = httpx.post(url + "/tokenize", json={"messages": CHAT, **body})
    assert answer.status_code == 200, answer.text
    return answer.json()["tokens"]


def test_every_api_reaches_the_same_switch(url, qwen3):
    off = qwen3.encode(CHAT, add_generation_prompt=True, enable_thinking=False, turns="none").input_ids.tolist()
    on = qwen3.encode(CHAT, add_generation_prompt=True, turns="none").input_ids.tolist()
    assert off != on
    assert _tokens(url, reasoning_effort="none") == _tokens(url, chat_template_kwargs={"enable_thinking": False}) == off
    assert _tokens(url, reasoning_effort="high") == on
    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    count = claude.messages.count_tokens
    assert count(model="qwen3", messages=CHAT, thinking={"type": "disabled"}).input_tokens == len(off)
    assert count(model="qwen3", messages=CHAT, thinking={"type": "adaptive"}).input_tokens == len(on)
    responses = httpx.post(
        url + "/v1/responses", json={"model": "qwen3", "input": "Hi", "reasoning": {"effort": "none"}}
    ).json()
    assert responses["usage"]["input_tokens"] == len(off)
    conflict = httpx.post(
        url + "/tokenize",
        json={"messages": CHAT, "reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert conflict.status_code == 400 and conflict.json()["error"]["param"] == "reasoning_effort"
    models = httpx.get(url + "/v1/models").json()["data"]
    assert models[0]["metadata"]["thinking_switch"] == {"toggle": "enable_thinking", "effort": None}


def test_prefill_is_the_open_turn_encoded_safely(url, qwen3):
    prefill = [*CHAT, {"role": "assistant", "content": "Sure <|im_end|> then"}]
    ids = _tokens(url, messages=prefill, continue_final_message=True)
    text = qwen3.tokenizer.decode(ids)
    assert text == qwen3.render(prefill, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nSure <|im_end|> then")
    (end,) = qwen3.tokenizer.encode("<|im_end|>").ids
    assert ids.count(end) == 1  # the user turn's; the one in the prefill is text
    reasoning = [*CHAT, {"role": "assistant", "content": "", "reasoning_content": "Let me think"}]
    assert qwen3.tokenizer.decode(_tokens(url, messages=reasoning, continue_final_message=True)).endswith(
        "<think>\nLet me think"
    )
    reply = httpx.post(
        url + "/v1/chat/completions", json={"model": "qwen3", "messages": prefill, "continue_final_message": True}
    )
    assert reply.json()["choices"][0]["message"]["content"] == "Fine."
    for bad in (
        {"messages": CHAT, "continue_final_message": True},
        {"messages": prefill, "continue_final_message": True, "add_generation_prompt": True},
    ):
        assert httpx.post(url + "/tokenize", json=bad).status_code == 400
