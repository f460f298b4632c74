"""Tool-call ids: the one place that decides what id a parsed call gets, per template, found by rendering.

A call the model wrote with its own id (an id hole, Kimi's ``functions.NAME:INDEX``, an ``"id"`` key in its JSON
object) keeps that id: the next turn's render writes it back, so the sampled ids and the template's render of the
history agree, and the tool result answers the id the model wrote. A call written without one gets an id made here,
and that id must be one the template accepts when the conversation comes back: Mistral's templates raise unless every
id is nine letters and digits (vLLM's Mistral tool parser makes such ids for that reason), so a ``call_...`` id breaks
the next turn of a trajectory, or of a client of ``turnkit serve`` that sends the call back.

So the shape is chosen once per template by rendering a call and its result: first with the default ``call_...`` id
(a template that accepts any id keeps today's ids), and where the template raises, with nine letters and digits. The
same render says whether the template writes a call's id after its name (Mistral Nemo's ``{"name": ..., "arguments":
..., "id": "..."}``): a reader of such a call object waits for the whole object before it announces the call, since
a stream sends the id with the name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnkit.errors import TurnkitError
from turnkit.parse.choice.markers import common_prefix
from turnkit.parse.reading.call_id_shapes import NUMBERED, SHAPES, Shape
from turnkit.template.chat_template import ChatTemplate

__all__ = ["CallIds", "accepted_call_ids"]

#: The probe's call: a name no template writes on its own, so where it is found in a render it is the call's.
_NAME = "probe_call_id_check"
_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
_TOOLS = [{"type": "function", "function": {"name": _NAME, "description": "A probe tool.", "parameters": _SCHEMA}}]


@dataclass(frozen=True)
class CallIds:
    """The ids a template's calls get: ``shape`` of the ids made for calls written without one, and
    ``after_name``: the template writes a call's id after its name (a reader waits for it)."""

    shape: Shape = "call"
    after_name: bool = False

    def maker(self) -> Callable[[int], str]:
        """A fresh id maker for one reply (call index -> id)."""
        return SHAPES[self.shape]()

    def numbered(self, start: int = 0) -> Callable[[int], str]:
        """Ids of this shape that follow from the call's index alone (``call_0``, or Mistral's ``call00000``), the
        ``start``-th id first: for a reading shown to a person (``turnkit parse``, a transcript), whose ids must be
        the same on every run and between a whole and a streamed parse, yet ones the template takes back."""
        number = NUMBERED[self.shape]
        return lambda index: number(start + index)


def accepted_call_ids(template: ChatTemplate) -> CallIds:
    """The call ids ``template`` accepts, found by rendering a call and its result with each shape in turn (the
    default first); a template that refuses both (it has no tool role) keeps the default."""
    shapes: tuple[Shape, ...] = ("call", "nine")
    for shape in shapes:
        call_id = SHAPES[shape]()(0)
        call = {"id": call_id, "type": "function", "function": {"name": _NAME, "arguments": {}}}
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "Probe question?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "name": _NAME, "content": "probe result"},
        ]
        try:
            template.render(messages, tools=_TOOLS)
            prompt = template.render(messages[:1], tools=_TOOLS, add_generation_prompt=True).text
            reply = template.render(messages[:2], tools=_TOOLS).text
        except TurnkitError:
            continue
        written = reply[len(common_prefix(prompt, reply)) :]  # the reply's render, not the tools' (which name it)
        named = written.find(_NAME)
        return CallIds(shape, after_name=named >= 0 and written.find(call_id, named + len(_NAME)) >= 0)
    return CallIds()
