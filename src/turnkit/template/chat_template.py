"""What the layers below :class:`~turnkit.ChatFormat` know of a chat format: a small, frozen, typed description.

The encoder and the reply parser need the template text, its special-token variables, the render limits and what the
format declares about ending a reply. They get exactly that, as a :class:`ChatTemplate` that ``ChatFormat`` builds,
so nothing below ``format.py`` imports or inspects ``ChatFormat`` (or a family spec) and the seam is typed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from turnkit.template.render import Rendered, RenderLimits, render_template
from turnkit.template.sources import TemplateSet

__all__ = ["ChatTemplate"]

Tools = Sequence[Mapping[str, Any] | Callable[..., Any]]


@dataclass(frozen=True)
class ChatTemplate:
    """One format's template(s) and what it declares.

    Attributes:
        templates: The checkpoint's templates (one, or several named ones).
        special_tokens: Template variables such as ``bos_token``; template keyword arguments override them.
        limits: The render limits (time, output size).
        end_markers: Control-token texts the format declares as ending a reply (a family's ``<|im_end|>``); the
            checkpoint's own EOS ids are added from the tokenizer (:class:`turnkit.tokenizer.StopSet`).
        stop_strings: Text that always ends a reply, for formats without control tokens (``plain``: ``"\\nuser:"``).
        reply_format: The reply format the format declares (a family's), or None to infer it from the templates.
    """

    templates: TemplateSet
    special_tokens: Mapping[str, str]
    limits: RenderLimits
    end_markers: tuple[str, ...] = ()
    stop_strings: tuple[str, ...] = ()
    reply_format: str | None = None

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def all_text(self) -> str:
        """Every template's text, joined: what markers are looked for in."""
        return "\n".join(self.templates.templates.values())

    def source(self, name: str | None = None, *, tools: object = None) -> str:
        """The template text a render with these arguments uses (selected as transformers selects it)."""
        return self.templates.select(name, tools=tools)[1]

    def render(
        self,
        messages: Iterable[Any],
        *,
        tools: Tools | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        template_name: str | None = None,
        track_generation: bool = False,
        with_data_spans: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> Rendered:
        """Render through the selected template, with this format's variables and limits."""
        return render_template(
            self.source(template_name, tools=tools),
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            variables=self.special_tokens,
            limits=self.limits,
            track_generation=track_generation,
            with_data_spans=with_data_spans,
            **(template_kwargs or {}),
        )
