"""The needles a state looks for: which markers, literals and stops can end the text the machine is reading now.

The :class:`~.lexer.Lexer` finds the earliest needle of a set; this module says which set, per state of the
reading, so ``>`` ends a function name in ``<function=NAME>`` without ever ending content. :func:`state_key` is what
the set depends on, so the machine builds each set once per state (:func:`needles_for`) rather than once per piece.
Everything here reads the :class:`~.state.ReadingState` and changes nothing (but for a flag set and restored).
"""

from __future__ import annotations

from typing import Any

from turnkit.parse.encodings import Reading
from turnkit.parse.formats import Hole
from turnkit.parse.reading.callstate import CallState
from turnkit.parse.reading.compiled import SymArgs, SymLit, SymSyntax, first_cores, opening
from turnkit.parse.reading.modes import AfterCall, BetweenCalls, EndingBlock, InCall, InContent, InHeader, InReasoning
from turnkit.parse.reading.state import ReadingState

__all__ = ["CDATA", "needles_for", "resync_needles", "state_key"]

#: A value's CDATA section: its end is the only needle inside it.
CDATA = ("<![CDATA[", "]]>")
#: Characters the arguments' own syntax uses: an end literal starting with one does not cut a reader short.
_SYNTAX_CHARS = frozenset("]}),:;\"'0123456789")


def state_key(s: ReadingState) -> tuple[Any, ...]:
    """What the needle set depends on, so that it is built once per state rather than once per piece."""
    mode = s.mode
    if type(mode) is InContent:
        return (InContent, s.calls_allowed, not s.content.started and not s.calls)
    if type(mode) is InReasoning:
        return (InReasoning, s.calls_allowed)
    if type(mode) is InCall:
        call = mode.call
        candidates = call.candidates
        syntax = candidates[0]
        return (
            InCall,
            id(syntax),
            len(call.seq) - len(syntax.call),
            tuple(map(id, candidates)) if len(candidates) > 1 else None,
            call.pos,
            call.core,
            call.param_pos,
            call.param_core,
            call.cdata,
            call.closing,
            call.fresh,
            id(mode.block),
        )
    if type(mode) is BetweenCalls:
        return (BetweenCalls, id(mode.block))
    if type(mode) is EndingBlock:
        return (EndingBlock, mode.cores[0])
    return (type(mode),)


def needles_for(s: ReadingState) -> list[str]:
    """The needles of the state the reading is in: the stops always, and what can end this state's text."""
    found = list(s.stops)
    mode = s.mode
    compiled = s.compiled
    if type(mode) is InContent:
        found += compiled.content_markers
        if compiled.reasoning is not None:
            found.append(compiled.reasoning[0])
            found.append(compiled.reasoning[1])  # a stray end marker is dropped
        found += _triggers(s)
        if compiled.lead and not s.content.started and not s.calls:
            found.append(compiled.lead)
        if compiled.channels is not None:
            found += compiled.channels.boundaries
    elif type(mode) is InReasoning:
        found += compiled.content_markers  # stray markers are dropped here too
        if compiled.reasoning is not None:
            found.append(compiled.reasoning[1])
            found.append(compiled.reasoning[0])  # a repeated start (a model that writes the prompt's <think>)
        if s.calls_allowed:
            found += [syn.trigger for syn in compiled.syntaxes if not syn.spec.bare]
        if compiled.channels is not None:
            found += compiled.channels.boundaries
    elif type(mode) is InCall:
        found += _call_needles(s, mode)
    elif type(mode) is BetweenCalls:
        found += _between_needles(mode.block)
    elif type(mode) is EndingBlock:
        found.append(mode.cores[0])
    elif type(mode) is InHeader:
        channels = compiled.channels
        assert channels is not None
        found += [channels.header_end, *channels.boundaries]
    elif type(mode) is AfterCall:
        assert compiled.channels is not None
        found += compiled.channels.boundaries
    return found


def _triggers(s: ReadingState) -> list[str]:
    if not s.calls_allowed:
        return []
    at_start = not s.content.started and not s.calls  # in content no call is open
    return [syn.trigger for syn in s.compiled.syntaxes if at_start or not syn.spec.bare]


def _call_needles(s: ReadingState, mode: InCall) -> list[str]:
    call = mode.call
    if call.closing:
        return resync_needles(s, call)
    element = call.element
    block = mode.block
    if call.fresh and call.pos >= 1 and block is not None and block.block_end is not None:
        return [*_fresh_needles(s, mode), block.block_end.cores[0]]
    if call.param_pos is not None:
        assert isinstance(element, SymArgs)
        return list(_param_needles(call, element))
    if isinstance(element, SymLit):
        cores = {element.cores[call.core]}
        for candidate in call.candidates[1:]:
            other = call.seq_of(candidate)
            there = other[call.pos] if call.pos < len(other) else None
            if isinstance(there, SymLit) and there.cores:
                cores.add(there.cores[min(call.core, len(there.cores) - 1)])
        if call.closing_only:  # a call whose end marker the model left out: the next call ends it
            cores.update(syn.trigger for syn in s.compiled.syntaxes if not syn.spec.bare)
            first = opening(call.syntax.call)
            if isinstance(first, SymLit):
                cores.add(first.cores[0])
        return list(cores)
    if isinstance(element, Hole):
        found: set[str] = set()
        for candidate in call.candidates:
            seq = call.seq_of(candidate)
            found |= first_cores(seq, call.pos + 1, frozenset())
        return list(found)
    if isinstance(element, SymArgs) and element.encoding.reading is Reading.PARAMS:
        return list(first_cores(element.param, 0, frozenset()) | first_cores(call.seq, call.pos + 1, frozenset()))
    if isinstance(element, SymArgs) and element.encoding.reading is Reading.ELEMENTS:  # up to what follows them
        return list(first_cores(call.seq, call.pos + 1, frozenset()))
    if isinstance(element, SymArgs):  # a reader: the call's end marker cuts it short (outside a string)
        return [n for n in resync_needles(s, call) if n[0] not in _SYNTAX_CHARS]
    return []


def _fresh_needles(s: ReadingState, mode: InCall) -> list[str]:
    """The needles of the call's element as if more than its block's opening had been read."""
    mode.call.fresh = False
    try:
        return _call_needles(s, mode)
    finally:
        mode.call.fresh = True


def _param_needles(call: CallState, args: SymArgs) -> set[str]:
    assert call.param_pos is not None
    element = args.param[call.param_pos]
    if isinstance(element, SymLit):
        return {element.cores[call.param_core]}
    if call.cdata:  # only the section's end ends a CDATA section
        return {CDATA[1]}
    follow = first_cores(args.param, 0, frozenset()) | first_cores(call.seq, call.pos + 1, frozenset())
    own = set(first_cores(args.param, call.param_pos + 1, follow))
    if isinstance(element, Hole) and element.kind == "value":  # a value left unclosed ends where the next begins
        return own | follow | ({CDATA[0]} if args.spec.cdata else set())
    return own


def resync_needles(s: ReadingState, call: CallState) -> list[str]:
    """Where a call ends whatever its arguments hold: its end literal, its block's end, a message's end (and, for a
    broken call, another call's start)."""
    found = []
    if call.closing:  # a broken call also ends where another call starts
        found += [syn.trigger for syn in s.compiled.syntaxes if not syn.spec.bare]
    if s.compiled.channels is not None:
        found += s.compiled.channels.message_ends
    if call.syntax.end_core:
        found.append(call.syntax.end_core)
    if s.block is not None and s.block.block_end is not None:
        found.append(s.block.block_end.cores[-1])
    return found


def _between_needles(block: SymSyntax) -> list[str]:
    found = list(block.separator.cores)
    if block.block_end is not None:
        found.append(block.block_end.cores[0])
    first = opening(block.call)
    if isinstance(first, SymLit):
        found.append(first.cores[0])
    elif isinstance(first, SymArgs) and first.encoding.bracketed:
        found.append("{")
    return found
