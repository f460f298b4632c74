"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``): a thin translation onto the
one path.

A body is read into the same :class:`~.protocol.ChatRequest` chat completions make: ``system`` becomes a system
message; ``text`` blocks become message text; ``tool_use`` blocks become the assistant's tool calls and
``tool_result`` blocks tool messages; ``thinking`` blocks become the assistant's reasoning; ``tools`` (with
``input_schema``) become function tools, ``tool_choice`` ``any``/``tool`` a forced call (decoded under the tool's
schema), and a conversation that ends with an assistant message is continued (prefill). ``thinking`` and
``output_config.effort`` set the template's thinking switch. The session's steps come back as Anthropic's stream
events (``message_start``, ``content_block_start``/``_delta``/``_stop`` with ``text_delta``, ``thinking_delta`` and
``input_json_delta``, ``message_delta`` with the ``stop_reason`` and usage, ``message_stop``), and a whole message is
those events folded, as the official client folds a stream.

Tool calls are sent when the reply has ended, each as one ``tool_use`` block: its ``input`` must be a JSON object, so
a call is only sent once the parser knows it parsed. A call the model wrote but that did not parse (broken JSON, an
unknown tool) cannot be a ``tool_use`` block; it is sent as the text the model wrote, never dropped.

The body's fields are :data:`FIELDS`: fields that do not change the output (``metadata``, ``cache_control``,
``service_tier``, the ``keep: "all"`` thinking edit of ``context_management`` ...) are accepted; a field that would
change the result and cannot be honoured (an image block, an MCP server ...) is a 400 naming it, and so is a field the
API does not have (``seed``). The tools Anthropic defines (:data:`BUILTIN_TOOLS`: server tools such as
``web_search_20250305``, and client tools whose schema is built into Claude, such as ``bash_20250124``) are left out of
the prompt and named in the reply's ``turnkit_dropped_tools``, or refused with a 400 where the server is told to
(``refuse_builtin``). Errors have Anthropic's shape (:func:`error_body`) and name the body's own
places (``messages[1].content[2].input``), also for errors found once the conversation was translated.

Its rooms: :mod:`.request` (the body's fields, tools, ``tool_choice``, ``thinking`` and ``output_config`` into the
:class:`~turnkit.serve.protocol.ChatRequest`), :mod:`.conversation` (``system`` and the messages' blocks as chat
messages, each with its place in the body), :mod:`.events` (the reply as stream events, and those events folded) and
:mod:`.errors` (the error object). The names are re-exported here: the server imports them from this package.
"""

from turnkit.serve.messages.errors import error_body
from turnkit.serve.messages.events import PING, Event, fold_message, message_events
from turnkit.serve.messages.request import BUILTIN_TOOLS, FIELDS, MessagesRequest, parse_messages

__all__ = [
    "BUILTIN_TOOLS",
    "FIELDS",
    "PING",
    "Event",
    "MessagesRequest",
    "error_body",
    "fold_message",
    "message_events",
    "parse_messages",
]
