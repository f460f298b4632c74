"""From a conversation to token ids, safely, with loss masks for any template.

The steps of :meth:`Encoder.encode`:

1. Normalise the messages (as for rendering), take out turnkit's per-message ``train`` flags, and check roles.
2. Prepare the data (:mod:`turnkit.encode.marking`): added-token strings in data are broken, data strings tagged.
3. Render once with provenance. Every complete added-token string in that render was written by the template.
4. Tokenize. With no added-token string in the data, the whole text goes through the checkpoint's tokenizer in one
   call, so the ids are exactly ``apply_chat_template(tokenize=True)``'s. Otherwise the text is cut at the template's
   control tokens, which become their ids, and the pieces between them are encoded with added tokens disabled.
5. Check the invariant: each control token id appears exactly as often as the template wrote it.
6. Attribute tokens to messages and to data, and compute the loss mask: from ``{% generation %}`` blocks when the
   template has them, otherwise from the turns themselves: each trained assistant turn runs from the end of the
   generation-prompt header before it to its end-of-turn marker, inclusive; the separator after the marker is not
   trained.
"""

from __future__ import annotations

import bisect
import itertools
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from turnkit.encode.encoding import NO_MESSAGE, Encoding
from turnkit.encode.marking import DataMarker
from turnkit.encode.options import EncodeOptions
from turnkit.errors import EmptyMaskError, EncodeError, MessageError, TemplateError
from turnkit.messages import KNOWN_ROLES, Conversation, normalize_conversation, plain_data
from turnkit.template.chat_template import ChatTemplate
from turnkit.template.render import Rendered, render_prepared
from turnkit.template.tools import tool_schemas
from turnkit.tokenizer import StopSet, TokenizerBinding

__all__ = ["Encoder", "TrustedDataWarning"]

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_WHITESPACE = " \t\r\n"


class TrustedDataWarning(UserWarning):
    """Emitted whenever ``trust_data=True`` lets control tokens in data through."""


class _Pieces:
    """Token positions of text encoded piece by piece: maps a character offset to the token that holds it."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.char_starts: list[int] = []
        self.token_starts: list[int] = []
        self.lookups: list[Callable[[int], int | None] | None] = []

    def add_control(self, at: int, token_id: int) -> None:
        self.char_starts.append(at)
        self.token_starts.append(len(self.ids))
        self.lookups.append(None)
        self.ids.append(token_id)

    def add_text(self, at: int, encoded: tuple[list[int], Callable[[int], int | None]]) -> None:
        ids, char_to_token = encoded
        self.char_starts.append(at)
        self.token_starts.append(len(self.ids))
        self.lookups.append(char_to_token)
        self.ids.extend(ids)

    def char_to_token(self, position: int) -> int | None:
        piece = bisect.bisect_right(self.char_starts, position) - 1
        if piece < 0:
            return None
        lookup = self.lookups[piece]
        if lookup is None:
            return self.token_starts[piece]
        found = lookup(position - self.char_starts[piece])
        return None if found is None else self.token_starts[piece] + found


class Encoder:
    """Encodes conversations for one chat format and one tokenizer. Built once; holds the caches."""

    def __init__(self, template: ChatTemplate, binding: TokenizerBinding, stops: StopSet) -> None:
        self.template = template
        self.binding = binding
        self.marker = DataMarker(binding)
        self._headers: dict[tuple[str, str], str | None] = {}
        self._segment_cache = _SegmentCache()
        #: Control tokens that end a turn: the format's declared end markers and EOS, the checkpoint's EOS ids.
        self.stop_texts = stops.texts
        size = max([binding.backend.get_vocab_size(with_added_tokens=True), *binding.by_id]) + 1
        self._is_control = np.zeros(size, dtype=bool)
        self._is_control[list(binding.by_id)] = True

    # -- public ---------------------------------------------------------------------------------------------------

    def encode(self, messages: Conversation, options: EncodeOptions) -> Encoding | list[Encoding]:
        """One conversation; a list of examples with ``options.split_turns``."""
        if options.split_turns:
            return self.encode_turns(messages, options)
        return self._encode_one(messages, options)

    def _encode_one(self, messages: Conversation, options: EncodeOptions) -> Encoding:
        job = self.render(messages, options)
        if self.binding.segment_safe:
            # Text between control tokens, tokenized once and cached: a system prompt or tool schemas shared by
            # many conversations are not tokenized again.
            segments = _segments(job.text, job.controls)
            self._segment_cache.fill([piece for _, piece in segments], self.binding.data)
            assembled = self._assemble(job.text, job.controls, segments)
            return self.finish(job, assembled.ids, assembled.char_to_token)
        if job.prepared.broken:
            pieces = self._encode_pieces(job.text, job.controls)
            return self.finish(job, pieces.ids, pieces.char_to_token)
        encoding = self.binding.encode(job.text)
        return self.finish(job, encoding.ids, encoding.char_to_token)

    def encode_batch(
        self,
        conversations: Sequence[Conversation | Mapping[str, Any]],
        options: EncodeOptions,
        *,
        chunk_size: int = 16,
    ) -> list[Encoding] | list[list[Encoding]]:
        """Encode many conversations: templates render here, tokenization runs in the tokenizer's threads.

        Work is pipelined by chunks: while the tokenizer's threads encode one chunk (the GIL is released there), this
        thread renders the next one and finishes the previous one. Text is cut at the template's control tokens and
        each piece is tokenized once and kept in a cache, so system prompts and tool schemas that repeat across a
        dataset are tokenized once. (For tokenizers where cutting could change the result, whole texts are
        tokenized instead.) With ``options.split_turns`` each conversation gives a list, as :meth:`encode` does.
        """
        items: list[tuple[Any, EncodeOptions]] = []
        for item in conversations:
            if isinstance(item, Mapping):
                tools, documents = item.get("tools", options.tools), item.get("documents", options.documents)
                items.append((item.get("messages"), replace(options, tools=tools, documents=documents)))
            else:
                items.append((item, options))
        if options.split_turns:
            return [self.encode_turns(m, o) for m, o in items]

        def render(chunk: Sequence[tuple[Any, EncodeOptions]]) -> list[_Job]:
            return [self.render(m, o) for m, o in chunk]

        chunks = [items[i : i + chunk_size] for i in range(0, len(items), chunk_size)]
        out: list[Encoding] = []
        if not self.binding.segment_safe:
            for chunk in chunks:
                jobs = render(chunk)
                plain = [j for j in jobs if not j.prepared.broken]
                encodings = iter(self.binding.backend.encode_batch([j.text for j in plain], add_special_tokens=False))
                for job in jobs:
                    if job.prepared.broken:
                        pieces = self._encode_pieces(job.text, job.controls)
                        out.append(self.finish(job, pieces.ids, pieces.char_to_token))
                    else:
                        encoding = next(encodings)
                        out.append(self.finish(job, encoding.ids, encoding.char_to_token))
            return out

        def finish(jobs: list[_Job], segments: list[list[tuple[int, str]]]) -> None:
            for job, pieces in zip(jobs, segments, strict=True):
                assembled = self._assemble(job.text, job.controls, pieces)
                out.append(self.finish(job, assembled.ids, assembled.char_to_token))

        pending: tuple[list[_Job], list[list[tuple[int, str]]]] | None = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="turnkit-tokenize") as pool:
            for chunk in chunks:
                jobs = render(chunk)
                segments = [_segments(job.text, job.controls) for job in jobs]
                missing = self._segment_cache.missing([piece for pieces in segments for _, piece in pieces])
                future = pool.submit(self.binding.data.encode_batch, missing, add_special_tokens=False)
                if pending is not None:
                    finish(*pending)  # overlaps with the tokenizer working on this chunk
                self._segment_cache.store(missing, future.result())
                pending = (jobs, segments)
            if pending is not None:
                finish(*pending)
        return out

    # -- the stages -----------------------------------------------------------------------------------------------

    def render(self, messages: Conversation, options: EncodeOptions) -> _Job:
        """Stage 1: check, prepare and render with provenance; find the template's control tokens."""
        tools, documents, template_name = options.tools, options.documents, options.template_name
        add_generation_prompt = options.add_generation_prompt
        source = self.template.source(template_name, tools=tools)
        chat = normalize_conversation(messages)
        flags = _take_train_flags(chat)
        self._check_roles(chat)
        if options.trust_data:
            warnings.warn(
                "trust_data=True: control-token strings inside the data are encoded as control tokens; never use it "
                "for data a user or a model wrote",
                TrustedDataWarning,
                stacklevel=5,
            )
        schemas = plain_data(tool_schemas(tools))
        docs = plain_data(list(documents)) if documents is not None else None
        variables = plain_data(dict(options.template_kwargs))
        prepared = self.marker.prepare(chat, schemas, docs, variables, neutralize=not options.trust_data)
        has_blocks = bool(_GENERATION_TAG.search(source))
        if options.masks == "generation" and not has_blocks:
            raise EncodeError("masks='generation' but the template has no {% generation %} blocks")
        use_blocks = has_blocks and options.masks != "turns"
        context = {
            "messages": prepared.chat,
            "tools": prepared.tools,
            "documents": prepared.documents,
            "add_generation_prompt": add_generation_prompt,
            **self.template.special_tokens,
            **prepared.variables,
        }
        rendered = render_prepared(source, context, limits=self.template.limits, track_generation=use_blocks)
        controls = [(m.start(), m.end(), m.group(0)) for m in self.binding.added_pattern.finditer(rendered.text)]
        text = self.marker.restore(rendered.text) if prepared.broken else rendered.text
        return _Job(
            chat,
            flags,
            prepared,
            rendered,
            text,
            controls,
            use_blocks,
            add_generation_prompt,
            template_name,
            tools,
            variables,
            options,
        )

    def finish(self, job: _Job, ids: Sequence[int], char_to_token: Callable[[int], int | None]) -> Encoding:
        """Stage 3: check the control tokens, attribute every token, and compute the loss mask."""
        ids_array = np.asarray(ids, dtype=np.int64)
        counts = Counter(token for _, _, token in job.controls)
        self._check_controls(ids_array, counts)
        text, rendered, chat, options = job.text, job.rendered, job.chat, job.options

        spans = _Spans(text, len(ids_array), char_to_token)
        is_data = np.zeros(len(ids_array), dtype=bool)
        turns = self._turns(text, job.controls, rendered)
        if options.attribution:
            for start, end in _merged(rendered.data_spans):
                first, last = spans.tokens(start, end)
                is_data[first:last] = True
            message_index = turns.message_index(spans)
        else:
            message_index = np.full(len(ids_array), NO_MESSAGE, dtype=np.int32)

        mask = np.zeros(len(ids_array), dtype=np.int8)
        if not job.add_generation_prompt:
            selected = _selected_messages(chat, job.flags, options)
            if job.use_blocks:
                regions = [r for r in rendered.generation_spans if turns.message_at(r[0], r[1]) in selected]
            else:
                regions = [self._turn_region(k, job, turns) for k in sorted(selected)]
                self._check_reasoning_turns(chat, selected, text, job.template_name, job.tools, job.variables)
            for start, end in regions:
                first, last = spans.tokens(start, end)
                mask[first:last] = 1
            wanted = bool(selected) or options.turns != "none"
            if wanted and not mask.any():
                if not any(m["role"] == "assistant" for m in chat):
                    reason = "the conversation has no assistant turn"
                elif not selected:
                    reason = f"no assistant turn is selected (turns={options.turns!r} and the messages' train flags)"
                else:
                    reason = f"the template renders no text for the selected assistant turns {sorted(selected)}"
                raise EmptyMaskError(f"no token would be trained: {reason}")
        return Encoding.from_arrays(ids_array, mask, message_index, is_data, text, dict(counts))

    def encode_turns(self, messages: Conversation, options: EncodeOptions) -> list[Encoding]:
        """One example per trained assistant turn: the conversation up to it, training only that turn."""
        chat = normalize_conversation(messages, alias_reasoning=False)
        flags = _take_train_flags(chat)
        selected = sorted(_selected_messages(chat, flags, options))
        if not selected:
            raise EmptyMaskError("no token would be trained: no assistant turn is selected")
        one_turn = replace(options, turns="none", split_turns=False, add_generation_prompt=False)
        out = []
        for index in selected:
            prefix = [dict(m) for m in chat[: index + 1]]
            prefix[index]["train"] = True
            out.append(self._encode_one(prefix, one_turn))
        return out

    # -- tokenizing -----------------------------------------------------------------------------------------------

    def _encode_pieces(self, text: str, controls: Sequence[tuple[int, int, str]]) -> _Pieces:
        """Control tokens as their ids; everything between them as plain text (added tokens disabled)."""
        segments = _segments(text, controls)
        encoded = self.binding.data.encode_batch([piece for _, piece in segments], add_special_tokens=False)
        by_start = {at: (e.ids, e.char_to_token) for (at, _), e in zip(segments, encoded, strict=True)}
        return _pieces(controls, by_start, self.binding, len(text))

    def _assemble(
        self, text: str, controls: Sequence[tuple[int, int, str]], segments: list[tuple[int, str]]
    ) -> _Pieces:
        lookup = self._segment_cache.get
        return _pieces(controls, {at: lookup(piece) for at, piece in segments}, self.binding, len(text))

    def _check_controls(self, ids: np.ndarray, counts: Counter[str]) -> None:
        written = sum(counts.values())
        found = int(self._is_control[ids[ids < len(self._is_control)]].sum())
        if found == written and all(int((ids == self.binding.added[t].id).sum()) == n for t, n in counts.items()):
            return
        raise EncodeError(
            f"internal check failed: the template wrote {written} control tokens but the encoding holds {found} "
            f"({dict(counts)}); please report this with the template and the tokenizer"
        )

    # -- roles ----------------------------------------------------------------------------------------------------

    def _check_roles(self, chat: Sequence[Mapping[str, Any]]) -> None:
        for index, message in enumerate(chat):
            role = message["role"]
            if role in KNOWN_ROLES:
                continue
            word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(role)}(?![A-Za-z0-9_])")
            for token in self.binding.added:
                if word.search(token):
                    raise MessageError(
                        f"role {role!r} spells part of the control token {token!r}; a template that writes "
                        "'<|' + role + '|>' would turn it into that token",
                        index=index,
                        field="role",
                    )

    # -- turns and masks --------------------------------------------------------------------------------------

    def _turns(self, text: str, controls: Sequence[tuple[int, int, str]], rendered: Rendered) -> _Turns:
        ends = []
        for start, end, token in controls:
            if token in self.stop_texts:
                stop = end
                while stop < len(text) and text[stop] in _WHITESPACE:
                    stop += 1
                ends.append((start, end, stop))
        return _Turns(len(text), ends, rendered.data_spans)

    def _turn_region(self, index: int, job: _Job, turns: _Turns) -> tuple[int, int]:
        """The characters of assistant turn ``index`` to train: from the end of its generation-prompt header to its
        end-of-turn marker (inclusive unless ``train_end_marker=False``)."""
        chat, text, options = job.chat, job.text, job.options
        template_name, tools, variables = job.template_name, job.tools, job.variables
        first, last = turns.data_extent(index)
        before = first if first is not None else len(text)
        lower = max(turns.previous_boundary(before), turns.previous_message_end(index, before))
        start = None
        header = self._header(chat, index, template_name, tools, variables)
        if header and first is not None:
            at = text.rfind(header, lower, first)
            if at >= 0:
                start = at + len(header)
        if start is None:
            start = self._prefix_start(chat, index, text, template_name, tools, variables)
        after = max(start, last if last is not None else start)
        limit = turns.next_message_start(index)
        for marker_start, marker_end, _ in turns.ends:
            if marker_start >= after:
                if marker_end <= limit:
                    return (start, marker_end if options.train_end_marker else marker_start)
                break
        # No end-of-turn marker closes this turn before the next message: the turn ends where the template ends it
        # when the conversation stops after it.
        ending = self._render_plain(chat[: index + 1], False, template_name, tools, variables)
        if not text.startswith(ending) or len(ending) <= start:
            raise EncodeError(
                f"cannot tell where assistant turn {index} ends: the template writes no end-of-turn marker the "
                f"tokenizer declares ({sorted(self.stop_texts) or 'none declared'}) and is not prefix-stable there"
            )
        end = len(ending)
        while end > start + 1 and ending[end - 1] in _WHITESPACE:
            end -= 1
        return (start, end)

    def _check_reasoning_turns(
        self,
        chat: list[dict[str, Any]],
        selected: set[int],
        text: str,
        name: str | None,
        tools: Any,
        variables: dict[str, Any],
    ) -> None:
        """A trained turn with reasoning, followed by later messages, must render as the model generated it.

        Templates such as Qwen3's drop the reasoning of a turn once a later user turn follows; training that turn in
        the full conversation would teach the model to answer without reasoning. (Only turns with reasoning are
        re-rendered: it is the one common way history is rewritten, and each check costs a render.)
        """
        for index in sorted(selected):
            message = chat[index]
            if index == len(chat) - 1 or not (
                "reasoning_content" in message or "<think>" in str(message.get("content", ""))
            ):
                continue
            generated = self._render_plain(chat[: index + 1], False, name, tools, variables)
            if not text.startswith(generated):
                raise EncodeError(
                    f"the template is not prefix-stable at message {index}: it renders this turn differently once "
                    "later messages follow (its reasoning is dropped), so training it in the full conversation "
                    "teaches the wrong reply; encode with split_turns=True (see check_prefix_stable)"
                )

    def _render_plain(
        self, chat: list[dict[str, Any]], generation_prompt: bool, name: str | None, tools: Any, variables: dict
    ) -> str:
        return self.template.render(
            chat, tools=tools, add_generation_prompt=generation_prompt, template_name=name, template_kwargs=variables
        ).text

    def _header(
        self, chat: list[dict[str, Any]], index: int, name: str | None, tools: Any, variables: dict[str, Any]
    ) -> str | None:
        """The generation-prompt header (``<|im_start|>assistant\\n``), from the template, cached per set-up."""
        key = (self.template.source(name, tools=tools), repr((tools is not None, sorted(variables.items()))))
        if key in self._headers:
            return self._headers[key]
        header = None
        prefix = chat[:index]
        if prefix:
            try:
                with_prompt = self._render_plain(prefix, True, name, tools, variables)
                without = self._render_plain(prefix, False, name, tools, variables)
            except TemplateError:
                return None  # this prefix is not renderable alone; try again with another turn
            if with_prompt.startswith(without) and len(with_prompt) > len(without):
                header = with_prompt[len(without) :]
        self._headers[key] = header
        return header

    def _prefix_start(
        self, chat: list[dict[str, Any]], index: int, text: str, name: str | None, tools: Any, variables: dict
    ) -> int:
        """Where turn ``index`` starts, from the render of the messages before it with the generation prompt."""
        prompt = self._render_plain(chat[:index], True, name, tools, variables) if index else ""
        if not text.startswith(prompt):
            raise EncodeError(
                f"the template is not prefix-stable at message {index}: the prompt the model sees for this turn is "
                "not a prefix of the full render, so one example cannot train it in its inference context; encode "
                "with split_turns=True (see check_prefix_stable)"
            )
        return len(prompt)


class _Spans:
    """Character spans to token ranges, for one encoding."""

    def __init__(self, text: str, count: int, char_to_token: Callable[[int], int | None]) -> None:
        self.text = text
        self.count = count
        self.char_to_token = char_to_token

    def token_at(self, position: int, step: int, limit: int) -> int | None:
        while position != limit:
            found = self.char_to_token(position)
            if found is not None:
                return found
            position += step
        return None

    def tokens(self, start: int, end: int) -> tuple[int, int]:
        """The tokens that overlap characters ``[start, end)``, as a ``[first, last)`` range (empty if none)."""
        if end <= start:
            return (0, 0)
        first = self.char_to_token(start)
        if first is None:
            first = self.token_at(start + 1, 1, end)
        last = self.char_to_token(end - 1)
        if last is None:
            last = self.token_at(end - 2, -1, start - 1)
        if first is None or last is None:
            return (0, 0)
        return (first, last + 1)


class _Turns:
    """The turns of a render: where each ends (its end-of-turn marker and the separator after it), and the data."""

    def __init__(self, size: int, ends: list[tuple[int, int, int]], data_spans: Sequence[tuple[int, int, int]]):
        self.size = size
        self.ends = ends  # (marker start, marker end, end of the separator after it)
        self.boundaries = [stop for _, _, stop in ends]
        self.data_spans = [s for s in data_spans if s[2] >= 0 and s[1] > s[0]]

    def data_extent(self, index: int) -> tuple[int | None, int | None]:
        mine = [(a, b) for a, b, source in self.data_spans if source == index]
        if not mine:
            return (None, None)
        return (min(a for a, _ in mine), max(b for _, b in mine))

    def previous_message_end(self, index: int, limit: int) -> int:
        """Where the data of earlier messages ends, before ``limit`` (a turn starts after it)."""
        ends = [b for a, b, source in self.data_spans if source < index and b <= limit]
        return max(ends) if ends else 0

    def next_message_start(self, index: int) -> int:
        """Where the data of a later message first appears (the end of the text when none does)."""
        later = [a for a, _, source in self.data_spans if source > index]
        return min(later) if later else self.size

    def previous_boundary(self, position: int) -> int:
        at = bisect.bisect_right(self.boundaries, position) - 1
        return self.boundaries[at] if at >= 0 else 0

    def next_boundary(self, position: int) -> int:
        at = bisect.bisect_right(self.boundaries, position)
        return self.boundaries[at] if at < len(self.boundaries) else self.size

    def message_at(self, start: int, end: int) -> int:
        """The message a stretch of text belongs to: the first message with data inside it, else the turn's."""
        inside = [source for a, b, source in self.data_spans if a < end and b > start]
        if inside:
            return inside[0]
        return self._owner(start)

    def _owner(self, position: int) -> int:
        lower = self.previous_boundary(position)
        owner = NO_MESSAGE
        for a, _, source in self.data_spans:
            if a >= lower and a <= position:
                owner = source
            elif a > position:
                if owner == NO_MESSAGE and a < self.next_boundary(position):
                    owner = source
                break
        return owner

    def message_index(self, spans: _Spans) -> np.ndarray:
        """Per token: the message whose turn it belongs to (``-1`` for turns that hold no message's data).

        A turn (the text up to and including an end-of-turn marker and its separator) belongs to the first message
        whose data it holds; within a turn, each message's data and the template text after it belong to that
        message (a template may fold several tool results into one turn).
        """
        out = np.full(spans.count, NO_MESSAGE, dtype=np.int32)
        data = self.data_spans
        points: list[tuple[int, int]] = []  # (character where it starts, message)
        bounds = [0, *self.boundaries, self.size]
        j = 0
        for chunk_start, chunk_end in itertools.pairwise(bounds):
            while j < len(data) and data[j][0] < chunk_start:
                j += 1
            first = True
            while j < len(data) and data[j][0] < chunk_end:
                source = data[j][2]
                if first or source != points[-1][1]:
                    points.append((chunk_start if first else data[j][0], source))
                first = False
                j += 1
            if first:
                points.append((chunk_start, NO_MESSAGE))
        for n, (start, source) in enumerate(points):
            if source == NO_MESSAGE:
                continue
            end = points[n + 1][0] if n + 1 < len(points) else self.size
            first_token, last_token = spans.tokens(start, end)
            out[first_token:last_token] = source
        return out


def _take_train_flags(chat: list[dict[str, Any]]) -> dict[int, bool]:
    flags = {}
    for index, message in enumerate(chat):
        if "train" in message:
            value = message.pop("train")
            if not isinstance(value, bool):
                raise MessageError("train must be true or false", index=index, field="train")
            if value and message["role"] != "assistant":
                raise MessageError("only assistant turns can be trained", index=index, field="train")
            flags[index] = value
    return flags


def _selected_messages(chat: list[dict[str, Any]], flags: dict[int, bool], options: EncodeOptions) -> set[int]:
    assistants = [i for i, m in enumerate(chat) if m["role"] == "assistant"]
    if options.turns == "all":
        selected = set(assistants)
    elif options.turns == "last":
        selected = set(assistants[-1:])
    else:
        selected = set()
    for index, value in flags.items():
        (selected.add if value else selected.discard)(index)
    return selected


@dataclass
class _Job:
    """A conversation after stage 1 (rendered), waiting for its token ids."""

    chat: list[dict[str, Any]]
    flags: dict[int, bool]
    prepared: Any
    rendered: Rendered
    text: str
    controls: list[tuple[int, int, str]]
    use_blocks: bool
    add_generation_prompt: bool
    template_name: str | None
    tools: Any
    variables: dict[str, Any]
    options: EncodeOptions


def _merged(spans: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Character spans with touching or overlapping ones joined (sources ignored)."""
    out: list[tuple[int, int]] = []
    for start, end, _ in sorted(spans):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _segments(text: str, controls: Sequence[tuple[int, int, str]]) -> list[tuple[int, str]]:
    """The text between the template's control tokens, with where each piece starts."""
    out: list[tuple[int, str]] = []
    pos = 0
    for start, end, _ in controls:
        if start > pos:
            out.append((pos, text[pos:start]))
        pos = end
    if pos < len(text):
        out.append((pos, text[pos:]))
    return out


def _pieces(
    controls: Sequence[tuple[int, int, str]], encoded: Mapping[int, Any], binding: TokenizerBinding, size: int
) -> _Pieces:
    pieces = _Pieces()
    pos = 0
    for start, end, token in controls:
        if start > pos:
            pieces.add_text(pos, encoded[pos])
        pieces.add_control(start, binding.added[token].id)
        pos = end
    if pos < size:
        pieces.add_text(pos, encoded[pos])
    return pieces


class _SegmentCache:
    """Tokenized text pieces, kept across batches (least recently used out first)."""

    def __init__(self, capacity: int = 65_536) -> None:
        self.capacity = capacity
        self._items: dict[str, Any] = {}

    def get(self, piece: str) -> Any:
        found = self._items.pop(piece)
        self._items[piece] = found  # most recent last
        return found

    def missing(self, pieces: Sequence[str]) -> list[str]:
        """The distinct pieces not in the cache yet."""
        return list(dict.fromkeys(p for p in pieces if p not in self._items))

    def store(self, pieces: Sequence[str], encodings: Sequence[Any]) -> None:
        for piece, encoding in zip(pieces, encodings, strict=True):
            self._items[piece] = (encoding.ids, encoding.char_to_token)
        self._evict(len(pieces))

    def fill(self, pieces: Sequence[str], tokenizer: Any) -> None:
        """Tokenize the pieces that are not cached yet, in this thread."""
        missing = self.missing(pieces)
        for piece in missing:
            encoding = tokenizer.encode(piece, add_special_tokens=False)
            self._items[piece] = (encoding.ids, encoding.char_to_token)
        self._evict(len(pieces))

    def _evict(self, in_use: int) -> None:
        overflow = len(self._items) - max(self.capacity, in_use)
        if overflow > 0:  # the least recently used are first
            for key in list(itertools.islice(self._items, overflow)):
                del self._items[key]
