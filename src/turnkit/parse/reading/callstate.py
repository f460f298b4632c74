"""One tool call being read: the record the machine's collaborators share while a call is open.

The walk (:mod:`.walk`) moves ``pos``/``core`` over the call's elements; the argument readers (:mod:`.arguments`,
:mod:`.params`) keep their own progress in it (``reader``, ``param_pos``, the value being read); the output side
(:mod:`.state`) fills ``sent``/``pending`` and announces it once its name is known and it is confirmed a call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from turnkit.parse.reading.compiled import SymElem, SymLit, SymSyntax
from turnkit.parse.reply import CallStatus

if TYPE_CHECKING:
    from turnkit.parse.encodings import ArgumentScan
    from turnkit.parse.reading.modes import InCall, Mode

__all__ = ["CallState", "CallSteps"]


class CallState:
    """A tool call being read: where the walk over its elements stands, what it has read and sent so far, and the
    syntaxes it may still be (several share a trigger until what follows decides)."""

    def __init__(self, index: int, call_id: str, candidates: list[SymSyntax], seq: tuple[SymElem, ...]) -> None:
        self.index = index
        self.id = call_id
        self.candidates = candidates
        self.seq = seq
        self.pos = 0
        self.core = 0
        self.name: str | None = None
        self.written_id: str | None = None
        self.announced = False
        self.confirmed = not candidates[0].spec.bare
        self.sent: list[str] = []
        self.pending: list[str] = []
        self.raw: list[str] = []
        self.status: CallStatus | None = None
        self.error: str | None = None
        self.hole: list[str] = []
        self.reader: ArgumentScan | None = None
        # tagged arguments
        self.param_pos: int | None = None
        self.param_core = 0
        self.key: str | None = None
        self.raw_string: bool | None = None  # from a type attribute
        self.value_streams = False
        self.value_parts: list[str] = []
        self.opening = ""  # '{"key": ' or ', "key": ', sent with a value that is not streamed
        self.value_started = False
        self.cdata = False  # inside a value's <![CDATA[ section
        self.params = 0
        self.closing = False  # a broken call skipping to its end
        self.peek = False  # several syntaxes still possible: the next character decides
        self.fresh = False  # only a block's opening read so far: its end here means an empty block
        #: Syntaxes that share the trigger but continue differently: (syntax, elements, element, core) each.
        self.alternatives: list[tuple[SymSyntax, tuple[SymElem, ...], int, int]] | None = None

    @property
    def syntax(self) -> SymSyntax:
        return self.candidates[0]

    @property
    def element(self) -> SymElem | None:
        return self.seq[self.pos] if self.pos < len(self.seq) else None

    @property
    def closing_only(self) -> bool:
        """Only the call's end literals are left to read (its name and arguments are complete)."""
        return self.pos > 0 and all(isinstance(e, SymLit) for e in self.seq[self.pos :])

    def seq_of(self, candidate: SymSyntax) -> tuple[SymElem, ...]:
        """The elements the call would walk were it ``candidate`` (a block's opening, already read, kept first)."""
        prefix = len(self.seq) - len(self.candidates[0].call)
        return self.seq[:prefix] + candidate.call


class CallSteps(Protocol):
    """What an argument reader tells the walk over the call (:class:`~.walk.CallWalk` is the one implementation);
    each returns the mode the reading is in after it."""

    def enter(self, mode: InCall) -> Mode:
        """The element is done and the call has moved on: set up the one it is now at."""

    def fall_back(self, mode: InCall, rest: str) -> Mode:
        """A bare call that is not one: its text is content (``rest`` is read again)."""

    def broken(self, mode: InCall, error: str, status: CallStatus) -> Mode:
        """The call is broken: it fails with ``error`` and is skipped to its end."""

    def mismatch(self, mode: InCall, error: str, rest: str) -> Mode:
        """Text the syntax does not allow here: content for a bare call, else the call is broken."""
