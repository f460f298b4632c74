"""A griffe extension for the API reference: turnkit's docstrings mark code the reST way (``x``, :class:`~a.b.C`), and
Markdown reads double backticks beside single ones unreliably. Each docstring is rewritten to Markdown's single
backticks before mkdocstrings renders it; a role shows the name it refers to (``~a.b.C`` as ``C``, as Sphinx does)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+?)``")


def _role(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def markdown_code(text: str) -> str:
    """reST inline code and cross-references as Markdown code spans."""
    return _LITERAL.sub(r"`\1`", _ROLE.sub(_role, text))


class RestToMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_code(obj.docstring.value)
