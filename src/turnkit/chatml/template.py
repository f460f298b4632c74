"""The ChatML template that ``add-chatml`` writes into a checkpoint, as ../shared/seeds/000 shows the format.

Every turn is ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` and the generation prompt is ``<|im_start|>assistant\\n``;
nothing else (no BOS, no tool layer). The render equals turnkit's ``chatml`` family for every conversation the family
accepts (tests check it); this copy is written for a checkpoint, so its refusals speak of the checkpoint, not of
families. An optional default system prompt is written when the conversation has no system message first, the way
Qwen2.5's template writes its own.

A base model given ChatML has no tool-call convention yet, so tools and tool calls are refused rather than silently
dropped: a fine-tune that needs tools should train with a template that has one.
"""

from __future__ import annotations

__all__ = ["IM_END", "IM_START", "chatml_template"]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

_BODY = """\
{%- macro text_of(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is not none -%}
        {%- for part in content -%}
            {%- if part.type != 'text' -%}
                {{- raise_exception("this ChatML template renders text parts only, not '" ~ part.type ~ "'") -}}
            {%- endif -%}
            {{- part.text -}}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- raise_exception("this ChatML template has no tool format (added by turnkit add-chatml)") -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.tool_calls -%}
        {{- raise_exception("this ChatML template has no tool-call format (message " ~ loop.index0 ~ ")") -}}
    {%- endif -%}
    {{- '<|im_start|>' ~ message.role ~ '\\n' ~ text_of(message.content) ~ '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""

_HEADER = "{#- ChatML (turnkit add-chatml): <|im_start|>role\\ncontent<|im_end|>\\n per turn -#}\n"


def _literal(text: str) -> str:
    """``text`` as a Jinja string literal: Jinja decodes Python escapes, so escape backslash, quote and controls."""
    named = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    escaped = "".join(named.get(ch) or (ch if ch.isprintable() else f"\\u{ord(ch):04x}") for ch in text)
    return f"'{escaped}'"


def chatml_template(system_prompt: str | None = None) -> str:
    """The ChatML chat template, with ``system_prompt`` as the default system turn when given.

    >>> "<|im_start|>assistant" in chatml_template()
    True
    """
    if not system_prompt:
        return _HEADER + _BODY
    default = (
        "{%- if not messages or messages[0].role != 'system' -%}\n"
        f"    {{{{- '<|im_start|>system\\n' ~ {_literal(system_prompt)} ~ '<|im_end|>\\n' -}}}}\n"
        "{%- endif -%}\n"
    )
    return _HEADER + default + _BODY
