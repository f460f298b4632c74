"""How a template reads a message's ``content``: as one string, or as a list of typed parts it walks itself.

OpenAI's Chat Completions lets a client send ``content`` as parts, ``[{"type": "text", "text": "Hi"}]``, and typed
SDK messages, agent frameworks and chat UIs do. Templates split in two. Most text models' templates use
``message['content']`` as a string (``'<|im_start|>' + message['role'] + '\\n' + message['content']``): given parts,
they fail with a ``TypeError``, print the list's repr, or, guarding with ``is string``, write an empty turn (Qwen3).
Multimodal templates, and some text ones, walk the parts (``{% for part in message['content'] %}``) and write each
text part themselves. transformers passes ``content`` on as given, so only the second kind can read parts.

:func:`content_format` decides which kind a template is, once per template text, from its syntax tree (never by
running it), as vLLM decides between its "string" and "openai" content formats. A template reads parts when it
loops over a message's content (``for part in message.content``, filtered or not), pipes it through a filter that
walks a list of objects (``message.content | selectattr('type', 'equalto', 'text') | map(attribute='text')``), or
reads a field of a part by position (``message['content'][0]['text']``). The content may be read as
``message.get('content')``, and may reach the loop through a variable (``{% set content = message.content %}``, a
namespace attribute) or a macro's parameter (Qwen3.5's ``render_content(message.content)``, the ``chatml`` family's
``text_of``): both are followed. Anything else reads a string. Over the 631 templates of ``../shared/conformance``,
every template that transformers lets write a text part's text is read as ``"parts"``
(``tests/template/test_content_parts.py`` checks it).

:func:`turnkit.messages.normalize_conversation` then gives the template what it reads: for ``"string"``, each
message's text parts joined with ``"\\n"`` (as vLLM joins them, and as the Responses and Messages APIs join their
text blocks; transformers' own server joins with a space, and the templates that walk parts put nothing between
them); for ``"parts"``, the parts as sent, so the render is ``transformers.apply_chat_template``'s. A picture, sound,
video or file part is refused wherever token ids are made (encode, ``turnkit prepare``, the server: turnkit's models
read text only), and by a render for a template that reads a string, which has no place for it; a render for a
template that walks parts shows it as transformers does (Qwen3.5's ``<|vision_start|><|image_pad|><|vision_end|>``).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import jinja2.nodes as nodes

from turnkit.messages import ContentFormat
from turnkit.template.sandbox import TEMPLATES_KEPT, parse_template

__all__ = ["content_format"]

#: Filters whose result is still the content's list of parts (``for part in message.content | list``).
_KEEPS_PARTS = frozenset({"list", "default", "d", "reverse", "sort", "unique", "selectattr", "rejectattr", "batch"})
#: Filters that only make sense on a list of objects: applied to the content, they mean it holds parts.
_WALKS_PARTS = frozenset({"selectattr", "rejectattr", "map", "groupby", "sort", "sum"})
#: The fields of a part a template reads when it picks a part by position (``message.content[0].text``).
_PART_FIELDS = frozenset({"text", "type"})


def _field(node: nodes.Node) -> tuple[nodes.Node, str] | None:
    """``(x, "field")`` for ``x.field``, ``x['field']`` or ``x.get('field', ...)``, else None."""
    if isinstance(node, nodes.Getattr):
        return node.node, node.attr
    if isinstance(node, nodes.Getitem):
        owner, arg = node.node, node.arg
    elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr) and node.node.attr == "get":
        if not node.args:
            return None
        owner, arg = node.node.node, node.args[0]
    else:
        return None
    return (owner, arg.value) if isinstance(arg, nodes.Const) and isinstance(arg.value, str) else None


def _key(node: nodes.Node) -> str | None:
    """The field name :func:`_field` finds, else None."""
    found = _field(node)
    return None if found is None else found[1]


def _name(node: nodes.Node) -> str | None:
    """The variable a node reads, with a namespace attribute as ``ns.attr`` (its name where it is assigned)."""
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name):
        return f"{node.node.name}.{node.attr}"
    return None


class _Reader:
    """The names a template gives to a message's content, grown until nothing new is found."""

    def __init__(self, tree: nodes.Template) -> None:
        self.tree = tree
        self.names: set[str] = set()
        self.macros = {macro.name: macro for macro in tree.find_all(nodes.Macro)}

    def is_content(self, node: nodes.Node) -> bool:
        """Whether ``node`` evaluates to a message's content (as given, or through a filter that keeps the list)."""
        if _key(node) == "content":
            return True
        name = _name(node)
        if name is not None and name in self.names:
            return True
        if isinstance(node, nodes.Filter) and node.name in _KEEPS_PARTS and node.node is not None:
            return self.is_content(node.node)
        if isinstance(node, nodes.CondExpr):
            return self.is_content(node.expr1) or (node.expr2 is not None and self.is_content(node.expr2))
        return False

    def _bindings(self) -> Iterator[str]:
        """The names bound to content: ``{% set x = message.content %}``, and macro parameters called with it."""
        for assign in self.tree.find_all(nodes.Assign):
            target = assign.target
            name = f"{target.name}.{target.attr}" if isinstance(target, nodes.NSRef) else _name(target)
            if name is not None and self.is_content(assign.node):
                yield name
        for call in self.tree.find_all(nodes.Call):
            macro = self.macros.get(call.node.name) if isinstance(call.node, nodes.Name) else None
            if macro is None:
                continue
            for param, arg in zip(macro.args, call.args, strict=False):
                if self.is_content(arg):
                    yield param.name
            params = {param.name for param in macro.args}
            for keyword in call.kwargs:
                if keyword.key in params and self.is_content(keyword.value):
                    yield keyword.key

    def follow(self) -> None:
        while True:
            found = set(self._bindings()) - self.names
            if not found:
                return
            self.names |= found

    def walks_parts(self) -> bool:
        """Whether the template loops over the content, filters it as a list of objects, or reads a part by index."""
        for loop in self.tree.find_all(nodes.For):
            if self.is_content(loop.iter):
                return True
        for applied in self.tree.find_all(nodes.Filter):
            if applied.name in _WALKS_PARTS and applied.node is not None and self.is_content(applied.node):
                return True
        for read in self.tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Call)):
            found = _field(read)
            if found is None:
                continue
            inner, key = found
            if (
                key in _PART_FIELDS
                and isinstance(inner, nodes.Getitem)
                and isinstance(inner.arg, nodes.Const)
                and type(inner.arg.value) is int
                and self.is_content(inner.node)
            ):
                return True
        return False


@lru_cache(maxsize=TEMPLATES_KEPT)
def content_format(source: str) -> ContentFormat:
    """``"parts"`` when the template text walks a message's content as a list of parts, else ``"string"``.

    Decided from the parsed template (see the module's description), once per text. Raises
    :class:`~turnkit.TemplateSyntaxError` when the text is not valid Jinja.
    """
    reader = _Reader(parse_template(source))
    reader.follow()
    return "parts" if reader.walks_parts() else "string"
