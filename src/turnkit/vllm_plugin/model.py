"""The checkpoint's chat format, once per model folder, for the renderer and the parsers of one vLLM process.

vLLM hands the renderer its model config and each parser only the tokenizer, so both find the format by the folder
the tokenizer was loaded from. What the format says about replies is logged once, at the first use (vLLM builds the
renderer and checks the parsers while it starts): the reply format chosen, and, loudly, a template that writes tool
calls in a syntax nothing reads, whose calls would come back as content.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from turnkit.errors import TurnkitError
from turnkit.format import ChatFormat

__all__ = ["format_for", "format_of_tokenizer"]

log = logging.getLogger("vllm.turnkit")  # under vLLM's logger: its handler writes the lines into its own log


@functools.cache
def format_for(folder: str) -> ChatFormat:
    """The chat format of a Hugging Face model folder (its own template and tokenizer), with its reply format chosen
    and announced."""
    path = Path(folder)
    if not path.is_dir():
        raise TurnkitError(
            f"--tokenizer-mode turnkit reads the chat template and tokenizer from a model folder, and {folder!r} is "
            "not one (download the model first, e.g. hf download REPO --local-dir DIR, and serve DIR)"
        )
    fmt = ChatFormat.from_pretrained(path)
    choice = fmt.reply_choice
    if choice.tools_unreadable:
        log.error(
            "turnkit: %s: the chat template writes tool calls in a syntax no reading follows (%s): the model's calls "
            "come back as content",
            folder,
            choice.format.reason,
        )
    else:
        log.info("turnkit: %s: replies are read as %s (%s)", folder, choice.format.name, choice.format.reason)
    return fmt


def format_of_tokenizer(tokenizer: Any) -> ChatFormat:
    """The format of the folder a vLLM tokenizer was loaded from (its ``name_or_path``), or the one it carries as
    ``turnkit_format`` (a program that builds vLLM's parsers itself, for a format of its own)."""
    carried = getattr(tokenizer, "turnkit_format", None)
    if isinstance(carried, ChatFormat):
        return carried
    folder = getattr(tokenizer, "name_or_path", None)
    if not folder:
        raise TurnkitError(
            "the turnkit parsers need the tokenizer of a model folder: serve with --tokenizer-mode turnkit"
        )
    return format_for(str(folder))
