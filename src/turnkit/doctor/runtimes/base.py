"""The one interface every other runtime's renderer has: template text and a context in, text or a named failure out.

A renderer is small on purpose (as httpx's ``BaseTransport``): :meth:`Renderer.render` takes the template text and the
exact context turnkit's reference render gives the template (``messages``, ``tools``, ``add_generation_prompt``,
``bos_token`` ...: built once, by :mod:`turnkit.doctor.runtimes.probes`), and answers with the text or with the
runtime's own error. Whether the runtime is there at all is a separate question (:meth:`Renderer.missing`): a runtime
that is not installed is reported as not checked, never as identical.

Templates are untrusted code. The runtimes here run outside turnkit's sandbox, so each is held to what it can do:
minijinja gets only plain data and a fuel budget; ``@huggingface/jinja`` and llama.cpp's runtime run in child processes
that are killed and restarted when a render passes its time limit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

__all__ = ["RENDER_TIMEOUT_S", "RenderFailure", "Renderer"]

#: How long one render may run in a runtime before it counts as failed (the reference's own limit is of this size).
RENDER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RenderFailure:
    """The runtime refused or failed the render: its own message, as it words it."""

    message: str


class Renderer(ABC):
    """One Jinja runtime other than transformers' that serves chat templates."""

    #: The name ``--runtimes`` picks it by.
    name: str
    #: What runs this runtime, for the report ("llama-server and apps built on llama.cpp").
    served_by: str

    @abstractmethod
    def missing(self) -> str | None:
        """Why this runtime cannot run here (not installed, not built), or None when it can."""

    @abstractmethod
    def version(self) -> str:
        """The runtime's version, as the report and the corpus table print it."""

    @abstractmethod
    def render(self, template: str, context: dict[str, Any]) -> str | RenderFailure:
        """``template`` rendered with ``context`` (the variables the reference render gives the template)."""

    def close(self) -> None:  # noqa: B027 - most runtimes hold nothing
        """Release what the renderer holds (a child process)."""

    def __enter__(self) -> Renderer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
