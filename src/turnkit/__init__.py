"""turnkit: chat formatting that is correct by construction, from the training data to the served reply.

The public API:

* :class:`ChatFormat`: a checkpoint's (or a built-in family's) chat format; ``render`` a conversation with it.
* :class:`Message`, :class:`ToolCall`, :class:`FunctionCall`, :class:`TextPart`: typed OpenAI-style messages
  (plain dicts are accepted everywhere too).
* :mod:`turnkit.families`: the built-in families and ``infer``.
* :func:`parse_transcript`: a ChatML transcript back to messages; ``fmt.parse`` / ``fmt.stream_parser`` for replies.
* :class:`Encoding` (from :mod:`turnkit.encode`, imported on first use: numpy and tokenizers are not loaded by a
  plain render), and the warnings an encode may emit: :class:`TrustedDataWarning`, :class:`MissingControlTokenWarning`.
* :func:`add_chatml`: give a base model and its tokenizer the ChatML format (from :mod:`turnkit.chatml`, imported on
  first use).
* The errors, all derived from :class:`TurnkitError` and all defined in :mod:`turnkit.errors`.
"""

from typing import Any

from turnkit import families
from turnkit.errors import (
    APIError,
    BackendBusyError,
    CacheFullError,
    ChatMLError,
    ClusterError,
    DoctorInputError,
    DroppedDataError,
    EmbeddedModelError,
    EmptyMaskError,
    EncodeError,
    EngineError,
    FamilyNotFoundError,
    HistoryRewriteError,
    InputError,
    MessageError,
    MissingControlTokenWarning,
    PrepareError,
    QueueTimeoutError,
    RecordError,
    ReplyParseError,
    ServeConfigError,
    ShuttingDownError,
    TemplateError,
    TemplateLimitError,
    TemplateNotFoundError,
    TemplateSecurityError,
    TemplateSyntaxError,
    TokenizerError,
    ToolSchemaError,
    TrajectoryError,
    TranscriptError,
    TrustedDataWarning,
    TurnkitError,
    UnknownReplyFormatError,
)
from turnkit.format import ChatFormat
from turnkit.messages import FunctionCall, Message, TextPart, ToolCall, normalize_conversation
from turnkit.parse.transcript import parse_transcript
from turnkit.template import RenderLimits, function_schema

__version__ = "0.1.0"

_LAZY = {"Encoding"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import turnkit.encode

        return getattr(turnkit.encode, name)
    if name == "add_chatml":
        from turnkit.chatml import add_chatml

        return add_chatml
    raise AttributeError(f"module 'turnkit' has no attribute {name!r}")


__all__ = [
    "APIError",
    "BackendBusyError",
    "CacheFullError",
    "ChatFormat",
    "ChatMLError",
    "ClusterError",
    "DoctorInputError",
    "DroppedDataError",
    "EmbeddedModelError",
    "EmptyMaskError",
    "EncodeError",
    "Encoding",
    "EngineError",
    "FamilyNotFoundError",
    "FunctionCall",
    "HistoryRewriteError",
    "InputError",
    "Message",
    "MessageError",
    "MissingControlTokenWarning",
    "PrepareError",
    "QueueTimeoutError",
    "RecordError",
    "RenderLimits",
    "ReplyParseError",
    "ServeConfigError",
    "ShuttingDownError",
    "TemplateError",
    "TemplateLimitError",
    "TemplateNotFoundError",
    "TemplateSecurityError",
    "TemplateSyntaxError",
    "TextPart",
    "TokenizerError",
    "ToolCall",
    "ToolSchemaError",
    "TrajectoryError",
    "TranscriptError",
    "TrustedDataWarning",
    "TurnkitError",
    "UnknownReplyFormatError",
    "__version__",
    "add_chatml",
    "families",
    "function_schema",
    "normalize_conversation",
    "parse_transcript",
]
