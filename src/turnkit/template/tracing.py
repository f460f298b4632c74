"""A render that reports which data strings the template *looked at*, for renders reused by splicing.

Most chat templates never read the text of a message: they output it, joined to their own text. For such a template
the render of a conversation is a fixed *skeleton* (template text, with holes) filled with the message strings, and
every conversation of the same shape (roles, fields, which strings are empty) fills the same skeleton
(:mod:`turnkit.template.splice`). What decides it is whether the template branched on, measured, transformed or
looked up a data string. This module runs a template with each data string replaced by a unique *sentinel* and
records every such observation.

A sentinel is ``U+FFFE <digits> U+FFFF``: Unicode noncharacters, which turnkit refuses in data, so a sentinel (or any
string built from one) is recognised wherever it goes. The observations are recorded where a template can read text:

* the sandbox's ``getattr`` and ``getitem`` on a string holding a sentinel (every string method, indexing, slicing),
  and ``getitem`` with such a string as the key (a lookup by content);
* every filter and test applied to a value holding a sentinel, except the few that only see structure (``length`` of
  a list, ``map(attribute=...)``, ``join``, ``default``; type tests such as ``is string``);
* every call of a function or method with such a value among its arguments (not the template's own macros);
* the operands of every comparison (``==``, ``in``, ``<``...), the keys of dict literals, the iterable of every
  ``for`` loop, the ``*``, ``%`` and ``**`` operators, ``+`` with a ``Markup`` operand (which escapes the other one),
  and ``str()`` of a container (its ``repr``) in output or ``~``.

What is left is output, concatenation, truthiness (a sentinel and the string it stands for are both non-empty) and
type tests, which cannot tell a sentinel from the text it stands for; and two transforms the hole applies to the text
it is filled with (see ``TRANSFORMS``): ``trim``/``strip()``, and ``tojson`` of a value whose strings are all whole
sentinels (the JSON text depends on each only through its escaping). A render that raises is never reused; one that
called ``strftime_now`` records the dates it wrote, and is reused only while the clock gives the same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.nodes as nodes
from jinja2.runtime import Macro
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from turnkit.template.sandbox import TEMPLATES_KEPT, ProvenanceSandbox, _strftime_now, _TemplateNamespace
from turnkit.template.taint import DataStr, tainted

__all__ = ["CLOSE", "OPEN", "SENTINEL", "TRANSFORMS", "UNTRACEABLE", "Trace", "compile_traced", "observing", "sentinel"]

OPEN, CLOSE = "\ufffe", "\uffff"
SENTINEL = re.compile(f"{OPEN}(\\d+)([slrj]?){CLOSE}")  # a slot, and the transform applied to it (see TRANSFORMS)
_PLAIN_SENTINEL = re.compile(f"{OPEN}(\\d+){CLOSE}")


def _json_string(text: str) -> str:
    """``text`` as ``tojson`` writes it inside a JSON string (ensure_ascii off: quotes, backslashes and control
    characters escaped)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


#: Transforms a skeleton's hole may apply to its text: ``strip()``, ``lstrip()``, ``rstrip()`` without arguments (and
#: the ``trim`` filter), and ``j``: the text escaped as ``tojson`` writes a string. Templates trim message text all
#: the time (Llama 3: ``message['content'] | trim``) and write tool-call arguments with ``tojson`` (Qwen, Hermes); the
#: output then depends on the text only through the trimmed or escaped text, which the hole computes.
TRANSFORMS: dict[str, Callable[[str], str]] = {"s": str.strip, "l": str.lstrip, "r": str.rstrip, "j": _json_string}
#: How much longer than its text a hole's text can be (a control character escaped as ``\\u0000`` is 6 characters).
_LONGEST_ESCAPE = 6
_TRANSFORM_OF_METHOD = {"strip": "s", "lstrip": "l", "rstrip": "r"}
#: Recorded when a value is too deeply nested to search: the render cannot be reused.
UNTRACEABLE = -1


@dataclass
class Trace:
    """What a traced render observed, and the most a string it built held: sentinels, and other characters.

    The sizes bound every string the same render builds from real text (``literal + copies * longest text``), which
    decides whether the real render could have hit a size limit that the render of sentinels did not.
    """

    seen: set[int] = field(default_factory=set)
    copies: int = 0
    literal: int = 0
    #: (slot, transform) of every transformed sentinel made: the transformed real text must not be empty either
    transformed: set[tuple[int, str]] = field(default_factory=set)
    #: (format, result) of every ``strftime_now`` call: the render holds the date, valid while the clock agrees
    clock: set[tuple[str, str]] = field(default_factory=set)


_trace: ContextVar[Trace | None] = ContextVar("turnkit_trace", default=None)

#: Tests that only see a value's type: a sentinel and its text answer them alike.
_TYPE_TESTS = frozenset(
    {"defined", "undefined", "none", "string", "mapping", "sequence", "iterable", "number", "integer", "float",
     "boolean", "true", "false", "callable", "escaped"}
)  # fmt: skip
#: Filters that only see the structure of a list or dict (never the text inside), with the arguments that are output
#: verbatim rather than read (join's separator, default's fallback).
_STRUCTURAL_FILTERS = {
    "length": (), "count": (), "first": (), "last": (), "reverse": (), "list": (), "map": (), "select": (),
    "reject": (), "selectattr": (), "rejectattr": (), "batch": (), "slice": (), "items": (),
    "join": (1, "d"), "default": (1, "default_value"), "d": (1, "default_value"),
}  # fmt: skip
_TEXT_PRIMARY_OK = frozenset({"default", "d"})


def sentinel(slot: int) -> str:
    """The stand-in for data string number ``slot``."""
    return f"{OPEN}{slot}{CLOSE}"


def _find(value: Any, found: set[int], depth: int = 0) -> None:
    """Add the slot of every sentinel inside ``value`` (strings, and strings in lists, tuples and dicts)."""
    if isinstance(value, str):
        if OPEN in value:
            found.update(int(n) for n, _ in SENTINEL.findall(value))
        return
    if depth > 12:
        if isinstance(value, list | tuple | dict):
            found.add(UNTRACEABLE)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _find(key, found, depth + 1)
            _find(item, found, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _find(item, found, depth + 1)
    elif isinstance(value, Namespace):
        _find(object.__getattribute__(value, "_Namespace__attrs"), found, depth + 1)


def _note(*values: Any) -> None:
    trace = _trace.get()
    if trace is not None:
        for value in values:
            _find(value, trace.seen)


def _built(text: Any) -> Any:
    """Record the size of a string the render built (see :class:`Trace`)."""
    trace = _trace.get()
    if trace is not None and isinstance(text, str):
        # a JSON-escaped hole can hold its text 6 times over: counted as that many copies
        copies = text.count(OPEN) + (_LONGEST_ESCAPE - 1) * text.count("j" + CLOSE)
        sentinels = sum(len(n) + len(t) + 2 for n, t in SENTINEL.findall(text)) if copies else 0
        trace.copies = max(trace.copies, copies)
        trace.literal = max(trace.literal, len(text) - sentinels)
    return text


def _text_with_sentinel(value: Any) -> bool:
    return isinstance(value, str) and OPEN in value


def _transformed(value: Any, kind: str) -> Any:
    """A whole, untransformed sentinel with ``kind`` applied (see TRANSFORMS); None for anything else."""
    trace = _trace.get()
    match = _PLAIN_SENTINEL.fullmatch(value) if type(value) is DataStr else None
    if trace is None or match is None:
        return None
    trace.transformed.add((int(match.group(1)), kind))
    return tainted(f"{OPEN}{match.group(1)}{kind}{CLOSE}", ((0, len(value) + 1, value._spans[0][2]),))


def _only_whole_sentinels(value: Any, depth: int = 0) -> bool:
    """Whether every data string inside ``value`` is a whole, untransformed sentinel, and no key holds one (other
    strings and the numbers are part of the shape's key)."""
    if isinstance(value, str):
        return OPEN not in value or (type(value) is DataStr and _PLAIN_SENTINEL.fullmatch(value) is not None)
    if depth > 12:
        return False
    if type(value) is dict:
        return all(
            isinstance(k, str | int | float | bool | None) and not _text_with_sentinel(k) for k in value
        ) and all(_only_whole_sentinels(v, depth + 1) for v in value.values())
    if type(value) is list or type(value) is tuple:
        return all(_only_whole_sentinels(v, depth + 1) for v in value)
    return value is None or type(value) in (int, float, bool)


def _json_with_holes(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``tojson`` of a value whose data strings are whole sentinels, as JSON text with a ``j`` hole for each (filled
    with the string escaped as JSON writes it); None where the text would depend on the strings otherwise
    (``ensure_ascii``, a sentinel in a key or an option, a transformed sentinel, an attribution not whole)."""
    if _trace.get() is None or not args:
        return None
    value, options = args[0], [*args[1:], *kwargs.values()]
    ensure_ascii = args[1] if len(args) > 1 else kwargs.get("ensure_ascii", False)
    found: set[int] = set()
    _find(options, found)
    if ensure_ascii or found or not _only_whole_sentinels(value):
        return None
    result = function(*args, **kwargs)
    spans = result._spans if type(result) is DataStr else ()
    if len(spans) > 1 or (spans and spans[0][:2] != (0, len(result))):
        return None
    text = _PLAIN_SENTINEL.sub(lambda m: f"{OPEN}{m.group(1)}j{CLOSE}", result)
    return tainted(text, ((0, len(text), spans[0][2]),)) if spans else text


def _observing_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    skip_context = 1 if hasattr(function, "jinja_pass_arg") else 0
    verbatim = _STRUCTURAL_FILTERS.get(name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        args_only = args[skip_context:]
        if name == "trim" and len(args_only) == 1 and not kwargs:
            trimmed = _transformed(args_only[0], "s")
            if trimmed is not None:
                return trimmed
        if name == "tojson" and not skip_context:
            with_holes = _json_with_holes(function, args, kwargs)
            if with_holes is not None:
                return _built(with_holes)
        if verbatim is None:
            _note(*args_only, *kwargs.values())
        else:
            primary = args_only[0] if args_only else None
            if _text_with_sentinel(primary) and name not in _TEXT_PRIMARY_OK:
                _note(primary)
            elif name == "join" and primary is not None and not isinstance(primary, str):
                # only strings join verbatim: anything else prints its repr (a generator is read once, here)
                primary = list(primary)
                _note(*(item for item in primary if not isinstance(item, str)))
                args = (*args[:skip_context], primary, *args_only[1:])
            for position, arg in enumerate(args_only[1:], start=1):
                if position not in verbatim:
                    _note(arg)
            for key, arg in kwargs.items():
                if key not in verbatim:
                    _note(arg)
        return _built(function(*args, **kwargs))

    wrapped.__name__ = getattr(function, "__name__", name)
    if skip_context:
        wrapped.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    return wrapped


def _observing_test(name: str, function: Any) -> Callable[..., Any]:
    if name in _TYPE_TESTS:
        return function

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _note(*args, *kwargs.values())
        return function(*args, **kwargs)

    wrapped.__name__ = getattr(function, "__name__", name)
    if hasattr(function, "jinja_pass_arg"):
        wrapped.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    return wrapped


def _seen(node: Any, how: str = "tk_seen") -> nodes.Expr:
    """``node`` wrapped in the ``tk_seen`` filter: its value is read (jinja2 refuses custom node types)."""
    return nodes.Filter(node, how, [], [], None, None, lineno=node.lineno)


class _MarkReads(NodeTransformer):
    """Marks the expressions a template reads: comparison operands, dict keys, loop iterables."""

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:  # noqa: N802 - jinja2's visitor naming
        self.generic_visit(node)
        node.expr = _seen(node.expr)
        for operand in node.ops:
            # `key in mapping` reads the mapping's keys only (keys are part of a shape's key, never a slot)
            how = "tk_container" if operand.op in ("in", "notin") else "tk_seen"
            operand.expr = _seen(operand.expr, how)
        return node

    def visit_Pair(self, node: nodes.Pair) -> nodes.Node:  # noqa: N802
        self.generic_visit(node)
        node.key = _seen(node.key)
        return node

    def visit_For(self, node: nodes.For) -> nodes.Node:  # noqa: N802
        self.generic_visit(node)
        node.iter = _seen(node.iter, "tk_iterated")  # a list's items are not read by looping
        return node


def _traced_strftime_now(fmt: Any) -> str:
    _note(fmt)
    result = _strftime_now(fmt)
    trace = _trace.get()
    if trace is not None:
        trace.clock.add((fmt, result))
    return result


class TracingSandbox(ProvenanceSandbox):
    """The provenance sandbox (same text, same spans), recording which sentinels the template observed."""

    def __init__(self) -> None:
        super().__init__()
        for name, function in list(self.filters.items()):
            self.filters[name] = _observing_filter(name, function)
        for name, function in list(self.tests.items()):
            self.tests[name] = _observing_test(name, function)
        self.globals["strftime_now"] = _traced_strftime_now
        self.filters["tk_seen"] = self.tk_seen
        self.filters["tk_iterated"] = self.tk_iterated
        self.filters["tk_container"] = self.tk_container

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        return _MarkReads().visit(tree)  # type: ignore[no-any-return]

    @staticmethod
    def tk_seen(value: Any) -> Any:
        _note(value)
        return value

    @staticmethod
    def tk_container(value: Any) -> Any:
        if not isinstance(value, dict):
            _note(value)  # a substring search, or a comparison with each item
        return value

    @staticmethod
    def tk_iterated(value: Any) -> Any:
        if isinstance(value, str):
            _note(value)  # looping over the characters of a string
        return value

    @staticmethod
    def tk_str(value: Any) -> str:
        if not isinstance(value, str):
            _note(value)  # str() of a list or dict is its repr, which escapes noncharacters
        return ProvenanceSandbox.tk_str(value)

    @staticmethod
    def checked_concat(parts: tuple[Any, ...]) -> str:
        _note(*(p for p in parts if not isinstance(p, str)))
        return _built(ProvenanceSandbox.checked_concat(parts))  # type: ignore[no-any-return]

    @staticmethod
    def concat(parts: Any) -> str:  # type: ignore[override]  # jinja joins macro and block output with it
        return _built(ProvenanceSandbox.concat(parts))  # type: ignore[no-any-return]

    @staticmethod
    def checked_add(left: Any, right: Any) -> Any:
        if isinstance(left, Markup) or isinstance(right, Markup):
            _note(left, right)  # Markup + text escapes the text ('<' becomes '&lt;')
        return _built(ProvenanceSandbox.checked_add(left, right))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _note(left, right)
        return super().call_binop(context, operator, left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if _text_with_sentinel(obj):
            kind = _TRANSFORM_OF_METHOD.get(attribute)
            method = super().getattr(obj, attribute)
            if kind is not None and _PLAIN_SENTINEL.fullmatch(obj):

                def transform(*args: Any, **kwargs: Any) -> Any:
                    if not args and not kwargs:
                        return _transformed(obj, kind)
                    _note(obj)  # strip(chars): the result depends on the text
                    return method(*args, **kwargs)

                return transform
            _note(obj)
            return method
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if _text_with_sentinel(obj):
            _note(obj)
        if not isinstance(argument, int | slice):
            _note(argument)
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        if not isinstance(__obj, Macro) and __obj is not _TemplateNamespace:
            _note(*args, *kwargs.values())
        return super().call(__context, __obj, *args, **kwargs)


_TRACING_ENVIRONMENT = TracingSandbox()


@lru_cache(maxsize=TEMPLATES_KEPT)
def compile_traced(source: str) -> jinja2.Template:
    """The template compiled for tracing (the caller has compiled it once normally, so the text is valid)."""
    return _TRACING_ENVIRONMENT.from_string(source)


class observing:  # noqa: N801 - used as a context manager, named like one
    """``with observing() as trace:`` records in ``trace`` what a render observes and the sizes it built."""

    def __enter__(self) -> Trace:
        self.trace = Trace()
        self.token = _trace.set(self.trace)
        return self.trace

    def __exit__(self, *exc: object) -> None:
        _trace.reset(self.token)
