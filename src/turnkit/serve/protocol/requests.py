"""The internal requests every API translates into: a :class:`ChatRequest` (its :class:`ChatInput`, the prompt's
makings, and its :class:`Sampling`) or a :class:`CompletionRequest`, whichever API it came from; the requests a
:class:`~turnkit.serve.session.Session` runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnkit.serve.protocol.builtin_tools import DroppedTool
from turnkit.serve.protocol.wording import Wording

__all__ = ["ChatInput", "ChatRequest", "CompletionRequest", "Sampling", "Thinking"]


@dataclass(frozen=True)
class Thinking:
    """What a request asks of the model's reasoning, whatever the API called it: ``enabled`` turns it on or off
    (``None``: the template's default), ``effort`` asks for a level. ``param`` is the request's own field, named in
    errors (``reasoning_effort``, ``reasoning.effort``, ``thinking``). The session sets the template's own switch
    (:mod:`turnkit.template.switches`).

    ``effort_is_hint``: the effort is a hint about the whole reply (Anthropic's ``output_config.effort``), set where
    the template has an effort variable and otherwise left out, never a reason to refuse the request."""

    enabled: bool | None = None
    effort: str | None = None
    param: str = "reasoning_effort"
    effort_is_hint: bool = False


@dataclass
class ChatInput:
    """What a chat prompt is made of: every chat-shaped API and ``/tokenize`` read it with the same checks.

    ``continue_final``: the last message is an assistant message to continue (prefill), not a turn to answer after.

    ``prompt_ids``: chat completions' ``prompt_token_ids``, the prompt as the client's own ids (an agent-RL trajectory:
    turn 1's prompt, the ids the engine sampled, the delta of a tool or user turn). They are the prompt instead of the
    render of ``messages``, which stay the request's context: the checks of roles and tool results, the tools offered
    and the reply parser's tools and reasoning read them as for any chat.
    """

    messages: list[Any] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    family: str | None = None
    continue_final: bool = False
    thinking: Thinking = field(default_factory=Thinking)
    prompt_ids: list[int] | None = None

    @property
    def offers_tools(self) -> bool:
        """Tools are rendered and tool calls parsed unless there are none or ``tool_choice`` is ``none``."""
        return self.tools is not None and self.tool_choice != "none"


@dataclass
class Sampling:
    """What both generating endpoints share. ``samplers``: the samplers the request sets, by name
    (:mod:`turnkit.serve.request_fields`); one it leaves out is the model's default (:mod:`turnkit.serve.sampling`).
    ``logit_bias`` maps token ids to the bias added to their logits; ``stop_token_ids`` (vLLM's field) are more ids
    that end the reply, as the template's own end ids do. ``return_token_ids`` (vLLM's field): the answer
    carries the ids the engine was given (``prompt_token_ids``) and each choice the ids it sampled (``token_ids``), so
    that a trainer takes the very ids the policy produced, never a re-encoding of text."""

    model: str
    max_tokens: int | None
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    samplers: dict[str, float] = field(default_factory=dict)
    n: int = 1
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop_token_ids: list[int] = field(default_factory=list)
    return_token_ids: bool = False

    @property
    def prompt_logprobs(self) -> int | None:
        """How many alternatives to each prompt token's log-probability the request asks for (None: none)."""
        return None

    def asks_for(self, name: str) -> bool:
        """Whether the request sets ``name`` (a sampler, or a field such as ``logit_bias``) to something that changes
        the reply, for the refusal of a field its model's engine cannot honour."""
        return name in self.samplers or getattr(self, name, None) not in (None, {}, [])


@dataclass
class ChatRequest(Sampling):
    chat_input: ChatInput = field(default_factory=ChatInput)
    #: ``None`` for text; else ``{"type": "json_object"}`` or ``{"type": "json_schema", "schema": ..., "name": ...}``
    response_format: dict[str, Any] | None = None
    #: How the API the request came from names its fields, for the errors raised on the one path.
    wording: Wording = field(default_factory=Wording)
    #: Built-in tools the request asked for and the prompt leaves out (chat completions' ``web_search_options``):
    #: named in the response. Responses and Messages keep theirs on their own requests.
    dropped_tools: tuple[DroppedTool, ...] = ()


@dataclass
class CompletionRequest(Sampling):
    prompt: str | list[int] = ""
    echo: bool = False

    @property
    def prompt_logprobs(self) -> int | None:
        """``echo`` with ``logprobs``: the echoed prompt's tokens carry their log-probabilities."""
        return self.top_logprobs if self.logprobs and self.echo else None
