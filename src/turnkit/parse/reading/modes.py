"""Where the reading of one reply stands: one type per mode, each holding the data only that mode has.

The machine (:mod:`.machine`) holds one :data:`Mode`. The code that reads a mode's text decides what comes next and
returns it (the walk over a call returns :class:`InContent` when the call ends, the header machine the mode its body
is routed to); only the machine assigns it. A mode's data is its own: a call being read exists only while
:class:`InCall` does, a block's remaining end cores only while :class:`EndingBlock` does, so no field can be stale
in a mode that does not use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from turnkit.parse.reading.callstate import CallState
from turnkit.parse.reading.compiled import SymSyntax

__all__ = ["AfterCall", "BetweenCalls", "EndingBlock", "InCall", "InContent", "InHeader", "InReasoning", "Mode"]


@dataclass(slots=True)
class InContent:
    """Content: text is shown; a marker starts reasoning or a call, or is dropped."""


@dataclass(slots=True)
class InReasoning:
    """Reasoning. ``label``: a label still expected right after its start (Gemma's ``thought``), dropped when it
    comes; ``label_held``: text that may still turn out to be that label."""

    label: str = ""
    label_held: str = ""


@dataclass(slots=True)
class InCall:
    """A tool call being read, element by element (:class:`~.callstate.CallState`), and the block of calls it is in
    (``None`` for a call that stands alone)."""

    call: CallState
    block: SymSyntax | None = None


@dataclass(slots=True)
class BetweenCalls:
    """Between two calls of a block: a separator, the block's end, or the next call."""

    block: SymSyntax


@dataclass(slots=True)
class EndingBlock:
    """The block end's first core matched; ``cores``: its further cores, expected next (text there ends the block
    without them)."""

    cores: list[str]


@dataclass(slots=True)
class InHeader:
    """A headed message's header (Harmony): its text so far, routed when the header ends."""

    parts: list[str] = field(default_factory=list)


@dataclass(slots=True)
class AfterCall:
    """After a headed tool call's arguments, up to the end of its message (nothing there is read)."""


Mode = InContent | InReasoning | InCall | BetweenCalls | EndingBlock | InHeader | AfterCall
