"""Prefix stability, one example per turn, and the token-level diff of serving and training prompts."""

from __future__ import annotations

import pytest
from corpus import template_text, tokenizer_with_markers

from turnkit import ChatFormat
from turnkit.encode import EncodeError

REASONING = [
    {"role": "user", "content": "Is 91 prime?"},
    {"role": "assistant", "reasoning_content": "91 = 7 * 13.", "content": "No."},
    {"role": "user", "content": "And 97?"},
    {"role": "assistant", "reasoning_content": "No divisor up to 9.", "content": "Yes."},
]


@pytest.fixture(scope="module")
def qwen3(smollm2_hf_folder):
    tokenizer = tokenizer_with_markers(smollm2_hf_folder, ["<think>", "</think>", "<tool_call>", "</tool_call>"])
    return ChatFormat.from_template(template_text("Qwen-Qwen3-0.6B.jinja"), tokenizer=tokenizer, eos_token="<|im_end|>")


def test_qwen3_is_reported_unstable_where_it_drops_reasoning(qwen3):
    report = qwen3.check_prefix_stable(REASONING)
    assert not report and report.unstable_turns == [1]
    (turn1, turn3) = report.turns
    assert turn1.prompt_stable and not turn1.turn_stable
    assert "91 = 7 * 13." in turn1.expected_excerpt and "91 = 7 * 13." not in turn1.render_excerpt
    assert turn3.stable
    assert "message 1" in str(report)


def test_encoding_an_unstable_conversation_in_one_example_refuses(qwen3):
    with pytest.raises(EncodeError, match="split_turns=True"):
        qwen3.encode(REASONING)


def test_split_turns_trains_each_turn_in_its_inference_context(qwen3):
    examples = qwen3.encode(REASONING, split_turns=True)
    decode = qwen3.tokenizer.decode
    assert [e.trained_text(decode) for e in examples] == [
        ["<think>\n91 = 7 * 13.\n</think>\n\nNo.<|im_end|>"],
        ["<think>\nNo divisor up to 9.\n</think>\n\nYes.<|im_end|>"],
    ]
    for index, example in zip((1, 3), examples, strict=True):
        prompt = qwen3.encode(REASONING[:index], add_generation_prompt=True).input_ids.tolist()
        assert example.input_ids.tolist()[: len(prompt)] == prompt  # the exact serving prompt comes first
        assert example.assistant_mask[: len(prompt)].sum() == 0


def test_prefix_stable_template_reports_stable(smollm2_hf_folder):
    fmt = ChatFormat.from_pretrained(smollm2_hf_folder)
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    report = fmt.check_prefix_stable(messages)
    assert report and str(report) == "prefix-stable"
    assert all(diff.agrees for diff in fmt.diff_prompts(messages))
    assert len(fmt.encode(messages, split_turns=True)) == 2


def test_diff_prompts_shows_the_first_different_token(smollm2_hf_folder):
    markers = ["<｜begin▁of▁sentence｜>", "<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"]
    tokenizer = tokenizer_with_markers(smollm2_hf_folder, markers)
    fmt = ChatFormat.from_template(
        template_text("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
        tokenizer=tokenizer,
        bos_token="<｜begin▁of▁sentence｜>",
        eos_token="<｜end▁of▁sentence｜>",
    )
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    (diff,) = fmt.diff_prompts(messages)
    assert not diff.agrees
    assert "<think>" in "".join(diff.serving_tokens) and "<think>" not in "".join(diff.training_tokens)
    assert "first different token" in str(diff)
    report = fmt.check_prefix_stable(messages)
    assert not report.turns[0].prompt_stable


def _turns(n: int, exchanges: int = 3) -> list[dict]:
    return [
        {"role": role, "content": f"{role} {n}.{k} " * (n % 3 + 1)}
        for k in range(exchanges)
        for role in ("user", "assistant")
    ]


def test_a_turn_written_differently_once_others_follow_is_refused_in_every_conversation(smollm2_hf_folder):
    """Spliced renders prove a turn as generated once per pair of shapes: a template whose last reply differs from
    the same reply in history must still be refused for every conversation, not only the first of its shape."""
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and loop.last %}Final: "
        "{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    tokenizer = ChatFormat.from_pretrained(smollm2_hf_folder).tokenizer
    fmt = ChatFormat.from_template(template, tokenizer=tokenizer, eos_token="<|im_end|>")
    for n in range(4):
        with pytest.raises(EncodeError, match="not prefix-stable at message 1"):
            fmt.encode(_turns(n))
        assert len(fmt.encode(_turns(n), split_turns=True)) == 3


def test_turns_proven_by_splicing_encode_as_renders_do(smollm2_hf_folder):
    spliced = ChatFormat.from_pretrained(smollm2_hf_folder)
    rendered = ChatFormat.from_pretrained(smollm2_hf_folder)
    rendered.encoder.stage.renders.enabled = rendered.encoder.masks.history.renders.enabled = False
    for n in range(6):
        a, b = spliced.encode(_turns(n)), rendered.encode(_turns(n))
        assert a.input_ids.tolist() == b.input_ids.tolist() and a.labels.tolist() == b.labels.tolist()
    assert spliced.encoder.stage.renders._fills > 0  # the comparison is between the two ways
