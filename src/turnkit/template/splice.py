"""Renders reused by splicing: a conversation of a known shape costs a string join, not a template run.

A dataset repeats a handful of conversation *shapes* (the roles in order, the fields each message has, which strings
are empty, the tool schemas, the template's variables) with different text. When the template only outputs the text
of a message (it never compares, measures, cuts or looks it up), every conversation of one shape renders to the same
*skeleton*: the template's own text with holes that the message strings fill. :mod:`turnkit.template.tracing` decides
that for each shape, by rendering it once with a sentinel in place of every string and recording what the template
observed. Then each conversation of that shape is the skeleton filled with its strings, and the loss-mask spans and
data spans of the render are the skeleton's, shifted by the strings' lengths.

When the template does observe some strings (``content.split('</think>')``, ``arguments|tojson``, ``content|trim``),
those become part of the key: the skeleton is reused only for conversations whose observed strings are equal, and the
render is traced again otherwise (it may then observe more). A shape whose every string is observed, or whose
skeletons are not reused, is rendered directly from then on; so is anything unusual (a render that raises, text over
a million characters). Renders are checked against a direct render: the first two uses of every skeleton, then one
in 256; a difference (a turnkit bug) turns splicing off for the renderer with a warning, and the direct render is used.
"""

from __future__ import annotations

import contextlib
import warnings
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from turnkit.errors import SpliceMismatchWarning
from turnkit.template.render import Rendered, RenderLimits, render_prepared, run_compiled
from turnkit.template.taint import DataStr, tainted
from turnkit.template.tracing import (
    CLOSE,
    OPEN,
    SENTINEL,
    TRANSFORMS,
    UNTRACEABLE,
    Trace,
    compile_traced,
    observing,
    sentinel,
)

__all__ = ["MessageShapes", "SplicingRenderer"]

_SLOT = ("\x00slot",)  # where a shape has a string to fill (a tuple: never equal to a string or a scalar's key)
_DICT, _LIST, _TUPLE = ("\x00dict",), ("\x00list",), ("\x00tuple",)
_OWN = frozenset({"messages", "tools"})  # keyed apart: the messages by shape, the tools by identity
_MAX_SPLICED_CHARS = 1_000_000  # beyond this, render directly (the size limits then apply as in any render)
_MAX_SHAPES = 1024
_MAX_SKELETONS_PER_SHAPE = 32
_MAX_STORED_CHARS = 32_000_000  # all skeletons' text together; past it the cache starts again (memory stays bounded)
_CHECK_EVERY = 256


def _whole(value: DataStr) -> bool:
    """Whether a data string is tagged as one whole (as marking tags it): then it is a slot to fill."""
    spans = value._spans
    return len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == len(value)


def _shape(value: Any, slots: list[str] | None) -> Any:
    """A hashable key of ``value`` with every data string (a :class:`DataStr` tagged as a whole) replaced by a slot,
    appended to ``slots``; with ``slots=None``, every string is part of the key."""
    kind = type(value)
    if kind is DataStr:
        if slots is not None and _whole(value):
            slots.append(value)
            return _SLOT
        return str.__str__(value)
    if kind is str:
        return value
    if kind is dict:
        out: list[Any] = [_DICT]
        for k, v in value.items():
            out.append(k if type(k) is str else _shape(k, None))
            out.append(v if type(v) is str else _shape(v, slots))  # a plain str (a role) is part of the key
        return tuple(out)
    if kind is list or kind is tuple:
        return (_LIST if kind is list else _TUPLE, *[_shape(v, slots) for v in value])
    return (kind, value)


def _fill(value: Any, keep: frozenset[int], at: list[int]) -> Any:
    """``value`` with each slot (in the order :func:`_shape` finds them) replaced by its sentinel, unless kept."""
    kind = type(value)
    if kind is DataStr:
        if not _whole(value):
            return value
        index = at[0]
        at[0] += 1
        if index in keep:
            return value
        text = sentinel(index)
        return tainted(text, ((0, len(text), value._spans[0][2]),))
    if kind is dict:
        return {k: _fill(v, keep, at) for k, v in value.items()}
    if kind is list:
        return [_fill(v, keep, at) for v in value]
    if kind is tuple:
        return tuple(_fill(v, keep, at) for v in value)
    return value


def _evict_oldest(cache: dict[Any, Any]) -> None:
    """Drop the oldest entry (another thread may be doing the same: losing that race is harmless)."""
    with contextlib.suppress(StopIteration, RuntimeError):
        cache.pop(next(iter(cache)), None)


@dataclass(frozen=True, slots=True)
class Skeleton:
    """A render with holes: ``literals[0] + text[slots[0]] + literals[1] + ... + literals[-1]``. Span ends are
    ``(literal index, offset in it)``, so they move with the lengths of the strings filled in."""

    literals: tuple[str, ...]
    slots: tuple[int, ...]
    kinds: tuple[str, ...]  # the transform of each hole ("" for none; see tracing.TRANSFORMS)
    generation: tuple[tuple[int, int, int, int], ...]
    data: tuple[tuple[int, int, int, int, int], ...]
    #: The most sentinels, and other characters, one string built by the render held (see tracing.Trace).
    copies: int = 0
    literal: int = 0
    #: (slot, transform) pairs the render made: the transformed text must be non-empty, as a sentinel's is
    nonempty: tuple[tuple[int, str], ...] = ()
    #: (format, text) of the dates the render wrote (``strftime_now``): reused while the clock gives the same text
    clock: tuple[tuple[str, str], ...] = ()
    #: id of another skeleton -> (it, whether its renders are prefixes of this one's): see :meth:`begins_with`
    prefixes: dict[int, tuple[Skeleton, bool]] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def build(rendered: Rendered, trace: Trace) -> Skeleton | None:
        """The skeleton of a render of sentinels; None when a sentinel was not output whole."""
        parts = SENTINEL.split(rendered.text)  # literal, slot, transform, literal, slot, transform, ..., literal
        literals = parts[0::3]
        if any(OPEN in lit or CLOSE in lit for lit in literals):
            return None
        starts, ends, pos = [], [], 0
        for n, lit in enumerate(literals):
            starts.append(pos)
            pos += len(lit)
            ends.append(pos)
            if n < len(literals) - 1:
                pos += len(parts[3 * n + 1]) + len(parts[3 * n + 2]) + 2

        def where(offset: int) -> tuple[int, int]:
            index = bisect_right(starts, offset) - 1
            if offset > ends[index]:
                raise ValueError  # inside a sentinel: the render split it without observing it
            return index, offset - starts[index]

        try:
            generation = tuple((*where(a), *where(b)) for a, b in rendered.generation_spans)
            data = tuple((*where(a), *where(b), source) for a, b, source in rendered.data_spans)
        except ValueError:
            return None
        slots = tuple(int(n) for n in parts[1::3])
        nonempty = tuple(sorted(trace.transformed))
        clock = tuple(sorted(trace.clock))
        kinds = tuple(parts[2::3])
        return Skeleton(tuple(literals), slots, kinds, generation, data, trace.copies, trace.literal, nonempty, clock)

    def begins_with(self, part: Skeleton) -> bool:
        """Whether every render filled from ``part`` is a prefix of this skeleton's render of the same strings: the
        same literals and holes up to ``part``'s last literal, which begins the literal at that place here. Decided
        once per pair (the answer is kept here, with ``part``, so that its id stays its own)."""
        known = self.prefixes.get(id(part))
        if known is not None and known[0] is part:
            return known[1]
        holes = len(part.slots)
        answer = (
            holes <= len(self.slots)
            and part.slots == self.slots[:holes]
            and part.kinds == self.kinds[:holes]
            and part.literals[:holes] == self.literals[:holes]
            and self.literals[holes].startswith(part.literals[holes])
        )
        if len(self.prefixes) >= _MAX_SKELETONS_PER_SHAPE:
            self.prefixes.clear()
        self.prefixes[id(part)] = (part, answer)
        return answer

    def fits(self, slots: list[str], limits: RenderLimits) -> bool:
        """Whether these strings may be filled in (else a render goes direct): its dates are still current, no
        transformed hole is empty, and no string the render built could pass the size limit."""
        if self.clock and not self.current():
            return False
        for slot, kind in self.nonempty:
            if not TRANSFORMS[kind](slots[slot]):
                return False
        return self.literal + self.copies * max(map(len, slots), default=0) <= limits.max_output_chars

    def current(self) -> bool:
        """Whether the dates the render wrote (``strftime_now``) are still what the clock gives."""
        return all(datetime.now().strftime(fmt) == text for fmt, text in self.clock)

    def fill(self, slots: list[str]) -> Rendered | None:
        """The render of these texts; None where a transformed text is empty (the template may branch on that)."""
        for slot, kind in self.nonempty:
            if not TRANSFORMS[kind](slots[slot]):
                return None
        literals = self.literals
        kinds = self.kinds
        pieces = [literals[0]]
        starts = [0]
        pos = len(literals[0])
        for n, slot in enumerate(self.slots):
            text = slots[slot]
            if kinds[n]:
                text = TRANSFORMS[kinds[n]](text)
            pieces.append(text)
            pos += len(text)
            starts.append(pos)
            literal = literals[n + 1]
            pieces.append(literal)
            pos += len(literal)
        generation = tuple((starts[i] + o, starts[j] + p) for i, o, j, p in self.generation)
        data = tuple((starts[i] + o, starts[j] + p, source) for i, o, j, p, source in self.data)
        return Rendered("".join(pieces), generation, data, self)


class MessageShapes:
    """The shape key and the data strings of each message of one prepared conversation, computed once for the render
    of the conversation and those of its beginnings (the renders that locate and check trained turns).

    A render given these shapes must be of the same message objects, or of the first ones (``messages[:n]``).
    """

    __slots__ = ("keys", "slots")

    def __init__(self, messages: list[Any]) -> None:
        self.keys: list[Any] = []
        self.slots: list[list[str]] = []
        for message in messages:
            slots: list[str] = []
            if type(message) is dict:  # _shape of a message, its strings inlined (every render computes these)
                key: list[Any] = [_DICT]
                for name, value in message.items():
                    key.append(name if type(name) is str else _shape(name, None))
                    kind = type(value)
                    if kind is str:
                        key.append(value)
                    elif kind is DataStr and _whole(value):
                        slots.append(value)
                        key.append(_SLOT)
                    else:
                        key.append(_shape(value, slots))
                self.keys.append(tuple(key))
            else:
                self.keys.append(_shape(message, slots))
            self.slots.append(slots)

    def first(self, count: int) -> tuple[Any, list[str]]:
        """The shape key of the first ``count`` messages (a list), and their data strings in order."""
        if count == len(self.keys):
            return (_LIST, *self.keys), [s for part in self.slots for s in part]
        return (_LIST, *self.keys[:count]), [s for part in self.slots[:count] for s in part]


@dataclass
class _Shape:
    """What is known about one conversation shape."""

    tools: Any  # the tools object whose id is in the key (kept alive, and compared, so the id stays its own)
    observed: tuple[int, ...] = ()  # slots the template reads: their text is part of a skeleton's key
    direct: bool = False  # render directly from now on
    #: by the text of the observed slots: the skeleton and how often it was filled
    skeletons: dict[tuple[str, ...], list[Any]] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0


class SplicingRenderer:
    """``render_prepared`` with provenance, reusing skeletons across conversations of one shape (see the module)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._shapes: dict[Any, _Shape] = {}
        self._fills = 0
        self._stored_chars = 0

    def render(
        self,
        source: str,
        context: dict[str, Any],
        *,
        limits: RenderLimits,
        track_generation: bool,
        shapes: MessageShapes | None = None,
    ) -> Rendered:
        """The render of ``context`` (prepared data) through ``source``: spliced where that is proven equal.
        ``shapes``: those of the context's messages (or of a conversation they begin), when the caller has them."""
        spliced = self._spliced(source, context, limits, track_generation, shapes) if self.enabled else None
        if spliced is not None:
            return spliced
        return render_prepared(source, context, limits=limits, track_generation=track_generation)

    def proves_prefix(
        self, source: str, context: dict[str, Any], *, shapes: MessageShapes | None, of: Rendered, limits: RenderLimits
    ) -> bool:
        """Whether the render of ``context`` (without ``{% generation %}`` tracking) is shown, without running it, to be
        a prefix of ``of``: ``of`` was filled from a skeleton, this context's shape has a skeleton that a render
        would fill (:meth:`Skeleton.fits`), and that skeleton begins ``of``'s hole for hole. False means unknown.

        This is how a conversation cut short is checked against the whole once per pair of shapes, not rendered for
        every conversation (:mod:`turnkit.encode.history`)."""
        whole = of.skeleton
        if whole is None or not self.enabled:
            return False
        found = self._lookup(source, context, False, shapes)
        if found is None:
            return False
        shape, slots = found
        if shape.direct:
            return False
        entry = shape.skeletons.get(tuple([slots[i] for i in shape.observed]))
        if entry is None:
            return False
        part: Skeleton = entry[0]
        return part.fits(slots, limits) and whole.begins_with(part)

    def _lookup(
        self, source: str, context: dict[str, Any], track_generation: bool, shapes: MessageShapes | None
    ) -> tuple[_Shape, list[str]] | None:
        """The known shape of a context (None when there is none yet, or the data is unhashable) and its strings."""
        key, slots = self._key(source, context, track_generation, shapes)
        try:
            shape = self._shapes.get(key)
        except TypeError:  # an unhashable value in the data
            return None
        if shape is None or shape.tools is not context.get("tools"):
            return None
        return shape, slots

    @staticmethod
    def _key(
        source: str, context: dict[str, Any], track_generation: bool, shapes: MessageShapes | None
    ) -> tuple[Any, list[str]]:
        rest = tuple([(k, v if type(v) is str else _shape(v, None)) for k, v in context.items() if k not in _OWN])
        messages = context.get("messages")
        if shapes is not None and type(messages) is list:
            messages_key, slots = shapes.first(len(messages))
        else:
            slots = []
            messages_key = _shape(messages, slots)
        return (source, track_generation, id(context.get("tools")), rest, messages_key), slots

    def _spliced(
        self,
        source: str,
        context: dict[str, Any],
        limits: RenderLimits,
        track_generation: bool,
        shapes: MessageShapes | None,
    ) -> Rendered | None:
        tools = context.get("tools")
        key, slots = self._key(source, context, track_generation, shapes)
        try:
            shape = self._shapes.get(key)
        except TypeError:  # an unhashable value in the data
            return None
        if shape is None or shape.tools is not tools:
            if len(self._shapes) >= _MAX_SHAPES:
                _evict_oldest(self._shapes)
            # a template that writes the sentinels' characters itself cannot be told apart from its holes
            shape = self._shapes[key] = _Shape(tools, direct=OPEN in source or CLOSE in source)
        if shape.direct or sum(map(len, slots)) > _MAX_SPLICED_CHARS:
            return None
        while True:
            texts = tuple(slots[i] for i in shape.observed)
            entry = shape.skeletons.get(texts)
            if entry is not None and entry[0].clock and not entry[0].current():
                shape.skeletons.pop(texts, None)  # the date changed since it was traced: trace again
                entry = None
            if entry is not None:
                shape.hits += 1
                return self._filled(entry, slots, source, context, limits, track_generation)
            shape.misses += 1
            if shape.misses > 32 and shape.hits < shape.misses:
                shape.direct = True  # its skeletons are not reused: tracing would only cost
                return None
            traced = self._trace(source, context, frozenset(shape.observed), limits, track_generation)
            if traced is None or UNTRACEABLE in traced[0].seen:
                shape.direct = True
                return None
            trace, rendered = traced
            seen = trace.seen
            if seen:  # the template reads these strings: key the skeletons by their text, and trace again
                shape.observed = tuple(sorted(set(shape.observed) | seen))
                shape.skeletons.clear()
                if len(shape.observed) >= len(slots):
                    shape.direct = True
                    return None
                continue
            skeleton = Skeleton.build(rendered, trace)
            if skeleton is None:
                shape.direct = True
                return None
            if len(shape.skeletons) >= _MAX_SKELETONS_PER_SHAPE:
                _evict_oldest(shape.skeletons)
            self._stored_chars += sum(map(len, skeleton.literals))
            if self._stored_chars > _MAX_STORED_CHARS:
                self._shapes.clear()  # what is still in use is traced again
                self._stored_chars = 0
            entry = shape.skeletons[texts] = [skeleton, 0]
            return self._filled(entry, slots, source, context, limits, track_generation)

    @staticmethod
    def _trace(
        source: str, context: dict[str, Any], keep: frozenset[int], limits: RenderLimits, track_generation: bool
    ) -> tuple[Trace, Rendered] | None:
        """Render the shape with sentinels for the strings not in ``keep``; what it observed, and the render."""
        traced = dict(context)
        traced["messages"] = _fill(context.get("messages"), keep, [0])
        try:
            template = compile_traced(source)
            with observing() as trace:
                rendered = run_compiled(template, traced, limits, track_generation)
        except Exception:  # noqa: BLE001 - any failure: the direct render gives the real result or the real error
            return None
        return trace, rendered

    def _filled(
        self,
        entry: list[Any],
        slots: list[str],
        source: str,
        context: dict[str, Any],
        limits: RenderLimits,
        track_generation: bool,
    ) -> Rendered | None:
        skeleton = entry[0]
        longest = max(map(len, slots), default=0)
        if skeleton.literal + skeleton.copies * longest > limits.max_output_chars:
            return None  # some string of the real render might pass the size limit: the direct render tells
        out = skeleton.fill(slots)
        if out is None or len(out.text) > limits.max_output_chars:
            return None  # the direct render reports the limit as any render does
        entry[1] += 1
        self._fills += 1
        if entry[1] <= 2 or self._fills % _CHECK_EVERY == 0:
            direct = render_prepared(source, context, limits=limits, track_generation=track_generation)
            if direct != out:
                self.enabled = False
                warnings.warn(
                    "turnkit: a spliced render differed from the template's own render; splicing is now off for "
                    "this format (please report this as a bug, with the template)",
                    SpliceMismatchWarning,
                    stacklevel=4,
                )
                return direct
        return out
