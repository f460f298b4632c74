"""One request's generation, in three rooms: its prompt, its start, and the generation as it runs.

* :mod:`.prompt`: the prompt ids every chat-shaped API (and ``/tokenize``) encodes with ``ChatFormat.encode``, with
  prefill, the template's thinking switch and the forced start of a tool call; tools a template does not show or whose
  calls cannot be read back are 400s;
* :mod:`.start`: the checks against the context and the engine, the engine's request over the model's sampling
  defaults, ``n`` choices submitted, and admission (a refusal is raised before any byte of a reply);
* :mod:`.generation`: the :class:`Session`, the engine's token stream read by the stream parser, stops and
  cancellation, its :class:`Step` objects, latencies and log line; the :class:`Ledger` of a request's sessions.

Each wire API (:mod:`..chat`, :mod:`..completions` ...) turns a session's steps into its own chunks; a streamed reply
sends those chunks, a whole reply is the chunks folded together. Nothing here knows a wire shape, and no wire API knows
the backend or the parser. The names are re-exported here: the rest of the server imports them from this package.
"""

from turnkit.serve.session.generation import (
    Choices,
    Ledger,
    Session,
    Step,
    Timing,
    TokenLogprob,
    choices_timing,
    engine_error,
    recording,
)
from turnkit.serve.session.prompt import (
    chat_prompt_ids,
    check_tools_readable,
    check_tools_shown,
    forced_call_ids,
    template_variables,
)
from turnkit.serve.session.start import generation_request, start_chat, start_completion

__all__ = [
    "Choices",
    "Ledger",
    "Session",
    "Step",
    "Timing",
    "TokenLogprob",
    "chat_prompt_ids",
    "check_tools_readable",
    "check_tools_shown",
    "choices_timing",
    "engine_error",
    "forced_call_ids",
    "generation_request",
    "recording",
    "start_chat",
    "start_completion",
    "template_variables",
]
