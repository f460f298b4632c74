"""The sampling fields of a body (the budget, ``n``, stops, the seed, temperature and the other samplers, the
logit bias, ``response_format``), read and checked alike by every generating API; the sampling fields of other servers
(vLLM's, llama.cpp's) this one refuses. The samplers are read as their rows in :mod:`turnkit.serve.request_fields`
declare them: which APIs have each, and the range each API takes.
"""

from __future__ import annotations

from typing import Any

from turnkit.errors import APIError
from turnkit.serve.protocol.fields import Refusal, is_token_ids, read_field, read_optional_number
from turnkit.serve.request_fields import Api, SamplerValues, WireRange, body_fields, foreign_body_fields, samplers

__all__ = [
    "SAMPLING_FIELDS",
    "SAMPLING_REFUSALS",
    "foreign_samplers",
    "read_logit_bias",
    "read_response_format",
    "read_sampling",
    "read_single_reply_sampling",
    "read_stop_token_ids",
    "sampler_fields",
]


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


def sampler_fields(api: Api) -> frozenset[str]:
    """The samplers ``api`` has (its body's names for them)."""
    return frozenset(name for name, row in samplers() if api in row.reads)


def foreign_samplers(api: Api) -> dict[str, None]:
    """The samplers (and the other engine fields of :mod:`~turnkit.serve.request_fields`) other APIs have and ``api``
    has not, for its table's ``foreign``: named as another API's field."""
    names = [name for name, row in samplers() if api not in row.reads]
    return dict.fromkeys([*names, *sorted(foreign_body_fields(api))])


#: The fields :func:`read_sampling` reads (chat completions also read ``max_completion_tokens`` there), with
#: ``return_token_ids`` (vLLM's field), which both OpenAI-style APIs answer alike; they read the samplers and the
#: engine fields declared for them (``logit_bias``, ``stop_token_ids``) alike too.
SAMPLING_FIELDS = (
    frozenset({"model", "max_tokens", "n", "stop", "stream", "stream_options", "seed", "return_token_ids"})
    | sampler_fields("chat")
    | body_fields("chat")
)

_NEUTRAL = SamplerValues()


def _read_sampler(body: dict[str, Any], name: str, wire: WireRange) -> float | None:
    """One sampler as ``wire`` says this API takes it: ``None`` (the model's default) when absent, a 400 naming it
    outside its range, the neutral value for the API's "off"."""
    neutral: float = getattr(_NEUTRAL, name)
    value: float | None
    if wire.integer:
        value = read_field(body, name, int)
        if value is not None and not wire.low <= value <= wire.high:
            raise APIError(400, f"{name} must be {wire.must_be}, got {value}", param=name)
    else:
        value = read_optional_number(body, name, wire.low, wire.high)
        if value is not None and wire.above_low and value == wire.low:
            raise APIError(400, f"{name} must be above {wire.low:g} ({neutral:g} is off)", param=name)
    if value is not None and value == wire.off:
        return neutral
    return value


def read_samplers(body: dict[str, Any], api: Api) -> dict[str, float]:
    """The samplers ``api`` has that the body sets, by name, checked; those it leaves out get the model's
    defaults."""
    values = {}
    for name, row in samplers():
        wire = row.reads.get(api)
        value = None if wire is None else _read_sampler(body, name, wire)
        if value is not None:
            values[name] = value
    return values


#: Sampling fields of servers clients also talk to (vLLM, llama.cpp), with the values that ask for nothing: refused by
#: both OpenAI-style APIs unless declared in :mod:`turnkit.serve.request_fields` (:data:`SAMPLING_REFUSALS`), so a
#: field declared there is read, never refused, without an edit here.
_OTHER_SERVERS: dict[str, Refusal] = {
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
    "include_stop_str_in_output": ("include_stop_str_in_output is not supported", (False,)),
    "skip_special_tokens": ("skip_special_tokens: false is not supported", (True,)),
    "use_beam_search": ("beam search is not supported", (False,)),
    "length_penalty": ("length_penalty (beam search) is not supported", (1, 1.0)),
    "bad_words": ("bad_words is not supported; use logit_bias", ([],)),
    "allowed_token_ids": ("allowed_token_ids is not supported; use logit_bias", ()),
}

#: The sampling fields of other servers that this one refuses: those no row of the request fields declares.
SAMPLING_REFUSALS: dict[str, Refusal] = {
    name: refusal for name, refusal in _OTHER_SERVERS.items() if name not in {declared for declared, _ in samplers()}
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


def read_stop_token_ids(body: dict[str, Any]) -> list[int]:
    """``stop_token_ids`` (vLLM's field): more ids that end the reply, beside the template's own end ids; a list of
    token ids (whether each names a token of the model's vocabulary is checked once the model is known)."""
    value = body.get("stop_token_ids")
    if value is None:
        return []
    if not is_token_ids(value):
        raise APIError(400, "stop_token_ids must be a list of token ids (integers, 0 or more)", param="stop_token_ids")
    return list(dict.fromkeys(value))


def read_sampling(body: dict[str, Any], api: Api) -> dict[str, Any]:
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
    return {
        "model": model,
        "max_tokens": max_tokens,
        "samplers": read_samplers(body, api),
        "n": n,
        "logit_bias": read_logit_bias(body),
        "seed": seed,
        "stop": stops,
        "stop_token_ids": read_stop_token_ids(body),
        "stream": read_field(body, "stream", bool, False),
        "include_usage": include_usage,
        "return_token_ids": read_field(body, "return_token_ids", bool, False),
    }


def read_single_reply_sampling(
    body: dict[str, Any], api: Api, *, max_tokens: int | None, stop: list[str] | None = None
) -> dict[str, Any]:
    """The :class:`Sampling` fields of an API that answers one reply, with usage and no log-probabilities (the
    Responses and Messages APIs): ``model`` (required), the samplers ``api`` has, ``stream``, and what the API read
    under its own names."""
    model = read_field(body, "model", str)
    if model is None:
        raise APIError(400, "model is required", param="model")
    return {
        "model": model,
        "max_tokens": max_tokens,
        "samplers": read_samplers(body, api),
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
