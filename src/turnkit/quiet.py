"""Third-party output kept off a user's terminal where it does not help: transformers' progress bars.

Loading a model's weights from disk takes a moment, and its bar ("Loading weights: 100%|████| 272/272") says nothing
a user needs; turnkit prints its own line about what it loads. A step that takes long (dequantizing a GGUF file for
the torch engine) keeps its bar, on a terminal only: a log file or a pipe never gets bars. transformers' switch does
not reach every bar it draws: its GGUF reader calls tqdm itself ("Converting and de-quantizing GGUF tensors..."), so
that module's tqdm is switched with it.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

__all__ = ["progress_bars"]

#: transformers modules that draw bars with their own ``tqdm`` (imported from tqdm), past transformers' switch.
_OWN_TQDM = ("transformers.modeling_gguf_pytorch_utils",)


@contextmanager
def progress_bars(*, shown: bool) -> Iterator[None]:
    """transformers' progress bars on (``shown`` and stderr is a terminal) or off while the block runs; the setting
    before it is restored after."""
    from transformers.utils import logging as transformers_logging

    before = transformers_logging.is_progress_bar_enabled()
    show = shown and sys.stderr.isatty()
    if show:
        transformers_logging.enable_progress_bar()
    else:
        transformers_logging.disable_progress_bar()
    own: list[tuple[ModuleType, Any]] = []
    if not show:
        for name in _OWN_TQDM:
            module = importlib.import_module(name)
            bar = getattr(module, "tqdm", None)
            if bar is not None:
                own.append((module, bar))
                module.tqdm = functools.partial(bar, disable=True)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        (transformers_logging.enable_progress_bar if before else transformers_logging.disable_progress_bar)()
        for module, bar in own:
            module.tqdm = bar  # type: ignore[attr-defined]
