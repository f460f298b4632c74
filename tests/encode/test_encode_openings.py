"""How a conversation opens does not change what a reply trains: over every template of ``../shared/conformance``,
a conversation that opens with the assistant (a greeting first), holds only an assistant message, or opens with a tool
result trains each reply, its end marker included, from right after the generation-prompt header: nothing of the text
before it (a default system prompt, the header itself). A template where nothing tells where the reply starts refuses
the conversation instead (counted, and the reason must say so).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from corpus import CorpusTemplate, all_templates, marker_tokenizer, template_markers

from turnkit import ChatFormat, EncodeError, TurnkitError
from turnkit.embedded import default_model_path
from turnkit.tokenizer import TokenizerBinding

#: About two CPU-minutes over the corpus's 569 distinct templates.
pytestmark = pytest.mark.slow

TEMPLATES = all_templates()
GREETING, ANSWER, RESULT = "Hello there, what can I do today?", "Blue is a calm colour.", '{"temperature": 21}'
USER = {"role": "user", "content": "Say something."}
OPENINGS = {
    "assistant first": [
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": "Name a colour please."},
        {"role": "assistant", "content": ANSWER},
    ],
    "assistant only": [{"role": "assistant", "content": GREETING}],
    "tool first": [{"role": "tool", "content": RESULT}, {"role": "assistant", "content": ANSWER}],
}


def _examples(fmt: ChatFormat, messages: list[dict]) -> list:
    """One example, or one per turn where the template is not prefix-stable."""
    try:
        return [fmt.encode(messages)]
    except EncodeError:
        return fmt.encode(messages, split_turns=True)


def _header(fmt: ChatFormat) -> str | None:
    """What the generation prompt adds after one user message, when it is an addition."""
    user = [USER]
    try:
        with_prompt, without = fmt.render(user, add_generation_prompt=True), fmt.render(user)
    except TurnkitError:
        return None
    return with_prompt[len(without) :] if with_prompt.startswith(without) and with_prompt != without else None


def _stretches_after_a_user(fmt: ChatFormat, messages: list[dict]) -> list[str] | None:
    """The trained stretches of the same conversation with a user message first."""
    try:
        return [stretch for e in _examples(fmt, [USER, *messages]) for stretch in e.trained_text(fmt.tokenizer.decode)]
    except TurnkitError:
        return None


def _check(template: CorpusTemplate, tokenizers: dict) -> str:
    """How the template trains the openings: ``only replies`` when each trained stretch holds its reply and nothing
    before it (no header, no text the template writes before the turn); ``refused`` when it refuses an opening that it
    also refuses after a user message (a template no example trains faithfully); ``opening refused`` when it refuses
    only the opening, naming the turn it cannot train; else why nothing was checked."""
    markers = tuple(template_markers(template))
    if markers not in tokenizers:  # bound once per marker set: a binding builds its data tokenizer once
        tokenizers[markers] = TokenizerBinding.from_any(marker_tokenizer(markers))
    try:
        fmt = ChatFormat.from_template(template.source, tokenizer=tokenizers[markers], **template.special_tokens)
    except TurnkitError:
        return "no format"
    if re.search(r"{%-?\s*generation\s*-?%}", template.source):
        return "generation blocks"  # the template marks what is trained ({% generation %}), its author's choice
    header = _header(fmt)
    outcomes = []
    for name, messages in OPENINGS.items():
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        try:
            examples = _examples(fmt, messages)
        except EncodeError as exc:
            try:
                _examples(fmt, [USER, *messages])
            except TurnkitError:
                outcomes.append("refused")
                continue
            assert re.search(r"message \d", str(exc)), f"{template.name}, {name}: {exc}"  # it names the turn
            outcomes.append("opening refused")
            continue
        except TurnkitError:
            outcomes.append("template refuses")
            continue
        stretches = [stretch for e in examples for stretch in e.trained_text(fmt.tokenizer.decode)]
        assert len(stretches) == len([r for r in replies if r in fmt.render(messages)]), (template.name, name)
        for n, (stretch, reply) in enumerate(zip(stretches, replies, strict=False)):
            where = f"{template.name}, {name}: trained {stretch!r}"
            assert reply in stretch and not (header and header.strip() and header in stretch), where
            # before the reply: at most what the template writes before it when a user message comes first (Qwen3's
            # empty <think></think>), or whitespace of the header merged into the reply's first token
            before = stretch[: stretch.index(reply)]
            if before.strip():
                twin = _stretches_after_a_user(fmt, messages)
                assert twin and before == twin[n][: twin[n].index(reply)], where
        outcomes.append("only replies")
    return ",".join(sorted(set(outcomes)))


#: The sweep in shards, so that pytest-xdist spreads it over the workers (one distinct template in SHARDS each, in
#: the corpus's order), each with its floor of templates checked: 460 in all (the single sweep asserted >= 450).
SHARDS = 4
SHARD_FLOORS = (112, 122, 118, 108)


@pytest.mark.parametrize("shard", range(SHARDS))
def test_openings_train_only_the_replies_on_every_template(shard):
    default_model_path()  # the tokenizer is the embedded model's
    tokenizers: dict = {}
    distinct = {(t.source, tuple(sorted(t.special_tokens.items()))): t for t in TEMPLATES}  # 569 of the 631
    outcomes = Counter(_check(template, tokenizers) for template in list(distinct.values())[shard::SHARDS])
    print(dict(outcomes))
    checked = sum(n for outcome, n in outcomes.items() if "only replies" in outcome)
    print(f"shard {shard}: {checked} checked")
    assert checked >= SHARD_FLOORS[shard], outcomes
