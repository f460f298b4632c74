"""Built-in chat families, and inference of a family from a model name or a template.

>>> from turnkit import families
>>> families.infer("meta-llama/Llama-3.2-1B-Instruct").name
'llama3'
>>> families.infer("Qwen/Qwen2.5-7B-Instruct").name
'qwen2.5'

When nothing matches, :func:`infer` raises :class:`~turnkit.FamilyNotFoundError`; it never falls back to ChatML
silently (the failure mode of model servers that guess by name).
"""

from __future__ import annotations

from turnkit.errors import FamilyNotFoundError
from turnkit.families.spec import Family

__all__ = ["BUILTIN", "Family", "get", "infer", "names"]

_ROLE_WORDS = r"(?:^|[^a-z0-9])"

#: The built-in families, most specific first: inference tries them in this order.
BUILTIN: tuple[Family, ...] = (
    # ChatML with Qwen's default system prompt and Hermes-style <tool_call> tools (Qwen2.5 instruct)
    Family(
        name="qwen2.5",
        template_file="qwen2.5.jinja",
        special_tokens={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        reply_format="hermes",
        name_patterns=(r"qwen[-_ ]?2[._]5",),
        template_clues=("<|im_start|>", "You are Qwen, created by Alibaba Cloud", "<tool_call>", "<tool_response>"),
    ),
    # Llama 3: <|start_header_id|>role<|end_header_id|>, a blank line, content, <|eot_id|>
    Family(
        name="llama3",
        template_file="llama3.jinja",
        special_tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        stop_tokens=("<|eot_id|>", "<|end_of_text|>"),
        name_patterns=(r"llama[-_ ]?3",),
        template_clues=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    ),
    # ChatML: <|im_start|>role\ncontent<|im_end|>\n, generation prompt <|im_start|>assistant\n
    Family(
        name="chatml",
        template_file="chatml.jinja",
        special_tokens={"eos_token": "<|im_end|>"},
        stop_tokens=("<|im_end|>", "<|im_start|>"),
        name_patterns=(
            r"chatml",
            r"qwen",
            r"smol-?lm",
            r"hermes",
            r"tinyllama",
            r"dolphin",
            _ROLE_WORDS + r"yi[-_ ]",
        ),
        template_clues=("<|im_start|>", "<|im_end|>"),
    ),
    # No markers: 'role: content' lines and 'assistant:' as the generation prompt (base models)
    Family(
        name="plain",
        template_file="plain.jinja",
        stop_strings=("\nuser:",),
        name_patterns=(r"gpt-?2", r"starcoder", r"^plain$"),
    ),
)

_BY_NAME = {family.name: family for family in BUILTIN}


def names() -> list[str]:
    """The names of the built-in families."""
    return [family.name for family in BUILTIN]


def get(name: str) -> Family:
    """The built-in family called ``name`` (``chatml``, ``llama3``, ``plain``, ``qwen2.5``)."""
    try:
        return _BY_NAME[name.lower()]
    except KeyError:
        raise FamilyNotFoundError(f"no built-in family named {name!r}; the families are {names()}") from None


def _looks_like_template(text: str) -> bool:
    return "{{" in text or "{%" in text


def infer(name_or_template: str) -> Family:
    """Pick a family from a family name, a model name, or a chat template's text.

    A model name is matched against each family's name patterns (``Llama-3.2-1B-Instruct`` is ``llama3``, as in
    Shimmy, and ``Qwen2.5-7B`` is ``qwen2.5``). A template is matched on the markers it writes; the family that
    explains the most of them wins. Raises :class:`~turnkit.FamilyNotFoundError` when nothing matches.
    """
    if not isinstance(name_or_template, str) or not name_or_template.strip():
        raise FamilyNotFoundError("give a model name or a chat template to infer a family from")
    if name_or_template.lower() in _BY_NAME:
        return _BY_NAME[name_or_template.lower()]
    if _looks_like_template(name_or_template):
        scored = [(family.clue_score(name_or_template), family) for family in BUILTIN]
        score, best = max(scored, key=lambda pair: pair[0])
        if score:
            return best
        raise FamilyNotFoundError(
            "the template matches none of the built-in families "
            f"{names()}; render it as it is with ChatFormat.from_template instead"
        )
    for family in BUILTIN:
        if family.matches_name(name_or_template):
            return family
    raise FamilyNotFoundError(
        f"cannot tell the chat family of the model name {name_or_template!r}; use its own template "
        f"(ChatFormat.from_pretrained) or name a family: {names()}"
    )
