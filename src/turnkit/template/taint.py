"""Provenance for rendered text: which characters came from data, and from which message.

A data string (message content, a tool-call argument, a tool result...) enters the template as a :class:`DataStr`: a
``str`` that behaves exactly like the plain string (equality, hashing, ``startswith``, ``tojson``, length), so the
template renders the very same text, but that also carries *spans*: ``(start, end, source)`` triples saying which of
its characters came from which source (a message index, or one of the ``SOURCE_*`` constants).

The sandbox keeps spans alive through what templates do with data: output (``{{ x }}``), concatenation (``+``, ``~``,
joined macro and block output), slicing, the ``str`` methods that cut or re-case, and filters. Where an operation
builds new text whose layout cannot be traced (``replace``, ``format``, ``tojson`` of a dict), the whole result is
attributed to the first data source it used. Provenance feeds attribution and loss masks; forgery safety does not
rely on it (see :mod:`turnkit.encode.marking`), so a span lost in an exotic template costs accuracy, never safety.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "SOURCE_DOCUMENTS",
    "SOURCE_TOOLS",
    "SOURCE_VARIABLES",
    "DataStr",
    "Span",
    "join",
    "slice_data",
    "spans_of",
    "tagged",
    "tainted",
]

Span = tuple[int, int, int]  # (start, end, source)

SOURCE_TOOLS = -2
SOURCE_DOCUMENTS = -3
SOURCE_VARIABLES = -4


class DataStr(str):
    """A string from data, with the spans of its sources. Templates cannot see the spans (``_spans`` is private)."""

    _spans: tuple[Span, ...]


def tainted(text: str, spans: Sequence[Span]) -> str:
    """``text`` carrying ``spans``; a plain ``str`` when there are none."""
    if not spans:
        return str.__str__(text) if type(text) is not str else text
    out = DataStr(text)
    out._spans = tuple(spans)
    return out


def tagged(value: Any, source: int) -> Any:
    """``value`` (plain JSON data) with every non-empty string in it, dict keys included, a :class:`DataStr` of
    ``source``: data that a render with provenance then tells apart from the template's own text."""
    kind = type(value)
    if kind is str:
        return tainted(value, ((0, len(value), source),)) if value else value
    if kind is dict:
        return {tagged(k, source): tagged(v, source) for k, v in value.items()}
    if kind is list or kind is tuple:
        return kind(tagged(v, source) for v in value)
    return value


def spans_of(value: Any) -> tuple[Span, ...]:
    return value._spans if type(value) is DataStr else ()


def slice_data(value: DataStr, start: int, end: int) -> str:
    """``value[start:end]`` with its spans clipped and shifted."""
    text = str.__getitem__(value, slice(start, end))
    out = [(max(a, start) - start, min(b, end) - start, src) for a, b, src in value._spans if a < end and b > start]
    return tainted(text, out)


def join(parts: Iterable[Any], separator: str = "") -> str:
    """``separator.join(str(p) for p in parts)``, keeping the spans of the parts (and of the separator)."""
    texts = [p if isinstance(p, str) else str(p) for p in parts]
    spans: list[Span] = []
    sep_spans = spans_of(separator)
    step = len(separator)
    pos = 0
    for n, text in enumerate(texts):  # the hot path of every render: only data parts cost more than a length
        if n and step:
            if sep_spans:
                spans.extend([(a + pos, b + pos, s) for a, b, s in sep_spans])
            pos += step
        if type(text) is DataStr:
            spans.extend([(a + pos, b + pos, s) for a, b, s in text._spans] if pos else text._spans)
        pos += len(text)
    return tainted(str.join(str(separator), texts), spans)


def concat2(left: str, right: str) -> str:
    """``left + right`` for two strings, at least one of them a :class:`DataStr` (the hot path of templates)."""
    text = str.__add__(left, right)
    spans = left._spans if type(left) is DataStr else ()
    if type(right) is DataStr:
        shift = len(left)
        spans = (*spans, *((a + shift, b + shift, s) for a, b, s in right._spans))
    out = DataStr(text)
    out._spans = spans
    return out


def whole(result: str, source: int) -> str:
    """``result`` attributed as a whole to one source (for operations whose layout cannot be traced)."""
    return tainted(result, ((0, len(result), source),)) if result else result


def locate(result: str, value: DataStr) -> str:
    """``result`` that was cut out of ``value`` (trim, first, string...): keep the spans of the piece it came from."""
    at = str.find(value, result)
    if at < 0:
        return whole(result, value._spans[0][2])
    return slice_data(value, at, at + len(result))


def _pieces(value: DataStr, pieces: Sequence[str]) -> list[str]:
    """Pieces that appear in ``value`` in order (split, partition, splitlines): each keeps its own spans."""
    out: list[str] = []
    pos = 0
    for piece in pieces:
        at = str.find(value, piece, pos)
        if at < 0:
            out.append(whole(piece, value._spans[0][2]) if piece else piece)
            continue
        out.append(slice_data(value, at, at + len(piece)))
        pos = at + len(piece)
    return out


_CUTTING = frozenset({"strip", "lstrip", "rstrip", "removeprefix", "removesuffix"})
_SPLITTING = frozenset({"split", "rsplit", "splitlines", "partition", "rpartition"})
_SAME_LENGTH = frozenset({"lower", "upper", "title", "capitalize", "casefold", "swapcase"})
_REBUILDING = frozenset({"replace", "center", "ljust", "rjust", "zfill", "expandtabs", "format", "format_map", "join"})


def tainted_method(value: DataStr, name: str, method: Callable[..., Any]) -> Callable[..., Any] | None:
    """A wrapper of ``value.<name>`` that keeps provenance in its result, or None when the result is not text."""
    if name in _CUTTING:

        def cut(*args: Any, **kwargs: Any) -> Any:
            return locate(method(*args, **kwargs), value)

        return cut
    if name in _SPLITTING:

        def split(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            pieces = _pieces(value, result)
            return tuple(pieces) if isinstance(result, tuple) else pieces

        return split
    if name in _SAME_LENGTH:

        def recase(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if len(result) == len(value):
                return tainted(result, value._spans)
            return whole(result, value._spans[0][2])

        return recase
    if name in _REBUILDING:

        def rebuild(*args: Any, **kwargs: Any) -> Any:
            return whole(method(*args, **kwargs), value._spans[0][2])

        return rebuild
    return None


def _find_source(value: Any, depth: int = 0) -> int | None:
    """The first data source inside a value (a DataStr, or one nested in lists and dicts), if any."""
    kind = type(value)
    if kind is DataStr:
        return value._spans[0][2]
    if depth > 6:
        return None
    if kind is dict:
        for key, item in value.items():
            found = _find_source(key, depth + 1) if type(key) is DataStr else _find_source(item, depth + 1)
            if found is not None:
                return found
    elif kind in (list, tuple):
        for item in value:
            found = _find_source(item, depth + 1)
            if found is not None:
                return found
    return None


def taint_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Jinja filter so that text it builds from data stays attributed to that data."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        if type(result) is not str:
            return result
        for arg in args:
            if type(arg) is DataStr:
                return locate(result, arg) if str.find(arg, result) >= 0 else whole(result, arg._spans[0][2])
        for arg in (*args, *kwargs.values()):
            source = _find_source(arg)
            if source is not None:
                return whole(result, source)
        return result

    wrapped.__name__ = getattr(function, "__name__", name)
    if hasattr(function, "jinja_pass_arg"):
        wrapped.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    return wrapped
