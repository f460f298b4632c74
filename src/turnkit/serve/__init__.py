"""``turnkit serve``: an OpenAI-compatible server that renders exactly as training did.

* :mod:`.backend`: the backend interface (and a replay backend for tests);
* :mod:`.llama_backend`: llama.cpp's kernels with continuous batching, chunked prefill and prefix reuse (the default for
  GGUF files; :mod:`.sampler` samples its logits); :mod:`.torch_backend`: transformers on torch with dynamic batching;
  :mod:`.engines`: which engine loads a model;
* :mod:`.modelspec`, :mod:`.models`: the models a server offers (by name, loaded lazily, least recently used
  unloaded); :mod:`.sampling`: each model's sampling defaults;
* :mod:`.structured`: ``response_format`` by grammar-constrained decoding (llguidance);
* :mod:`.terminal`: ``turnkit generate`` and ``turnkit chat`` on the same sessions;
* :mod:`.protocol`: request checking and OpenAI error objects;
* :mod:`.session`: one request's generation (prompt, backend stream, stream parser, stops, cancellation);
* :mod:`.responses`: the OpenAI response and chunk shapes (a whole response is its chunks folded together);
* :mod:`.routes`: the HTTP API (:class:`~.routes.Server`): routes, the API key, errors as OpenAI error objects;
* :mod:`.ui`: the playground page at ``/`` (``--no-ui`` leaves it out), with :mod:`turnkit.inspect`'s token chips;
* :mod:`.replicas`: ``--ray``, the app as a Ray Serve deployment; it gets a factory and imports nothing of the server.

Layering: ``routes`` -> ``ui``, ``models``, ``structured`` and ``responses`` -> ``session`` -> ``protocol`` and
``backend``; ``terminal`` -> ``models`` and ``session``; nothing imports ``routes`` but the command line, and
``backend`` imports nothing of the server, so an engine needs only that interface.
"""

from turnkit.serve.backend import Backend, BackendBusyError, Generation, GenerationRequest, ReplayBackend, TokenEvent

__all__ = ["Backend", "BackendBusyError", "Generation", "GenerationRequest", "ReplayBackend", "TokenEvent"]
