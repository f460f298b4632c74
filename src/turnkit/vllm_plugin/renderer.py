"""``--tokenizer-mode turnkit``: vLLM's chat prompts encoded by turnkit, from the checkpoint's own template.

vLLM's own renderer (``HfRenderer``) renders the conversation to text with transformers and tokenizes that text with
special tokens parsed, so a marker a user types becomes the marker. :class:`TurnkitRenderer` hands vLLM the ids of
``fmt.encode`` instead (a ``TokensPrompt``, as vLLM's Kimi K3 renderer does): every control token in them was written
by the template, and data that spells a marker stays text. On conversations without such strings the ids are the
ones transformers' ``apply_chat_template(..., tokenize=True)`` gives, so nothing else changes.

vLLM still parses the request, checks it, batches, caches prefixes and detokenizes as ever; completions prompts
(``/v1/completions``) are untouched. The template is the checkpoint's: a ``--chat-template`` or a request's
``chat_template`` is refused, because the parsers read replies by the format chosen from the checkpoint's template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm.renderers.base import BaseRenderer
from vllm.renderers.chat_utils import parse_chat_messages, parse_chat_messages_async
from vllm.renderers.inputs.preprocess import parse_dec_only_prompt
from vllm.utils.async_utils import make_async

from turnkit.encode import EncodeOptions
from turnkit.errors import TurnkitError
from turnkit.format import ChatFormat
from turnkit.vllm_plugin.model import format_for

__all__ = ["TurnkitRenderer", "prompt_ids"]

#: ``chat_template_kwargs`` vLLM fills that are settings of the render, not variables of the template.
_SETTINGS = frozenset(
    {
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "return_dict",
        "chat_template",
    }
)


def prompt_ids(fmt: ChatFormat, messages: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any]) -> list[int]:
    """The prompt ids of a chat request: ``fmt.encode`` with vLLM's ``chat_template_kwargs`` (``tools``,
    ``documents``, ``add_generation_prompt``, ``continue_final_message``; the rest are template variables, those
    vLLM leaves ``None`` left out as transformers' render leaves them undefined)."""
    continued = bool(kwargs.get("continue_final_message"))
    options = EncodeOptions(
        tools=kwargs.get("tools") or None,
        documents=kwargs.get("documents") or None,
        add_generation_prompt=bool(kwargs.get("add_generation_prompt", True)) and not continued,
        continue_final_message=continued,
        turns="none",
        attribution=False,
        template_kwargs={k: v for k, v in kwargs.items() if k not in _SETTINGS and v is not None},
    )
    encoding = fmt.encode(list(messages), options)
    assert not isinstance(encoding, list)  # one encoding: split_turns is off
    return [int(token) for token in encoding.input_ids]


class TurnkitRenderer(BaseRenderer):  # type: ignore[misc]  # vLLM is untyped where mypy runs
    """vLLM's renderer for ``--tokenizer-mode turnkit``: chat messages to turnkit's ids."""

    def __init__(self, config: Any, tokenizer: Any) -> None:
        super().__init__(config, tokenizer)
        self.format = format_for(str(self.model_config.tokenizer))
        self._templates = {self.format.template(name) for name in self.format.template_names}
        self._prompt_ids_async = make_async(self._prompt_ids, executor=self._executor)

    def _prompt_ids(self, messages: list[Any], params: Any) -> list[int]:
        if params.chat_template is not None and params.chat_template not in self._templates:
            raise ValueError(
                "chat_template: --tokenizer-mode turnkit renders with the checkpoint's own template, the one its "
                "replies are read by: put another template into the model folder (chat_template.jinja) rather than "
                "giving --chat-template or a request's chat_template"
            )
        try:
            return prompt_ids(self.format, messages, params.chat_template_kwargs)
        except TurnkitError as exc:  # vLLM answers a ValueError from rendering as a 400
            raise ValueError(str(exc)) from None

    def render_messages(self, messages: list[Any], params: Any) -> tuple[list[Any], Any]:
        conversation, mm_data, _ = parse_chat_messages(
            messages, self.model_config, content_format="string", media_io_kwargs=params.media_io_kwargs
        )
        _refuse_media(mm_data)
        return conversation, parse_dec_only_prompt(self._prompt_ids(messages, params))

    async def render_messages_async(self, messages: list[Any], params: Any) -> tuple[list[Any], Any]:
        conversation, mm_data, _ = await parse_chat_messages_async(
            messages, self.model_config, content_format="string", media_io_kwargs=params.media_io_kwargs
        )
        _refuse_media(mm_data)
        return conversation, parse_dec_only_prompt(await self._prompt_ids_async(messages, params))


def _refuse_media(mm_data: Any) -> None:
    if mm_data:
        raise ValueError(
            f"messages: --tokenizer-mode turnkit encodes text conversations; this one holds {', '.join(mm_data)} "
            "parts (serve a multimodal model without the turnkit tokenizer mode)"
        )
