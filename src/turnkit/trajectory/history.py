"""Whether a template rewrites history: the check one agent step runs (:func:`rewrite`), and the same check over
scripted probe episodes, known before the run (:func:`rewrites_history`, which a trajectory runs on creation and
``turnkit doctor`` reports as ``history-rewrite``).

Qwen3 drops the reasoning of earlier turns, and a generation prompt may pre-write ``<think>``: the render of the
conversation at turn N+1 then disagrees with what the engine was given at turn N, and a trajectory's policy
(:data:`HISTORY_POLICIES`) decides what happens. The checks compare renders as text, and as ids where an encoder is
given, since a generation prompt that ends inside a piece of text is tokenized otherwise once the reply follows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from turnkit.errors import TurnkitError
from turnkit.parse.reading.call_id_shapes import default_call_id
from turnkit.trajectory.diffs import excerpt, first_difference

__all__ = [
    "HISTORY_POLICIES",
    "Encode",
    "History",
    "Render",
    "episode_steps",
    "probe_conversations",
    "rewrite",
    "rewrites_history",
]

History = Literal["keep", "fork", "refuse"]
HISTORY_POLICIES: tuple[str, ...] = ("keep", "fork", "refuse")
#: ``(messages, add_generation_prompt) -> text``: the template's render, as the encoder makes it
Render = Callable[[list[dict[str, Any]], bool], str]
#: ``messages -> ids``: the serving prompt's ids
Encode = Callable[[list[dict[str, Any]]], list[int]]


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
        at = first_difference(prompt, text)
        return (_message_at(history, at, prompt), _why("the prompt given for it", at, prompt, text, index))
    if not generated.startswith(prompt):
        at = first_difference(prompt, generated)
        return (
            index,
            f"the generation prompt is not how the template writes the reply it starts: "
            f"{excerpt(prompt, at)!r} vs {excerpt(generated, at)!r}",
        )
    body = generated[len(prompt) :].rstrip()
    if eos and body.endswith(eos):
        body = body[: -len(eos)].rstrip()
    if not text.startswith(body, len(prompt)):
        at = first_difference(prompt + body, text)
        return (index, _why("the reply as generated", at, prompt + body, text, index))
    if encode is not None or (prompt_ids is not None and ids is not None):
        prompt_ids = prompt_ids if prompt_ids is not None else encode(history)  # type: ignore[misc]
        ids = ids if ids is not None else encode([*history, reply, *after])  # type: ignore[misc]
        if ids[: len(prompt_ids)] != prompt_ids:
            at = first_difference(prompt_ids, ids)
            return (
                index,
                f"the serving prompt of message {index} ends in text that the next prompt tokenizes otherwise "
                f"(token {at}: the prompt's last tokens merge with the reply's first), so the ids the engine was "
                "given are not the template's encoding once the reply follows",
            )
    return None


def _why(what: str, at: int, expected: str, found: str, index: int) -> str:
    return (
        f"the template rewrites history once later messages follow: {what} (message {index}) reads "
        f"{excerpt(expected, at)!r} at character {at}, the next prompt {excerpt(found, at)!r}"
    )


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


def probe_conversations(call_id: Callable[[int], str]) -> list[list[dict[str, Any]]]:
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


def episode_steps(chat: list[dict[str, Any]]) -> list[tuple[int, int]]:
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
    for chat in probe_conversations(call_id or default_call_id()):
        for index, end in episode_steps(chat):
            if index == 0:
                continue
            try:
                found = rewrite(render, chat[:index], chat[index], chat[index + 1 : end], encode=encode, eos=eos)
            except TurnkitError:
                break  # this episode's shape is refused by the template; the others still tell
            if found is not None:
                return f"message {found[0]} of a probe episode: {found[1]}"
    return ""
