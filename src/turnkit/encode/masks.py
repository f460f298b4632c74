"""Which tokens are trained: the loss mask of an encoding.

Two sources, picked per template (``masks="auto"``):

* ``{% generation %}`` blocks, when the template has them: the characters the template marked, for the selected
  messages (transformers' ``return_assistant_tokens_mask``, without its all-zeros fallback);
* the turns themselves, for any other template: each trained assistant turn runs from the end of the
  generation-prompt header before it to its end-of-turn marker, inclusive (the marker is how the model learns to
  stop); the separator after the marker is not trained, since the model never generates it. Where the header or
  the marker cannot be found, renders of the conversation cut short locate the turn (:mod:`turnkit.encode.history`),
  and a template that is not prefix-stable there is refused rather than trained in the wrong context. A reply that
  opens the conversation (a greeting first) trains from its header, or its first character, never the text a template
  writes before a first message (:meth:`~turnkit.encode.history.History.opening_reply_start`).

Which turns are selected: ``turns`` (all, the last, none), overridden by each message's own ``train`` flag. Nothing
selected and nothing trained raises :class:`~turnkit.errors.EmptyMaskError` (transformers only logs a warning and
returns all zeros).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from turnkit.encode.attribution import Spans, Turns
from turnkit.encode.coverage import check_trained
from turnkit.encode.history import History
from turnkit.encode.options import EncodeOptions
from turnkit.errors import EmptyMaskError, EncodeError

if TYPE_CHECKING:
    from turnkit.encode.job import Job

__all__ = ["Masks", "selected_messages"]

_WHITESPACE = " \t\r\n"


def selected_messages(chat: list[dict[str, Any]], flags: dict[int, bool], options: EncodeOptions) -> set[int]:
    """The assistant turns to train: those ``options.turns`` picks, with each message's ``train`` flag applied."""
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


class Masks:
    """Computes loss masks for one template and tokenizer."""

    def __init__(self, history: History, stop_texts: Iterable[str]) -> None:
        self.history = history
        self.stop_texts = stop_texts

    def mask(self, job: Job, turns: Turns, spans: Spans) -> np.ndarray:
        """1 for each trained token, 0 elsewhere (all 0 for a serving prompt, ``add_generation_prompt``)."""
        mask = np.zeros(spans.count, dtype=np.int8)
        if job.add_generation_prompt:
            return mask
        chat, options = job.chat, job.options
        selected = selected_messages(chat, job.flags, options)
        check_trained(job.unrendered, job.sources, selected, allow=options.allow_dropped)
        if job.use_blocks:
            regions = [r for r in job.rendered.generation_spans if turns.message_at(r[0], r[1]) in selected]
        else:
            regions = [self.turn_region(k, job, turns) for k in sorted(selected)]
            self.history.check_as_generated(job, selected)
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
        return mask

    def turn_region(self, index: int, job: Job, turns: Turns) -> tuple[int, int]:
        """The characters of assistant turn ``index`` to train: from the end of its generation-prompt header to its
        end-of-turn marker (inclusive unless ``train_end_marker=False``)."""
        text = job.text
        first, last = turns.data_extent(index)
        before = first if first is not None else len(text)
        lower = max(turns.previous_boundary(before), turns.previous_message_end(index, before))
        start = None
        header = self.history.header(job, index)
        if header and first is not None:
            at = text.rfind(header, lower, first)
            if at >= 0:
                start = at + len(header)
        if index == 0:
            start = self.history.opening_reply_start(job, start, first)
        elif start is None:
            start = self.history.prompt_start(job, index)
        after = max(start, last if last is not None else start)
        limit = turns.next_message_start(index)
        for marker_start, marker_end, _ in turns.ends:
            if marker_start >= after:
                if marker_end <= limit:
                    return (start, marker_end if job.options.train_end_marker else marker_start)
                break
        # No end-of-turn marker closes this turn before the next message: the turn ends where the template ends it
        # when the conversation stops after it.
        ending = self.history.ending(job, index)
        if not text.startswith(ending) or len(ending) <= start:
            raise EncodeError(
                f"cannot tell where assistant turn {index} ends: the template writes no end-of-turn marker the "
                f"tokenizer declares ({sorted(self.stop_texts) or 'none declared'}) and is not prefix-stable there"
            )
        end = len(ending)
        while end > start + 1 and ending[end - 1] in _WHITESPACE:
            end -= 1
        return (start, end)
