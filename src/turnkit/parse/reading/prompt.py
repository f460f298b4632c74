"""A reply parser for one request: where the prompt leaves the reply, and what ends it.

A reply continues its prompt. A generation prompt that pre-writes ``<think>`` leaves the reply inside reasoning; one
rendered with ``continue_final_message`` leaves it inside text, whose spaces then belong to the reply; a headed
format (Harmony) may leave a message's body open, whose header routes the reply. This is read off the prompt's last
characters (its last 256 ids decoded). What ends the reply: the checkpoint's end ids, the family's stop strings, and
the request's own; a reply given as text has no ids, so there the end markers count as text.

:meth:`turnkit.ChatFormat.stream_parser` and :meth:`~turnkit.ChatFormat.parse` build their parser here, from what the
layers below the format know (:class:`~turnkit.template.chat_template.ChatTemplate`, the tokenizer binding).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from turnkit.parse.formats import ReplyFormat
from turnkit.parse.reading.parser import StreamParser
from turnkit.parse.reply import EndReason
from turnkit.template.chat_template import ChatTemplate
from turnkit.template.tools import tool_schemas

if TYPE_CHECKING:
    from turnkit.tokenizer import StopSet, TokenizerBinding

__all__ = ["prompt_tail", "reply_parser", "stop_ids"]


def stop_ids(stops: StopSet) -> dict[int, tuple[EndReason, str]]:
    """Every id that ends a reply, with why: the template's end-of-turn markers and the checkpoint's EOS ids."""
    out = {token_id: (EndReason.EOS, text) for token_id, text in stops.eos.items()}
    out.update({token_id: (EndReason.END_OF_TURN, text) for token_id, text in stops.end_of_turn.items()})
    return out


def prompt_tail(prompt: Sequence[int] | str, binding: Callable[[], TokenizerBinding]) -> str:
    """The prompt's end, as text: where it leaves the reply is decided there. Given as ids, a marker's text that data
    spelled (a tool result holding ``<|channel>``: text pieces, no control id) is broken (its first character made
    U+FFFD), so that only the markers the template wrote decide whether the reply starts inside reasoning."""
    if isinstance(prompt, str):
        return prompt[-4096:]
    tokenizer = binding()
    ids = list(prompt)[-256:]
    text = tokenizer.decode(ids)
    found = [m.start() for m in tokenizer.added_pattern.finditer(text)] if tokenizer.added else []
    controls = {token.id for token in tokenizer.added.values()}
    written = [at for at, token_id in enumerate(ids) if token_id in controls]
    if len(found) <= len(written):
        return text  # every marker's text is a control id: nothing forged
    real = {len(tokenizer.decode(ids[:at])) for at in written}
    pieces = list(text)
    for start in found:
        if start not in real:
            pieces[start] = "\ufffd"
    return "".join(pieces)


def reply_parser(
    template: ChatTemplate,
    spec: ReplyFormat,
    binding: TokenizerBinding | None,
    *,
    ids: dict[int, tuple[EndReason, str]] | None,
    tail: str | None,
    stop: str | Sequence[str] | None,
    tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None,
    call_id: Callable[[int], str] | None,
    strict: bool,
    ids_after_name: bool = False,
) -> StreamParser:
    """A parser of ``spec`` for a reply to a prompt ending in ``tail`` (None: no prompt given); ``binding`` None: a
    parser fed text. ``ids``: the ids that end a reply (:func:`stop_ids`), where there is a binding."""
    schemas: dict[str, Any] | None = None
    if tools is not None:
        schemas = {}
        for schema in tool_schemas(tools) or []:
            if isinstance(schema, Mapping):
                function = schema.get("function", schema)
                schemas[function.get("name")] = function.get("parameters")
    # The family's stop strings end a reply always; text has no ids, so there the end-of-turn markers count as text.
    ends = dict.fromkeys(template.stop_strings, EndReason.END_OF_TURN)
    if binding is None:
        markers = [*template.end_markers, template.eos_token]
        ends.update(dict.fromkeys((m for m in markers if m), EndReason.END_OF_TURN))
    return StreamParser(
        spec,
        added_tokens={text: token.id for text, token in binding.added.items()} if binding else None,
        stop_ids=ids if binding else None,
        stops=[stop] if isinstance(stop, str) else list(stop or []),
        end_texts=ends,
        tools=schemas,
        byte_table=binding.byte_table if binding else None,
        backend=binding.backend if binding else None,
        in_reasoning=_opens_reasoning(tail, spec),
        continues=_continues(tail, spec),
        open_message=_open_message(tail, spec),
        call_id=call_id,
        ids_after_name=ids_after_name,
        strict=strict,
    )


def _opens_reasoning(tail: str | None, spec: ReplyFormat) -> bool:
    """Whether the prompt ends inside an open reasoning block (a generation prompt that pre-writes ``<think>``)."""
    if spec.reasoning is None:
        return False
    if tail is None:
        return spec.reasoning.prefilled
    return tail.rfind(spec.reasoning.start) > tail.rfind(spec.reasoning.end)


def _continues(tail: str | None, spec: ReplyFormat) -> bool:
    """Whether the prompt ends inside reasoning or message text rather than right after the marker that opens it
    (a prompt rendered with ``continue_final_message``): the reply then continues that text, spaces included."""
    if tail is None:
        return False
    if spec.channels is not None:
        opened = tail.rfind(spec.channels.header_end)
        return opened >= 0 and bool(tail[opened + len(spec.channels.header_end) :].strip())
    if spec.reasoning is None or not _opens_reasoning(tail, spec):
        return False
    return bool(tail[tail.rfind(spec.reasoning.start) + len(spec.reasoning.start) :].strip())


def _open_message(tail: str | None, spec: ReplyFormat) -> str | None:
    """For headed messages: the header of the message whose body the prompt left open, if it did."""
    channels = spec.channels
    if tail is None or channels is None:
        return None
    opened = tail.rfind(channels.header_end)
    closed = max([tail.rfind(m) for m in channels.message_ends if m] + [tail.rfind(channels.start)])
    if opened < 0 or closed < 0 or opened < closed:
        return None
    return tail[max(closed, 0) : opened].removeprefix(channels.start)
