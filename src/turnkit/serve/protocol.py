"""The wire types every API shares: checked request fields, the one internal request each API translates into, and
the error object.

Each wire API (:mod:`.chat`, :mod:`.completions`, and the routes of :mod:`.app`) reads its body with the readers here
(:func:`read_field`, :func:`read_sampling`, :func:`read_chat_input` ...), so a field means the same thing, and is
checked the same way, wherever it appears: ``/tokenize`` takes ``messages``, ``tools`` and ``chat_template_kwargs``
through the checks chat completions use, and a wrong type can never reach the encoder. What a body asks for becomes a
:class:`ChatRequest` or :class:`CompletionRequest`, the requests a :class:`~.session.Session` runs, whichever API it
came from. Every problem becomes an :class:`APIError` with an HTTP status and a message that names the field, never a
500 or a stack trace; each API writes it in its own error shape (OpenAI's ``{"error": {"message", "type", "param",
"code"}}`` by default) and in its own words (:class:`Wording`: a Responses error names ``input[3]`` and
``max_output_tokens``, not the chat request's ``messages[2]`` and ``max_tokens``).

Each API lists the top-level fields its body may carry in a :class:`Fields` table next to its parser: what it reads,
what real clients send that does not change the reply (accepted without effect), and what it refuses. Any other field
is a 400 naming it and the nearest known name (a misspelt ``max_token`` is never silently the default budget); known
fields of the wrong type are refused.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from turnkit.errors import TurnkitError

__all__ = [
    "CHAT_INPUT_FIELDS",
    "CHAT_ROLES",
    "DROPPED_TOOLS_HEADER",
    "SAMPLING_FIELDS",
    "SAMPLING_REFUSALS",
    "TEMPLATE_FIELDS",
    "APIError",
    "BuiltinTools",
    "ChatInput",
    "ChatRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "DroppedTool",
    "Fields",
    "Sampling",
    "Thinking",
    "TokenizeRequest",
    "Wording",
    "as_api_error",
    "is_token_ids",
    "parse_detokenize",
    "parse_tokenize",
    "read_chat_input",
    "read_field",
    "read_logit_bias",
    "read_number",
    "read_optional_number",
    "read_reasoning_effort",
    "read_response_format",
    "read_sampling",
    "read_single_reply_sampling",
    "template_fields",
]

_KINDS = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


class APIError(Exception):
    """An error answered to the client: a 4xx is the client's ``invalid_request_error`` unless a more precise OpenAI
    type exists (401, 404, 429); a 5xx is a ``server_error``. ``retry_after`` (seconds) goes out as the
    ``Retry-After`` header of a 429 or 503: when a retry is likely to be admitted. ``facts`` are the numbers behind
    the message (``prompt_tokens``, ``context`` ...), for an API whose clients read its own wording of them.
    ``reason``: the message without the place it names (which :class:`Wording` writes in an API's own words)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        retry_after: float | None = None,
        facts: dict[str, int] | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or _KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.retry_after = retry_after
        self.facts = facts or {}
        self.reason = reason

    @property
    def headers(self) -> dict[str, str]:
        """The response headers this error asks for: ``Retry-After`` in whole seconds (at least 1)."""
        return {} if self.retry_after is None else {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def as_api_error(exc: TurnkitError) -> APIError:
    """A 400 for what turnkit refused in a request; ``param`` is the error's location (``messages[i].field``)."""
    reason = getattr(exc, "reason", None)
    return APIError(400, str(exc), param=exc.location, reason=reason if isinstance(reason, str) else None)


# -- an API's own words ------------------------------------------------------------------------------------------------

_MESSAGE_PLACE = re.compile(r"messages\[(\d+)\](.*)")


@dataclass
class Wording:
    """How one API names what the one path names in chat completions' words, so that an error raised past the API's
    parser (rendering, the context check, the grammar, the engine) names the API's own fields.

    ``fields``: chat field to this API's field (Responses: ``max_tokens`` is ``max_output_tokens``, ``messages`` is
    ``input``, ``response_format`` is ``text.format``). ``messages``: for each chat message the API's translation
    made, where its parts came from: ``""`` is the message itself, and longer paths (``.content``,
    ``.tool_calls[0].function.arguments``) name a part that came from elsewhere (the ``arguments`` of a
    ``function_call`` item, the ``input`` of a ``tool_use`` block). A path under a known part keeps its tail where
    that part is an item of a list (``input[3]`` + ``.content``); a message from a field (``instructions``, the
    conversation ``previous_response_id`` names) is that field. The chat API's own wording is the empty one."""

    fields: Mapping[str, str] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)

    @staticmethod
    def call(index: int, where: str, *, arguments: str, name: str) -> dict[str, str]:
        """The places of an assistant message's tool call ``index`` that came from ``where``, whose arguments and
        name the API calls ``arguments`` and ``name`` (paths under ``where``)."""
        call = f".tool_calls[{index}]"
        return {
            call: where,
            f"{call}.function.arguments": f"{where}.{arguments}",
            f"{call}.function.name": f"{where}.{name}",
        }

    def place(self, param: str | None) -> str | None:
        """``param`` in this API's words (unchanged where the API names it the same)."""
        if param is None:
            return None
        match = _MESSAGE_PLACE.fullmatch(param)
        if match is not None and int(match.group(1)) < len(self.messages):
            parts, rest = self.messages[int(match.group(1))], match.group(2)
            known = max((p for p in parts if rest == p or rest.startswith((p + ".", p + "["))), key=len, default=None)
            if known is not None:  # the tail of a list item's path reads the same (input[3].content)
                where = parts[known]
                return where + rest[len(known) :] if where.endswith("]") else where
        head = re.match(r"[a-z_]+", param)
        if head is not None and head.group(0) in self.fields:
            return self.fields[head.group(0)] + param[head.end() :]
        return param

    def reword(self, error: APIError) -> APIError:
        """``error`` naming this API's fields: its ``param``, and its message where that names the place (a
        message's place in front of its reason, or the field the error is about)."""
        param = self.place(error.param)
        if param == error.param:
            return error
        message = error.message
        if error.reason is not None:
            message = f"{param}: {error.reason}"
        elif error.param is not None:
            message = re.sub(rf"(?<![\w.\[]){re.escape(error.param)}(?![\w\[])", param or "", message)
        return APIError(
            error.status,
            message,
            param=param,
            code=error.code,
            kind=error.kind,
            retry_after=error.retry_after,
            facts=error.facts,
            reason=error.reason,
        )


# -- the fields of an API's body ---------------------------------------------------------------------------------------

#: A field an API has that this server does not do: why, and the values that ask for nothing (those pass).
Refusal = tuple[str, tuple[Any, ...]]


@dataclass(frozen=True)
class Fields:
    """The top-level fields one API's body may carry, as data next to its parser (``chat.FIELDS``,
    ``responses.FIELDS`` ...), checked before anything else is read.

    * ``read``: what the parser reads;
    * ``without_effect``: what real clients send and does not change the reply (the OpenAI SDK's and Codex's
      ``store``, ``prompt_cache_key``, ``service_tier`` ...; Claude Code's ``metadata``): accepted, not used;
    * ``refused``: the API's fields this server does not do, a 400 ``unsupported_parameter`` naming the field unless
      the value asks for nothing;
    * ``foreign``: other APIs' fields, with this API's name for the same thing (``stop_sequences`` in chat completions
      is ``stop``), or ``None`` where this API has nothing like it (``seed`` in the Messages API), for the error's
      hint (and so that a near name is not offered for them: ``seed`` is not a misspelt ``speed``).

    Any other field (that is not null) is a 400 ``unknown_parameter`` naming it and the nearest known name, as OpenAI
    answers: a misspelt ``max_token`` is never silently a reply of the default length."""

    api: str
    read: frozenset[str]
    without_effect: frozenset[str] = frozenset()
    refused: Mapping[str, Refusal] = field(default_factory=dict)
    foreign: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def known(self) -> frozenset[str]:
        return self.read | self.without_effect | frozenset(self.refused)

    def check(self, body: dict[str, Any]) -> None:
        """A 400 naming the first field of ``body`` that is unknown, or known and refused."""
        known = self.known
        for name, value in body.items():
            if name in self.refused:
                why, harmless = self.refused[name]
                if value is not None and value not in harmless:
                    raise APIError(400, f"{why} (the request sets {name})", param=name, code="unsupported_parameter")
            elif name not in known and value is not None:
                raise APIError(400, self._unknown(name), param=name, code="unknown_parameter")

    def _unknown(self, name: str) -> str:
        said = f"unknown parameter {name!r}"
        if name in self.foreign:
            ours = self.foreign[name]
            if ours is None:
                return f"{said}: that is another API's field, which the {self.api} API does not have"
            return f"{said}: that is another API's name; in the {self.api} API it is {ours}"
        near = _nearest(name, self.read | self.without_effect)
        if near is not None:
            return f"{said}; did you mean {near!r}?"
        return f"{said}: the {self.api} API has no such field"


def _nearest(name: str, names: frozenset[str]) -> str | None:
    """The known name ``name`` most likely misspells (case and ``-`` aside), or None when none is close."""
    folded = {known.lower().replace("-", "_"): known for known in names}
    key = name.lower().replace("-", "_")
    if key in folded:
        return folded[key]
    close = difflib.get_close_matches(key, sorted(folded), n=1, cutoff=0.75)
    return folded[close[0]] if close else None


# -- built-in tools ----------------------------------------------------------------------------------------------------

#: The response header naming the built-in tools a request offered that were left out of the prompt (their types,
#: comma-separated); absent when none was.
DROPPED_TOOLS_HEADER = "turnkit-dropped-tools"


@dataclass(frozen=True)
class DroppedTool:
    """A built-in tool a request offered and the server left out of the prompt: its ``type``, where the request had
    it (``tools[8]``) and why it cannot be offered. Logged, named in :data:`DROPPED_TOOLS_HEADER`, and listed in the
    response body's ``turnkit_dropped_tools``."""

    type: str
    param: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"type": self.type, "param": self.param, "reason": self.reason}


@dataclass(frozen=True)
class BuiltinTools:
    """The tools an API's provider builds in, which this server cannot offer a model: a model here calls functions,
    described by the request's own schemas. ``hosted``: tool types the provider runs on its own servers (web search,
    file search, code execution, remote MCP ...); ``client``: types the client runs but the provider's models call in
    a format of their own, with no schema in the request (computer use, a shell, a text editor ...). A type matches
    with a version date after it (``web_search_2025_08_26``, ``web_search_20250305``); with ``any_dated``, any dated
    type is the provider's (Anthropic names each of its tools so), listed or not.

    Agents offer them unasked (Codex offers ``web_search`` by default), so by default a request that offers one is
    served without it and the response says so (:class:`DroppedTool`); a server that must not answer without them
    refuses the request instead (``turnkit serve --refuse-builtin-tools``: a 400 naming the tool)."""

    provider: str
    hosted: frozenset[str]
    client: frozenset[str]
    dated: re.Pattern[str]
    any_dated: bool = False

    def reason(self, kind: Any) -> str | None:
        """Why a tool of type ``kind`` cannot be offered, or None when it is not one of the provider's."""
        if not isinstance(kind, str):
            return None
        family = self.dated.sub("", kind)
        if kind in self.hosted or family in self.hosted:
            return f"a hosted tool: {self.provider} runs it on its own servers, and this server has nothing to run it"
        if kind in self.client or family in self.client:
            return (
                f"a tool built into {self.provider}'s models, which call it in a format of their own and not as a "
                "function with a schema: this server offers a model function tools only"
            )
        if self.any_dated and family != kind:
            return f"a tool {self.provider} defines: this server offers a model only tools with their own schema"
        return None

    def leave_out(self, kind: Any, param: str, *, refuse: bool) -> DroppedTool | None:
        """The tool of type ``kind`` at ``param`` left out (None when it is not built in); with ``refuse``, a 400
        naming it instead."""
        reason = self.reason(kind)
        if reason is None:
            return None
        if refuse:
            raise APIError(
                400,
                f"the tool type {kind!r} is not supported: {reason} (this server refuses such requests; without "
                "turnkit serve --refuse-builtin-tools it leaves the tool out and says so)",
                param=f"{param}.type",
                code="unsupported_parameter",
            )
        return DroppedTool(str(kind), param, reason)


def read_field(body: dict[str, Any], name: str, kinds: type | tuple[type, ...], default: Any = None) -> Any:
    """``body[name]`` when it is one of ``kinds`` (a boolean only where ``bool`` is named), ``default`` when absent or
    null; a 400 naming the field otherwise."""
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise APIError(400, f"{name} must be {_describe(kinds)}, not a boolean", param=name)
    if not isinstance(value, kinds):
        raise APIError(400, f"{name} must be {_describe(kinds)}, got {type(value).__name__}", param=name)
    return value


def _describe(kinds: type | tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
    }
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


#: The seeds a request may give: any signed or unsigned 64-bit integer (vLLM's range); the engines draw from it
#: modulo 2**64, and the choices of ``n`` > 1 from the seeds after it (wrapping), so no choice's seed overflows.
_SEED_RANGE = (-(2**63), 2**64 - 1)


def _read_seed(body: dict[str, Any]) -> int | None:
    """``seed`` as the engines take it (0 to 2**64 - 1), read from any 64-bit integer; a 400 naming it outside."""
    seed = read_field(body, "seed", int)
    if seed is None:
        return None
    low, high = _SEED_RANGE
    if not low <= seed <= high:
        raise APIError(400, f"seed must be a 64-bit integer, between {low} and {high}; got {seed}", param="seed")
    return seed % 2**64


def read_number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    """A number between ``low`` and ``high`` (inclusive), ``default`` when absent."""
    value = read_field(body, name, (int, float), default)
    if not low <= value <= high:
        raise APIError(400, f"{name} must be between {low} and {high}, got {value}", param=name)
    return float(value)


def is_token_ids(value: Any) -> TypeGuard[list[int]]:
    """A list of non-negative integers (booleans are not ids)."""
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


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
    """

    messages: list[Any] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    family: str | None = None
    continue_final: bool = False
    thinking: Thinking = field(default_factory=Thinking)

    @property
    def offers_tools(self) -> bool:
        """Tools are rendered and tool calls parsed unless there are none or ``tool_choice`` is ``none``."""
        return self.tools is not None and self.tool_choice != "none"


@dataclass
class Sampling:
    """What both generating endpoints share. A sampling value left ``None`` is the model's default
    (:mod:`.sampling`); ``logit_bias`` maps token ids to the bias added to their logits."""

    model: str
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    n: int = 1
    logit_bias: dict[int, float] = field(default_factory=dict)


@dataclass
class ChatRequest(Sampling):
    chat_input: ChatInput = field(default_factory=ChatInput)
    #: ``None`` for text; else ``{"type": "json_object"}`` or ``{"type": "json_schema", "schema": ..., "name": ...}``
    response_format: dict[str, Any] | None = None
    #: How the API the request came from names its fields, for the errors raised on the one path.
    wording: Wording = field(default_factory=Wording)


@dataclass
class CompletionRequest(Sampling):
    prompt: str | list[int] = ""
    echo: bool = False


@dataclass
class TokenizeRequest:
    """``/tokenize``: a raw ``prompt``, or ``chat_input`` rendered as chat completions would render it."""

    model: str | None
    prompt: str | None = None
    chat_input: ChatInput | None = None
    add_generation_prompt: bool = True


@dataclass
class DetokenizeRequest:
    model: str | None
    tokens: list[int] = field(default_factory=list)


#: The fields :func:`read_sampling` reads (chat completions also read ``max_completion_tokens`` there).
SAMPLING_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "n",
        "stop",
        "stream",
        "stream_options",
        "seed",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
    }
)

#: Sampling fields of servers clients also talk to (vLLM, llama.cpp) that this server does not implement, refused by
#: both OpenAI-style APIs; with the values that ask for nothing.
SAMPLING_REFUSALS: dict[str, Refusal] = {
    "guided_json": ("guided_json is not supported; use response_format", ()),
    "guided_regex": ("guided_regex is not supported", ()),
    "guided_choice": ("guided_choice is not supported", ()),
    "guided_grammar": ("guided_grammar is not supported", ()),
    "structured_outputs": ("structured_outputs is not supported; use response_format", ()),
    "grammar": ("grammar is not supported; use response_format", ()),
    "mirostat": ("mirostat sampling is not supported", (0,)),
    "typical_p": ("typical_p sampling is not supported", (1, 1.0)),
    "min_tokens": ("min_tokens is not supported", (0,)),
    "ignore_eos": ("ignore_eos is not supported: a reply ends at the model's end of turn", (False,)),
    "stop_token_ids": ("stop_token_ids is not supported; use stop", ([],)),
    "include_stop_str_in_output": ("include_stop_str_in_output is not supported", (False,)),
    "skip_special_tokens": ("skip_special_tokens: false is not supported", (True,)),
    "use_beam_search": ("beam search is not supported", (False,)),
    "length_penalty": ("length_penalty (beam search) is not supported", (1, 1.0)),
    "bad_words": ("bad_words is not supported; use logit_bias", ([],)),
    "allowed_token_ids": ("allowed_token_ids is not supported; use logit_bias", ()),
}


def read_logit_bias(body: dict[str, Any]) -> dict[int, float]:
    """``logit_bias``: token ids (as JSON object keys) to a bias from -100 to 100, at most 300 of them."""
    raw = read_field(body, "logit_bias", dict, {})
    if len(raw) > 300:
        raise APIError(400, "logit_bias takes at most 300 tokens", param="logit_bias")
    out = {}
    for key, value in raw.items():
        if not key.isdigit() or len(key) > 9:
            raise APIError(400, f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise APIError(400, f"logit_bias[{key!r}] must be a number from -100 to 100", param="logit_bias")
        out[int(key)] = float(value)
    return out


def read_optional_number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    """A number between ``low`` and ``high``, or ``None`` (the model's default) when absent."""
    return None if body.get(name) is None else read_number(body, name, 0.0, low, high)


def read_sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The :class:`Sampling` fields of an OpenAI-style body (``max_tokens``/``max_completion_tokens``, ``stop``,
    ``stream_options`` ...), checked; an API with other names maps them before or after calling this. The API's
    :class:`Fields` table has been checked first."""
    model = read_field(body, "model", str)
    if model is None:
        raise APIError(400, "model is required", param="model")
    budget = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    read_field(body, "max_tokens", int)
    max_tokens = read_field(body, budget, int)
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"{budget} must be at least 1, got {max_tokens}", param=budget)
    n = read_field(body, "n", int, 1)
    if not 1 <= n <= 16:
        raise APIError(400, f"n must be between 1 and 16, got {n}", param="n")
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = stop
    else:
        raise APIError(400, "stop must be a string or a list of strings", param="stop")
    if len(stops) > 16 or any(not s for s in stops):
        raise APIError(400, "stop takes at most 16 non-empty strings", param="stop")
    options = read_field(body, "stream_options", dict, {})
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise APIError(400, "stream_options.include_usage must be a boolean", param="stream_options")
    seed = _read_seed(body)
    top_k = read_field(body, "top_k", int)
    if top_k is not None and top_k < -1:
        raise APIError(400, f"top_k must be -1 or 0 (off) or a positive number of tokens, got {top_k}", param="top_k")
    repetition_penalty = read_optional_number(body, "repetition_penalty", 0.0, 10.0)
    if repetition_penalty == 0.0:
        raise APIError(400, "repetition_penalty must be above 0 (1 is off)", param="repetition_penalty")
    top_p = read_optional_number(body, "top_p", 0.0, 1.0)
    return {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": read_optional_number(body, "temperature", 0.0, 2.0),
        "top_p": top_p or (None if top_p is None else 1.0),
        "top_k": None if top_k is None else max(top_k, 0),
        "min_p": read_optional_number(body, "min_p", 0.0, 1.0),
        "repetition_penalty": repetition_penalty,
        "presence_penalty": read_optional_number(body, "presence_penalty", -2.0, 2.0),
        "frequency_penalty": read_optional_number(body, "frequency_penalty", -2.0, 2.0),
        "n": n,
        "logit_bias": read_logit_bias(body),
        "seed": seed,
        "stop": stops,
        "stream": read_field(body, "stream", bool, False),
        "include_usage": include_usage,
    }


def read_single_reply_sampling(
    body: dict[str, Any],
    *,
    max_tokens: int | None,
    temperature_max: float,
    stop: list[str] | None = None,
    top_k: int | None = None,
) -> dict[str, Any]:
    """The :class:`Sampling` fields of an API that answers one reply, with usage and no log-probabilities (the
    Responses and Messages APIs): ``model`` (required), ``temperature`` (up to ``temperature_max``), ``top_p``,
    ``stream``, and what the API read under its own names."""
    model = read_field(body, "model", str)
    if model is None:
        raise APIError(400, "model is required", param="model")
    return {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": read_optional_number(body, "temperature", 0.0, temperature_max),
        "top_p": read_optional_number(body, "top_p", 0.0, 1.0),
        "top_k": top_k,
        "seed": None,
        "stop": stop or [],
        "stream": read_field(body, "stream", bool, False),
        "include_usage": True,
        "logprobs": False,
        "top_logprobs": 0,
    }


def read_response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``text`` (or none): ``None``; ``json_object``; ``json_schema`` with its ``schema`` (an object) checked here."""
    value = read_field(body, "response_format", dict)
    if value is None:
        return None
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise APIError(
                400,
                "response_format json_schema needs json_schema: {'name': ..., 'schema': {...}}",
                param="response_format.json_schema",
            )
        return {"type": "json_schema", "name": spec.get("name"), "schema": spec.get("schema", {})}
    raise APIError(
        400,
        f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
        param="response_format.type",
    )


#: turnkit's own fields that pick or feed the template, taken alike by every chat-shaped API (chat completions,
#: Responses, Messages) and ``/tokenize``: ``chat_template`` and ``family`` (where the server allows overrides) and
#: ``chat_template_kwargs``.
TEMPLATE_FIELDS = frozenset({"chat_template", "chat_template_kwargs", "family"})

#: The fields :func:`read_chat_input` reads.
CHAT_INPUT_FIELDS = TEMPLATE_FIELDS | {
    "messages",
    "tools",
    "tool_choice",
    "continue_final_message",
    "add_generation_prompt",
    "reasoning_effort",
}

#: The roles of a chat completions message: OpenAI's, less the legacy ``function`` (its ``functions`` field is not
#: supported either). A template may know other roles, but a client's role goes into the prompt as written: ``bot``
#: would be a turn the model never saw in training, so it is refused as the Responses and Messages APIs refuse theirs.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def template_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The :data:`TEMPLATE_FIELDS` a body sets, for an API that builds its own chat input body."""
    return {name: body[name] for name in TEMPLATE_FIELDS if name in body}


def _check_roles(messages: list[Any]) -> None:
    """Every message's role is one of :data:`CHAT_ROLES` (a message that is not an object, or has no role, is left to
    the message checks, which say so)."""
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if isinstance(role, str) and role not in CHAT_ROLES:
            roles = ", ".join(repr(r) for r in CHAT_ROLES[:-1]) + f" or {CHAT_ROLES[-1]!r}"
            raise APIError(400, f"role must be {roles}, got {role!r}", param=f"messages[{index}].role")


def read_chat_input(body: dict[str, Any]) -> ChatInput:
    """``messages``, ``tools``, ``tool_choice``, ``chat_template_kwargs`` and the template override fields, checked
    (the messages themselves are checked where they are rendered, with their index in every error)."""
    messages = read_field(body, "messages", list)
    if not messages:
        raise APIError(400, "messages must be a non-empty list", param="messages")
    _check_roles(messages)
    tools = read_field(body, "tools", list)
    if tools is not None:
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
                raise APIError(
                    400,
                    f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                    param=f"tools[{index}]",
                )
        tools = tools or None
    tool_choice = body.get("tool_choice", "auto")
    names = [t["function"]["name"] for t in tools or []]
    if tool_choice in ("auto", "none", "required"):
        pass
    elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if name not in names:
            raise APIError(
                400,
                f"tool_choice names the function {name!r}, which is not among the tools {names}",
                param="tool_choice",
            )
    else:
        raise APIError(
            400,
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    if tool_choice == "required" and not tools:
        raise APIError(400, "tool_choice 'required' needs tools", param="tool_choice")
    continue_final = read_field(body, "continue_final_message", bool, False)
    if continue_final and read_field(body, "add_generation_prompt", bool, False):
        raise APIError(
            400,
            "continue_final_message and add_generation_prompt exclude each other: the first continues the last "
            "message, the second opens a new assistant turn",
            param="add_generation_prompt",
        )
    return ChatInput(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        template_kwargs=read_field(body, "chat_template_kwargs", dict, {}),
        chat_template=read_field(body, "chat_template", str),
        family=read_field(body, "family", str),
        continue_final=continue_final,
        thinking=read_reasoning_effort(read_field(body, "reasoning_effort", str), "reasoning_effort"),
    )


def read_reasoning_effort(effort: str | None, param: str) -> Thinking:
    """OpenAI's reasoning effort (``none``, ``minimal``, ``low``, ``medium``, ``high``, ``xhigh``, or a template's
    own level): ``none`` turns thinking off, any other level asks for it (the template's effort variable gets the
    level as given, and checks it itself)."""
    if effort is None:
        return Thinking(param=param)
    if not effort or len(effort) > 32:
        raise APIError(400, f"{param} must be a reasoning level such as 'low', 'medium' or 'high'", param=param)
    if effort == "none":
        return Thinking(enabled=False, param=param)
    return Thinking(effort=effort, param=param)


#: ``/tokenize`` (vLLM's): a raw ``prompt``, or a chat input read as chat completions read it. The rest of a chat or
#: completions body is taken without effect, so that the very body a client will send counts as it will be sent.
TOKENIZE_FIELDS = Fields(
    "/tokenize",
    CHAT_INPUT_FIELDS | {"model", "prompt"},
    without_effect=(SAMPLING_FIELDS - CHAT_INPUT_FIELDS - {"model"})
    | {"max_completion_tokens", "logprobs", "top_logprobs", "response_format", "echo", "user", "metadata", "store"},
)
#: ``/detokenize``.
DETOKENIZE_FIELDS = Fields("/detokenize", frozenset({"model", "tokens"}))


def parse_tokenize(body: dict[str, Any]) -> TokenizeRequest:
    TOKENIZE_FIELDS.check(body)
    model = read_field(body, "model", str)
    add_generation_prompt = read_field(body, "add_generation_prompt", bool, not body.get("continue_final_message"))
    if "messages" in body:
        return TokenizeRequest(model, chat_input=read_chat_input(body), add_generation_prompt=add_generation_prompt)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise APIError(400, "give 'prompt' (a string) or 'messages' (a list of messages)", param="prompt")
    return TokenizeRequest(model, prompt=prompt)


def parse_detokenize(body: dict[str, Any]) -> DetokenizeRequest:
    DETOKENIZE_FIELDS.check(body)
    tokens = body.get("tokens")
    if not is_token_ids(tokens):
        raise APIError(400, "tokens must be a list of token ids", param="tokens")
    return DetokenizeRequest(read_field(body, "model", str), tokens)
