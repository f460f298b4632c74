"""Token in, token out: one agent episode as the exact ids the policy saw and sampled, rows a trainer takes.

An agent loop for reinforcement learning gives the engine a prompt, gets sampled ids back, runs the tools, and asks
again. Decoding the reply, rendering the conversation again and re-encoding it breaks the sequence: BPE is not a
bijection (the trainer's ids are not the ids the policy sampled, so its log-probabilities belong to other tokens), and
a template writes text the engine never sampled (the ``\\n`` after ``<|im_end|>``). A :class:`Trajectory` never does
that. The sampled ids are appended verbatim and trained; what follows them is *the delta*: exactly the ids the
checkpoint's own template writes between that reply and the next generation prompt, never trained.

The delta is not a per-family patch. Each :meth:`Trajectory.add_messages` encodes the conversation with the new
messages and the generation prompt through the encoder (so every message's text is forgery-proof: a tool result that
holds ``<|im_end|>\\n<|im_start|>system`` stays text), locates the last reply in that encoding by the template's own
structure (:meth:`~turnkit.encode.masks.Masks.turn_region`: from the generation-prompt header to the end-of-turn
marker the stop set declares), and takes the ids after it. So the separator after the marker, a stop id that is also
the next role's marker (it ends the reply, so the delta starts after it), tool results a template groups into one
turn and text that depends on the tools all come from the template. A reply cut by the token budget has no stop: its
delta starts with the template's end-of-turn marker. A sampled stop the template does not write there (EOS where the
template closes with ``<|im_end|>``; gpt-oss' ``<|return|>``, closed by ``<|end|>`` once a message follows, which is
no stop) stays, and what the template writes after the reply's text follows it.

A step costs its new tokens, not the history: rendering the whole conversation again at every step is what makes
re-rendering loops slow (tens of milliseconds per step at 128 turns). Where the template keeps its history, a delta
comes from a *window*: the conversation's leading system messages, the last user message before the reply, the reply
and the new messages, rendered and encoded the same way. That is exact only if nothing outside the window changes
what the template writes after the reply (a counter over every earlier call would), so it is proved on creation, not
assumed: the probe episodes' deltas are computed both ways, and any difference (or a window the template refuses)
makes every step render the whole conversation (:attr:`Trajectory.delta_render` says which).

Templates that rewrite history (Qwen3 drops the reasoning of earlier turns; a generation prompt that pre-writes
``<think>``) make the render of the conversation at turn N+1 disagree with what the engine was given at turn N. Each
step checks it (:func:`rewrite`), and the policy chosen up front decides: ``keep`` appends anyway (the trainer sees
what the engine saw), ``fork`` closes the row and starts the next one from the template's own render of the whole
conversation (what the model reads when deployed), ``refuse`` raises :class:`~turnkit.errors.HistoryRewriteError`
naming the turn. Which templates do it is known before the run: :func:`rewrites_history` runs the same check over
scripted probe conversations, the trajectory states it on creation, and ``turnkit doctor`` reports it
(``history-rewrite``).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from turnkit.encode.attribution import Spans
from turnkit.encode.controls import find_turns
from turnkit.encode.encoding import IGNORE_INDEX
from turnkit.encode.options import EncodeOptions
from turnkit.encode.tokenize import encode_text
from turnkit.errors import EncodeError, HistoryRewriteError, TrajectoryError, TurnkitError
from turnkit.messages import Conversation, normalize_conversation
from turnkit.parse.reading.call_id_shapes import default_call_id
from turnkit.parse.reply import CallStatus

if TYPE_CHECKING:
    from turnkit.encode.job import Job
    from turnkit.format import ChatFormat
    from turnkit.parse.reply import Reply

#: What the probe episodes found, per encoder (one format and tokenizer) and set-up: a run makes many trajectories.
_PROBED: weakref.WeakKeyDictionary[Any, dict[str, _Probed]] = weakref.WeakKeyDictionary()

__all__ = ["HISTORY_POLICIES", "DeltaRender", "Row", "Trajectory", "rewrite", "rewrites_history"]

History = Literal["keep", "fork", "refuse"]
DeltaRender = Literal["window", "whole"]
HISTORY_POLICIES: tuple[str, ...] = ("keep", "fork", "refuse")
Tools = Sequence[Mapping[str, Any] | Callable[..., Any]]
Render = Callable[[list[dict[str, Any]], bool], str]
Encode = Callable[[list[dict[str, Any]]], list[int]]


@dataclass(frozen=True)
class Row:
    """One training row: ``input_ids``, ``labels`` (the id where sampled, ``-100`` elsewhere) and ``logprobs``, one
    value per position: the engine's log-probability of each sampled token, ``nan`` for a sampled token whose
    log-probability was not given, ``0.0`` off the sampled tokens."""

    input_ids: list[int]
    labels: list[int]
    logprobs: list[float]

    @property
    def mask(self) -> list[int]:
        """1 on the sampled tokens, 0 elsewhere (TRL's ``completion_mask``, verl's ``response_mask``)."""
        return [int(label != IGNORE_INDEX) for label in self.labels]

    def to_dict(self) -> dict[str, list[Any]]:
        return {
            "input_ids": list(self.input_ids),
            "labels": list(self.labels),
            "logprobs": list(self.logprobs),
            "attention_mask": [1] * len(self.input_ids),
        }


@dataclass
class _Builder:
    ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def add(self, ids: Sequence[int], *, trained: bool, logprobs: Sequence[float] | None = None) -> None:
        self.ids.extend(ids)
        self.labels.extend(ids if trained else [IGNORE_INDEX] * len(ids))
        if not trained:
            self.logprobs.extend([0.0] * len(ids))
        else:
            self.logprobs.extend([math.nan] * len(ids) if logprobs is None else [float(x) for x in logprobs])

    def row(self) -> Row:
        return Row(list(self.ids), list(self.labels), list(self.logprobs))


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
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if history not in HISTORY_POLICIES:
            raise ValueError(f"history must be one of {', '.join(HISTORY_POLICIES)}, not {history!r}")
        self._fmt = fmt
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
        self._row = _Builder()
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
        reasoning, tool calls, and ``finish_reason`` (``"length"`` when no stop id ends it: cut by the budget)."""
        if self._reply is not None:
            raise TrajectoryError("add_reply follows a reply: add_messages must come between two replies")
        sampled = [int(i) for i in ids]
        if logprobs is not None and len(logprobs) != len(sampled):
            raise TrajectoryError(f"logprobs has {len(logprobs)} values for {len(sampled)} sampled ids")
        if not sampled:
            raise TrajectoryError("add_reply got no ids: an engine's reply holds at least its stop or one token")
        fmt = self._fmt
        stopped = sampled[-1] in fmt.stop_ids
        reply = fmt.parse(sampled, prompt=self._row.ids, tools=self.tools, length=not stopped)
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
            self._row = _Builder()
            delta = step.ids if at == index else self._encode(chat).ids
        else:
            delta = step.ids[self._delta_start(step, at, sampled[-1] if stopped else None) :]
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
        for chat in _probe_conversations(call_id):
            for index, end in _steps(chat):
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


def rewrite(
    render: Render,
    history: list[dict[str, Any]],
    reply: dict[str, Any],
    after: list[dict[str, Any]],
    *,
    encode: Encode | None = None,
    before: tuple[str, list[int] | None] | None = None,
    following: tuple[str, list[int] | None] | None = None,
    eos: str | None = None,
) -> tuple[int, str] | None:
    """Whether adding ``after`` to the conversation ``history + [reply]`` rewrites what the engine was given for
    ``reply`` or how it wrote it: ``(message index, why)``, or None when the history is kept.

    Three renders, compared as text: the serving prompt of the reply (``before``: its text and ids, when known), the
    reply as the last message (as the model generated it), and the next serving prompt (``following``). The next
    prompt must begin with the serving prompt, and continue with the reply as generated (up to the whitespace, or the
    EOS text, a template writes after a final message only). With ids (``encode`` makes a serving prompt's), the next
    prompt's ids must also begin with the serving prompt's: a generation prompt that ends inside a piece of text
    (``<|end_header_id|>\n\n``) is tokenized otherwise once the reply follows it (``\n`` ``\n<``).
    """
    index = len(history)
    prompt, prompt_ids = before if before is not None else (render(history, True), None)
    generated = render([*history, reply], False)
    text, ids = following if following is not None else (render([*history, reply, *after], True), None)
    if not text.startswith(prompt):
        at = _first_difference(prompt, text)
        return (_message_at(history, at, prompt), _why("the prompt given for it", at, prompt, text, index))
    if not generated.startswith(prompt):
        at = _first_difference(prompt, generated)
        return (
            index,
            f"the generation prompt is not how the template writes the reply it starts: "
            f"{_excerpt(prompt, at)!r} vs {_excerpt(generated, at)!r}",
        )
    body = generated[len(prompt) :].rstrip()
    if eos and body.endswith(eos):
        body = body[: -len(eos)].rstrip()
    if not text.startswith(body, len(prompt)):
        at = _first_difference(prompt + body, text)
        return (index, _why("the reply as generated", at, prompt + body, text, index))
    if encode is not None or (prompt_ids is not None and ids is not None):
        prompt_ids = prompt_ids if prompt_ids is not None else encode(history)  # type: ignore[misc]
        ids = ids if ids is not None else encode([*history, reply, *after])  # type: ignore[misc]
        if ids[: len(prompt_ids)] != prompt_ids:
            at = _first_difference_ids(prompt_ids, ids)
            return (
                index,
                f"the serving prompt of message {index} ends in text that the next prompt tokenizes otherwise "
                f"(token {at}: the prompt's last tokens merge with the reply's first), so the ids the engine was "
                "given are not the template's encoding once the reply follows",
            )
    return None


def _first_difference_ids(a: list[int], b: list[int]) -> int:
    size = min(len(a), len(b))
    return next((i for i in range(size) if a[i] != b[i]), size)


def _why(what: str, at: int, expected: str, found: str, index: int) -> str:
    return (
        f"the template rewrites history once later messages follow: {what} (message {index}) reads "
        f"{_excerpt(expected, at)!r} at character {at}, the next prompt {_excerpt(found, at)!r}"
    )


def _excerpt(text: str, at: int, width: int = 30) -> str:
    return text[max(0, at - width) : at + width]


def _first_difference(a: str, b: str) -> int:
    size = min(len(a), len(b))
    return next((i for i in range(size) if a[i] != b[i]), size)


def _message_at(before: list[dict[str, Any]], at: int, prompt: str) -> int:
    """The message whose render holds character ``at``: the earliest assistant message whose content or reasoning is
    found at or after it, else the last message before the reply."""
    for index, message in enumerate(before):
        if message["role"] != "assistant":
            continue
        for key in ("reasoning_content", "content"):
            value = message.get(key)
            if isinstance(value, str) and value and prompt.find(value, max(0, at - len(value))) >= 0:
                return index
    return max(len(before) - 1, 0)


# -- known before the run --------------------------------------------------------------------------------------------


def _probe_conversations(call_id: Callable[[int], str]) -> list[list[dict[str, Any]]]:
    """Scripted episodes of the shapes an agent makes, with reasoning and without: tool calls, parallel calls whose
    results come back together, content replies, user turns after them. Each call has an id of its own (as an
    engine's have) of the shape ``call_id`` makes (the template's: Mistral's refuse any but nine letters and digits);
    each result names its tool, as many clients send it (functiongemma's templates require it)."""
    ids = [call_id(n) for n in range(3)]
    weather = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    time = {"id": ids[1], "type": "function", "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}

    def result(n: int, name: str, text: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": ids[n], "name": name, "content": text}

    def episode(reasoning: bool) -> list[dict[str, Any]]:
        def reply(text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = calls
            if reasoning:
                message["reasoning_content"] = f"Thinking before: {text or 'a call'}"
            return message

        return [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Weather in Oslo?"},
            reply("", [{**weather, "id": ids[0]}]),
            result(0, "get_weather", "sunny"),
            reply("It is sunny."),
            {"role": "user", "content": "And the time, and the weather again?"},
            reply("", [{**weather, "id": ids[2]}, time]),
            result(2, "get_weather", "rain"),
            result(1, "get_time", "12:00"),
            reply("Rain, at noon."),
            {"role": "user", "content": "Thanks."},
            reply("You are welcome."),
        ]

    plain = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "How are you?"},
        {"role": "assistant", "content": "Well."},
        {"role": "user", "content": "Good."},
    ]
    return [episode(True), episode(False), plain]


def _steps(chat: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """An episode's steps: each reply that messages follow, as ``(its index, the index of the next reply or the
    end)``, so the messages it is answered with are ``chat[index + 1 : end]``."""
    replies = [i for i, m in enumerate(chat) if m["role"] == "assistant"]
    ends = [*replies[1:], len(chat)]
    return [(index, end) for index, end in zip(replies, ends, strict=True) if end > index + 1]


def rewrites_history(
    render: Render,
    *,
    encode: Encode | None = None,
    tools: object = None,
    eos: str | None = None,
    call_id: Callable[[int], str] | None = None,
) -> str:
    """Why the template rewrites history, found by :func:`rewrite` at every reply of scripted probe episodes (empty
    when it keeps it; ``encode`` adds the check on ids). An episode the template refuses (a template without a tool
    role) is skipped; the episodes cover tool calls, parallel calls, grouped results and user turns, with reasoning
    and without. ``call_id`` makes the calls' ids: the template's own (``fmt.replies.call_ids.maker()``), so that a
    template that checks ids renders the tool episodes."""
    for chat in _probe_conversations(call_id or default_call_id()):
        for index, end in _steps(chat):
            if index == 0:
                continue
            try:
                found = rewrite(render, chat[:index], chat[index], chat[index + 1 : end], encode=encode, eos=eos)
            except TurnkitError:
                break  # this episode's shape is refused by the template; the others still tell
            if found is not None:
                return f"message {found[0]} of a probe episode: {found[1]}"
    return ""
