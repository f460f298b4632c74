"""``turnkit serve``: a server that renders exactly as training did, speaking the APIs clients use.

Its rooms, each a package or module of one concept:

* wire APIs, a module or package each, thin translations onto the one path: :mod:`.chat` (OpenAI Chat Completions),
  :mod:`.completions` (OpenAI Completions), :mod:`.responses` (OpenAI Responses, with its store of responses) and
  :mod:`.messages` (Anthropic Messages), over :mod:`.protocol` (the checked request fields, the internal
  :class:`~.protocol.ChatRequest` every chat-shaped API translates into, the error object) and :mod:`.chunks` (the
  chunk stream the two OpenAI chunk APIs share: a whole response is its chunks folded); each API writes the same
  session steps as its own events and the same :class:`~.protocol.APIError` in its own error shape;
* the one path: :mod:`.session` (one request's generation: prompt from ``ChatFormat.encode`` with prefill and the
  template's thinking switch, the engine's token stream, the stream parser, stops, cancellation), :mod:`.structured`
  (grammars by llguidance: ``response_format``, and forced tool calls under the tool's schema);
* :mod:`.engines`: the engine interface (:mod:`.engines.base`: ``Backend``, ``GenerationRequest``, ``Inbox``), the
  llama.cpp engine (:mod:`.engines.llama_cpp`, with :mod:`.engines.sampler`), the torch engine
  (:mod:`.engines.torch`), and which engine loads a model (one table);
* the models a server offers: :mod:`.modelspec` (``--model``, ``--models``, models files), :mod:`.models` (the
  registry: formats at hand, weights loaded lazily, least recently used unloaded), :mod:`.sampling` (defaults);
* :mod:`.app`: the HTTP app (routes, every request watched for a client that leaves, running and draining with a
  deadline, ``/metrics``, the API key, error objects, body limits, server-sent events, the playground);
* :mod:`.terminal` (``turnkit generate`` and ``chat`` on the same sessions) and :mod:`.replicas` (``--ray``: the app
  as a Ray Serve deployment; it gets a factory and imports nothing of the server).

Layering (``tests/test_architecture.py`` checks it): :mod:`.engines` imports nothing else of the server, so an engine
needs only that interface; :mod:`.protocol` imports nothing of the server; the wire API modules do not import each
other; nothing imports :mod:`.app` but the command line.
"""

from turnkit.errors import BackendBusyError
from turnkit.serve.engines.base import Backend, Generation, GenerationRequest, ReplayBackend, TokenEvent

__all__ = ["Backend", "BackendBusyError", "Generation", "GenerationRequest", "ReplayBackend", "TokenEvent"]
