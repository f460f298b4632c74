"""``turnkit generate`` and ``turnkit chat``: the server's engine, prompts, stops and sampling, on a terminal.

A :class:`Conversation` holds the messages and answers each user turn by streaming the reply to a text stream. It
goes through exactly what the server does: the sampling flags are read by the server's request checks (so a flag
means what the request field means, with the same limits), the model's sampling defaults apply to flags left out,
and the reply is generated and parsed by the same :class:`~.session.Session` (stop ids, stop strings, reasoning, in
the reply format chosen from the model's template). Reasoning streams marked ``(thinking)`` before the answer and is
not kept in the history.

``chat`` keeps the history, ``/reset`` clears it (the system prompt stays), ``/exit`` or end of input leaves, and
Ctrl-C while a reply is printing stops that reply (what was printed stays in the history) but not the program.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from turnkit.serve.chat import parse_chat
from turnkit.serve.models import LoadedModel
from turnkit.serve.protocol import APIError
from turnkit.serve.session import start_chat

__all__ = ["Conversation", "describe", "run_chat", "run_generate"]

HELP = "/reset clears the history, /exit leaves (or Ctrl-D); Ctrl-C stops a reply"


@dataclass
class Conversation:
    """Messages with one model; :meth:`reply` adds a user turn and streams the assistant's answer."""

    model: LoadedModel
    sampling: dict[str, Any] = field(default_factory=dict)  # request fields: temperature, seed, max_tokens ...
    system: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    default_max_tokens: int = 512

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> int:
        """Forget the conversation but the system prompt; returns how many messages were forgotten."""
        forgotten = len(self.messages) - (1 if self.system else 0)
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        return max(forgotten, 0)

    def cut_note(self) -> str:
        """What is said of a reply that the token budget cut."""
        budget = self.sampling.get("max_tokens") or self.default_max_tokens
        return f"cut: the reply reached --max-tokens {budget} before it ended"

    async def reply(self, text: str, out: TextIO) -> tuple[str, str | None]:
        """Add ``text`` as the user's turn, stream the reply's content to ``out``; returns (content, finish reason).

        Cancelling the task that awaits this stops the generation; the part already printed is kept in the history.
        """
        self.messages.append({"role": "user", "content": text})
        request = parse_chat({"model": self.model.name, "messages": self.messages, **self.sampling})
        (session,) = await start_chat(self.model.fmt, self.model, request, default_max_tokens=self.default_max_tokens)
        content: list[str] = []
        thinking = False
        try:
            async with contextlib.aclosing(session.steps()) as steps:  # closing it cancels the generation
                async for step in steps:
                    for delta in step.deltas:
                        if delta.reasoning_content:  # shown as it streams, marked, and kept out of the history
                            out.write(delta.reasoning_content if thinking else "(thinking) " + delta.reasoning_content)
                            thinking = True
                        if delta.content:
                            if thinking:
                                out.write("\n\n")
                                thinking = False
                            content.append(delta.content)
                            out.write(delta.content)
                        out.flush()
        finally:
            self.messages.append({"role": "assistant", "content": "".join(content)})
        return "".join(content), session.reply.finish_reason if session.reply else None


def run_generate(conversation: Conversation, prompt: str, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """One reply to ``prompt``, streamed to ``out`` and ended with a newline; a reply cut by the token budget is said
    to be so on ``err`` (``out`` holds the reply alone, for a pipe)."""
    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(conversation.reply(prompt, out))
        with _interrupt_cancels(loop, task):
            loop.run_until_complete(_quietly(task))
    finally:
        loop.close()
    out.write("\n")
    out.flush()
    if task.cancelled():
        return 130
    if task.result()[1] == "length":
        err.write(f"turnkit: {conversation.cut_note()}\n")
    return 0


def run_chat(
    conversation: Conversation,
    read: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
) -> int:
    """The interactive loop: prompt ``> ``, reply, repeat until ``/exit`` or end of input."""
    out.write(f"turnkit chat with {conversation.model.name} ({HELP})\n")
    out.flush()
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                line = read("> ")
            except EOFError:
                out.write("\n")
                return 0
            except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
                out.write("\n")
                continue
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                return 0
            if text == "/reset":
                out.write(f"(history cleared: {conversation.reset()} messages)\n")
                continue
            if text in ("/help", "/?"):
                out.write(HELP + "\n")
                continue
            task = loop.create_task(conversation.reply(text, out))
            with _interrupt_cancels(loop, task):
                loop.run_until_complete(_quietly(task))
            if task.cancelled():
                out.write(" [stopped]\n")
            else:
                out.write(f" [{conversation.cut_note()}]\n" if task.result()[1] == "length" else "\n")
            out.flush()
    finally:
        loop.close()


async def _quietly(task: asyncio.Task[Any]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.contextmanager
def _interrupt_cancels(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> Any:
    """While a reply runs, Ctrl-C (SIGINT) cancels it instead of raising KeyboardInterrupt."""
    try:
        loop.add_signal_handler(signal.SIGINT, task.cancel)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def describe(error: APIError) -> str:
    """A request-check error as a command-line message (``--temperature`` rather than ``temperature``)."""
    flag = f"--{error.param.replace('_', '-')}" if error.param else ""
    return f"{flag}: {error.message}" if flag else error.message
