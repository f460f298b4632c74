"""Everything an encode takes besides the messages, written once.

``ChatFormat.encode``, ``ChatFormat.encode_batch`` and the encoder all take an :class:`EncodeOptions`; their keyword
arguments are turned into one by :meth:`EncodeOptions.from_keywords`, so a new option is added here and nowhere else
(copies of a keyword list drift: an earlier ``encode_batch`` lacked ``documents``, ``attribution`` and
``split_turns``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

__all__ = ["EncodeOptions"]

Tools = Sequence[Mapping[str, Any] | Callable[..., Any]]


@dataclass(frozen=True)
class EncodeOptions:
    """What to render and what to train.

    Attributes:
        tools: Tool schemas (JSON-schema dicts or Python functions) offered in the conversation.
        documents: Retrieval documents, for templates that render them.
        add_generation_prompt: End with the header of a new assistant turn (a serving prompt: nothing is trained).
        continue_final_message: Leave the final message open, so that the model continues it (prefill: a serving
            prompt, nothing is trained); ``True`` continues ``content``, a field name continues that field. Its text
            is data like any other: it is encoded as safely, and cannot open a turn either.
        template_name: A named template of the checkpoint (``tool_use`` is picked when tools are given).
        turns: ``"all"`` assistant turns, the ``"last"`` one, or ``"none"`` (a per-message ``"train": True`` still
            trains that message; ``"train": False`` excludes it).
        train_end_marker: Train the end-of-turn marker (``<|im_end|>``), which is how the model learns to stop.
        masks: ``"auto"`` follows ``{% generation %}`` blocks when the template has them, else the turns;
            ``"turns"`` and ``"generation"`` force one or the other.
        trust_data: Encode control-token strings in data as control tokens. Only for data you wrote yourself; every
            use emits a :class:`~turnkit.encode.TrustedDataWarning`.
        split_turns: One example per trained assistant turn, each holding the conversation up to that turn and
            training only it (for templates that are not prefix-stable).
        allow_dropped: Train an assistant turn even when the template leaves out its tool calls or its whole content
            (by default that raises :class:`~turnkit.errors.DroppedDataError`: the example would teach what is left,
            often an empty reply).
        attribution: Fill ``message_index`` and ``is_data``; a data pipeline that only needs ids and labels skips it
            (they are then all ``-1`` and ``False``).
        template_kwargs: More template variables (``enable_thinking=False``); they override special tokens.
    """

    tools: Tools | None = None
    documents: Sequence[Mapping[str, Any]] | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool | str = False
    template_name: str | None = None
    turns: Literal["all", "last", "none"] = "all"
    train_end_marker: bool = True
    masks: Literal["auto", "turns", "generation"] = "auto"
    trust_data: bool = False
    split_turns: bool = False
    allow_dropped: bool = False
    attribution: bool = True
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.turns not in ("all", "last", "none"):
            raise ValueError(f"turns must be 'all', 'last' or 'none', not {self.turns!r}")
        if self.masks not in ("auto", "turns", "generation"):
            raise ValueError(f"masks must be 'auto', 'turns' or 'generation', not {self.masks!r}")
        if self.continue_final_message and (self.add_generation_prompt or self.split_turns):
            raise ValueError(
                "continue_final_message excludes add_generation_prompt and split_turns: it continues the last "
                "message of one serving prompt"
            )

    @classmethod
    def from_keywords(cls, options: EncodeOptions | None = None, /, **keywords: Any) -> EncodeOptions:
        """``options`` (or the defaults) with keywords applied: a keyword named like a field sets it, any other
        keyword is a template variable (as ``apply_chat_template``'s extra keyword arguments are)."""
        base = options or cls()
        if not keywords:
            return base
        settings = {k: v for k, v in keywords.items() if k in _SETTINGS}
        if len(settings) == len(keywords):  # no template variable: the common call, kept cheap (once a record)
            return replace(base, **settings)
        variables = {k: v for k, v in keywords.items() if k not in _SETTINGS and k != "template_kwargs"}
        variables = {**base.template_kwargs, **dict(keywords.get("template_kwargs") or {}), **variables}
        return replace(base, **settings, template_kwargs=variables)


#: The fields a keyword sets directly (any other keyword is a template variable).
_SETTINGS = frozenset(f.name for f in fields(EncodeOptions)) - {"template_kwargs"}
