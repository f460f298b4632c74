"""Reply formats as data: how a model writes reasoning, content and tool calls in its reply.

A :class:`ReplyFormat` is a description, never code: one machine (:mod:`turnkit.parse.reading.machine`) runs every
format. It says

* where reasoning starts and ends (:class:`Reasoning`: ``<think>``...``</think>``, ``[THINK]``...``[/THINK]``,
  ``<|channel>thought``...``<channel|>``);
* which markers wrap content and are dropped (Cohere's ``<|START_RESPONSE|>``);
* how tool calls are written (:class:`ToolSyntax`): a sequence of literals and holes for one call, such as::

      <tool_call>\\n<function=  NAME  >\\n  ARGUMENTS  </function>\\n</tool_call>

  with the arguments in one of five encodings (:class:`Arguments`): a JSON object, a JSON object that also holds the
  name (Hermes), one tagged element per parameter whose raw text the tool's JSON schema types (Qwen3-Coder, GLM,
  DeepSeek DSML with its ``string="true|false"`` attribute), Python call syntax, or Gemma 4's literals;
* Harmony-style headed messages (:class:`Channels`), where a header routes each message body to reasoning, content
  or a tool call;
* the text that ends a reply in the template's own terms (``end_texts``), found by rendering.

Literals match with flexible whitespace: each whitespace run of a literal stands for any whitespace (or none), except
next to a raw value, whose text keeps exactly what the template did not write around it.

The formats turnkit knows by name are in :mod:`.catalog`; :mod:`turnkit.parse.choice.derive` reads a format off a
template's own renders, and :mod:`turnkit.parse.choice.select` picks the format of a template by rendering probe
messages and keeping the reading that gives them back.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field, replace
from typing import Literal, cast

from turnkit.parse.encodings import ENCODINGS

# The public names are listed once, in the package's __all__ (turnkit/parse/formats/__init__.py).


@dataclass(frozen=True)
class Lit:
    """Literal text the model writes (whitespace in it is flexible)."""

    text: str

    @property
    def cores(self) -> tuple[str, ...]:
        """The non-whitespace runs that must appear, in order."""
        return tuple(self.text.split())

    @property
    def lead(self) -> str:
        """The whitespace before the first core."""
        return self.text[: len(self.text) - len(self.text.lstrip())]

    @property
    def trail(self) -> str:
        """The whitespace after the last core."""
        return self.text[len(self.text.rstrip()) :]


HoleKind = Literal["name", "id", "named_id", "skip", "key", "value", "type"]


@dataclass(frozen=True)
class Hole:
    """Text the model chooses, ended by the literal that follows it.

    ``name``: the function name; ``id``: the call's id (kept as the call id); ``named_id``: an id that holds the
    name (Kimi's ``functions.NAME:0``: the name is what follows the last ``.`` before the last ``:``); ``skip``: text
    that is read and dropped; in a parameter, ``key``, ``value`` (raw text, typed by the schema) and ``type`` (a type
    attribute: see :attr:`Arguments.raw_types`).
    """

    kind: HoleKind


Encoding = Literal["json", "json_call", "tagged", "python", "gemma", "xml"]


@dataclass(frozen=True)
class Arguments:
    """How a call's arguments are written.

    Attributes:
        encoding: ``json``: a JSON object; ``json_call``: a JSON object holding the name under ``name_key`` and the
            arguments under one of ``keys`` (or, with ``name_as_key``, ``{"NAME": {...}}``); ``tagged``: ``param``
            repeated, one per argument; ``python``: ``key=value`` pairs of a Python call (``f(a=1, b="x")``, JSON's
            ``true``/``null`` accepted too); ``gemma``: Gemma 4's ``{key:<|"|>text<|"|>,n:1}`` (``quote`` says how
            strings are quoted); ``xml``: MiniMax M3's elements, ``<key>value</key>`` each after ``quote``, nested
            for objects, ``<item>`` for list entries (read when complete).
        param: For ``tagged``: the literals and holes of one argument.
        raw_types: For a ``tagged`` parameter with a ``type`` hole: the type texts whose value is raw text (DeepSeek
            DSML ``string="true"``, Kimi K3 ``type="string"``); any other type text means the value is JSON.
        python_literals: For ``json`` and ``json_call``: the object is written as a Python literal where JSON would
            be (``{'city': 'São Paulo', 'metric': True}``: a template that writes ``{{ arguments }}`` without
            ``tojson`` prints Python's repr, and its model learns to write that); read as the literal it is, JSON's
            own syntax accepted too, and sent as JSON once the object is complete.
        cdata: For ``tagged``: a value may be written in ``<![CDATA[...]]>`` sections (MiniCPM5's template wraps a
            value holding ``<``, ``&`` or a newline so): the sections' text is the value, unwrapped, and nothing in
            it ends the value, not even the parameter's own end tag.
    """

    encoding: Encoding
    param: tuple[Lit | Hole, ...] = ()
    name_key: str = "name"
    keys: tuple[str, ...] = ("arguments",)
    name_as_key: bool = False
    raw_types: tuple[str, ...] = ()
    quote: str = '<|"|>'
    python_literals: bool = False
    cdata: bool = False

    @property
    def self_delimited(self) -> bool:
        """True when the arguments' own syntax says where they end (a JSON object, Python's parentheses)."""
        return ENCODINGS[self.encoding].self_delimited


Element = Lit | Hole | Arguments


@dataclass(frozen=True)
class ToolSyntax:
    """How one or more tool calls are written.

    Attributes:
        call: One call, as literals, holes and one :class:`Arguments`, in order.
        block: Literals written before the first call and after the last (DeepSeek's ``<｜DSML｜tool_calls>``,
            Mistral's ``[TOOL_CALLS][`` and ``]``), or None when each call stands alone.
        separator: What is written between two calls of a block (``,`` in a JSON list, ``;`` for Llama 3).
        bare: The calls have no start marker (a reply that is a JSON object or list): they count only at the start
            of the reply, and text that does not read as a call after all is content.
    """

    call: tuple[Element, ...]
    block: tuple[str, str] | None = None
    separator: str = ""
    bare: bool = False

    @property
    def arguments(self) -> Arguments:
        return next(e for e in self.call if isinstance(e, Arguments))

    @property
    def trigger(self) -> str:
        """The first text that starts this syntax's calls (a bare syntax's is the JSON's first character)."""
        if self.block is not None and self.block[0].strip():
            return self.block[0].split()[0]
        first = self.call[0]
        if isinstance(first, Lit):
            return first.cores[0]
        if isinstance(first, Arguments):
            return ENCODINGS[first.encoding].bare_opening
        return ""

    def opening(self, name: str | None = None) -> str | None:
        """The text that starts a call, for a server that writes it for the model (``tool_choice``): up to the name
        (``name=None``: the model picks the function), or, for a named function, up to its arguments. None where a
        call cannot be started so (a bare syntax, whose start is its arguments' first character)."""
        if self.bare:
            return None
        parts = [self.block[0]] if self.block else []
        for element in self.call:
            if isinstance(element, Lit):
                parts.append(element.text)
            elif isinstance(element, Hole) and element.kind in ("name", "named_id"):
                if name is None:
                    return "".join(parts) + ("functions." if element.kind == "named_id" else "")
                parts.append(name if element.kind == "name" else f"functions.{name}:0")
            elif isinstance(element, Hole):
                return "".join(parts)  # an id or a type the model writes
            else:
                if not ENCODINGS[element.encoding].holds_name or element.name_as_key:
                    return "".join(parts)
                opened = "".join(parts) + "{" + json.dumps(element.name_key) + ": "
                if name is None:
                    return opened + '"'
                return opened + json.dumps(name) + ", " + json.dumps(element.keys[0]) + ": "
        return "".join(parts)

    @property
    def markers(self) -> tuple[str, ...]:
        """Every literal core of the syntax."""
        texts = [*(self.block or ()), self.separator]
        for element in self.call:
            if isinstance(element, Lit):
                texts.append(element.text)
            elif isinstance(element, Arguments):
                texts.extend(e.text for e in element.param if isinstance(e, Lit))
        return tuple(dict.fromkeys(core for text in texts for core in text.split()))


@dataclass(frozen=True)
class Reasoning:
    """The markers around reasoning.

    ``prefilled``: the template's generation prompt writes ``start`` itself, so a reply parsed without its prompt
    starts inside reasoning (with the prompt, the prompt decides: one that ends ``<think></think>`` closed it).
    ``label``: a word written right after ``start`` that is not reasoning (Gemma 4's ``<|channel>thought``).
    """

    start: str
    end: str
    prefilled: bool = False
    label: str = ""


@dataclass(frozen=True)
class Channels:
    """Messages with headers: Harmony's ``<|start|>assistant<|channel|>analysis<|message|>...<|end|>``, Functionary's
    ``>>>all\n...``.

    Attributes:
        start: What starts a message (followed by the role, which is read and dropped) when the reply holds several.
        header_end: What ends a header and starts its body.
        message_ends: What ends a body (one that ends the reply, such as ``<|call|>``, is usually an EOS id too).
        channel: The marker before a channel name in a header; "" when a header names only a recipient.
        routes: Where the body goes, by channel name or recipient: ``reasoning`` or ``content`` (content is read with
            the format's tool syntax, so a body may hold calls).
        recipient: How a recipient is written in a header (``to=``); "" when the header is the recipient itself.
        tool_prefix: A recipient that starts with it is a tool call (the rest is its name) whose body is the call's
            JSON arguments; "" makes every recipient that no route names a call; None: no such calls.
        constrain: A header marker before the body's content type (``<|constrain|>json``), read and dropped.
    """

    start: str
    header_end: str
    message_ends: tuple[str, ...] = ()
    channel: str = ""
    routes: tuple[tuple[str, Literal["reasoning", "content"]], ...] = ()
    recipient: str = "to="
    tool_prefix: str | None = None
    constrain: str = ""

    @property
    def markers(self) -> tuple[str, ...]:
        return tuple(m for m in (self.start, self.header_end, *self.message_ends, self.channel, self.constrain) if m)


@dataclass(frozen=True)
class ReplyFormat:
    """How the replies of a model are written.

    Attributes:
        name: The format's name (a catalog name, or ``derived`` for a reading taken from a template's renders).
        reasoning: The reasoning markers, or None.
        tools: The tool-call syntaxes (usually one; several when a family writes more than one form).
        content_markers: Markers written around content that are not content (dropped wherever they appear).
        channels: Harmony-style headed messages, or None.
        end_texts: Text that ends a reply in the template's own terms (``<|role_end|>`` where the tokenizer's EOS is
            another token), found by rendering; a reply given as ids also ends at every end id.
        lead: Text every reply starts with that is not content (a template whose replies begin ``Assistant: ``
            although its prompt does not end with it); dropped at the start of a reply.
        reason: Why this format was chosen for a template (set by :mod:`turnkit.parse.choice.select`; not part
            of equality).
    """

    name: str
    reasoning: Reasoning | None = None
    tools: tuple[ToolSyntax, ...] = ()
    content_markers: tuple[str, ...] = ()
    channels: Channels | None = None
    end_texts: tuple[str, ...] = ()
    lead: str = ""
    reason: str = field(default="", compare=False)

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker text of the format (what a tokenizer may hold as single tokens)."""
        found = [*(self.content_markers), *(m for syntax in self.tools for m in syntax.markers)]
        if self.reasoning is not None:
            found += self.reasoning.start.split() + self.reasoning.end.split()
        if self.channels is not None:
            found += self.channels.markers
        return tuple(dict.fromkeys(m for m in found if m))

    @property
    def reads_tools(self) -> bool:
        return bool(self.tools) or self.channels is not None

    def without_tools(self) -> ReplyFormat:
        """The same format with tool-call syntax not parsed (a request that offers no tools)."""
        if not self.tools:
            return self
        return replace(self, tools=())

    def with_python_literals(self) -> ReplyFormat:
        """The same format reading its JSON arguments as Python literals (see :attr:`Arguments.python_literals`)."""
        tools = tuple(replace(syntax, call=tuple(_python_literals(e) for e in syntax.call)) for syntax in self.tools)
        return replace(self, tools=tools)

    def because(self, reason: str) -> ReplyFormat:
        return replace(self, reason=reason)

    def ending_with(self, end_texts: tuple[str, ...]) -> ReplyFormat:
        return replace(self, end_texts=tuple(dict.fromkeys((*self.end_texts, *end_texts))))

    def describe(self) -> str:
        """A one-line description: the name and what it reads."""
        parts = []
        if self.reasoning is not None:
            parts.append(f"reasoning {self.reasoning.start!r}...{self.reasoning.end!r}")
        if self.channels is not None:
            parts.append("Harmony channels")
        for syntax in self.tools:
            literals = ", Python literals" if syntax.arguments.python_literals else ""
            parts.append(f"tool calls {syntax.trigger!r} ({syntax.arguments.encoding}{literals})")
        return f"{self.name}: " + (", ".join(parts) or "text only")


def _python_literals(element: Element) -> Element:
    if isinstance(element, Arguments) and ENCODINGS[element.encoding].literal is not None:
        return replace(element, python_literals=True)
    return element


_HOLES = ("name", "id", "named_id", "skip", "key", "value", "type")


def pattern(text: str, arguments: Arguments | None = None) -> tuple[Element, ...]:
    """Elements from a pattern: literal text with ``{name}``, ``{id}``, ``{skip}``, ``{args}`` (for a call), or
    ``{key}``, ``{value}``, ``{type}`` (for a parameter); ``{{`` and ``}}`` are literal braces.

    >>> pattern("<function={name}>{args}</function>", Arguments("json"))[:2]
    (Lit(text='<function='), Hole(kind='name'))
    """
    out: list[Element] = []
    for literal, field_name, _, _ in string.Formatter().parse(text):
        if literal:
            out.append(Lit(literal))
        if field_name is None:
            continue
        if field_name == "args":
            if arguments is None:
                raise ValueError("a pattern with {args} needs its Arguments")
            out.append(arguments)
        elif field_name in _HOLES:
            out.append(Hole(cast(HoleKind, field_name)))
        else:
            raise ValueError(f"unknown hole {{{field_name}}} in {text!r}")
    return tuple(out)


def tool_syntax(
    call: str,
    arguments: Arguments,
    *,
    param: str = "",
    block: tuple[str, str] | None = None,
    separator: str = "",
    bare: bool = False,
) -> ToolSyntax:
    """A tool syntax from patterns (see :func:`pattern`); ``param`` is one tagged argument's pattern."""
    if param:
        arguments = replace(arguments, param=cast(tuple[Lit | Hole, ...], pattern(param)))
    return ToolSyntax(pattern(call, arguments), block, separator, bare)
