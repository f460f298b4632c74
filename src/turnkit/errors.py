"""Every error turnkit raises on purpose, in one place.

A server, a data pipeline or a command line catches :class:`TurnkitError` and turns it into a clear message (an
OpenAI error object, a line in ``rejects.jsonl``, one line on stderr) instead of a stack trace. Each error says *what*
is wrong, and :attr:`TurnkitError.location` says *where* in the input (``messages[2].content``), written once here so
that the server's ``param`` and the pipeline's reject ``field`` can never disagree.

The hierarchy::

    TurnkitError
    ├── MessageError (ValueError)            a malformed message or conversation: .index, .field
    ├── TemplateError                        the template refused (raise_exception) or failed
    │   ├── TemplateSyntaxError              not valid Jinja (line number)
    │   ├── TemplateSecurityError            tried to leave the sandbox
    │   └── TemplateLimitError               ran past its time limit or built too much text
    ├── TemplateNotFoundError (LookupError)  no template where one was asked for
    ├── FamilyNotFoundError (LookupError)    no built-in family matches
    ├── ToolSchemaError (ValueError)         a Python function cannot become a tool schema
    ├── TokenizerError                       no tokenizer bound, or one that cannot be used
    ├── EncodeError                          a conversation cannot be encoded as asked
    │   ├── EmptyMaskError                   nothing would be trained
    │   └── DroppedDataError                 the template leaves out a trained turn's data: .index, .field
    ├── TrajectoryError (ValueError)         a trajectory's steps out of order (two replies in a row, no reply yet)
    │   └── HistoryRewriteError              history="refuse": the template rewrote what the engine was given: .index
    ├── ReplyParseError (ValueError)         strict parsing: a reply did not end cleanly: .reply, .call_index
    ├── UnknownReplyFormatError (LookupError)
    ├── TranscriptError (ValueError)         a ChatML transcript is malformed: .line, .column
    ├── RecordError (ValueError)             a dataset record cannot become a conversation: .field
    ├── InputError                           a dataset input cannot be read at all
    ├── PrepareError                         an output folder made with other options, and the like
    ├── EmbeddedModelError                   the embedded model could not be fetched or failed its checksum
    ├── DoctorInputError                     a path doctor cannot audit (no tokenizer, unreadable JSON)
    ├── ChatMLError                          add-chatml cannot convert this base model (or its result failed doctor)
    ├── ServeConfigError (ValueError)        a --model argument, models folder or file, or address that cannot be served
    ├── APIError                             the server's answer to a request it refuses: .status, .param, .code
    ├── EngineError                          a serving engine cannot start or cannot go on (not installed, full cache)
    │   └── CacheFullError                   a running request no longer fits the key/value cache (503)
    ├── BackendBusyError                     the engine cannot take a request now (429): .retry_after
    │   ├── QueueTimeoutError                it waited in the queue past its deadline (503)
    │   └── ShuttingDownError                the server is draining (503)
    ├── EngineReplyError                     an engine's token route failed or answered without ids: .route, .missing
    └── ClusterError                         a Ray cluster cannot be started or joined, or its replicas failed

Beside the tree, and here too so that every exception class turnkit defines has one home:

* warnings: :class:`MissingControlTokenWarning` (a marker the tokenizer lacks, trained as text),
  :class:`TrustedDataWarning` (``trust_data=True`` let control tokens in data through),
  :class:`SpliceMismatchWarning` (a spliced render differed from the template's own: splicing turns itself off);
* the command line's :class:`UsageError` (a flag or an input file; printed as one line);
* :class:`SwitchError` (ValueError): a request set thinking in a way the template's switch cannot (a 400);
* signals between two parts of turnkit that never reach a caller as such: :class:`TemplateRaised` (a template's
  ``raise_exception``, turned into :class:`TemplateError`), :class:`Overrun` (a render past its deadline, turned into
  :class:`TemplateLimitError`), :class:`ValueSyntaxError` and :class:`UnreadableArguments` (arguments text that does
  not read: the call fails with the reason), :class:`NotEvaluated` (a doctor check that cannot run on its target).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jinja2

if TYPE_CHECKING:
    from turnkit.parse.reply import Reply


class TurnkitError(Exception):
    """Base class of every error turnkit raises on purpose."""

    @property
    def location(self) -> str | None:
        """Where in the input the problem is, as a path (``messages[2].tool_calls[0].function.arguments``), or None."""
        return None


class _MessagePlaceError(TurnkitError):
    """An error about one place in a conversation: ``index`` is the position of the message (``None`` when the
    conversation itself is wrong) and ``field`` the dotted path of the field, for example
    ``tool_calls[0].function.arguments``; the message reads ``message 2, field 'content': reason``."""

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

    @property
    def location(self) -> str:
        where = "messages" if self.index is None else f"messages[{self.index}]"
        return f"{where}.{self.field}" if self.field else where


class MessageError(_MessagePlaceError, ValueError):
    """A message of a conversation is malformed (``index`` and ``field`` say where)."""


class TemplateError(TurnkitError):
    """A chat template refused to render, or failed while rendering.

    When the template itself called ``raise_exception(message)`` (for example "Conversation roles must alternate"),
    ``template_message`` holds the template's own words and ``str(error)`` starts with them.
    """

    def __init__(self, message: str, *, template_message: str | None = None) -> None:
        self.template_message = template_message
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


class TokenizerError(TurnkitError):
    """A tokenizer cannot be used (none bound, not a fast tokenizer, missing files, unknown token)."""


class EncodeError(TurnkitError):
    """A conversation cannot be encoded as asked (or an invariant of the encoding failed, which is a bug)."""


class EmptyMaskError(EncodeError):
    """No token would be trained: a training example that teaches nothing is a bug in the data."""


class DroppedDataError(_MessagePlaceError, EncodeError):
    """A trained assistant turn's tool calls or content are not in the render: the template leaves them out, and the
    example would train what is left (often an empty reply). ``index`` and ``field`` say which message and field."""


class TrajectoryError(TurnkitError, ValueError):
    """A trajectory was driven out of order: two replies without messages between them, messages before any reply,
    logprobs that do not match the sampled ids."""


class HistoryRewriteError(_MessagePlaceError, TrajectoryError):
    """``history="refuse"``: once later messages follow, the template renders the conversation the engine was given
    differently (earlier reasoning dropped, a turn written another way); ``index`` is the message rewritten."""


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

    @property
    def location(self) -> str | None:
        return None if self.call_index is None else f"tool_calls[{self.call_index}]"


class UnknownReplyFormatError(TurnkitError, LookupError):
    """No reply format by that name."""


class TranscriptError(TurnkitError, ValueError):
    """A transcript is not well-formed ChatML; ``line`` and ``column`` (1-based) say where."""

    def __init__(self, reason: str, text: str, offset: int) -> None:
        self.reason = reason
        self.offset = offset
        self.line = text.count("\n", 0, offset) + 1
        self.column = offset - (text.rfind("\n", 0, offset) + 1) + 1
        super().__init__(f"line {self.line}, column {self.column}: {reason}")

    @property
    def location(self) -> str:
        return f"line {self.line}, column {self.column}"


class RecordError(TurnkitError, ValueError):
    """A dataset record cannot become a conversation; ``field`` names what is wrong."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field

    @property
    def location(self) -> str | None:
        return self.field


class InputError(TurnkitError):
    """A dataset input cannot be read at all (missing, unknown kind, not a JSON array...)."""


class PrepareError(TurnkitError):
    """The output folder holds shards made with other options, or an input cannot be read."""


class EmbeddedModelError(TurnkitError):
    """The embedded model could not be fetched or failed its checksum."""


class DoctorInputError(TurnkitError):
    """The path given to doctor is not something it can audit (unreadable, not a model, no tokenizer).

    The message is kept to one line (a library's multi-line error text is joined), as the command line prints it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class ChatMLError(TurnkitError):
    """``add-chatml`` cannot give this base model ChatML: no weights or tokenizer, a GGUF file, another chat template
    (without ``force``), an output folder that is not empty, or a result that ``turnkit doctor`` finds errors in."""


class ServeConfigError(TurnkitError, ValueError):
    """A ``--model`` argument, a ``--models`` folder or a models file that cannot be served (says which entry), or an
    address (``--host``, ``--port``) the server cannot listen on."""


class EngineError(TurnkitError):
    """A serving engine cannot start (its library is missing, the model does not load) or cannot go on."""


class CacheFullError(EngineError):
    """A running request cannot continue: the key/value cache cannot hold it even with every other request preempted.
    The client gets this reason (an error naming the cache), never a generic failure."""


class BackendBusyError(TurnkitError):
    """The engine cannot take this request now: every slot and queue place is taken (the server answers 429).
    ``retry_after``: the seconds after which a retry is likely to be admitted (the answer's ``Retry-After``)."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueTimeoutError(BackendBusyError):
    """The request waited in the queue past its deadline without being admitted (503), before any token."""


class ShuttingDownError(BackendBusyError):
    """The server is shutting down: new requests are refused, and requests still running at the drain deadline end
    with this error (503, or an error event in a stream)."""


_API_ERROR_KINDS = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


class APIError(TurnkitError):
    """What the server answers a request it refuses, on every API's one path: every problem with a request becomes
    one, with an HTTP status and a message that names the field, never a 500 or a stack trace. It lives here, beside
    the errors it is made from, because the command line's ``generate`` and ``chat`` catch it as well as the server.

    A 4xx is the client's ``invalid_request_error`` unless a more precise OpenAI type exists (401, 404, 429); a 5xx
    is a ``server_error``. ``retry_after`` (seconds) goes out as the ``Retry-After`` header of a 429 or 503: when a
    retry is likely to be admitted. ``facts`` are the numbers behind the message (``prompt_tokens``, ``context``
    ...), for an API whose clients read its own wording of them. ``reason``: the message without the place it names
    (which the server's wording writes in an API's own words). Each API writes it in its own error shape (OpenAI's
    ``{"error": {"message", "type", "param", "code"}}`` by default)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        retry_after: float | None = None,
        facts: dict[str, int] | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or _API_ERROR_KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.retry_after = retry_after
        self.facts = facts or {}
        self.reason = reason

    @property
    def location(self) -> str | None:
        return self.param

    @property
    def headers(self) -> dict[str, str]:
        """The response headers this error asks for: ``Retry-After`` in whole seconds (at least 1)."""
        return {} if self.retry_after is None else {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class EngineReplyError(TurnkitError):
    """:class:`~turnkit.engine_client.EngineClient`: an engine's token route (``route``, its name and path) answered
    an HTTP error (``status``), could not be reached, or answered without what a trajectory needs: ``missing`` names
    the field (``choices[0].token_ids``), so a client of an engine that lacks ``return_token_ids`` learns which one,
    instead of a trajectory silently built from re-encoded text."""

    def __init__(self, route: str, reason: str, *, status: int | None = None, missing: str | None = None) -> None:
        self.route = route
        self.status = status
        self.missing = missing
        super().__init__(f"{route}: {reason}")


class ClusterError(TurnkitError):
    """``turnkit serve --ray``: Ray is missing, the cluster cannot be started or joined, or the replicas failed."""


# -- beside the tree ----------------------------------------------------------------------------------------------


class MissingControlTokenWarning(UserWarning):
    """The template writes a marker the tokenizer has no token for: it is encoded as text pieces and trained as text.

    Usually the template and the tokenizer come from different checkpoints (``--template`` with another model's
    ``--tokenizer``), or a base model's tokenizer lacks the chat markers (``turnkit add-chatml`` adds them).
    """


class TrustedDataWarning(UserWarning):
    """Emitted whenever ``trust_data=True`` lets control tokens in data through."""


class SpliceMismatchWarning(RuntimeWarning):
    """A spliced render differed from the template's own render (a turnkit bug): splicing is now off."""


class UsageError(Exception):
    """A problem with the command line or its input files (reported without a stack trace)."""


class SwitchError(ValueError):
    """A request asked for thinking to be set in a way this template's switch cannot."""


class TemplateRaised(jinja2.exceptions.TemplateError):
    """What ``raise_exception(message)`` raises inside a template; the renderer turns it into ``TemplateError``."""


class Overrun(BaseException):
    """Raised asynchronously into a thread whose guarded block ran past its deadline.

    It derives from ``BaseException`` so that ``except Exception`` inside the guarded code cannot swallow it.
    """


class ValueSyntaxError(ValueError):
    """Arguments text that does not read in its encoding."""


class UnreadableArguments(ValueSyntaxError):  # noqa: N818 - a signal to the argument reader, never raised to a caller
    """Arguments that are a call's (the tool is known, ``key=value`` pairs are there) but that the text does not
    let be read one way: the call fails with this reason rather than passing for content."""


class NotEvaluated(Exception):  # noqa: N818 - a signal between a check and the runner, not an error
    """Raised by a check that cannot run on this target; ``why`` goes into the report's ``not_evaluated``."""

    def __init__(self, why: str) -> None:
        self.why = why
        super().__init__(why)
