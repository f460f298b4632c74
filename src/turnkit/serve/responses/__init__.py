"""OpenAI's Responses API (``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``): a thin translation onto the
one path.

A body is read into the same :class:`~.protocol.ChatRequest` chat completions make. ``input`` is a string or a list
of items: messages (``input_text``/``output_text`` parts; ``developer`` is the system role), ``function_call`` and
``reasoning`` items (the assistant's calls and reasoning, merged into one assistant turn as a template expects) and
``function_call_output`` items (tool messages). ``instructions`` is the system message; function ``tools`` (also
inside a ``namespace``), ``tool_choice`` (a forced call is decoded under the tool's schema), ``text.format``
(structured output), ``reasoning.effort`` (the template's thinking switch), ``max_output_tokens`` and the sampling
fields map onto the chat request.

The session's steps come back as the documented stream: ``response.created``, ``response.in_progress``, then per
output item ``response.output_item.added``, its deltas (``response.output_text.delta``,
``response.reasoning_text.delta``, ``response.function_call_arguments.delta``) and their ``.done`` events,
``response.output_item.done``, and ``response.completed`` (or ``response.incomplete`` when ``max_output_tokens`` ran
out; the item it ran out in is then ``incomplete`` too), every event with its ``sequence_number``. The whole response
is the one those events build (:class:`ResponseEvents`), so a streamed and a whole answer cannot disagree.

``store`` (the default) keeps a response and the conversation that led to it in a :class:`ResponseStore` (in memory,
bounded, expiring), so ``previous_response_id`` continues it and ``GET``/``DELETE`` find it; a
``function_call_output`` must answer a ``function_call`` made before it (in ``input`` or the stored conversation).

The body's fields are :data:`FIELDS`: fields that do not change the output (``metadata``, ``prompt_cache_key``,
``client_metadata``, ``include`` of encrypted reasoning, ``user``...) are accepted; a field that would change it and
cannot be honoured (``background``, ``truncation: "auto"``...) is a 400 naming it, and so is a field the API does not
have (``max_tokens``: it is ``max_output_tokens`` here). OpenAI's built-in tools (:data:`BUILTIN_TOOLS`: hosted ones
such as ``web_search``, which Codex offers by default, and the client-run ones its models call in their own format)
are left out of the prompt and named in the response's ``turnkit_dropped_tools``, or refused with a 400 where the
server is told to (``refuse_builtin``). Errors name the body's own places (``input[3]``,
``max_output_tokens``), also for errors found once the input was translated into a chat request.

Its rooms: :mod:`.request` (the body's fields, tools, ``tool_choice``, ``text.format`` and ``reasoning`` into the
:class:`~turnkit.serve.protocol.ChatRequest`), :mod:`.input` (the ``input`` items as chat messages, each with its
place in the body), :mod:`.events` (the response as stream events, and the whole response they build) and
:mod:`.store` (the :class:`ResponseStore`). The names are re-exported here: the server imports them from this package.
"""

from turnkit.serve.responses.events import ResponseEvents
from turnkit.serve.responses.request import BUILTIN_TOOLS, FIELDS, ResponsesRequest, parse_responses
from turnkit.serve.responses.store import ResponseStore, StoredResponse

__all__ = [
    "BUILTIN_TOOLS",
    "FIELDS",
    "ResponseEvents",
    "ResponseStore",
    "ResponsesRequest",
    "StoredResponse",
    "parse_responses",
]
