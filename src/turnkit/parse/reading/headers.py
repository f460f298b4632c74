"""Headed messages (Harmony, Functionary v3.2): where a message's header sends its body.

A Harmony reply is a run of messages, each ``<|start|>assistant<|channel|>NAME to=RECIPIENT<|constrain|>json
<|message|>BODY<|end|>``: the header says what the body is. A channel or a recipient that the format's routes name
makes the body reasoning or content; a recipient that no route names (``functions.get_weather``) makes it a tool
call's JSON arguments; anything else is content. The machine keeps the header's text and asks here once it ends, as
openai-harmony's own parser routes by the header, and asks :func:`headless_text` when a message ends before its
header did (its lenient mode: the text is kept, never dropped).

The header text arrives with markers turned back into their text (``plain``), so these are pure functions of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from turnkit.parse.reading.compiled import ChannelSymbols

__all__ = ["Body", "headless_text", "route_body"]


@dataclass(frozen=True)
class Body:
    """Where a body goes: ``route`` (``content`` or ``reasoning`` or whatever mode a route names), or a call to
    ``tool`` (then ``route`` is ``call``); ``calls_allowed``: a routed message is text, calls come only in messages to
    a recipient no route names."""

    route: str
    tool: str | None = None
    calls_allowed: bool = False


def route_body(channels: ChannelSymbols, header: str, plain: Callable[[str], str]) -> Body:
    """Route the body by its header: a channel or recipient that a route names, a tool call, or content."""
    marker = plain(channels.channel)
    if marker:
        header = header.replace(marker, " " + marker + " ")
    constrain = plain(channels.constrain) if channels.constrain else ""
    if constrain:  # <|constrain|>json: the body's type, read and dropped
        header = header.replace(constrain, " " + constrain)
    words = header.split()
    words = [w for w in words if not (constrain and w.startswith(constrain))]
    if words and words[0] == "assistant":  # the role after a message's start
        words = words[1:]
    channel = None
    if marker and marker in words:
        at = len(words) - 1 - words[::-1].index(marker)  # the last channel named wins
        channel = words[at + 1] if at + 1 < len(words) else None
    if channels.recipient:
        recipient = next((w[len(channels.recipient) :] for w in words if w.startswith(channels.recipient)), None)
    else:
        recipient = words[0] if words else None
    if recipient == "assistant":  # addressed to the assistant itself: no recipient
        recipient = None
    prefix = channels.tool_prefix
    routed = channels.routes.get(recipient or "")
    if recipient is not None and prefix is not None and routed is None:
        return Body("call", recipient.removeprefix(prefix) if prefix else recipient)
    route = routed or channels.routes.get(channel or "") or "content"
    return Body(route, calls_allowed=recipient is not None and routed is None)


def headless_text(channels: ChannelSymbols, header: str, plain: Callable[[str], str]) -> tuple[str, str, str]:
    """A header with no end: what follows its channel name is the message's text (as openai-harmony's lenient
    parser reads it), routed by that channel, else content. Returns the route, the text, and the problem to report."""
    marker = plain(channels.channel)
    words = header.split()
    if words and words[0] == "assistant":
        header = header.split("assistant", 1)[1]
    route, text = "content", header.strip()
    if marker and marker in header:
        after = header.split(marker, 1)[1].strip()
        name, _, rest = after.partition(" ")
        route = channels.routes.get(name, "content")
        text = rest.strip()
    return route, text, f"a message header has no {plain(channels.header_end)!r}: {header.strip()!r}"
