"""The inspect page of one conversation: its encoding, as training sees it, and train vs serve for every turn.

The conversation is encoded with ``fmt.encode`` (safe, with attribution), exactly as ``turnkit prepare`` and a trainer
would. A template that is not prefix-stable cannot be trained in one example, so the page then shows one example per
assistant turn (``split_turns=True``), each in the context the model sees at inference, and says why. A conversation
that does not end with an assistant turn is a serving prompt: it is shown with the generation prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from turnkit.encode.encoding import Encoding
from turnkit.errors import EncodeError
from turnkit.format import ChatFormat, Tools
from turnkit.inspect.page import Page, comparisons, example_from_encoding
from turnkit.inspect.tokens import TokenTexts
from turnkit.messages import normalize_conversation

__all__ = ["conversation_page"]


def conversation_page(
    fmt: ChatFormat,
    messages: Sequence[Any],
    *,
    tools: Tools | None = None,
    variables: Mapping[str, Any] | None = None,
    source: str = "",
    allow_dropped: bool = False,
) -> Page:
    """The page model of a conversation encoded with ``fmt`` (see :func:`turnkit.inspect.render_html`).

    ``allow_dropped``: train an assistant turn whose tool calls or content the template leaves out, as ``fmt.encode``
    does with it (without it, such a conversation is shown untrained, with the reason).

    Raises what ``fmt.encode`` raises for a malformed conversation (:class:`~turnkit.errors.MessageError` naming the
    message and field, template errors).
    """
    variables = dict(variables or {})
    chat = normalize_conversation(messages, alias_reasoning=False)
    roles = {index: str(message["role"]) for index, message in enumerate(chat)}
    texts = TokenTexts(fmt.tokenizer, fmt.stops)
    has_reply = any(message["role"] == "assistant" for message in chat)
    serving = not chat or chat[-1]["role"] != "assistant"
    notes = []
    turns = comparisons(fmt, messages, tools, variables) if has_reply else []
    stable = all(turn.prompt_prefix is not False and turn.generated_prefix for turn in turns)
    single = "serving prompt" if serving else "training example"
    if serving:
        notes.append(
            "The conversation does not end with an assistant turn: it is shown as served, with the generation "
            "prompt, and nothing is trained in it."
        )
        encoded: Encoding | list[Encoding] = fmt.encode(
            messages, tools=tools, add_generation_prompt=True, turns="none", **variables
        )
    else:
        try:
            encoded = fmt.encode(
                messages, tools=tools, split_turns=not stable, allow_dropped=allow_dropped, **variables
            )
            if not stable:
                notes.append(
                    "This template is not prefix-stable for this conversation (see train vs serve): one example "
                    "cannot train every turn in the context the model sees when serving, so each assistant turn is "
                    "its own example (split_turns=True)."
                )
        except EncodeError as exc:  # nothing to train, or a turn that cannot be located: still show the tokens
            notes.append(f"turnkit cannot train this conversation: {exc}. Its tokens are shown untrained.")
            encoded = fmt.encode(messages, tools=tools, turns="none", **variables)
            single = "tokens, untrained"
    encodings = encoded if isinstance(encoded, list) else [encoded]
    examples = []
    for n, encoding in enumerate(encodings):
        if len(encodings) == 1:
            title = single
        else:
            trained = sorted({int(i) for i in encoding.message_index[encoding.assistant_mask == 1].tolist()})
            title = f"example {n + 1} of {len(encodings)}: trains message {', '.join(map(str, trained))}"
        examples.append(example_from_encoding(encoding, texts, roles, title=title))
    what = fmt.family.name if fmt.family else fmt.templates.origin
    return Page(
        title=f"turnkit inspect: {source or 'conversation'}",
        source=f"{source} · {what}" if source else str(what),
        examples=examples,
        comparisons=turns,
        notes=notes,
    )
