"""Third-party output kept off a user's terminal where it does not help: transformers' progress bars.

Loading a model's weights from disk takes a moment, and its bar ("Loading weights: 100%|████| 272/272") says nothing
a user needs; turnkit prints its own line about what it loads. A step that takes long (dequantizing a GGUF file for
the torch engine) keeps its bar, on a terminal only: a log file or a pipe never gets bars.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["progress_bars"]


@contextmanager
def progress_bars(*, shown: bool) -> Iterator[None]:
    """transformers' progress bars on (``shown`` and stderr is a terminal) or off while the block runs; the setting
    before it is restored after."""
    from transformers.utils import logging as transformers_logging

    before = transformers_logging.is_progress_bar_enabled()
    if shown and sys.stderr.isatty():
        transformers_logging.enable_progress_bar()
    else:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        (transformers_logging.enable_progress_bar if before else transformers_logging.disable_progress_bar)()
