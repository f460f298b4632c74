"""OpenAI-style chat messages: typed classes, and the one function that checks and normalises a conversation.

Callers may pass :class:`Message` objects, plain dicts (the OpenAI / transformers shape), pydantic models (the
``openai`` client's message objects) or other dataclasses. :func:`normalize_conversation` turns any of them into the
plain JSON data a chat template sees, exactly as ``transformers.apply_chat_template`` prepares it:

* keys of a message whose value is ``None`` are dropped (``content=None`` on a tool-call turn is common);
* everything is rebuilt from plain JSON types: ``str``/``int`` subclasses (enums) become the base type, numpy scalars
  become Python numbers, and any other object becomes the inert string ``"<TypeName>"``, so a template never gets
  hold of an object with methods;
* ``reasoning_content``, ``thinking`` and ``reasoning`` are aliased onto each other (gpt-oss templates read
  ``thinking``);
* ``content`` sent as a list of parts (``[{"type": "text", "text": "Hi"}]``, as typed OpenAI SDK messages and chat
  UIs send it) is given in the shape the template reads, when the caller says which (``content_format``, decided from
  the template by :func:`turnkit.template.content.content_format`): its text parts joined with ``"\\n"`` for a
  template that reads a string, the parts as sent for one that walks them. A picture, sound, video or file part
  (``image_url``, ``input_audio``, ``file`` ...) is refused wherever token ids are made, since turnkit's models read
  text only; a render passes it on to a template that walks parts, as transformers does.

Along the way every message is validated, and a problem raises :class:`~turnkit.MessageError` naming the message index
and the field. Roles are data too: a role must be a plain lowercase word, so ``"user<|im_end|>"`` or a role with a
newline can never reach a template that writes ``'<|im_start|>' + role``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from turnkit.errors import MessageError

__all__ = [
    "ContentFormat",
    "Conversation",
    "FunctionCall",
    "Message",
    "TextPart",
    "ToolCall",
    "normalize_conversation",
    "plain_data",
]

#: Roles that every OpenAI-style client knows. Other lowercase words are accepted too (templates define their own,
#: such as ``observation`` or ``function``), as long as they match :data:`ROLE_PATTERN`.
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "ipython"})

#: A role is a lowercase word: letters, digits, ``_`` and ``-``, starting with a letter, at most 64 characters.
ROLE_PATTERN = re.compile(r"[a-z][a-z0-9_\-]{0,63}")

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

#: How a template reads ``content``: ``"string"``, text; ``"parts"``, a list of typed parts it walks itself.
ContentFormat: TypeAlias = Literal["string", "parts"]

#: The part types that hold text, and the key their text is under (``refusal``: an assistant's refusal, as the OpenAI
#: API returns it and clients send it back).
TEXT_PARTS = {"text": "text", "refusal": "refusal"}

#: The part types that carry media, OpenAI's and transformers' names: a text model cannot read them.
MEDIA_PARTS = frozenset(
    {
        "image_url",
        "input_image",
        "image",
        "input_audio",
        "audio",
        "audio_url",
        "video",
        "video_url",
        "file",
        "input_file",
    }
)

_STRING_FIELDS = ("tool_call_id", "name", *REASONING_FIELDS)


@dataclass(slots=True)
class TextPart:
    """One text part of a message's ``content`` list (``{"type": "text", "text": ...}``)."""

    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": "text", "text": self.text}


@dataclass(slots=True)
class FunctionCall:
    """The function of a tool call. ``arguments`` is a dict or a JSON string, as the OpenAI API sends it."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(slots=True)
class ToolCall:
    """A tool call of an assistant message, in OpenAI shape."""

    function: FunctionCall
    id: str | None = None
    type: str = "function"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.id is not None:
            out["id"] = self.id
        out["type"] = self.type
        out["function"] = self.function.to_dict()
        return out


@dataclass(slots=True)
class Message:
    """A chat message. Only ``role`` is required; fields left at ``None`` are not shown to the template."""

    role: str
    content: str | list[TextPart | dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The message as an OpenAI-shaped dict, without the fields that are ``None``."""
        out: dict[str, Any] = {"role": self.role}
        if self.content is not None:
            if isinstance(self.content, str):
                out["content"] = self.content
            else:
                out["content"] = [p.to_dict() if isinstance(p, TextPart) else p for p in self.content]
        if self.tool_calls is not None:
            out["tool_calls"] = [c.to_dict() if isinstance(c, ToolCall) else c for c in self.tool_calls]
        for key in ("tool_call_id", "name", "reasoning_content"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """Build a typed message from an OpenAI-shaped dict (validated first)."""
        (plain,) = normalize_conversation([data], alias_reasoning=False)
        content = plain.get("content")
        if isinstance(content, list):
            content = [
                TextPart(p["text"]) if p.get("type") == "text" and set(p) == {"type", "text"} else p for p in content
            ]
        tool_calls = None
        if "tool_calls" in plain:
            tool_calls = []
            for call in plain["tool_calls"]:
                function = call.get("function", call)
                tool_calls.append(
                    ToolCall(
                        FunctionCall(function["name"], function.get("arguments", {})),
                        id=call.get("id"),
                        type=call.get("type", "function"),
                    )
                )
        return cls(
            role=plain["role"],
            content=content,
            tool_calls=tool_calls,
            tool_call_id=plain.get("tool_call_id"),
            name=plain.get("name"),
            reasoning_content=plain.get("reasoning_content"),
        )


Conversation: TypeAlias = Iterable[Message | Mapping[str, Any]]

_EXACT_SCALARS = (str, int, float, bool)


def plain_data(value: Any) -> Any:
    """Rebuild ``value`` from plain JSON types, as transformers does for everything a template can see.

    Templates are untrusted code; an object with methods (a numpy array, an image) could offer a way out of the
    sandbox, so such objects are replaced by the string ``"<TypeName>"``.
    """
    kind = type(value)
    if value is None or kind in _EXACT_SCALARS:
        return value
    if kind is dict:  # the common case, with the common leaves inlined
        return {
            (k if type(k) is str else plain_data(k)): (v if type(v) is str else plain_data(v)) for k, v in value.items()
        }
    if kind is list:
        return [v if type(v) is str else plain_data(v) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if callable(getattr(value, "item", None)) and type(value).__module__ == "numpy":
        return plain_data(value.item())
    if isinstance(value, (Message, ToolCall, FunctionCall, TextPart)):
        return plain_data(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _as_mapping(message: Any, index: int) -> Mapping[str, Any]:
    if isinstance(message, Message):
        return message.to_dict()
    if isinstance(message, Mapping):
        return message
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        return {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    if callable(getattr(message, "model_dump", None)):
        return message.model_dump()
    raise MessageError(
        f"expected a message (a dict with a 'role', or turnkit.Message), got {type(message).__name__}", index=index
    )


_VALID_ROLES: set[str] = set(KNOWN_ROLES)


def _check_role(role: Any, index: int) -> None:
    if isinstance(role, str) and role in _VALID_ROLES:  # a list role is unhashable: no set lookup for it
        return
    if not isinstance(role, str):
        raise MessageError(f"role must be a string, got {type(role).__name__}", index=index, field="role")
    if not ROLE_PATTERN.fullmatch(role):
        raise MessageError(
            f"role {role!r} is not a plain lowercase word (letters, digits, '_' or '-'); roles are data and must not"
            " carry markup or whitespace",
            index=index,
            field="role",
        )
    if len(_VALID_ROLES) < 1024:
        _VALID_ROLES.add(role)


def _dicts(value: Any, index: int, name: str, not_list: str, not_dict: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each entry of the message's list field ``name`` with its place (``name[n]``), for the field's own checks.

    A field that is not a list, or an entry that is not a dict, is a :class:`MessageError` (``not_list`` or
    ``not_dict``, with the type found) naming that place."""
    if not isinstance(value, list | tuple):
        raise MessageError(f"{not_list}, got {type(value).__name__}", index=index, field=name)
    for n, entry in enumerate(value):
        where = f"{name}[{n}]"
        if not isinstance(entry, Mapping):
            raise MessageError(f"{not_dict}, got {type(entry).__name__}", index=index, field=where)
        yield where, entry


def _check_content(content: Any, index: int) -> None:
    if isinstance(content, str):
        return
    not_dict = "a content part must be a dict like {'type': 'text', 'text': ...}"
    for where, part in _dicts(content, index, "content", "content must be a string or a list of parts", not_dict):
        kind = part.get("type")
        if not isinstance(kind, str):
            raise MessageError("a content part needs a string 'type'", index=index, field=f"{where}.type")
        key = TEXT_PARTS.get(kind)
        if key is not None and not isinstance(part.get(key), str):
            raise MessageError(f"a {kind} part needs a string {key!r}", index=index, field=f"{where}.{key}")


def _check_tool_calls(tool_calls: Any, index: int) -> None:
    not_dict = "a tool call must be a dict"
    for where, call in _dicts(tool_calls, index, "tool_calls", "tool_calls must be a list", not_dict):
        for key in ("id", "type"):
            if key in call and call[key] is not None and not isinstance(call[key], str):
                raise MessageError(f"{key} must be a string", index=index, field=f"{where}.{key}")
        if "function" in call:
            function = call["function"]
            where = f"{where}.function"
            if not isinstance(function, Mapping):
                raise MessageError("function must be a dict with 'name' and 'arguments'", index=index, field=where)
        else:
            function = call  # the flat shape {"name": ..., "arguments": ...} that some datasets use
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise MessageError("a tool call needs a non-empty string 'name'", index=index, field=f"{where}.name")
        if "arguments" in function:
            _check_arguments(function["arguments"], index, f"{where}.arguments")


def _check_arguments(arguments: Any, index: int, where: str) -> None:
    if isinstance(arguments, Mapping):
        return
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except ValueError as exc:
            raise MessageError(f"arguments is a string but not valid JSON ({exc})", index=index, field=where) from None
        return
    raise MessageError(
        f"arguments must be a dict or a JSON string, got {type(arguments).__name__}", index=index, field=where
    )


def _check_message(message: Mapping[str, Any], index: int) -> None:
    for key in message:
        if type(key) is not str and not isinstance(key, str):
            raise MessageError(f"message keys must be strings, got {key!r}", index=index)
    if "role" not in message:
        raise MessageError("the message has no 'role'", index=index, field="role")
    _check_role(message["role"], index)
    content = message.get("content")
    if content is not None and type(content) is not str:
        _check_content(content, index)
    if "tool_calls" in message:
        _check_tool_calls(message["tool_calls"], index)
    for key in _STRING_FIELDS:
        if key in message and not isinstance(message[key], str):
            raise MessageError(f"{key} must be a string, got {type(message[key]).__name__}", index=index, field=key)


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    for key in REASONING_FIELDS:
        reasoning = message.get(key)
        if reasoning is not None:
            return {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def _shape_content(
    parts: list[dict[str, Any]] | tuple[dict[str, Any], ...], form: ContentFormat, index: int, *, media: bool
) -> Any:
    """Checked parts in the shape a template reads: their text joined by newlines (``"string"``: any other part is
    refused, there is no text to join it as), or the parts (``"parts"``: a refusal part as a text part, a media part
    refused unless ``media``; other parts, such as GLM's ``tool_reference``, are the template's to read)."""
    for n, part in enumerate(parts):
        kind = part["type"]
        if kind in TEXT_PARTS or (form == "parts" and (media or kind not in MEDIA_PARTS)):
            continue
        if kind in MEDIA_PARTS:
            why = "it reads text only (send {'type': 'text', 'text': ...} parts, or content as a string)"
        else:
            why = "its chat template reads content as a string, and only text parts are joined into it"
        raise MessageError(
            f"a content part of type {kind!r} cannot be given to this model: {why}", index=index, field=f"content[{n}]"
        )
    if form == "string":
        return "\n".join(part[TEXT_PARTS[part["type"]]] for part in parts)
    return [{"type": "text", "text": part["refusal"]} if part["type"] == "refusal" else part for part in parts]


def normalize_conversation(
    messages: Conversation,
    *,
    alias_reasoning: bool = True,
    content_format: ContentFormat | None = None,
    media: bool = False,
) -> list[dict[str, Any]]:
    """Validate a conversation and return it as fresh plain-data dicts, ready for a template.

    ``content_format`` is how the template reads ``content`` (:func:`turnkit.template.content.content_format`): a
    content given as parts becomes their text joined by ``"\\n"`` for ``"string"`` (a part that is not text is
    refused), and stays parts for ``"parts"`` (a picture, sound, video or file part refused unless ``media``: a
    render shows it as transformers does, token ids for a text model cannot hold it). ``None`` leaves parts as they
    are (only checked), for callers that normalise before they know the template.

    The input is never modified. Raises :class:`~turnkit.MessageError` naming the message index and the field.
    """
    if not isinstance(messages, list | tuple) and hasattr(messages, "messages"):
        messages = messages.messages  # a conversation object, as transformers accepts
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise MessageError(f"a conversation must be a list of messages, got {type(messages).__name__}")
    out: list[dict[str, Any]] = []
    for index, raw in enumerate(messages):
        mapping = raw if type(raw) is dict else _as_mapping(raw, index)
        message = {key: value for key, value in mapping.items() if value is not None}
        _check_message(message, index)
        message = plain_data(message)
        if content_format is not None:
            content = message.get("content")
            if content is not None and type(content) is not str:
                message["content"] = _shape_content(content, content_format, index, media=media)
        out.append(_alias_reasoning(message) if alias_reasoning else message)
    if not out:
        raise MessageError("the conversation is empty; give at least one message")
    return out
