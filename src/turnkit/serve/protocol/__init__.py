"""The wire types every API shares: checked request fields, the one internal request each API translates into, and
the error object. One concept a module:

* :mod:`.apierror`: :class:`APIError`, what every problem with a request becomes (a status, a message naming the
  field, never a 500 or a stack trace), written by each API in its own error shape;
* :mod:`.wording`: :class:`Wording`, how an API names what the one path names in chat completions' words (a
  Responses error names ``input[3]`` and ``max_output_tokens``, not ``messages[2]`` and ``max_tokens``);
* :mod:`.fields`: :class:`Fields`, the per-API table of the top-level fields a body may carry (read, accepted without
  effect, refused; any other is a 400 naming it and the nearest known name), and the readers of one field
  (:func:`read_field`, :func:`read_number` ...), so a field is checked the same way wherever it appears;
* :mod:`.sampling_fields`: the sampling fields every generating API reads (:func:`read_sampling`), and other servers'
  that this one refuses; :mod:`.chat_input`: what a chat prompt is made of (:func:`read_chat_input`);
* :mod:`.requests`: :class:`ChatRequest` and :class:`CompletionRequest`, the requests a
  :class:`~turnkit.serve.session.Session` runs, whichever API they came from;
* :mod:`.builtin_tools`: the providers' built-in tools, left out and named, or refused;
* :mod:`.tokenizing`: ``/tokenize`` and ``/detokenize``.

Each wire API (:mod:`..chat`, :mod:`..completions` ...) reads its body with these readers, so ``/tokenize`` takes
``messages``, ``tools`` and ``chat_template_kwargs`` through the checks chat completions use, and a wrong type can
never reach the encoder. Nothing here imports the rest of the server (``tests/test_architecture.py``); the names are
re-exported here, and the rest of the server imports them from this package.
"""

from turnkit.serve.protocol.apierror import APIError, as_api_error
from turnkit.serve.protocol.builtin_tools import DROPPED_TOOLS_HEADER, BuiltinTools, DroppedTool
from turnkit.serve.protocol.chat_input import (
    CHAT_INPUT_FIELDS,
    CHAT_ROLES,
    TEMPLATE_FIELDS,
    read_chat_input,
    read_reasoning_effort,
    template_fields,
)
from turnkit.serve.protocol.fields import (
    Fields,
    Refusal,
    is_token_ids,
    read_field,
    read_number,
    read_optional_number,
)
from turnkit.serve.protocol.requests import ChatInput, ChatRequest, CompletionRequest, Sampling, Thinking
from turnkit.serve.protocol.sampling_fields import (
    SAMPLING_FIELDS,
    SAMPLING_REFUSALS,
    foreign_samplers,
    read_logit_bias,
    read_response_format,
    read_sampling,
    read_single_reply_sampling,
    sampler_fields,
)
from turnkit.serve.protocol.tokenizing import (
    DETOKENIZE_FIELDS,
    TOKENIZE_FIELDS,
    DetokenizeRequest,
    TokenizeRequest,
    parse_detokenize,
    parse_tokenize,
)
from turnkit.serve.protocol.wording import Wording

__all__ = [
    "CHAT_INPUT_FIELDS",
    "CHAT_ROLES",
    "DETOKENIZE_FIELDS",
    "DROPPED_TOOLS_HEADER",
    "SAMPLING_FIELDS",
    "SAMPLING_REFUSALS",
    "TEMPLATE_FIELDS",
    "TOKENIZE_FIELDS",
    "APIError",
    "BuiltinTools",
    "ChatInput",
    "ChatRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "DroppedTool",
    "Fields",
    "Refusal",
    "Sampling",
    "Thinking",
    "TokenizeRequest",
    "Wording",
    "as_api_error",
    "foreign_samplers",
    "is_token_ids",
    "parse_detokenize",
    "parse_tokenize",
    "read_chat_input",
    "read_field",
    "read_logit_bias",
    "read_number",
    "read_optional_number",
    "read_reasoning_effort",
    "read_response_format",
    "read_sampling",
    "read_single_reply_sampling",
    "sampler_fields",
    "template_fields",
]
