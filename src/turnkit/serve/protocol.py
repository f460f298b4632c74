"""The wire types every API shares: checked request fields, the one internal request each API translates into, and
the error object.

Each wire API (:mod:`.chat`, :mod:`.completions`, and the routes of :mod:`.app`) reads its body with the readers here
(:func:`read_field`, :func:`read_sampling`, :func:`read_chat_input` ...), so a field means the same thing, and is
checked the same way, wherever it appears: ``/tokenize`` takes ``messages``, ``tools`` and ``chat_template_kwargs``
through the checks chat completions use, and a wrong type can never reach the encoder. What a body asks for becomes a
:class:`ChatRequest` or :class:`CompletionRequest`, the requests a :class:`~.session.Session` runs, whichever API it
came from. Every problem becomes an :class:`APIError` with an HTTP status and a message that names the field, never a
500 or a stack trace; each API writes it in its own error shape (OpenAI's ``{"error": {"message", "type", "param",
"code"}}`` by default). Unknown fields are ignored (clients send many); known fields of the wrong type are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from turnkit.errors import TurnkitError

__all__ = [
    "APIError",
    "ChatInput",
    "ChatRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "Sampling",
    "Thinking",
    "TokenizeRequest",
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
    "refuse_unsupported",
]

_KINDS = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


class APIError(Exception):
    """An error answered to the client: a 4xx is the client's ``invalid_request_error`` unless a more precise OpenAI
    type exists (401, 404, 429); a 5xx is a ``server_error``. ``retry_after`` (seconds) goes out as the
    ``Retry-After`` header of a 429 or 503: when a retry is likely to be admitted. ``facts`` are the numbers behind
    the message (``prompt_tokens``, ``context`` ...), for an API whose clients read its own wording of them."""

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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or _KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.retry_after = retry_after
        self.facts = facts or {}

    @property
    def headers(self) -> dict[str, str]:
        """The response headers this error asks for: ``Retry-After`` in whole seconds (at least 1)."""
        return {} if self.retry_after is None else {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def as_api_error(exc: TurnkitError) -> APIError:
    """A 400 for what turnkit refused in a request; ``param`` is the error's location (``messages[i].field``)."""
    return APIError(400, str(exc), param=exc.location)


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


# Fields of OpenAI's API (and of servers clients also talk to) that this server does not implement: a request that
# sets one is refused with a 400 naming it, never answered as if it had been honoured. ``None`` values and the
# values that ask for nothing (``best_of: 1``, ``modalities: ["text"]``) pass.
_UNSUPPORTED: dict[str, str] = {
    "best_of": "best_of is not supported; use n",
    "suffix": "suffix (fill in the middle) is not supported",
    "audio": "audio output is not supported",
    "modalities": "only the text modality is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the legacy functions field is not supported; use tools",
    "function_call": "the legacy function_call field is not supported; use tool_choice",
    "guided_json": "guided_json is not supported; use response_format",
    "guided_regex": "guided_regex is not supported",
    "guided_choice": "guided_choice is not supported",
    "guided_grammar": "guided_grammar is not supported",
    "grammar": "grammar is not supported; use response_format",
    "mirostat": "mirostat sampling is not supported",
    "typical_p": "typical_p sampling is not supported",
}
_HARMLESS = {"best_of": (1,), "modalities": (["text"],), "suffix": ("",)}


def refuse_unsupported(body: dict[str, Any]) -> None:
    """A 400 naming the first field that asks for something this server does not do (:data:`_UNSUPPORTED`)."""
    for name, why in _UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value not in _HARMLESS.get(name, ()):
            raise APIError(400, f"{why} (the request sets {name})", param=name, code="unsupported_parameter")


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
    ``stream_options`` ...), checked; an API with other names maps them before or after calling this."""
    refuse_unsupported(body)
    model = read_field(body, "model", str)
    if model is None:
        raise APIError(400, "model is required", param="model")
    max_tokens = read_field(body, "max_completion_tokens", int, read_field(body, "max_tokens", int))
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
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


def read_chat_input(body: dict[str, Any]) -> ChatInput:
    """``messages``, ``tools``, ``tool_choice``, ``chat_template_kwargs`` and the template override fields, checked
    (the messages themselves are checked where they are rendered, with their index in every error)."""
    messages = read_field(body, "messages", list)
    if not messages:
        raise APIError(400, "messages must be a non-empty list", param="messages")
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


def parse_tokenize(body: dict[str, Any]) -> TokenizeRequest:
    model = read_field(body, "model", str)
    add_generation_prompt = read_field(body, "add_generation_prompt", bool, not body.get("continue_final_message"))
    if "messages" in body:
        return TokenizeRequest(model, chat_input=read_chat_input(body), add_generation_prompt=add_generation_prompt)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise APIError(400, "give 'prompt' (a string) or 'messages' (a list of messages)", param="prompt")
    return TokenizeRequest(model, prompt=prompt)


def parse_detokenize(body: dict[str, Any]) -> DetokenizeRequest:
    tokens = body.get("tokens")
    if not is_token_ids(tokens):
        raise APIError(400, "tokens must be a list of token ids", param="tokens")
    return DetokenizeRequest(read_field(body, "model", str), tokens)
