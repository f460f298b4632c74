"""A ChatML transcript back into messages: ``<|im_start|>role\\ncontent<|im_end|>\\n`` turns.

>>> parse_transcript("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n")
[{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello!'}]

A final turn left open (a prompt ending in ``<|im_start|>assistant\\n``) is returned with the text it has so far.
Anything else that is not a well-formed turn raises :class:`TranscriptError` naming the line and column.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from turnkit.errors import TranscriptError
from turnkit.messages import ROLE_PATTERN

if TYPE_CHECKING:
    from turnkit.parse.choice.call_ids import CallIds

__all__ = ["TranscriptError", "parse_transcript"]

START, END = "<|im_start|>", "<|im_end|>"


def parse_transcript(
    text: str, *, reply_format: str | None = None, call_ids: CallIds | None = None
) -> list[dict[str, Any]]:
    """The messages of a ChatML transcript.

    With ``reply_format`` (``"hermes"``, ``"qwen3"`` ...), assistant turns are parsed like replies: their
    ``<tool_call>`` blocks become ``tool_calls`` and ``<think>`` blocks ``reasoning_content``. A call written without
    an id gets one numbered across the transcript (``call_0``, ``call_1`` ...), of the shape ``call_ids`` says (a
    format's ``fmt.replies.call_ids``: Mistral's templates take only nine letters and digits back), so the messages
    render again through that template.
    """
    from turnkit.parse.choice.call_ids import CallIds

    shape = call_ids or CallIds()
    messages: list[dict[str, Any]] = []
    pos = 0
    while True:
        start = text.find(START, pos)
        between = text[pos:] if start < 0 else text[pos:start]
        if between.strip():
            at = pos + len(between) - len(between.lstrip())
            if text.startswith(END, at):
                raise TranscriptError(f"{END} outside any turn", text, at)
            raise TranscriptError("text outside a turn (each turn starts with <|im_start|>)", text, at)
        if start < 0:
            return messages
        role_start = start + len(START)
        newline = text.find("\n", role_start)
        header_end = newline if newline >= 0 else len(text)
        role = text[role_start:header_end]
        if not ROLE_PATTERN.fullmatch(role):
            if END in role or START in role:
                raise TranscriptError("a turn header with no role and newline", text, role_start)
            raise TranscriptError(f"the role {role!r} is not a lowercase word followed by a newline", text, role_start)
        content_start = header_end + 1
        end = text.find(END, content_start)
        nested = text.find(START, content_start)
        if nested >= 0 and (end < 0 or nested < end):
            raise TranscriptError(f"a turn starts before the {role} turn above it ended", text, nested)
        calls = sum(len(m.get("tool_calls", ())) for m in messages)  # the next call's number
        if end < 0:  # the final turn is open: a prompt waiting for its reply
            content = text[content_start:] if newline >= 0 else ""
            messages.append(_message(role, content, reply_format, shape.numbered(calls)))
            return messages
        messages.append(_message(role, text[content_start:end], reply_format, shape.numbered(calls)))
        pos = end + len(END)


def _message(role: str, content: str, reply_format: str | None, call_id: Callable[[int], str]) -> dict[str, Any]:
    if role != "assistant" or reply_format is None:
        return {"role": role, "content": content}
    from turnkit.parse.formats.catalog import get
    from turnkit.parse.reading.parser import StreamParser

    parser = StreamParser(get(reply_format), call_id=call_id)
    parser.feed_text(content)
    return parser.finish().message()
