"""Preparing data for a safe render: every added-token string in data is broken, and every data string is tagged.

Safety does not depend on tracking where data ends up. Before the template runs, each added-token string found in
data (message fields, tool-call names, argument keys and values, tool results, tool schemas, documents, template
keyword arguments) has its last character replaced by a Unicode *noncharacter* (U+FDD0...), one per distinct
character. The template therefore cannot output a complete added-token string that came from data: every complete
one in the render was written by the template. After the render the noncharacters are mapped back, and the text
around the broken strings is encoded with added tokens disabled. The same is done for a fragment of a marker (two
characters or more) at either end of a data string, so that data next to template text cannot complete a marker.

Data strings are also tagged with their source (:class:`~turnkit.template.taint.DataStr`), which is what per-token
attribution and loss masks are computed from. A message's fields are tagged apart (:func:`field_source`): the render's
data spans then say which fields of which message the template wrote (:mod:`turnkit.encode.coverage`), before they are
read back as message indices (:func:`message_of`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from turnkit.errors import MessageError, TokenizerError
from turnkit.template.taint import SOURCE_DOCUMENTS, SOURCE_TOOLS, SOURCE_VARIABLES, DataStr
from turnkit.tokenizer import TokenizerBinding

__all__ = ["FIELD_GROUPS", "DataMarker", "Prepared", "field_source", "message_of"]

#: Message fields whose place in a render is told apart, by group (the reasoning fields are aliases of each other);
#: every other field (``name``, ``tool_call_id`` ...) shares one more code.
FIELD_GROUPS: dict[str, tuple[str, ...]] = {
    "content": ("content",),
    "tool_calls": ("tool_calls",),
    "reasoning_content": ("reasoning_content", "thinking", "reasoning"),
}
_FIELD_CODES = {name: code for code, group in enumerate(FIELD_GROUPS.values()) for name in group}
_OTHER_FIELD = len(FIELD_GROUPS)
_CODES_PER_MESSAGE = _OTHER_FIELD + 1


def field_source(index: int, field: str) -> int:
    """The source a render's data spans carry for ``field`` of message ``index``."""
    return index * _CODES_PER_MESSAGE + _FIELD_CODES.get(field, _OTHER_FIELD)


def message_of(source: int) -> int:
    """The message index of a field's source (tools, documents and variables keep their negative sources)."""
    return source // _CODES_PER_MESSAGE if source >= 0 else source


#: The noncharacters of the Basic Multilingual Plane, which Unicode reserves for internal use.
_NONCHARACTERS = [chr(c) for c in range(0xFDD0, 0xFDF0)] + ["\ufffe", "\uffff"]


class _NoncharacterError(Exception):
    """A data string holds a character turnkit reserves; raised without where (the caller knows, and says it)."""


def _noncharacter(where: str) -> MessageError:
    return MessageError(
        f"{where} contains a Unicode noncharacter (U+FDD0-U+FDEF, U+FFFE or U+FFFF), which turnkit reserves for "
        "encoding safely; remove it"
    )


@dataclass
class Prepared:
    """Inputs ready for a provenance render, and how many added-token strings in them were broken."""

    chat: list[dict[str, Any]]
    tools: Any
    documents: Any
    variables: dict[str, Any]
    broken: int


class DataMarker:
    """Breaks added-token strings in data and tags data strings with their source, for one tokenizer."""

    def __init__(self, binding: TokenizerBinding) -> None:
        # Complete markers and marker fragments at the start of data are broken at their last character (the last
        # character of a token); fragments at the end of data at their first (the first character of a token).
        edge_chars = sorted({token[-1] for token in binding.added} | {token[0] for token in binding.added})
        if len(edge_chars) > len(_NONCHARACTERS):
            raise TokenizerError(f"the tokenizer's added tokens start or end in {len(edge_chars)} different characters")
        self._substitute = dict(zip(edge_chars, _NONCHARACTERS, strict=False))
        #: Whether U+FFFE and U+FFFF (the last noncharacters) stay unused, free for the sentinels of spliced renders.
        self.leaves_sentinels_free = len(self._substitute) <= len(_NONCHARACTERS) - 2
        self._restore = str.maketrans({v: k for k, v in self._substitute.items()})
        self._reserved = re.compile("[\ufdd0-\ufdef\ufffe\uffff]")
        self._pattern = binding.added_pattern
        self._heads: set[str] = set()
        self._tails: set[str] = set()
        for token in binding.added:
            for cut in range(2, len(token)):
                self._heads.add(token[:cut])
                self._tails.add(token[-cut:])
        self._longest = max((len(t) for t in binding.added), default=0)
        self._first_chars = sorted({token[0] for token in binding.added})
        self._last_chars = sorted({token[-1] for token in binding.added})
        self.active = bool(binding.added)
        # Text with none of the characters markers start or end with holds no marker and no fragment of one. Looked
        # for with `in` (a memchr) when they are few, as they are for every real tokenizer: a regex class search
        # costs 30x more, on every data string.
        edges = sorted({*self._first_chars, *self._last_chars})
        self._edge_chars = "".join(edges) if len(edges) <= 8 else None
        edge_class = "".join(re.escape(c) for c in edges)
        self._any_edge = re.compile(f"[{edge_class}]") if edge_class else None
        self._tool_cache: dict[tuple[bool, str], tuple[Any, int]] = {}

    def restore(self, text: str) -> str:
        """The render with every broken added-token string made whole again."""
        return text.translate(self._restore)

    def _holds_edge(self, text: str) -> bool:
        """Whether ``text`` holds a character some marker starts or ends with."""
        if self._edge_chars is not None:
            for char in self._edge_chars:  # noqa: SIM110 - a loop: any() of a generator costs 5x more, on every string
                if char in text:
                    return True
            return False
        return self._any_edge is not None and self._any_edge.search(text) is not None

    def _break(self, text: str) -> tuple[str, int]:
        if not self._holds_edge(text):
            return text, 0
        count = 0
        # Every added token starts with one of a few characters ("<", "[" ...): text without any needs no search.
        if any(c in text for c in self._first_chars) and self._pattern.search(text):
            pieces = []
            last = 0
            for match in self._pattern.finditer(text):
                token = match.group(0)
                pieces.append(text[last : match.end() - 1])
                pieces.append(self._substitute[token[-1]])
                last = match.end()
                count += 1
            pieces.append(text[last:])
            text = "".join(pieces)
        text, edges = self._break_edges(text)
        return text, count + edges

    def _break_edges(self, text: str) -> tuple[str, int]:
        """Break a marker fragment (two characters or more) at the end or at the start of the text."""
        broken = 0
        window = self._longest - 1
        tail_start = max(0, len(text) - window)
        tail = text[tail_start:]
        for first in self._first_chars:  # the start of a marker at the end: break its first character
            at = tail.find(first)
            while at != -1:
                if len(tail) - at >= 2 and tail[at:] in self._heads:
                    where = tail_start + at
                    text = text[:where] + self._substitute[text[where]] + text[where + 1 :]
                    broken += 1
                    break
                at = tail.find(first, at + 1)
            if broken:
                break
        head = text[:window]
        for last in self._last_chars:  # the end of a marker at the start: break its last character
            at = head.rfind(last)
            while at != -1:
                if at >= 1 and head[: at + 1] in self._tails:
                    text = text[:at] + self._substitute[text[at]] + text[at + 1 :]
                    return text, broken + 1
                at = head.rfind(last, 0, at)
        return text, broken

    def _mark_text(self, value: str, source: int, counter: list[int]) -> str:
        if not value.isascii() and self._reserved.search(value):
            raise _NoncharacterError
        if self.active:
            value, broken = self._break(value)
            counter[0] += broken
        out = DataStr(value)
        out._spans = ((0, len(value), source),)
        return out

    def _mark(self, value: Any, source: int, counter: list[int]) -> Any:
        kind = type(value)
        if kind is str:
            return self._mark_text(value, source, counter) if value else value
        if kind is dict:
            return {self._mark(k, source, counter): self._mark(v, source, counter) for k, v in value.items()}
        if kind is list or kind is tuple:
            return kind(self._mark(v, source, counter) for v in value)
        return value

    def _tools(self, tools: Any, counter: list[int]) -> Any:
        """Tool schemas, marked once per distinct set: a dataset repeats the same few across many records."""
        key = (self.active, json.dumps(tools, sort_keys=True, default=repr))
        cached = self._tool_cache.get(key)
        if cached is None:
            count = [0]
            cached = (self._mark(tools, SOURCE_TOOLS, count), count[0])
            if len(self._tool_cache) >= 64:
                self._tool_cache.pop(next(iter(self._tool_cache)))
            self._tool_cache[key] = cached
        counter[0] += cached[1]
        return cached[0]

    def prepare(
        self, chat: list[dict[str, Any]], tools: Any, documents: Any, variables: dict[str, Any], *, neutralize: bool
    ) -> Prepared:
        """Mark the data of a normalised conversation (roles are checked words and stay as they are)."""
        counter = [0]
        active = self.active
        self.active = active and neutralize
        mark, mark_text = self._mark, self._mark_text
        try:
            marked_chat = []
            for index, message in enumerate(chat):
                marked = {}
                for key, value in message.items():
                    if key == "role":
                        marked[key] = value
                        continue
                    try:
                        if type(value) is str:
                            marked[key] = mark_text(value, field_source(index, key), counter) if value else value
                        else:
                            marked[key] = mark(value, field_source(index, key), counter)
                    except _NoncharacterError:
                        raise _noncharacter(f"message {index}, field {key!r}") from None
                marked_chat.append(marked)
            try:
                marked_tools = self._tools(tools, counter) if tools else tools
            except _NoncharacterError:
                raise _noncharacter("tools") from None
            try:
                marked_documents = mark(documents, SOURCE_DOCUMENTS, counter)
            except _NoncharacterError:
                raise _noncharacter("documents") from None
            marked_variables = {}
            for name, value in variables.items():
                try:
                    marked_variables[name] = mark(value, SOURCE_VARIABLES, counter)
                except _NoncharacterError:
                    raise _noncharacter(f"template variable {name!r}") from None
        finally:
            self.active = active
        return Prepared(marked_chat, marked_tools, marked_documents, marked_variables, counter[0])
