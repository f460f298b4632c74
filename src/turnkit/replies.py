"""The reply side of a chat format: which reply format the template writes, what ends a reply, and parsers for one.

A :class:`~turnkit.ChatFormat` is read in two directions. Going in, it renders and encodes conversations; coming
back, it reads what a model wrote. The two share the template and the tokenizer and nothing else: the reply side adds
the reply format chosen by rendering probe replies, the ids that end a reply, and the push parser built for one
request. That is why the cut is here: :class:`Replies` is everything ``ChatFormat.reply_choice``, ``reply_format``,
``stop_ids``, ``stream_parser`` and ``parse`` do, over the same :class:`~turnkit.template.chat_template.ChatTemplate`
and tokenizer binding the encoder takes, so that neither side's room grows with the other's (``ChatFormat`` holds one
and hands these calls to it).

>>> from turnkit import ChatFormat
>>> ChatFormat.from_family("chatml").replies.choice.format.name
'plain'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from turnkit.template.chat_template import ChatTemplate

if TYPE_CHECKING:
    from turnkit.parse.choice.call_ids import CallIds
    from turnkit.parse.choice.select import Choice
    from turnkit.parse.formats import ReplyFormat
    from turnkit.parse.reading.parser import StreamParser
    from turnkit.parse.reply import EndReason
    from turnkit.tokenizer import StopSet, TokenizerBinding

__all__ = ["Replies"]

Tools = Sequence[Mapping[str, Any] | Callable[..., Any]]


@dataclass(frozen=True)
class Replies:
    """How one chat format's replies are read: ``template`` (what the layers below know of the format),
    ``tokenizer`` and ``stops`` (called on first use: a format without a tokenizer still reads text)."""

    template: ChatTemplate
    tokenizer: Callable[[], TokenizerBinding] = field(repr=False, compare=False)
    stops: Callable[[], StopSet] = field(repr=False, compare=False)

    @cached_property
    def choice(self) -> Choice:
        """The reply format chosen for the template by rendering probe replies, with what the probes showed
        (:func:`turnkit.parse.choice.select.choose`)."""
        from turnkit.parse.choice import select

        return select.choose(self.template)

    @cached_property
    def call_ids(self) -> CallIds:
        """The ids the template accepts for calls written without one, and whether it writes a call's id after its
        name, found by rendering (:func:`turnkit.parse.choice.call_ids.accepted_call_ids`)."""
        from turnkit.parse.choice.call_ids import accepted_call_ids

        return accepted_call_ids(self.template)

    @cached_property
    def stop_ids(self) -> dict[int, tuple[EndReason, str]]:
        """Every id that ends a reply, with why: the template's end-of-turn markers and the checkpoint's EOS ids."""
        from turnkit.parse.reading.prompt import stop_ids

        return stop_ids(self.stops())

    def parser(
        self,
        prompt: Sequence[int] | str | None,
        stop: str | Sequence[str] | None,
        stop_token_ids: Iterable[int] | None,
        tools: Tools | None,
        reply_format: str | ReplyFormat | None,
        call_id: Callable[[int], str] | None,
        strict: bool,
        *,
        text: bool,
    ) -> StreamParser:
        """A push parser for one reply: the arguments are :meth:`turnkit.ChatFormat.stream_parser`'s (its public,
        documented signature; this one is positional, for it and :meth:`~turnkit.ChatFormat.parse` to hand down)."""
        from turnkit.parse.formats import catalog
        from turnkit.parse.reading.prompt import prompt_tail, reply_parser

        if text and stop_token_ids is not None:
            raise TypeError("stop_token_ids end a reply read as ids; a parser fed text has none")
        spec = catalog.get(reply_format) if isinstance(reply_format, str) else reply_format or self.choice.format
        binding = None if text else self.tokenizer()
        return reply_parser(
            self.template,
            spec,
            binding,
            ids=None if binding is None else self._ends(binding, stop_token_ids),
            tail=None if prompt is None else prompt_tail(prompt, self.tokenizer),
            stop=stop,
            tools=tools,
            call_id=call_id or self.call_ids.maker(),
            ids_after_name=self.call_ids.after_name,
            strict=strict,
        )

    def _ends(
        self, binding: TokenizerBinding, stop_token_ids: Iterable[int] | None
    ) -> dict[int, tuple[EndReason, str]]:
        """The ids that end this reply: the format's own (:attr:`stop_ids`, with their reasons), and the request's
        ``stop_token_ids`` (vLLM's field: a template whose reply ends at the next role's marker), which end it with
        :attr:`~turnkit.parse.reply.EndReason.STOP_TOKEN` and their token's text."""
        if stop_token_ids is None:
            return self.stop_ids
        from turnkit.parse.reply import EndReason

        extra = {}
        for token_id in stop_token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise TypeError(f"stop_token_ids must be token ids (ints), got {token_id!r}")
            extra[token_id] = (EndReason.STOP_TOKEN, binding.decode([token_id]))
        return {**extra, **self.stop_ids}
