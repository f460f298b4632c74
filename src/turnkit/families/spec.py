"""What a built-in chat family is: a small piece of data, not a subclass.

A family is a Jinja template (rendered by the same sandboxed renderer as any checkpoint's template), the special
tokens it expects, the markers that end a reply, and the clues that identify it from a model name or a template text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources


@dataclass(frozen=True)
class Family:
    """A built-in chat format.

    Attributes:
        name: The family's name (``chatml``, ``llama3``, ``plain``, ``qwen2.5``).
        template_file: The ``.jinja`` file under ``turnkit/families/templates``.
        special_tokens: Template variables such as ``bos_token`` and ``eos_token``.
        stop_tokens: Control tokens that end an assistant reply.
        stop_strings: Text that ends a reply in formats without control tokens.
        reply_format: How replies write reasoning and tool calls (a name in ``turnkit.parse.REPLY_FORMATS``).
        name_patterns: Regular expressions matched (case-insensitively) against model names.
        template_clues: Strings that all appear in a template of this family; the family with the most matching clues
            wins when a template is inferred.
    """

    name: str
    template_file: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    stop_tokens: tuple[str, ...] = ()
    stop_strings: tuple[str, ...] = ()
    reply_format: str = "plain"
    name_patterns: tuple[str, ...] = ()
    template_clues: tuple[str, ...] = ()

    @cached_property
    def template(self) -> str:
        """The family's Jinja template text."""
        return resources.files("turnkit.families").joinpath("templates", self.template_file).read_text("utf-8")

    def matches_name(self, model_name: str) -> bool:
        return any(re.search(p, model_name, re.IGNORECASE) for p in self.name_patterns)

    def clue_score(self, template_text: str) -> int:
        """How many clues the template shows, or 0 unless it shows them all."""
        if not self.template_clues or not all(c in template_text for c in self.template_clues):
            return 0
        return len(self.template_clues)

    def __repr__(self) -> str:
        return f"Family({self.name!r})"
