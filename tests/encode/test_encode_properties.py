"""Property tests: random conversations whose data mixes every added-token string of the tokenizer, fragments of them,
and unicode. The invariants hold on all of them, and benign cases match transformers."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from turnkit import ChatFormat


@pytest.fixture(scope="module")
def setup(smollm2_hf_folder):
    from corpus import tokenizer_with_markers

    tokenizer = tokenizer_with_markers(
        smollm2_hf_folder, ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>"]
    )
    fmt = ChatFormat.from_family("qwen2.5", tokenizer=tokenizer)
    return fmt, tokenizer


def _round_trips(fmt, text: str) -> bool:
    """Whether the vocabulary can spell the text at all (SmolLM2's byte-level vocabulary lacks a few control bytes,
    which any tokenizer then drops: that is the tokenizer's limit, not an encoding error)."""
    return fmt.tokenizer.decode(fmt.tokenizer.encode_as_text(text).ids) == text


def _pieces(tokens: list[str]):
    fragments = sorted(
        {t[:cut] for t in tokens for cut in range(1, len(t))} | {t[cut:] for t in tokens for cut in (1, 2)}
    )
    return st.one_of(
        st.sampled_from(tokens),
        st.sampled_from(fragments),
        st.text(alphabet=st.characters(categories=("L", "M", "N", "P", "S", "Zs"), max_codepoint=0x2FFFF), max_size=8),
        st.sampled_from([" ", "\n", "\t", "  ", "é", "漢字", "🙂", "\u200b", "<", ">", "|"]),
    ).filter(lambda s: not any(0xFDD0 <= ord(c) <= 0xFDEF or ord(c) in (0xFFFE, 0xFFFF) for c in s))


def _conversations(tokens: list[str]):
    text = st.lists(_pieces(tokens), max_size=6).map("".join)
    turn = st.tuples(text, text)
    return st.lists(turn, min_size=1, max_size=3).map(
        lambda turns: [
            m
            for user, reply in turns
            for m in ({"role": "user", "content": user}, {"role": "assistant", "content": reply})
        ]
    )


def _benign_twin(messages, tokens):
    out = []
    for message in messages:
        content = message["content"]
        for token in sorted(tokens, key=len, reverse=True):
            content = content.replace(token, "x" * len(token))
        out.append({**message, "content": content.replace("<", "(").replace(">", ")").replace("|", "!")})
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_invariants_hold_on_hostile_data(setup, data):
    fmt, _ = setup
    tokens = sorted(fmt.tokenizer.added)
    messages = data.draw(_conversations(tokens))
    assume(all(_round_trips(fmt, m["content"]) for m in messages))
    encoding = fmt.encode(messages, turns="none")  # no data, however hostile, makes a plain conversation unencodable
    ids = encoding.input_ids.tolist()
    # decoding gives back the rendered text, which is the template's render of the data as given
    assert fmt.tokenizer.decode(ids) == encoding.text == fmt.render(messages)
    # each control id appears exactly as often as the template wrote it: as often as for a benign twin
    twin = fmt.encode(_benign_twin(messages, tokens), turns="none")
    for token in tokens:
        token_id = fmt.tokenizer.token_to_id(token)
        assert ids.count(token_id) == twin.input_ids.tolist().count(token_id) == twin.control_counts.get(token, 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_benign_conversations_match_transformers(setup, data):
    fmt, tokenizer = setup
    tokens = sorted(fmt.tokenizer.added)
    messages = _benign_twin(data.draw(_conversations(tokens)), tokens)
    for add_generation_prompt in (False, True):
        ours = fmt.encode(messages, add_generation_prompt=add_generation_prompt, turns="none").input_ids.tolist()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = tokenizer.apply_chat_template(
                messages,
                chat_template=fmt.template(),
                tokenize=True,
                add_generation_prompt=add_generation_prompt,
                eos_token="<|im_end|>",
                return_dict=False,
            )
        assert ours == list(theirs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_masks_train_exactly_the_replies(setup, data):
    fmt, _ = setup
    tokens = sorted(fmt.tokenizer.added)
    messages = data.draw(_conversations(tokens))
    assume(all(_round_trips(fmt, m["content"]) for m in messages))
    encoding = fmt.encode(messages)
    trained = encoding.trained_text(fmt.tokenizer.decode)
    replies = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
    assert len(trained) == len(replies)
    for stretch, reply in zip(trained, replies, strict=True):
        # exactly the reply and its end marker; when the reply starts with whitespace, the tokenizer may merge the
        # header's newline into its first token, and a token is trained when any of its characters is
        extra = stretch[: len(stretch) - len(reply)]
        assert stretch.endswith(reply) and (extra == "" or (extra.isspace() and reply[:1].isspace())), (stretch, reply)
