"""Several syntaxes that start their calls the same way: which ones a call may still be.

Mistral writes ``[TOOL_CALLS]`` before a JSON list of calls in one version and before ``name[ARGS]{...}`` in another;
a format may hold both. A call starts with every syntax whose trigger it met as a candidate, and what follows narrows
them: the literal matched next, the literal that ends a hole, or the first character after the trigger. These are
pure functions of the call and the character or literal seen; the walk (:mod:`.walk`) applies what they decide.
"""

from __future__ import annotations

from turnkit.parse.reading.callstate import CallState
from turnkit.parse.reading.compiled import SymArgs, SymElem, SymLit, SymSyntax, first_cores

__all__ = ["Start", "after_trigger", "choose", "fits_next", "kept_after_hole", "kept_at_literal", "kinds_differ"]

#: A syntax, its elements (a block's opening first), and where its trigger leaves them (element, literal core).
Start = tuple[SymSyntax, tuple[SymElem, ...], int, int]


def after_trigger(syntax: SymSyntax) -> Start:
    """A syntax's elements, and where its trigger leaves them (element, literal core)."""
    opening = syntax.block_start if syntax.block_start is not None and syntax.block_start.cores else None
    seq = (opening, *syntax.call) if opening is not None else syntax.call
    first = seq[0]
    if isinstance(first, SymLit) and syntax.trigger_cores < len(first.cores):
        return syntax, seq, 0, syntax.trigger_cores
    return syntax, seq, 1, 0


def aligned(starts: list[Start], pos: int, core: int, seq: tuple[SymElem, ...]) -> list[SymSyntax]:
    """The syntaxes whose trigger leaves them where the first one's does, with the same elements read."""
    return [st[0] for st in starts if st[2:] == (pos, core) and st[1][:pos] == seq[:pos]]


def kinds_differ(call: CallState) -> bool:
    """The candidates write different kinds of element next (a literal, a hole, arguments of another encoding)."""
    kinds = set()
    for candidate in call.candidates:
        seq = call.seq_of(candidate)
        element = seq[call.pos] if call.pos < len(seq) else None
        kinds.add(type(element).__name__ + (element.spec.encoding if isinstance(element, SymArgs) else ""))
    return len(kinds) > 1


def _fits(element: SymElem | None, core: int, char: str, *, any_args: bool) -> bool:
    """``element`` (at literal core ``core``) can start with ``char``; arguments that open with no bracket take any
    character where ``any_args``, else any but a bracket."""
    if isinstance(element, SymLit):
        return bool(element.cores) and element.cores[core].startswith(char)
    if isinstance(element, SymArgs) and element.encoding.bracketed:
        return char in "{["
    if isinstance(element, SymArgs) and any_args:
        return True
    return char not in "{["


def fits_next(call: CallState, char: str) -> list[SymSyntax]:
    """The candidates whose next element can start with ``char``."""
    kept = []
    for candidate in call.candidates:
        seq = call.seq_of(candidate)
        element = seq[call.pos] if call.pos < len(seq) else None
        if _fits(element, 0, char, any_args=False):
            kept.append(candidate)
    return kept


def choose(call: CallState, char: str) -> SymSyntax:
    """Among syntaxes that share the trigger but continue differently (``call.alternatives``), keep those whose next
    element can start with ``char``, and move the call to where the first of them stands; that syntax is returned."""
    assert call.alternatives is not None
    fitting = []
    for start in call.alternatives:
        _syntax, seq, pos, core = start
        if _fits(seq[pos] if pos < len(seq) else None, core, char, any_args=True):
            fitting.append(start)
    syntax, seq, pos, core = (fitting or call.alternatives)[0]
    call.candidates = aligned(fitting, pos, core, seq) or [syntax]
    call.seq, call.pos, call.core = seq, pos, core
    call.alternatives = None
    call.peek = False
    return syntax


def kept_at_literal(call: CallState, needle: str) -> list[SymSyntax]:
    """The candidates whose literal here is ``needle``."""
    kept = []
    for candidate in call.candidates:
        seq = call.seq_of(candidate)
        element = seq[call.pos] if call.pos < len(seq) else None
        if isinstance(element, SymLit) and needle in element.cores:
            kept.append(candidate)
    return kept


def kept_after_hole(call: CallState, needle: str) -> list[SymSyntax]:
    """The candidates in which ``needle`` can come right after the hole the call is at."""
    return [c for c in call.candidates if needle in first_cores(call.seq_of(c), call.pos + 1, frozenset())]
