"""``ChatFormat``: one checkpoint's chat format, the object every part of turnkit works from.

A ``ChatFormat`` holds the template(s) of a checkpoint, or of a built-in family, and the special tokens the template
reads. Training data, evaluation and the server all render through the same object, so they cannot drift apart.

>>> from turnkit import ChatFormat
>>> fmt = ChatFormat.from_family("chatml")
>>> fmt.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from turnkit import families
from turnkit.errors import TemplateNotFoundError
from turnkit.families.spec import Family
from turnkit.messages import Conversation
from turnkit.template.render import Rendered, RenderLimits, render_template
from turnkit.template.sandbox import compile_template
from turnkit.template.sources import TemplateSet, load_gguf, load_hf_folder

__all__ = ["ChatFormat"]

Tools = Sequence[Mapping[str, Any] | Callable[..., Any]]


@dataclass(frozen=True)
class ChatFormat:
    """The chat format of a checkpoint or of a built-in family.

    Build one with :meth:`from_pretrained` (a Hugging Face folder or a ``.gguf`` file), :meth:`from_template`
    (template text) or :meth:`from_family` (``chatml``, ``llama3``, ``plain``, ``qwen2.5``).
    """

    templates: TemplateSet
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    family: Family | None = None
    limits: RenderLimits = field(default_factory=RenderLimits)

    # -- construction ---------------------------------------------------------------------------------------------

    @classmethod
    def from_template(
        cls,
        text: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        limits: RenderLimits | None = None,
        **special_tokens: str,
    ) -> ChatFormat:
        """A format from template text. Special tokens given here become template variables (``bos_token`` ...)."""
        if not isinstance(text, str):
            raise TypeError(f"the template must be text, got {type(text).__name__}")
        compile_template(text)  # fail now, with the line number, rather than at the first render
        tokens = {k: v for k, v in {"bos_token": bos_token, "eos_token": eos_token, **special_tokens}.items() if v}
        return cls(TemplateSet({"default": text}), tokens, limits=limits or RenderLimits())

    @classmethod
    def from_pretrained(cls, path: str | Path, *, limits: RenderLimits | None = None) -> ChatFormat:
        """A format from a Hugging Face model folder or a GGUF file, read the way transformers reads it."""
        path = Path(path)
        if path.is_dir():
            templates = load_hf_folder(path)
        elif path.is_file() and path.suffix.lower() == ".gguf":
            templates = load_gguf(path)
        elif path.is_file():
            raise TemplateNotFoundError(f"{path} is neither a model folder nor a .gguf file")
        else:
            raise TemplateNotFoundError(f"{path} does not exist")
        for source in templates.templates.values():
            compile_template(source)
        return cls(templates, dict(templates.special_tokens), limits=limits or RenderLimits())

    @classmethod
    def from_family(cls, family: str | Family, *, limits: RenderLimits | None = None) -> ChatFormat:
        """A format from a built-in family, by name or as a :class:`~turnkit.families.Family`."""
        spec = families.get(family) if isinstance(family, str) else family
        templates = TemplateSet({"default": spec.template}, origin=f"family {spec.name}")
        return cls(templates, dict(spec.special_tokens), family=spec, limits=limits or RenderLimits())

    def with_limits(self, limits: RenderLimits) -> ChatFormat:
        """A copy that renders under other limits (``RenderLimits(timeout_s=None)`` turns the time limit off)."""
        return replace(self, limits=limits)

    # -- what it holds ------------------------------------------------------------------------------------------------

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def template_names(self) -> list[str]:
        return self.templates.names

    def template(self, name: str | None = None, *, tools: object = None) -> str:
        """The template text used for a render with these arguments (selected as transformers selects it)."""
        return self.templates.select(name, tools=tools)[1]

    # -- rendering ----------------------------------------------------------------------------------------------------

    def render(
        self,
        messages: Conversation,
        *,
        tools: Tools | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        template_name: str | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render a conversation to the exact text the template makes (as ``apply_chat_template(tokenize=False)``).

        Args:
            messages: Dicts or :class:`~turnkit.Message` objects; validated, ``None`` values dropped.
            tools: JSON-schema dicts or Python functions (schema from type hints and docstring).
            documents: Retrieval documents, for templates that render them (dicts with ``title`` and ``text``).
            add_generation_prompt: End with the header of a new assistant turn.
            continue_final_message: Leave the last message open so that the model continues it; ``True`` continues
                ``content``, a field name (``"reasoning_content"``) continues that field.
            template_name: Pick a named template of the checkpoint (``tool_use`` is picked when tools are given).
            template_kwargs: More template variables (``enable_thinking=False``, ``date_string=...``); they override
                the special tokens of the same name.

        Raises:
            MessageError: A message is malformed (the error names its index and field).
            TemplateError: The template refused the conversation (``raise_exception``) or failed.
            TemplateSecurityError: The template tried to leave the sandbox.
            TemplateLimitError: The template ran too long or built too much text.
        """
        return self.render_with_spans(
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            template_name=template_name,
            **template_kwargs,
        ).text

    def render_with_spans(
        self,
        messages: Conversation,
        *,
        tools: Tools | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        template_name: str | None = None,
        track_generation: bool = False,
        **template_kwargs: Any,
    ) -> Rendered:
        """Like :meth:`render`, also returning the character spans of ``{% generation %}`` blocks when tracked."""
        _, source = self.templates.select(template_name, tools=tools)
        return render_template(
            source,
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            variables=self.special_tokens,
            limits=self.limits,
            track_generation=track_generation,
            **template_kwargs,
        )

    def __repr__(self) -> str:
        what = f"family={self.family.name!r}" if self.family else f"origin={self.templates.origin!r}"
        return f"ChatFormat({what}, templates={self.template_names})"
