"""The exceptions turnkit raises.

Every error a user can cause derives from :class:`TurnkitError`, so a server or a data pipeline can catch one type
and turn it into a clear message instead of a stack trace. Each error says *what* is wrong and *where* (message index
and field, template name, file path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from turnkit.parse.reply import Reply


class TurnkitError(Exception):
    """Base class of every error turnkit raises on purpose."""


class MessageError(TurnkitError, ValueError):
    """A message of a conversation is malformed.

    ``index`` is the position of the message in the conversation (``None`` when the conversation itself is wrong)
    and ``field`` the dotted path of the offending field, for example ``tool_calls[0].function.arguments``.
    """

    def __init__(self, reason: str, *, index: int | None = None, field: str | None = None) -> None:
        self.reason = reason
        self.index = index
        self.field = field
        where = []
        if index is not None:
            where.append(f"message {index}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{', '.join(where)}: {reason}" if where else reason)


class TemplateError(TurnkitError):
    """A chat template refused to render, or failed while rendering.

    When the template itself called ``raise_exception(message)`` (for example "Conversation roles must alternate"),
    ``template_message`` holds the template's own words and ``str(error)`` starts with them.
    """

    def __init__(self, message: str, *, template_message: str | None = None, template_name: str | None = None):
        self.template_message = template_message
        self.template_name = template_name
        super().__init__(message)


class TemplateSyntaxError(TemplateError):
    """The template is not valid Jinja (reported with its line number)."""


class TemplateSecurityError(TemplateError):
    """The template tried to leave the sandbox: private attributes, unsafe calls, mutation of inputs."""


class TemplateLimitError(TemplateError):
    """The template ran longer than the time limit, or built more text than the size limit allows."""


class TemplateNotFoundError(TurnkitError, LookupError):
    """No chat template could be found where one was asked for (model folder, GGUF file, template name)."""


class FamilyNotFoundError(TurnkitError, LookupError):
    """No built-in family matches a name or a template. turnkit never falls back to ChatML silently."""


class ToolSchemaError(TurnkitError, ValueError):
    """A tool given as a Python function cannot be turned into a JSON schema (missing type hint or docstring)."""


class ReplyParseError(TurnkitError, ValueError):
    """A reply parsed with ``strict=True`` did not end cleanly: a tool call failed to parse, or the reply was cut off.

    ``reply`` is what lenient parsing makes of it (so the caller can still show or log it), ``call_index`` the
    position of the failed call in ``reply.tool_calls`` (``None`` when the reply itself did not end).
    """

    def __init__(self, reason: str, *, reply: Reply, call_index: int | None = None) -> None:
        self.reason = reason
        self.reply = reply
        self.call_index = call_index
        super().__init__(f"tool call {call_index}: {reason}" if call_index is not None else reason)
