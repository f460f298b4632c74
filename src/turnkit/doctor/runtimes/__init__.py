"""Other Jinja runtimes that serve a checkpoint's template, and ``turnkit doctor --runtimes``'s comparison with them.

turnkit renders as transformers does (Python's Jinja2, which vLLM and SGLang use too). The same checkpoint is also
served by runtimes with Jinja implementations of their own, each a renderer here behind one interface
(:class:`~turnkit.doctor.runtimes.base.Renderer`):

=============  ==================================================================================================
``llama.cpp``  llama.cpp's ``common/jinja`` (llama-server, llama-cli, apps built on llama.cpp): :mod:`.llama_cpp`
``minijinja``  minijinja in Rust, set up as mistral.rs sets it up (also TGI, Rust gateways): :mod:`.minijinja_runtime`
``hf-jinja``   ``@huggingface/jinja`` in node (transformers.js and apps on it): :mod:`.hfjs`
=============  ==================================================================================================

:mod:`.probes` makes the probe conversations and the exact context the reference render gives the template;
:mod:`.compare` renders them in a runtime and says identical, differs or fails; :mod:`.check` is the doctor check
``runtime-divergence``. ``python -m turnkit.doctor.runtimes setup`` installs ``@huggingface/jinja`` and builds
llama.cpp's runtime into the cache folder (``./dev.sh test`` runs it).
"""

from __future__ import annotations

from collections.abc import Iterable

from turnkit.doctor.runtimes.base import Renderer, RenderFailure
from turnkit.doctor.runtimes.hfjs import HfJinjaRenderer
from turnkit.doctor.runtimes.llama_cpp import LlamaCppRenderer
from turnkit.doctor.runtimes.minijinja_runtime import MinijinjaRenderer
from turnkit.errors import DoctorInputError

__all__ = ["RUNTIMES", "RenderFailure", "Renderer", "renderers"]

#: Every runtime by the name ``--runtimes`` takes, in report order.
RUNTIMES: dict[str, type[Renderer]] = {
    "llama.cpp": LlamaCppRenderer,
    "minijinja": MinijinjaRenderer,
    "hf-jinja": HfJinjaRenderer,
}


def renderers(names: Iterable[str] | None = None) -> list[Renderer]:
    """New renderers for ``names`` (comma-separated items allowed; None or ``all``: every runtime).

    Raises:
        DoctorInputError: A name is no runtime's (the message lists the names).
    """
    wanted = [part.strip() for item in (names or ["all"]) for part in item.split(",") if part.strip()]
    if not wanted or "all" in wanted:
        wanted = list(RUNTIMES)
    unknown = [name for name in wanted if name not in RUNTIMES]
    if unknown:
        raise DoctorInputError(
            f"unknown runtime {', '.join(unknown)} for --runtimes; the runtimes are: {', '.join(RUNTIMES)}"
        )
    return [RUNTIMES[name]() for name in dict.fromkeys(wanted)]
