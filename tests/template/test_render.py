"""Rendering semantics beyond the corpus: tools as functions, documents, continue_final_message, template kwargs,
tojson options, the generation tag; each compared with transformers where transformers defines the behaviour."""

from __future__ import annotations

import warnings
from enum import Enum
from typing import Literal

import pytest

from turnkit import ChatFormat, MessageError, TemplateError, ToolSchemaError, function_schema

SHOW_TOOLS = (
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}"
)


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius", days: int | None = None) -> dict:
    """Get the weather forecast.

    Longer explanation on a second paragraph.

    Args:
        city: The city to look up,
            over two lines.
        unit: The unit of temperature.
        days (int): How many days ahead. (choices: [1, 2, 3])

    Returns:
        The forecast as a dict.
    """
    return {}


class Colour(Enum):
    RED = "red"
    GREEN = "green"


def paint(colour: Colour, shades: list[str], weights: dict[str, float], pair: tuple[int, str], anything=None) -> None:
    """Paint something.

    Args:
        colour: Which colour.
        shades: Shades to use.
        weights: Weight per shade.
        pair: A pair.
        anything: Untyped.
    """


def no_doc(x: int) -> int:
    return x


class Toolbox:
    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        return key


def _hf(tokenizer, messages, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_function_schemas_match_transformers():
    from transformers.utils import get_json_schema

    assert function_schema(get_weather) == get_json_schema(get_weather)
    assert function_schema(Toolbox().lookup) == get_json_schema(Toolbox().lookup)


def test_function_schema_errors_are_clear():
    with pytest.raises(ToolSchemaError, match="no docstring"):
        function_schema(no_doc)
    with pytest.raises(ToolSchemaError, match="anything"):
        function_schema(paint)  # 'anything' has no type hint


def test_tools_as_functions_render_like_transformers(hf_tokenizer):
    fmt = ChatFormat.from_template(SHOW_TOOLS, **hf_tokenizer.special_tokens_map)
    messages = [{"role": "user", "content": "Forecast for Oslo?"}]
    tools = [get_weather, Toolbox().lookup]
    assert fmt.render(messages, tools=tools) == _hf(hf_tokenizer, messages, tools=tools, chat_template=SHOW_TOOLS)


def test_unusable_tools_are_refused():
    fmt = ChatFormat.from_template(SHOW_TOOLS)
    with pytest.raises(ToolSchemaError, match=r"tools\[0\]"):
        fmt.render([{"role": "user", "content": "x"}], tools=["get_weather"])


def test_documents_render_like_transformers(hf_tokenizer):
    template = (
        "{% for d in documents %}<doc title={{ d.title }}>{{ d.text }}</doc>{% endfor %}{{ messages[0].content }}"
    )
    documents = [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]
    messages = [{"role": "user", "content": "Summarise."}]
    fmt = ChatFormat.from_template(template)
    assert fmt.render(messages, documents=documents) == _hf(
        hf_tokenizer, messages, documents=documents, chat_template=template
    )
    with pytest.raises(MessageError, match=r"documents\[0\]"):
        fmt.render(messages, documents=["not a dict"])


@pytest.mark.parametrize("content", ["The answer is", "Trailing space ", "Trailing newline\n"])
def test_continue_final_message_matches_transformers(hf_tokenizer, content):
    template = hf_tokenizer.chat_template
    fmt = ChatFormat.from_template(template, **hf_tokenizer.special_tokens_map)
    messages = [{"role": "user", "content": "Question?"}, {"role": "assistant", "content": content}]
    ours = fmt.render(messages, continue_final_message=True)
    assert ours == _hf(hf_tokenizer, messages, continue_final_message=True)
    assert ours.endswith("<|im_start|>assistant\n" + content)


def test_continue_final_message_of_reasoning_matches_transformers(hf_tokenizer):
    template = (
        "{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
        "{% endif %}{{ m.content }}</{{ m.role }}>{% endfor %}"
    )
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "Let me"}]
    fmt = ChatFormat.from_template(template)
    ours = fmt.render(messages, continue_final_message="reasoning_content")
    assert ours == _hf(hf_tokenizer, messages, chat_template=template, continue_final_message="reasoning_content")
    assert ours.endswith("<think>Let me")


def test_continue_final_message_refusals():
    fmt = ChatFormat.from_family("chatml")
    with pytest.raises(ValueError, match="exclude each other"):
        fmt.render([{"role": "user", "content": "x"}], continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(MessageError, match="no 'content'"):
        fmt.render([{"role": "assistant"}], continue_final_message=True)
    dropping = ChatFormat.from_template("{% for m in messages %}{{ m.content[:3] }}{% endfor %}")
    with pytest.raises(TemplateError, match="does not appear"):
        dropping.render([{"role": "assistant", "content": "abcdef"}], continue_final_message=True)


def test_template_kwargs_override_special_tokens_like_transformers(hf_tokenizer):
    template = "{{ bos_token }}|{{ eos_token }}|{{ flag }}|{{ messages[0].content }}"
    fmt = ChatFormat.from_template(template, **hf_tokenizer.special_tokens_map)
    messages = [{"role": "user", "content": "x"}]
    ours = fmt.render(messages, bos_token="<B>", flag=True)
    assert ours == _hf(hf_tokenizer, messages, chat_template=template, bos_token="<B>", flag=True)
    assert ours == "<B>|<|im_end|>|True|x"


def test_tojson_options_match_transformers(hf_tokenizer):
    template = (
        "{{ messages[0] | tojson }}\n{{ messages[0] | tojson(indent=2) }}\n{{ messages[0] | tojson(sort_keys=true) }}"
        "\n{{ messages[0] | tojson(separators=(',', ':')) }}\n{{ messages[0] | tojson(ensure_ascii=true) }}"
    )
    messages = [{"role": "user", "content": "<b>&'\" é 漢字 🙂</b>", "meta": {"z": 1, "a": [True, None]}}]
    fmt = ChatFormat.from_template(template)
    assert fmt.render(messages) == _hf(hf_tokenizer, messages, chat_template=template)
    assert "<b>&'\\\" é 漢字 🙂</b>" in fmt.render(messages)  # no HTML or ASCII escaping by default


def test_strftime_now_and_loop_controls():
    template = (
        "{{ strftime_now('%Y') }}|{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{{ m.content }}{% if loop.index >= 2 %}{% break %}{% endif %}{% endfor %}"
    )
    import datetime

    messages = [{"role": "system", "content": "S"}, *({"role": "user", "content": str(i)} for i in range(5))]
    year = datetime.datetime.now().strftime("%Y")
    assert ChatFormat.from_template(template).render(messages) == f"{year}|0"


def test_generation_blocks_render_and_report_spans(hf_tokenizer):
    template = (
        "{% for m in messages %}{% if m.role == 'assistant' %}<a>{% generation %}{{ m.content }}</a>{% endgeneration %}"
        "{% else %}<u>{{ m.content }}</u>{% endif %}{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "ciao"},
    ]
    fmt = ChatFormat.from_template(template)
    rendered = fmt.render_with_spans(messages, track_generation=True)
    assert rendered.text == _hf(hf_tokenizer, messages, chat_template=template)
    assert [rendered.text[a:b] for a, b in rendered.generation_spans] == ["hello</a>", "ciao</a>"]
    assert fmt.render_with_spans(messages).generation_spans == ()


def test_compiled_templates_are_cached():
    from turnkit.template.sandbox import compile_template

    source = "{{ messages[0].content }} cached"
    assert compile_template(source) is compile_template(source)


def test_named_template_selection_errors():
    from turnkit import TemplateNotFoundError

    fmt = ChatFormat.from_family("chatml")
    with pytest.raises(TemplateNotFoundError, match="no chat template named 'tool_use'"):
        fmt.render([{"role": "user", "content": "x"}], template_name="tool_use")
