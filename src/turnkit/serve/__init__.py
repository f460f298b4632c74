"""``turnkit serve``: an OpenAI-compatible server that renders exactly as training did.

* :mod:`.backend`: the backend interface (and a replay backend for tests);
* :mod:`.torch_backend`: transformers on torch with dynamic batching;
* :mod:`.protocol`: request checking and OpenAI error objects;
* :mod:`.app`: the HTTP API.
"""

from turnkit.serve.backend import Backend, BackendBusyError, Generation, GenerationRequest, ReplayBackend, TokenEvent

__all__ = ["Backend", "BackendBusyError", "Generation", "GenerationRequest", "ReplayBackend", "TokenEvent"]
