"""The engine interface in one import: what an engine is asked and answers (:mod:`.request`), the token stream it
fills (:mod:`.stream`), the admission it may inherit (:mod:`.inbox`), the :class:`Backend` it implements
(:mod:`.backend`), and the scripted :class:`ReplayBackend` (:mod:`.replay`). The real engines are
:class:`turnkit.serve.engines.llama_cpp.LlamaCppBackend` (llama.cpp, for GGUF files),
:class:`turnkit.serve.engines.torch.TorchBackend` (transformers on torch) and
:class:`turnkit.serve.engines.vllm.VllmBackend`.
"""

from turnkit.serve.engines.backend import Backend
from turnkit.serve.engines.inbox import Inbox, InboxFront, Load
from turnkit.serve.engines.replay import ReplayBackend
from turnkit.serve.engines.request import GenerationRequest, TokenConstraint, TokenEvent
from turnkit.serve.engines.stream import Generation, put_all, serving_loop, serving_on

__all__ = [
    "Backend",
    "Generation",
    "GenerationRequest",
    "Inbox",
    "InboxFront",
    "Load",
    "ReplayBackend",
    "TokenConstraint",
    "TokenEvent",
    "put_all",
    "serving_loop",
    "serving_on",
]
