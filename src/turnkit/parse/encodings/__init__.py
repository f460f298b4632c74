"""Argument encodings: one row per way a call's arguments are written, everything that differs by it, and the code
that reads each.

A :class:`~turnkit.parse.formats.Arguments` names its encoding; the row here (:func:`encoding_of`) says what the rest
of the parser needs to know about it, so no module outside this table asks which encoding it has:

* how it is read (:class:`Reading`): one self-delimited value (a scanner from :mod:`.jsonscan` and the row's
  ``progress`` and ``done``, in the encoding's own module), one element per parameter (``tagged``, read by
  :mod:`turnkit.parse.reading.params`), or elements read whole up to what follows them (MiniMax M3,
  :func:`~turnkit.parse.encodings.values.element_arguments`);
* what its text can start with (the needles of what precedes it, the trigger of a bare call, a bracket);
* whether the object also holds the call's name (a server can then write the name for the model);
* whether a template may write it as Python literals (the variant row ``literal``, :mod:`.literal`).

The package also holds what the encodings' readers share: :mod:`.jsonscan` (self-delimited values read once, character
by character), :mod:`.values` (raw values typed by the tool's schema), :mod:`.literals` (Python and Gemma literals) and
:mod:`.calls` (the arguments-text rule). It is below :mod:`turnkit.parse.formats`, which asks the rows, and below
:mod:`turnkit.parse.reading`, which runs them; it names their types for annotations only.

Derivation from renders (:mod:`turnkit.parse.choice.toolsyntax`) asks the same rows (``holds_name``: no name hole
before the arguments).

A new encoding is its module (reader, progress, done) and one row in :data:`ENCODINGS`, with its name added to
``Encoding`` in :mod:`turnkit.parse.formats.reply_format`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum, auto
from functools import partial
from typing import TYPE_CHECKING

from turnkit.parse.encodings import gemma, json_call, json_object, literal, python
from turnkit.parse.encodings.jsonscan import BracketReader, ObjectReader, ValueReader

if TYPE_CHECKING:
    from turnkit.parse.formats import Arguments
    from turnkit.parse.reading.callstate import CallState
    from turnkit.parse.reading.state import ReadingState

__all__ = ["ARGUMENTS_INCOMPLETE", "ENCODINGS", "ArgumentEncoding", "ArgumentScan", "Reading", "encoding_of"]

#: The failure of a call whose end came before its arguments were complete.
ARGUMENTS_INCOMPLETE = "the arguments are not complete where the call ends"

#: What a bracketed encoding's text may start with.
_BRACKETS = frozenset({"{", "["})

#: What reads a self-delimited value as it is written.
ArgumentScan = ValueReader | ObjectReader | BracketReader


class Reading(Enum):
    """How the arguments element is read."""

    #: One self-delimited value: a scanner says how much text is the value's own (a marker inside a string is text).
    VALUE = auto()
    #: One element per parameter (``<parameter=KEY>VALUE</parameter>``), walked like the call's own elements.
    PARAMS = auto()
    #: Elements read as text up to what follows the arguments, then read whole (MiniMax M3's ``<key>value</key>``).
    ELEMENTS = auto()


@dataclass(frozen=True)
class ArgumentEncoding:
    """One encoding's row.

    Attributes:
        name: The encoding's name in :class:`~turnkit.parse.formats.Arguments`.
        reading: How its element is read.
        scanner: ``VALUE``: a new scanner for one call's arguments.
        progress: ``VALUE``: what is sent while the value is read (``None``: nothing, it is sent whole when done);
            called with the text the scanner took, markers already plain.
        done: ``VALUE``: the value is complete: check it and send what is left. False where the text was no call
            after all (a bare call whose text does not read): it falls back to content.
        at_end: ``VALUE``: the reply ended inside the value: what the call keeps of it (a name already read).
        holds_name: The object holds the call's name too (``{"name": ..., "arguments": {...}}``).
        bracketed: Its text opens with ``{`` or ``[`` (a hole before it ends there; a block's next call starts there).
        bare_opening: The trigger of a bare call (no marker before it) whose first element these arguments are.
        literal: The row that reads it written as Python literals where JSON would be (``None``: it cannot be).
        takes_cdata: Its values may be written in ``<![CDATA[...]]>`` sections.
        quoted: Strings are written between the arguments' own ``quote`` (Gemma 4's ``<|"|>``).
        incomplete: The failure of a call whose end came before these arguments were complete.
    """

    name: str
    reading: Reading
    scanner: Callable[[Arguments], ArgumentScan] | None = None
    progress: Callable[[ReadingState, CallState, Arguments, ArgumentScan, str], None] | None = None
    done: Callable[[ReadingState, CallState, Arguments, ArgumentScan], bool] | None = None
    at_end: Callable[[CallState, Arguments, ArgumentScan], None] | None = None
    holds_name: bool = False
    bracketed: bool = False
    bare_opening: str = "{"
    literal: ArgumentEncoding | None = None
    takes_cdata: bool = False
    quoted: bool = False
    incomplete: str = ARGUMENTS_INCOMPLETE

    @property
    def opening_cores(self) -> frozenset[str]:
        """What its text may start with: the needles of the element before it, where that is a hole."""
        return _BRACKETS if self.bracketed else frozenset()

    @property
    def self_delimited(self) -> bool:
        """The arguments' own syntax says where they end (a JSON object, Python's parentheses)."""
        return self.reading is Reading.VALUE


def _with_literal(row: ArgumentEncoding) -> ArgumentEncoding:
    """``row``, with the variant that reads its value written as a Python literal (:mod:`.literal`)."""
    done = partial(literal.done, holds_name=row.holds_name)
    variant = replace(row, scanner=literal.scanner, progress=None, done=done, at_end=None)
    return replace(row, literal=variant)


ENCODINGS: dict[str, ArgumentEncoding] = {
    row.name: row
    for row in (
        _with_literal(
            ArgumentEncoding(
                "json",
                Reading.VALUE,
                scanner=json_object.scanner,
                progress=json_object.progress,
                done=json_object.done,
                bracketed=True,
            )
        ),
        _with_literal(
            ArgumentEncoding(
                "json_call",
                Reading.VALUE,
                holds_name=True,
                scanner=json_call.scanner,
                progress=json_call.progress,
                done=json_call.done,
                at_end=json_call.name_at_end,
                bracketed=True,
                incomplete=json_call.INCOMPLETE,
            )
        ),
        ArgumentEncoding("python", Reading.VALUE, scanner=python.scanner, done=python.done, bare_opening="["),
        ArgumentEncoding(
            "gemma",
            Reading.VALUE,
            scanner=gemma.scanner,
            done=gemma.done,
            bracketed=True,
            quoted=True,
        ),
        ArgumentEncoding("tagged", Reading.PARAMS, takes_cdata=True),
        ArgumentEncoding("xml", Reading.ELEMENTS),
    )
}


def encoding_of(spec: Arguments) -> ArgumentEncoding:
    """The row that reads ``spec`` (its Python-literal variant where the template writes those)."""
    row = ENCODINGS[spec.encoding]
    return row.literal if spec.python_literals and row.literal is not None else row
