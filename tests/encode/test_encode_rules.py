"""Encode refuses or reports what would train the wrong thing silently (issue 14, item 6).

* A template that writes a trained turn differently once it is not the last (Qwen3 without reasoning: an empty
  ``<think>`` block before the last assistant turn only) is refused, as ``check_prefix_stable`` reports it, with the
  way out (``split_turns``).
* A template paired with a tokenizer that lacks one of its markers (Llama 3.1's template over the ChatML tokenizer)
  warns, naming the marker, once per marker.
"""

from __future__ import annotations

import warnings

import pytest
from corpus import template_text, tokenizer_with_markers

from turnkit import ChatFormat
from turnkit.encode import EncodeError, MissingControlTokenWarning

NO_REASONING = [
    {"role": "user", "content": "Is 91 prime?"},
    {"role": "assistant", "content": "No."},
    {"role": "user", "content": "And 97?"},
    {"role": "assistant", "content": "Yes."},
]


def _template(name: str) -> str:
    return template_text(name)


@pytest.fixture(scope="module")
def qwen3(smollm2_hf_folder):
    tokenizer = tokenizer_with_markers(smollm2_hf_folder, ["<think>", "</think>", "<tool_call>", "</tool_call>"])
    return ChatFormat.from_template(_template("Qwen-Qwen3-0.6B.jinja"), tokenizer=tokenizer, eos_token="<|im_end|>")


def test_qwen3_without_reasoning_is_refused_as_the_prefix_check_reports(qwen3):
    report = qwen3.check_prefix_stable(NO_REASONING)
    assert report.unstable_turns == [1]
    assert not report.turns[0].turn_stable and "<think>" in report.turns[0].expected_excerpt
    with pytest.raises(EncodeError, match=r"message 1.*split_turns=True") as caught:
        qwen3.encode(NO_REASONING)
    assert "writes the last assistant turn differently" in str(caught.value)
    assert "<think>" in str(caught.value)  # where it breaks: the turn as generated opens with an empty think block
    with pytest.raises(EncodeError, match="split_turns=True"):
        qwen3.encode_batch([NO_REASONING])


def test_qwen3_without_reasoning_trains_one_shape_with_split_turns(qwen3):
    decode = qwen3.tokenizer.decode
    examples = qwen3.encode(NO_REASONING, split_turns=True)
    assert [e.trained_text(decode) for e in examples] == [
        ["<think>\n\n</think>\n\nNo.<|im_end|>"],
        ["<think>\n\n</think>\n\nYes.<|im_end|>"],
    ]


def test_training_only_the_last_turn_needs_no_split(qwen3):
    """The last turn is its own generated form: nothing to refuse."""
    encoding = qwen3.encode(NO_REASONING, turns="last")
    assert encoding.trained_text(qwen3.tokenizer.decode) == ["<think>\n\n</think>\n\nYes.<|im_end|>"]


def test_a_prefix_stable_template_still_trains_every_turn(smollm2_hf_folder):
    fmt = ChatFormat.from_pretrained(smollm2_hf_folder)
    encoding = fmt.encode(NO_REASONING)
    assert encoding.trained_text(fmt.tokenizer.decode) == ["No.<|im_end|>", "Yes.<|im_end|>"]


def _llama31_over_chatml(smollm2_hf_folder) -> ChatFormat:
    from turnkit.tokenizer import TokenizerBinding

    return ChatFormat.from_template(
        _template("meta-llama-Llama-3.1-8B-Instruct.jinja"),
        tokenizer=TokenizerBinding.from_folder(smollm2_hf_folder),
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
    )


def test_a_marker_the_tokenizer_lacks_is_reported_by_name(smollm2_hf_folder):
    fmt = _llama31_over_chatml(smollm2_hf_folder)
    with pytest.warns(MissingControlTokenWarning) as caught:
        encoding = fmt.encode(NO_REASONING)
    named = {str(w.message).split("'")[1] for w in caught if issubclass(w.category, MissingControlTokenWarning)}
    assert {"<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>"} <= named
    assert all(w.filename == __file__ for w in caught)  # the warning points at the caller's line
    assert "<|eot_id|>" in encoding.text and "<|eot_id|>" not in encoding.control_counts  # text pieces


def test_each_missing_marker_is_reported_once_per_format(smollm2_hf_folder):
    fmt = _llama31_over_chatml(smollm2_hf_folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fmt.encode(NO_REASONING)
        fmt.encode_batch([NO_REASONING, NO_REASONING])
        fmt.encode(NO_REASONING, split_turns=True)
    named = [str(w.message).split("'")[1] for w in caught if issubclass(w.category, MissingControlTokenWarning)]
    assert sorted(named) == sorted(set(named)) and "<|eot_id|>" in named
    assert all(w.filename == __file__ for w in caught)


def test_a_marker_in_data_is_not_the_templates(smollm2_hf_folder):
    """Data may spell any marker (a user pasting Llama 3 text): it is text whatever the tokenizer, and no warning."""
    fmt = ChatFormat.from_pretrained(smollm2_hf_folder)
    messages = [{"role": "user", "content": "What is <|eot_id|>?"}, {"role": "assistant", "content": "A marker."}]
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingControlTokenWarning)
        encoding = fmt.encode(messages)
    assert "<|eot_id|>" in encoding.text


def test_the_warning_is_exported_from_turnkit():
    import turnkit

    assert turnkit.MissingControlTokenWarning is MissingControlTokenWarning
    assert "MissingControlTokenWarning" in turnkit.__all__


def test_a_turn_no_example_can_train_says_so_instead_of_advising_split_turns(smollm2_hf_folder):
    """QwQ's generation prompt opens ``<think>\n``, which its rendered turns never contain: even as the last message
    (as every split_turns example has it) the trained text cannot follow the served prompt, so the error must not send
    the user to split_turns, which they may already be using."""
    tokenizer = tokenizer_with_markers(smollm2_hf_folder, ["<think>", "</think>", "<tool_call>", "</tool_call>"])
    qwq = ChatFormat.from_template(_template("Qwen-QwQ-32B.jinja"), tokenizer=tokenizer, eos_token="<|im_end|>")
    with pytest.raises(EncodeError, match="cannot be trained in its inference context by any example") as caught:
        qwq.encode(NO_REASONING, split_turns=True)
    assert "split_turns" not in str(caught.value)
