from __future__ import annotations

import copy
import json

import pytest
from conversations import WEATHER_TOOL, conversations
from corpus import template_text

from turnkit import ChatFormat, FamilyNotFoundError, TemplateError, families

# The ChatML reference: the one-line template of OpenHermes-2.5 (the format's textbook form).
CHATML_REFERENCE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _standard(messages) -> bool:
    return all(m["role"] in ("system", "user", "assistant", "tool") for m in messages)


def test_qwen25_family_renders_like_qwens_own_template():
    official = ChatFormat.from_template(template_text("Qwen-Qwen2.5-7B-Instruct.jinja"), eos_token="<|im_end|>")
    family = ChatFormat.from_family("qwen2.5")
    compared = 0
    for name, messages, tools in conversations():
        if not _standard(messages) or any(isinstance(m.get("content"), list) for m in messages):
            continue  # Qwen's template concatenates content with '+', so it cannot render content parts
        for add_generation_prompt in (False, True):
            expected = official.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)
            assert family.render(messages, tools=tools, add_generation_prompt=add_generation_prompt) == expected, name
            compared += 1
    assert compared >= 20


def test_qwen25_family_writes_string_arguments_once():
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}],
        },
    ]
    as_dict = copy.deepcopy(messages)
    as_dict[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Oslo"}
    fmt = ChatFormat.from_family("qwen2.5")
    text = fmt.render(messages, tools=[WEATHER_TOOL])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>' in text
    assert text == fmt.render(as_dict, tools=[WEATHER_TOOL])
    # Qwen's own template encodes a string a second time; the family does not copy that.
    official = ChatFormat.from_template(template_text("Qwen-Qwen2.5-7B-Instruct.jinja"))
    assert '"arguments": "{\\"city\\": \\"Oslo\\"}"' in official.render(messages, tools=[WEATHER_TOOL])


def test_qwen25_tools_section_and_folded_tool_results():
    fmt = ChatFormat.from_family("qwen2.5")
    _, messages, tools = next(c for c in conversations() if c[0] == "parallel-tool-calls")
    text = fmt.render(messages, tools=tools)
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
    assert "\n\n# Tools\n" in text and f"<tools>\n{json.dumps(tools[0], ensure_ascii=False)}\n" in text
    assert text.count("<|im_start|>user") == 2  # the question, and one turn holding both tool results
    assert text.endswith(
        '<|im_start|>user\n<tool_response>\n{"temp_c": 18}\n</tool_response>\n<tool_response>\n{"time": "09:30"}'
        "\n</tool_response><|im_end|>\n"
    )


def test_chatml_family_matches_the_reference_template():
    reference = ChatFormat.from_template(CHATML_REFERENCE)
    family = ChatFormat.from_family("chatml")
    for name, messages, tools in conversations():
        if tools or any(isinstance(m.get("content"), list) or "content" not in m for m in messages):
            continue
        for add_generation_prompt in (False, True):
            expected = reference.render(messages, add_generation_prompt=add_generation_prompt)
            assert family.render(messages, add_generation_prompt=add_generation_prompt) == expected, name
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert family.render(parts) == "<|im_start|>user\nab<|im_end|>\n"


def test_llama3_family_is_metas_format():
    fmt = ChatFormat.from_family("llama3")
    messages = [
        {"role": "system", "content": "You are a helpful coding assistant."},
        {"role": "user", "content": "  Write a Rust function to reverse a string.\n"},
        {"role": "assistant", "content": "fn rev(s: &str) -> String { s.chars().rev().collect() }"},
        {"role": "user", "content": "Thanks"},
    ]
    assert fmt.render(messages, add_generation_prompt=True) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful coding assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWrite a Rust function to reverse a string.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nfn rev(s: &str) -> String { s.chars().rev().collect() }"
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert fmt.bos_token == "<|begin_of_text|>" and fmt.eos_token == "<|eot_id|>"
    assert families.get("llama3").stop_tokens == ("<|eot_id|>", "<|end_of_text|>")


def test_plain_family():
    fmt = ChatFormat.from_family("plain")
    messages = [
        {"role": "system", "content": "Be nice."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert fmt.render(messages, add_generation_prompt=True) == (
        "system: Be nice.\nuser: Hi\nassistant: Hello!\nuser: Bye\nassistant:"
    )
    assert families.get("plain").stop_strings == ("\nuser:",)


@pytest.mark.parametrize("name", ["chatml", "llama3", "plain"])
def test_families_without_a_tool_format_refuse_tools(name):
    fmt = ChatFormat.from_family(name)
    with pytest.raises(TemplateError, match="tool"):
        fmt.render([{"role": "user", "content": "x"}], tools=[WEATHER_TOOL])
    call = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}
    with pytest.raises(TemplateError, match="message 1"):
        fmt.render([{"role": "user", "content": "x"}, call])


@pytest.mark.parametrize(
    ("model_name", "family"),
    [
        ("meta-llama/Llama-3.2-1B-Instruct", "llama3"),
        ("llama3-8b-instruct.Q4_K_M.gguf", "llama3"),
        ("Meta-Llama-3-70B", "llama3"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5"),
        ("qwen2_5-coder", "qwen2.5"),
        ("Qwen/Qwen2-7B-Instruct", "chatml"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "chatml"),
        ("TinyLlama-1.1B-Chat", "chatml"),
        ("teknium/OpenHermes-2.5-Mistral-7B", "chatml"),
        ("01-ai/Yi-6B-Chat", "chatml"),
        ("gpt2", "plain"),
        ("bigcode/starcoder2-3b", "plain"),
        ("ChatML", "chatml"),
        ("qwen2.5", "qwen2.5"),
    ],
)
def test_infer_from_model_name(model_name, family):
    assert families.infer(model_name).name == family


@pytest.mark.parametrize("model_name", ["mistralai/Mistral-7B-Instruct-v0.3", "google/gemma-2-2b-it", "phi-3", "x"])
def test_infer_never_falls_back_silently(model_name):
    with pytest.raises(FamilyNotFoundError, match="cannot tell"):
        families.infer(model_name)


@pytest.mark.parametrize(
    ("template_file", "family"),
    [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2.5"),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3"),
        ("HuggingFaceTB-SmolLM3-3B.jinja", "chatml"),
        ("Qwen-Qwen3-0.6B.jinja", "chatml"),
    ],
)
def test_infer_from_template(template_file, family):
    assert families.infer(template_text(template_file)).name == family


def test_infer_from_template_refuses_unknown_formats():
    with pytest.raises(FamilyNotFoundError, match="matches none"):
        families.infer(template_text("mistralai-Mistral-Nemo-Instruct-2407.jinja"))
    assert families.infer(families.get("chatml").template).name == "chatml"
    assert families.infer(families.get("qwen2.5").template).name == "qwen2.5"


def test_family_lookup():
    assert families.names() == ["qwen2.5", "llama3", "chatml", "plain"]
    with pytest.raises(FamilyNotFoundError, match="no built-in family"):
        families.get("vicuna")
    assert ChatFormat.from_family(families.get("chatml")).family.name == "chatml"
