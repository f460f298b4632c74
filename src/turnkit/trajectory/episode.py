"""One agent episode as the ids an engine is given and samples: :class:`Trajectory`, its steps and its deltas.

:mod:`turnkit.trajectory` says why the sampled ids are kept verbatim and what a delta is; this module makes them.
Each delta is located in the encoder's own encoding of the conversation (forgery-proof), after the reply's
end-of-turn marker, rendered from a window of the conversation where the probe episodes prove that exact.
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from turnkit.encode.attribution import Spans
from turnkit.encode.controls import find_turns
from turnkit.encode.options import EncodeOptions
from turnkit.encode.tokenize import encode_text
from turnkit.errors import EncodeError, HistoryRewriteError, TrajectoryError, TurnkitError
from turnkit.messages import Conversation, normalize_conversation
from turnkit.parse.reply import CallStatus
from turnkit.trajectory.history import (
    HISTORY_POLICIES,
    History,
    episode_steps,
    probe_conversations,
    rewrite,
    rewrites_history,
)
from turnkit.trajectory.rows import Row, RowBuilder

if TYPE_CHECKING:
    from turnkit.encode.job import Job
    from turnkit.format import ChatFormat
    from turnkit.parse.reply import Reply

#: What the probe episodes found, per encoder (one format and tokenizer) and set-up: a run makes many trajectories.
_PROBED: weakref.WeakKeyDictionary[Any, dict[str, _Probed]] = weakref.WeakKeyDictionary()

__all__ = ["DeltaRender", "Trajectory"]

DeltaRender = Literal["window", "whole"]
Tools = Sequence[Mapping[str, Any] | Callable[..., Any]]


@dataclass(frozen=True)
class _Probed:
    """What the probe episodes found for one template and set-up: why it rewrites history (empty: it keeps it), and
    why a window's delta is not the whole render's (empty: it is)."""

    history: str
    window: str


@dataclass(frozen=True)
class _Step:
    """The conversation encoded with a generation prompt: its ids and its (data-broken) text."""

    ids: list[int]
    text: str
    job: Job
    spans: Spans


class Trajectory:
    """One episode, as the ids an engine is given and samples. Made by :meth:`turnkit.ChatFormat.trajectory`.

    Attributes:
        history: The policy for a template that rewrites history: ``"keep"``, ``"fork"`` or ``"refuse"``.
        rewrites_history: Known on creation: the template rewrites history for conversations of the probes' shapes
            (:func:`rewrites_history`), and ``history_reason`` says where; the policy applies when it happens.
        rewrites: The message indices where this episode found history rewritten, in order.
        finish_reasons: Each reply's finish reason as turnkit read it (``"stop"``, ``"tool_calls"``, ``"length"``).
        stop_token_ids: More ids that end a reply, beside the format's own (vLLM's ``stop_token_ids``, set once as
            an RL loop sets its sampling parameters): a reply ending at one is stopped, not cut by the budget, is read
            with them, and what follows it is what the template writes after the reply (its own close, untrained).
        delta_render: ``"window"``: each delta renders the reply and the messages after it, with the conversation's
            system messages and last user message (the probes found its deltas equal to the whole render's);
            ``"whole"``: each step renders the whole conversation, and ``window_reason`` says why.
    """

    def __init__(
        self,
        fmt: ChatFormat,
        messages: Conversation,
        *,
        tools: Tools | None = None,
        history: History = "keep",
        stop_token_ids: Iterable[int] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if history not in HISTORY_POLICIES:
            raise ValueError(f"history must be one of {', '.join(HISTORY_POLICIES)}, not {history!r}")
        self._fmt = fmt
        self.stop_token_ids: tuple[int, ...] = _checked_stop_ids(
            stop_token_ids, fmt.tokenizer.backend.get_vocab_size(with_added_tokens=True)
        )
        self.tools = tools
        self.history: History = history
        self._variables = dict(template_kwargs or {})
        self._options = EncodeOptions(
            tools=tools, add_generation_prompt=True, turns="none", attribution=False, template_kwargs=self._variables
        )
        self._chat = normalize_conversation(messages)
        probed = _PROBED.setdefault(fmt.encoder, {})
        key = repr((tools, sorted(self._variables.items())))
        if key not in probed:
            call_id = fmt.replies.call_ids.maker()  # the ids the template accepts
            reason = rewrites_history(
                self._render, encode=self._prompt_ids, tools=tools, eos=fmt.eos_token, call_id=call_id
            )
            window = (
                "the template rewrites history: each step checks the whole render" if reason else self._probe(call_id)
            )
            probed[key] = _Probed(reason, window)
        self.history_reason = probed[key].history
        self.rewrites_history = bool(self.history_reason)
        self.window_reason = probed[key].window
        self.delta_render: DeltaRender = "whole" if self.window_reason else "window"
        self.rewrites: list[int] = []
        self.finish_reasons: list[str] = []
        step = self._encode(self._chat)
        # the template's own serving prompt, as text and ids, while each step renders the whole conversation
        self._prompt: tuple[str, list[int]] | None = (step.text, step.ids)
        self._closed: list[Row] = []
        self._row = RowBuilder()
        self._row.add(step.ids, trained=False)
        self._reply: tuple[list[int], bool] | None = None  # the last reply's ids, and whether a stop id ended it

    # -- what the engine and the trainer take ---------------------------------------------------------------------

    @property
    def prompt_ids(self) -> list[int]:
        """What the engine must be given now: turn 1's prompt, then every sampled reply and delta (after a fork, the
        template's render of the whole conversation, with the generation prompt)."""
        if self._reply is not None:
            raise TrajectoryError(
                "the trajectory ends with a reply: add the tool results or the next user message (add_messages) "
                "before asking for the next prompt"
            )
        return list(self._row.ids)

    @property
    def rows(self) -> list[Row]:
        """What the trainer takes: one row, or one per fork (``history="fork"``), each ``input_ids``, ``labels`` and
        ``logprobs`` aligned one to one."""
        return [*self._closed, self._row.row()]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation as turnkit reads it: the messages given, and each reply as parsed from its ids."""
        return [dict(m) for m in self._chat]

    # -- the steps ------------------------------------------------------------------------------------------------

    def add_reply(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> Reply:
        """Append the engine's sampled ids verbatim (trained) and return the reply as turnkit reads it: content,
        reasoning, tool calls, and ``finish_reason`` (``"length"`` when no stop id ends it, the format's or the
        trajectory's :attr:`stop_token_ids`: cut by the budget)."""
        if self._reply is not None:
            raise TrajectoryError("add_reply follows a reply: add_messages must come between two replies")
        sampled = [int(i) for i in ids]
        if logprobs is not None and len(logprobs) != len(sampled):
            raise TrajectoryError(f"logprobs has {len(logprobs)} values for {len(sampled)} sampled ids")
        if not sampled:
            raise TrajectoryError("add_reply got no ids: an engine's reply holds at least its stop or one token")
        fmt = self._fmt
        stopped = sampled[-1] in fmt.stop_ids or sampled[-1] in self.stop_token_ids
        reply = fmt.parse(
            sampled,
            prompt=self._row.ids,
            tools=self.tools,
            length=not stopped,
            stop_token_ids=self.stop_token_ids or None,
        )
        self._row.add(sampled, trained=True, logprobs=logprobs)
        self.finish_reasons.append(reply.finish_reason or ("stop" if stopped else "length"))
        self._chat.append(_as_history(reply))
        self._reply = (sampled, stopped)
        return reply

    def add_messages(self, messages: Conversation) -> list[int]:
        """Append tool results and user turns as the ids the template writes between the last reply and the next
        generation prompt (not trained); returns those ids. Checks the template kept what the engine was given."""
        if self._reply is None:
            raise TrajectoryError("add_messages follows a reply: call add_reply with the engine's ids first")
        new = normalize_conversation(messages)
        if not new:
            raise TrajectoryError("add_messages got no message")
        for offset, message in enumerate(new):
            if message["role"] == "assistant":
                raise TrajectoryError(
                    f"message {len(self._chat) + offset} is an assistant message: replies come from the engine, "
                    "through add_reply"
                )
        index = len(self._chat) - 1  # the reply's message
        chat = [*self._chat, *new]
        sampled, stopped = self._reply
        if self.delta_render == "window" and _answers_only(self._chat[index], new):
            # the probes proved the template keeps history; the policy's check still runs, on the window
            context, at = _window(self._chat, index)
            step = self._encode([*context, *new])
            broken = None
            if self.history != "keep":
                found = rewrite(
                    self._render,
                    context[:at],
                    context[at],
                    new,
                    encode=self._prompt_ids,
                    following=(step.text, step.ids),
                    eos=self._fmt.eos_token,
                )
                broken = None if found is None else (found[0] + index - at, found[1])
            self._prompt = None  # the whole render was not made
        else:
            at, step = index, self._encode(chat)
            broken = rewrite(
                self._render,
                self._chat[:index],
                self._chat[index],
                new,
                encode=self._prompt_ids,
                before=self._prompt,
                following=(step.text, step.ids),
                eos=self._fmt.eos_token,
            )
            self._prompt = (step.text, step.ids)
        if broken is not None:
            self.rewrites.append(broken[0])
            if self.history == "refuse":
                raise HistoryRewriteError(broken[1], index=broken[0])
        if broken is not None and self.history == "fork":
            self._closed.append(self._row.row())
            self._row = RowBuilder()
            delta = step.ids if at == index else self._encode(chat).ids
        else:
            start = self._delta_start(step, at, sampled[-1] if stopped else None)
            if stopped and sampled[-1] not in self._fmt.stop_ids and step.ids[start : start + 1] == sampled[-1:]:
                start += 1  # a stop id of the trajectory's that the template writes next (the next role's marker)
            delta = step.ids[start:]
        self._row.add(delta, trained=False)
        self._chat = chat
        self._reply = None
        return list(delta)

    # -- how ------------------------------------------------------------------------------------------------------

    def _encode(self, chat: list[dict[str, Any]]) -> _Step:
        """The conversation and the generation prompt as the encoder makes them (forgery-proof), with what locates
        a turn in them."""
        encoder = self._fmt.encoder
        job = encoder.render(chat, self._options)
        ids, char_to_token = encode_text(
            encoder.binding, encoder.segment_cache, job.text, job.controls, broken=bool(job.prepared.broken)
        )
        encoding = encoder.finish(job, ids, char_to_token)  # the control-id invariant, checked
        return _Step(encoding.input_ids.tolist(), job.text, job, Spans(job.text, len(encoding), char_to_token))

    def _delta_start(self, step: _Step, index: int, stop: int | None) -> int:
        """The first token of the delta: after reply ``index``'s end-of-turn marker if the engine sampled its id, else
        at it (cut by the budget); a reply the next prompt holds no data of ends where it ends when it is last."""
        job = step.job
        encoder = self._fmt.encoder
        turns = find_turns(job.text, job.controls, encoder.stop_texts, job.rendered.data_spans)
        _, last = turns.data_extent(index)
        marker = None
        if last is not None:  # the first end-of-turn marker after the reply's data, before the next message's
            limit = turns.next_message_start(index)
            marker = next(((a, b) for a, b, _ in turns.ends if a >= last), None)
            if marker is not None and marker[1] > limit:
                marker = None
        if marker is None:  # a reply without data, or no marker: as the loss masks locate the turn
            try:
                _, end = encoder.masks.turn_region(index, job, turns)
            except EncodeError as exc:
                ending = encoder.masks.history.ending(job, index).rstrip() if last is None else ""
                first = step.spans.tokens(last, len(job.text))[0] if last is not None else 0
                if ending and job.text.startswith(ending):
                    end = len(ending)
                elif last is not None and first and step.spans.char_to_token(last - 1) != first:
                    return first  # data, no stop after it (gpt-oss' sampled <|return|>): the delta follows the data
                else:
                    raise TrajectoryError(f"cannot tell where reply {index} ends in the next prompt: {exc}") from None
            marker = next(((a, b) for a, b, _ in turns.ends if b == end), None)
            if marker is None:  # no end-of-turn marker: the turn ends where the template ends it when it is last
                return step.spans.tokens(end, len(job.text))[0] if end < len(job.text) else len(step.ids)
        first, after = step.spans.tokens(*marker)
        if stop is not None and after - first == 1 and step.ids[first] == stop:
            return after
        return first

    def _probe(self, call_id: Callable[[int], str]) -> str:
        """Why a window's delta is not the whole render's on the probe episodes (empty when every delta agrees): the
        ids from the reply's end-of-turn marker on, each way. An episode the template refuses whole is skipped; a
        window it refuses, or no episode it takes, is a reason."""
        compared = 0
        for chat in probe_conversations(call_id):
            for index, end in episode_steps(chat):
                try:
                    whole = self._encode(chat[:end])
                except TurnkitError:
                    break  # this episode's shape is refused by the template; the others still tell
                expected = whole.ids[self._delta_start(whole, index, None) :]
                context, at = _window(chat, index)
                try:
                    window = self._encode([*context, *chat[index + 1 : end]])
                    found = window.ids[self._delta_start(window, at, None) :]
                except TurnkitError as exc:
                    return f"the template refuses the window for message {index} of a probe episode: {exc}"
                if found != expected:
                    return (
                        f"message {index} of a probe episode: the window's delta ({len(found)} ids) is not the whole "
                        f"render's ({len(expected)} ids): the template writes what follows a reply from earlier turns"
                    )
                compared += 1
        return "" if compared else "the template takes none of the probe episodes"

    def _prompt_ids(self, chat: list[dict[str, Any]]) -> list[int]:
        return self._encode(chat).ids

    def _render(self, chat: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The text the encoder renders (data markers broken as in every step), for the history checks."""
        options = EncodeOptions(
            tools=self.tools,
            add_generation_prompt=add_generation_prompt,
            turns="none",
            attribution=False,
            template_kwargs=self._variables,
        )
        return self._fmt.encoder.render(chat, options).text


def _window(chat: list[dict[str, Any]], index: int) -> tuple[list[dict[str, Any]], int]:
    """The messages a delta after reply ``index`` is rendered from, and the reply's place among them: the leading
    system messages, the last user message before the reply (a template may require one to open the conversation),
    and the reply. Without a user message after the system messages, the whole conversation up to the reply."""
    head = 0
    while head < len(chat) and chat[head]["role"] in ("system", "developer"):
        head += 1
    user = next((i for i in range(index - 1, head - 1, -1) if chat[i]["role"] == "user"), None)
    if user is None:
        return chat[: index + 1], index
    context = [*chat[:head], chat[user], chat[index]]
    return context, len(context) - 1


def _answers_only(reply: dict[str, Any], new: list[dict[str, Any]]) -> bool:
    """Whether every tool result in ``new`` that names a call names one of ``reply``'s: a template may look a result's
    call up by its id (to write the function's name), and a call of an earlier reply is outside the window."""
    calls = {call.get("id") for call in reply.get("tool_calls") or ()}
    return all(m.get("tool_call_id") in calls for m in new if m["role"] == "tool" and m.get("tool_call_id"))


def _as_history(reply: Reply) -> dict[str, Any]:
    """The reply as a message of the conversation: each call's arguments as the JSON object the model wrote, which
    is how templates read a call (a JSON string would be written quoted); a call that does not parse keeps its text,
    as content; no content is ``""`` (a template that reads ``content`` fails on a missing one)."""
    message = reply.message()
    calls, unread = [], []
    for call, parsed in zip(message.pop("tool_calls", ()), reply.tool_calls, strict=True):
        if parsed.status != CallStatus.OK or not parsed.name:
            unread.append(parsed.raw)  # what the model wrote for it stays in the conversation, as text
            continue
        with contextlib.suppress(ValueError):
            arguments = parsed.parsed_arguments
            if isinstance(arguments, dict):
                call["function"]["arguments"] = arguments
        calls.append(call)
    message["content"] = "".join([message.get("content") or "", *unread])
    if calls:
        message["tool_calls"] = calls
    return message


def _checked_stop_ids(values: Iterable[int] | None, vocabulary: int) -> tuple[int, ...]:
    """``stop_token_ids`` as token ids, each once, in order; anything else is an error naming the field and the
    entry (a float, a string, a bool, a negative id or one past the tokenizer's ``vocabulary`` would never match a
    sampled id, so every reply would silently read as cut by the budget)."""
    if values is None:
        return ()
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise TrajectoryError(f"stop_token_ids must be a list of token ids (ints), not {values!r}")
    out: dict[int, None] = {}
    for position, value in enumerate(values):
        try:
            if isinstance(value, bool):
                raise TypeError
            token_id = operator.index(value)
        except TypeError:
            raise TrajectoryError(
                f"stop_token_ids[{position}] is {value!r}: stop_token_ids must be token ids (ints)"
            ) from None
        if not 0 <= token_id < vocabulary:
            raise TrajectoryError(
                f"stop_token_ids[{position}] is {token_id}: not a token id of this tokenizer (0 to {vocabulary - 1})"
            )
        out[token_id] = None
    return tuple(out)
