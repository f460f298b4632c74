"""From a conversation to token ids, safely, with loss masks for any template: the stages, in order.

The steps of :meth:`Encoder.encode`, each in its own module:

1. :mod:`.job`: normalise the messages (as for rendering), take out turnkit's per-message ``train`` flags, check
   roles; prepare the data (:mod:`.marking`: added-token strings in data are broken, data strings tagged); render once
   with provenance. Every complete added-token string in that render was written by the template (:mod:`.controls`),
   and a marker the tokenizer has no token for is reported.
2. :mod:`.tokenize`: cut the text at the template's control tokens, which become their ids, and encode the pieces
   between them with added tokens disabled (cached); or, where cutting could change the result, the whole text in one
   call, so the ids are exactly ``apply_chat_template(tokenize=True)``'s.
3. :mod:`.controls`: check the invariant: each control token id appears exactly as often as the template wrote it.
4. :mod:`.attribution`: attribute tokens to messages and to data; :mod:`.masks`: compute the loss mask, from
   ``{% generation %}`` blocks or from the turns (with :mod:`.history` where renders of the conversation cut short
   are needed, and to refuse what is not prefix-stable).

This module only runs the stages, one conversation at a time or pipelined over a batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from turnkit.collector import fewer_collections
from turnkit.encode.attribution import Spans, data_mask
from turnkit.encode.controls import ControlCheck, find_turns
from turnkit.encode.encoding import NO_MESSAGE, Encoding
from turnkit.encode.history import History
from turnkit.encode.job import Job, Stage, take_train_flags
from turnkit.encode.masks import Masks, selected_messages
from turnkit.encode.options import EncodeOptions
from turnkit.encode.tokenize import CharToToken, SegmentCache, encode_pieces, encode_text, segments
from turnkit.errors import EmptyMaskError
from turnkit.messages import Conversation, normalize_conversation
from turnkit.template.chat_template import ChatTemplate
from turnkit.tokenizer import StopSet, TokenizerBinding

__all__ = [
    "Encoder",
]

#: Stack frames between a user's ``ChatFormat.encode`` call and stage 1, for warnings that point at the user's line.
_USER_FRAMES = 4


class Encoder:
    """Encodes conversations for one chat format and one tokenizer. Built once; holds the caches."""

    def __init__(self, template: ChatTemplate, binding: TokenizerBinding, stops: StopSet) -> None:
        self.template = template
        self.binding = binding
        self.stage = Stage(template, binding)
        self.segment_cache = SegmentCache()
        #: Control tokens that end a turn: the format's declared end markers and EOS, the checkpoint's EOS ids.
        self.stop_texts = stops.texts
        self.check_controls = ControlCheck(binding)
        self.masks = Masks(History(template, splicing=self.stage.renders.enabled), self.stop_texts)

    # -- public ---------------------------------------------------------------------------------------------------

    def encode(self, messages: Conversation, options: EncodeOptions) -> Encoding | list[Encoding]:
        """One conversation; a list of examples with ``options.split_turns``."""
        if options.split_turns:
            return self.encode_turns(messages, options)
        return self._encode_one(messages, options)

    def _encode_one(self, messages: Conversation, options: EncodeOptions, *, depth: int = 0) -> Encoding:
        job = self.render(messages, options, stacklevel=_USER_FRAMES + depth)
        tokenized = encode_text(
            self.binding, self.segment_cache, job.text, job.controls, broken=bool(job.prepared.broken)
        )
        return self.finish(job, *tokenized)

    def encode_batch(
        self,
        conversations: Sequence[Conversation | Mapping[str, Any]],
        options: EncodeOptions,
        *,
        chunk_size: int = 16,
        tokenizer_thread: bool | None = None,
    ) -> list[Encoding] | list[list[Encoding]]:
        """Encode many conversations, by chunks: render a chunk, tokenize what its text holds that is not cached yet,
        finish it. Text is cut at the template's control tokens and each piece is tokenized once and kept in a cache,
        so system prompts and tool schemas that repeat across a dataset are tokenized once. (For tokenizers where
        cutting could change the result, whole texts are tokenized instead.) With ``options.split_turns`` each
        conversation gives a list, as :meth:`encode` does.

        ``tokenizer_thread``: tokenize each chunk in a thread while this one renders the next. By default (None) only
        where the tokenizer encodes a whole batch without Python's GIL (the ``tokenizers`` path, in Rust). The exact
        tiktoken path encodes piece by piece, and a thread that needs the GIL back after every piece waits for the
        rendering thread to yield it (every 5 ms): there the thread was measured slower than none.

        Python's garbage collector runs less often meanwhile (:mod:`turnkit.collector`): a batch's encodings are held
        until it returns, and the default collector rescanned them (a batch was slower than a loop of :meth:`encode`).
        """
        with fewer_collections():
            return self._encode_batch(conversations, options, chunk_size=chunk_size, tokenizer_thread=tokenizer_thread)

    def _encode_batch(
        self,
        conversations: Sequence[Conversation | Mapping[str, Any]],
        options: EncodeOptions,
        *,
        chunk_size: int,
        tokenizer_thread: bool | None,
    ) -> list[Encoding] | list[list[Encoding]]:
        items: list[tuple[Any, EncodeOptions]] = []
        for item in conversations:
            item_options = options
            if isinstance(item, Mapping):
                tools, documents = item.get("tools", options.tools), item.get("documents", options.documents)
                if tools is not options.tools or documents is not options.documents:
                    item_options = replace(options, tools=tools, documents=documents)
                items.append((item.get("messages"), item_options))
            else:
                items.append((item, options))
        if tokenizer_thread is None:
            tokenizer_thread = self.binding.fast_path is None
        if options.split_turns:
            return [self.encode_turns(m, o) for m, o in items]

        def render(chunk: Sequence[tuple[Any, EncodeOptions]]) -> list[Job]:
            return [self.render(m, o, stacklevel=_USER_FRAMES) for m, o in chunk]

        chunks = [items[i : i + chunk_size] for i in range(0, len(items), chunk_size)]
        out: list[Encoding] = []
        if not self.binding.segment_safe:
            for chunk in chunks:
                jobs = render(chunk)
                plain = [j for j in jobs if not j.prepared.broken]
                encodings = iter(self.binding.backend.encode_batch([j.text for j in plain], add_special_tokens=False))
                for job in jobs:
                    if job.prepared.broken:
                        pieces = encode_pieces(self.binding, job.text, job.controls)
                        out.append(self.finish(job, pieces.ids, pieces.char_to_token))
                    else:
                        encoding = next(encodings)
                        out.append(self.finish(job, encoding.ids, encoding.char_to_token))
            return out

        def finish(jobs: list[Job], cuts: list[list[tuple[int, str]]]) -> None:
            for job, cut in zip(jobs, cuts, strict=True):
                assembled = self.segment_cache.assemble(self.binding, job.text, job.controls, cut)
                out.append(self.finish(job, assembled.ids, assembled.char_to_token))

        if not tokenizer_thread:
            for chunk in chunks:
                jobs = render(chunk)
                cuts = [segments(job.text, job.controls) for job in jobs]
                self.segment_cache.fill([piece for cut in cuts for _, piece in cut], self.binding.data)
                finish(jobs, cuts)
            return out
        pending: tuple[list[Job], list[list[tuple[int, str]]]] | None = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="turnkit-tokenize") as pool:
            for chunk in chunks:
                jobs = render(chunk)
                cuts = [segments(job.text, job.controls) for job in jobs]
                missing = self.segment_cache.missing([piece for cut in cuts for _, piece in cut])
                future = pool.submit(self.binding.data.encode_batch, missing, add_special_tokens=False)
                if pending is not None:
                    finish(*pending)  # overlaps with the tokenizer working on this chunk
                self.segment_cache.store(missing, future.result())
                pending = (jobs, cuts)
            if pending is not None:
                finish(*pending)
        return out

    def encode_turns(self, messages: Conversation, options: EncodeOptions) -> list[Encoding]:
        """One example per trained assistant turn: the conversation up to it, training only that turn."""
        chat = normalize_conversation(messages, alias_reasoning=False)
        flags = take_train_flags(chat)
        selected = sorted(selected_messages(chat, flags, options))
        if not selected:
            raise EmptyMaskError("no token would be trained: no assistant turn is selected")
        one_turn = replace(options, turns="none", split_turns=False, add_generation_prompt=False)
        out = []
        for index in selected:
            prefix = [dict(m) for m in chat[: index + 1]]
            prefix[index]["train"] = True
            out.append(self._encode_one(prefix, one_turn, depth=1))
        return out

    # -- the stages -----------------------------------------------------------------------------------------------

    def render(self, messages: Conversation, options: EncodeOptions, *, stacklevel: int = 1) -> Job:
        """Stage 1: check, prepare and render with provenance; find the template's control tokens."""
        return self.stage(messages, options, stacklevel=stacklevel + 1)

    def finish(self, job: Job, ids: Sequence[int], char_to_token: CharToToken) -> Encoding:
        """Stages 3 and 4: check the control tokens, attribute every token, and compute the loss mask."""
        # (fromiter reads a list of ints faster than asarray, which first discovers the list's type)
        ids_array = ids if isinstance(ids, np.ndarray) else np.fromiter(ids, np.int64, len(ids))
        tokens = [token for _, _, token in job.controls]
        counts = Counter(tokens)
        added = self.binding.added
        self.check_controls(ids_array, counts, [added[token].id for token in tokens])
        spans = Spans(job.text, len(ids_array), char_to_token)
        turns = find_turns(job.text, job.controls, self.stop_texts, job.rendered.data_spans)
        if job.options.attribution:
            is_data = data_mask(spans, job.rendered.data_spans)
            message_index = turns.message_index(spans)
        else:
            is_data = np.zeros(len(ids_array), dtype=bool)
            message_index = np.full(len(ids_array), NO_MESSAGE, dtype=np.int32)
        mask = self.masks.mask(job, turns, spans)
        return Encoding.from_arrays(ids_array, mask, message_index, is_data, job.text, dict(counts), job.unrendered)
