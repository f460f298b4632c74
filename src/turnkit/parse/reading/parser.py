"""The streaming reply parser: token ids (or text) in, OpenAI-shaped deltas out, one pass over the reply.

A :class:`StreamParser` reads a reply token by token:

* an id in the stop set (the template's end-of-turn marker, the checkpoint's EOS ids) ends the reply;
* an id that is a marker of the reply format (``<tool_call>``, ``<think>``, ``[TOOL_CALLS]``, ``<|channel|>`` ...) is
  passed on as a symbol: where a marker is a single token of the vocabulary only that token counts, and the same
  characters written as ordinary text are text;
* any other id becomes text (:mod:`.detokenize`).

The :class:`~.machine.ReplyMachine` runs the reply format over that stream and produces the deltas; stop strings (the
request's, and the format's own, such as the ``plain`` family's ``"\\nuser:"``) are found across token boundaries.

A reply that exists only as text (``feed_text``) has no ids to go by, so every marker counts as written, and the
text that ends a turn (``<|im_end|>``, ``</s>``, a template's own ``<|role_end|>``) is passed in as ``end_texts``.

Every delta is also kept for the final :class:`~turnkit.parse.reply.Reply`, so the concatenated deltas always equal it,
and however the ids are chunked, the result is the same. Nothing is removed from the text after the fact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from turnkit.errors import ReplyParseError, TokenizerError
from turnkit.parse.formats import ReplyFormat
from turnkit.parse.reading.call_id_shapes import default_call_id
from turnkit.parse.reading.detokenize import TextDecoder
from turnkit.parse.reading.machine import ReplyMachine
from turnkit.parse.reply import CallStatus, Delta, EndReason, Reply
from turnkit.tokenizer.bytetable import ByteTable

__all__ = ["StreamParser", "marker_symbols"]

#: Markers that are single tokens travel through the machine as characters of Unicode's plane-15 private use area.
_SYMBOL_BASE = 0xF0000


def marker_symbols(texts: Iterable[str], added_tokens: Mapping[str, int]) -> dict[str, int]:
    """The added tokens written inside ``texts`` (the format's markers and end texts), by text: the tokens that
    count only as their ids."""
    found: dict[str, int] = {}
    for text in texts:
        for core in text.split():
            for start in range(len(core)):
                for end in range(len(core), start, -1):
                    piece = core[start:end]
                    if piece in added_tokens:
                        found[piece] = added_tokens[piece]
                        break
    return found


class StreamParser:
    """Parses one reply incrementally. Build it with ``ChatFormat.stream_parser`` (or ``parse`` for a whole reply).

    ``feed(token_ids)`` returns the deltas the new ids complete; ``feed_text(text)`` does the same for replies that
    exist only as text (markers are then matched as text). ``finish()`` returns the :class:`~turnkit.parse.reply.Reply`.

    ``stops`` are the request's stop strings (end reason ``stop_string``); ``end_texts`` is text that ends the reply
    in the format's own terms, with its reason: a family's stop strings, always, and for text replies the markers
    that end a turn. ``tools`` are the names of the tools offered, or their ``parameters`` schemas by name (which
    type raw parameter values). ``in_reasoning``: the prompt left reasoning open (a generation prompt that writes
    ``<think>``); ``continues``: the reply continues text the prompt ended with (``continue_final_message``), so its
    leading whitespace is kept; ``open_message``: for headed messages (Harmony), the header of a message whose body
    the prompt left open. ``strict=True`` makes ``finish()`` raise :class:`~turnkit.errors.ReplyParseError`
    for a reply that did not end cleanly (see :attr:`~turnkit.parse.reply.Reply.ended_cleanly`); lenient parsing, the
    default, returns it with its failed calls and end reason. ``call_id`` makes the id of a call written without one
    (:func:`~.call_id_shapes.default_call_id` by default); ``ids_after_name``: the template writes a
    call's id after its name, so a call object is announced once complete, with the id the model wrote.
    """

    def __init__(
        self,
        reply_format: ReplyFormat,
        *,
        added_tokens: Mapping[str, int] | None = None,
        stop_ids: Mapping[int, tuple[EndReason, str]] | None = None,
        stops: Sequence[str] = (),
        end_texts: Mapping[str, EndReason] | None = None,
        tools: Iterable[str] | Mapping[str, Any] | None = None,
        byte_table: ByteTable | None = None,
        backend: Any = None,
        in_reasoning: bool = False,
        continues: bool = False,
        open_message: str | None = None,
        call_id: Callable[[int], str] | None = None,
        ids_after_name: bool = False,
        strict: bool = False,
    ) -> None:
        self.format = reply_format
        self.strict = strict
        given = dict(end_texts or {})
        if reply_format.channels is not None:  # a message's end is not the reply's unless the template ends on it
            for marker in reply_format.channels.message_ends:
                if marker not in reply_format.end_texts:
                    given.pop(marker, None)
        ends = {
            **{text: EndReason.END_OF_TURN for text in reply_format.end_texts},
            **given,
            **dict.fromkeys(stops, EndReason.STOP_STRING),
        }
        found = marker_symbols([*reply_format.markers, *ends], added_tokens or {})
        self._symbol_of = {token_id: chr(_SYMBOL_BASE + n) for n, token_id in enumerate(sorted(set(found.values())))}
        symbols = {text: self._symbol_of[token_id] for text, token_id in found.items()}
        self._stop_ids = dict(stop_ids or {})
        self._decoder = TextDecoder(byte_table, backend) if (byte_table is not None or backend is not None) else None
        self._backend = backend
        self._known, self._gaps = _known_ids(byte_table, backend)
        self._fed = 0  # ids fed so far: where an id outside the vocabulary was
        if tools is not None and not isinstance(tools, Mapping):
            tools = dict.fromkeys(tools)
        stop_symbols = {_symbolize(text, symbols): reason for text, reason in ends.items()}
        self._machine = ReplyMachine(
            reply_format,
            symbols=symbols,
            stops=stop_symbols,
            tools=tools,
            call_id=call_id or default_call_id(),
            ids_after_name=ids_after_name,
            in_reasoning=in_reasoning,
            continues=continues,
            open_message=open_message,
        )
        self.final_deltas: list[Delta] = []

    @property
    def ended(self) -> bool:
        """True once the reply has ended (a stop id or stop string); later input is ignored."""
        return self._machine.end is not None

    # -- input ---------------------------------------------------------------------------------------------------

    def feed(self, token_ids: Iterable[int]) -> list[Delta]:
        """Feed generated token ids; returns the deltas they complete (possibly none).

        Raises:
            TokenizerError: An id names no token of the vocabulary (it stood for no text and was dropped before, so a
                reply of another tokenizer's ids read as a clean reply with text missing).
        """
        decoder = self._decoder
        if decoder is None:
            raise TypeError("this parser has no tokenizer; feed it text with feed_text")
        machine = self._machine
        out = machine.out = []
        stops, symbols, known, gaps = self._stop_ids, self._symbol_of, self._known, self._gaps
        pending: list[str] = []
        position = self._fed
        for token_id in token_ids:
            if machine.end is not None:
                break
            position += 1
            if not 0 <= token_id < known or token_id in gaps:
                self._check_known(token_id, position)
            stop = stops.get(token_id)
            if (
                stop is not None
                and token_id in symbols
                and _ends_reasoning(machine, symbols[token_id], pending, decoder)
            ):
                pending.append(symbols[token_id])  # it may open the switch that ends reasoning: what follows decides
                continue
            if stop is not None:
                pending.append(decoder.flush())
                machine.feed("".join(pending))
                pending = []
                machine.finish_text()
                if machine.end is None:
                    machine.end, machine.stop = stop
                break
            symbol = symbols.get(token_id)
            if symbol is not None:
                pending.append(decoder.flush())
                pending.append(symbol)
                continue
            text = decoder.feed(token_id)
            if text:
                pending.append(text)
        self._fed = position
        if pending and machine.end is None:
            machine.feed("".join(pending))
        return out

    def _check_known(self, token_id: int, position: int) -> None:
        """Raise for an id that names no token (the tokenizer is asked where the byte table cannot say)."""
        backend = self._backend
        known = token_id >= 0 and token_id not in self._gaps and backend is not None
        if known and backend.id_to_token(token_id) is not None:
            return
        count = backend.get_vocab_size(with_added_tokens=True) if backend is not None else self._known
        raise TokenizerError(
            f"token id {token_id} (token {position} of the reply) is not in the tokenizer's vocabulary ({count:,} "
            "tokens): the reply holds ids of another tokenizer, or is not token ids"
        )

    def feed_text(self, text: str) -> list[Delta]:
        """Feed generated text (for replies that only exist as text: every marker is matched as text)."""
        if self._decoder is not None:  # its single-token markers are ids: they would not be seen in text
            raise TypeError("this parser reads token ids; parse text with a parser built without a tokenizer")
        machine = self._machine
        out = machine.out = []
        machine.feed(text)
        return out

    def finish(self, *, length: bool = False) -> Reply:
        """End the stream (``length=True`` when the token budget ran out) and return the reply.

        Any text held back is released first (but an incomplete character that a reply cut by ``length`` ends in is
        dropped, never shown as U+FFFD); the deltas returned by that last step are in ``final_deltas``.

        Raises:
            ReplyParseError: The parser is strict and the reply did not end cleanly.
        """
        machine = self._machine
        out = machine.out = []
        if machine.end is None and self._decoder is not None:
            machine.feed(self._decoder.flush(cut=length))
        machine.finish()
        if machine.end is None:
            machine.end = EndReason.LENGTH if length else EndReason.NONE
        self.final_deltas = out
        reasoning = machine.reasoning.text() or None  # "<think></think>" is no reasoning
        reply = Reply(machine.content.text(), reasoning, machine.calls, machine.end, machine.stop, machine.problems)
        if self.strict and not reply.ended_cleanly:
            _raise_unclean(reply)
        return reply


def _ends_reasoning(machine: ReplyMachine, symbol: str, pending: list[str], decoder: TextDecoder) -> bool:
    """Whether an end id just read may instead start the end of open reasoning (a template that closes the thinking
    with a role switch, ``<|im_end|>\n<|im_start|>assistant\n``): the machine is given the text so far and asked.
    Then the id goes on as its marker, and the machine ends the reply there unless the switch follows."""
    if not machine.reasoning_end_starts_with(symbol):
        return False
    pending.append(decoder.flush())
    machine.feed("".join(pending))
    pending.clear()
    return machine.in_reasoning


def _known_ids(byte_table: ByteTable | None, backend: Any) -> tuple[int, frozenset[int]]:
    """Which ids name a token, as ``(bound, gaps)``: every id below ``bound`` but those in ``gaps``; ids at or past
    ``bound`` are asked of the tokenizer one by one. The byte table spans the vocabulary's highest id, so where it
    holds as many ids as the vocabulary counts there is no gap (the usual case); where it holds more, the ids with no
    token are found once. Without a table every id is asked (that path decodes each token through the tokenizer
    anyway)."""
    if byte_table is None:
        return 0, frozenset()
    table = byte_table.table
    if backend is None or len(table) == backend.get_vocab_size(with_added_tokens=True):
        return len(table), frozenset()
    return len(table), frozenset(i for i, piece in enumerate(table) if not piece and backend.id_to_token(i) is None)


def _symbolize(text: str, symbols: Mapping[str, str]) -> str:
    for marker in sorted(symbols, key=len, reverse=True):
        text = text.replace(marker, symbols[marker])
    return text


_CUT = {EndReason.LENGTH: "the token budget ran out", EndReason.NONE: "it has no end-of-turn marker, EOS or stop"}


def _raise_unclean(reply: Reply) -> None:
    """Strict parsing: say why ``reply`` did not end cleanly, the end first (a cut-off reply explains its calls)."""
    if reply.end in _CUT:
        open_call = next((i for i, c in enumerate(reply.tool_calls) if c.status == CallStatus.UNTERMINATED), None)
        inside = f", inside tool call {open_call}" if open_call is not None else ""
        raise ReplyParseError(f"the reply did not end: {_CUT[reply.end]}{inside}", reply=reply)
    for index, call in enumerate(reply.tool_calls):
        if call.status != CallStatus.OK:
            what = f"{call.name!r} " if call.name else ""
            raise ReplyParseError(f"{what}did not parse ({call.status}): {call.error}", reply=reply, call_index=index)
    if reply.problems:
        raise ReplyParseError(f"the reply does not read as its format says: {reply.problems[0]}", reply=reply)
