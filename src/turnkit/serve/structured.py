"""Constrained decoding by llguidance: ``response_format`` (``json_object``, ``json_schema``) and forced tool calls.

The grammar comes from llguidance and becomes a matcher over the model's own tokenizer; at every step the backend
masks the tokens the matcher does not allow (:class:`JsonConstraint`, the ``constraint`` of a
:class:`~.engines.base.GenerationRequest`). The matcher allows the stop token only once the grammar is complete, so a
reply that ends by itself always parses. JSON is written compactly (no free whitespace), which keeps a small model
from wandering into endless blank space.

* ``response_format``: the reply is JSON of the schema (``{"type": "object"}`` for ``json_object``). A reply cut short
  (``max_tokens``, a stop string) is not JSON: :func:`checked` turns it into a 400 ``incomplete_json`` error rather
  than a 200 with text that does not parse (in a stream, an error event before the end).
* A forced tool call (``tool_choice`` ``required`` or a named function, Anthropic's ``any`` or ``tool``):
  :func:`forced_call` writes the start of the call for the model (the start marker and ``{"name": ``), and the rest
  is decoded under a grammar: one of the offered names, then arguments under *that* tool's JSON schema, then the end
  marker, with every object that names its properties closed to other keys (:func:`strict_objects`, OpenAI's strict
  mode). So a forced call parses and its arguments validate against the schema. Only the tagged-JSON formats
  (``<tool_call>{...}</tool_call>``: ``hermes``, ``qwen3``) have a call to write; any other is a 400.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from turnkit.format import ChatFormat
from turnkit.parse.encodings import encoding_of
from turnkit.parse.formats import Lit
from turnkit.serve.protocol import APIError, ChatInput, ChatRequest

__all__ = ["ForcedCall", "JsonConstraint", "checked", "constraint_for", "forced_call", "strict_objects"]

#: Compact JSON: no whitespace the grammar leaves free (see the module's docstring).
_COMPACT: Any = {"whitespace_flexible": False}

_TOKENIZERS: dict[int, Any] = {}  # id of a tokenizers.Tokenizer -> (that tokenizer, its llguidance tokenizer)
_LOCK = threading.Lock()


def _ll_tokenizer(fmt: ChatFormat) -> Any:
    """The llguidance tokenizer of a format's tokenizer, built once (about a second) and kept."""
    import llguidance

    backend = fmt.tokenizer.backend
    with _LOCK:
        held = _TOKENIZERS.get(id(backend))
        if held is None or held[0] is not backend:
            held = (backend, llguidance.LLTokenizer(backend.to_str(), eos_token=sorted(fmt.stop_ids)))
            _TOKENIZERS[id(backend)] = held
    return held[1]


class JsonConstraint:
    """One reply's grammar matcher: :meth:`mask` sets disallowed logits to ``-inf``, :meth:`consume` advances."""

    def __init__(self, tokenizer: Any, grammar: str, param: str = "response_format") -> None:
        import llguidance

        self.matcher = llguidance.LLMatcher(tokenizer, grammar)
        self.size = tokenizer.vocab_size
        #: llguidance's grammar (an engine that runs its own matcher, as vLLM's engine process, compiles it there)
        self.grammar = grammar
        if self.matcher.is_error():
            raise APIError(400, f"{param}: {self.matcher.get_error()}", param=param)

    def _allowed(self, size: int) -> Any:
        """A boolean array over ``size`` logits: True where the grammar allows the token (rows past the tokenizer's
        vocabulary never are)."""
        import numpy as np

        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self.size].astype(bool)
        keep = np.zeros(size, dtype=bool)
        keep[: min(len(allowed), size)] = allowed[:size]
        return keep

    def mask(self, scores: Any) -> Any:
        """``scores`` (a 1-D torch tensor of logits) with every token the grammar forbids at ``-inf``."""
        import torch

        keep = torch.from_numpy(self._allowed(scores.shape[-1]))
        return scores.masked_fill(~keep.to(scores.device), float("-inf"))

    def mask_array(self, scores: Any) -> Any:
        """The same for a 1-D numpy array of logits (the llama.cpp engine's sampler)."""
        import numpy as np

        return np.where(self._allowed(scores.shape[-1]), scores, -np.inf).astype(scores.dtype, copy=False)

    def consume(self, token_id: int) -> None:
        self.matcher.consume_token(token_id)


@dataclass(frozen=True)
class ForcedCall:
    """A tool call the request forces: ``text`` is its start, written for the model after ``start`` (the format's
    call marker: its token id when it is one token, else its text), and ``grammar`` (llguidance's Lark) what may
    follow: a name offered, that tool's arguments, and the end of the call. Syntaxes other than a JSON object between
    two markers have no grammar here: their start is written (``<tool_call>\n<function=`` for Qwen3-Coder's), and
    the model writes the rest unconstrained."""

    start: int | str
    text: str
    grammar: str | None


def forced_call(fmt: ChatFormat, chat_input: ChatInput) -> ForcedCall | None:
    """The forced call of a request whose ``tool_choice`` is ``required`` or names a function; ``None`` otherwise.

    A tool whose schema llguidance cannot compile is a 400 naming it (checked when the constraint is built)."""
    choice = chat_input.tool_choice
    if not chat_input.offers_tools or choice == "auto":
        return None
    spec = fmt.reply_format
    syntax = spec.tools[0] if spec.tools and spec.channels is None else None
    if (
        syntax is None
        or syntax.block is not None
        or len(syntax.call) != 3
        or not isinstance(syntax.call[0], Lit)
        or not isinstance(syntax.call[2], Lit)
        or not encoding_of(syntax.arguments).holds_name
        or syntax.arguments.name_as_key
    ):  # not a JSON object between a start and an end marker (hermes, qwen3), what the grammar below writes
        opening = syntax.opening(choice["function"]["name"] if isinstance(choice, dict) else None) if syntax else None
        if not opening:  # headed messages, a bare JSON reply: nothing to start the call with
            raise APIError(
                400,
                f"tool_choice {choice!r} is not supported for the {spec.name!r} reply format of this model",
                param="tool_choice",
            )
        return ForcedCall("", opening, None)
    added = fmt.tokenizer.added
    tool_start, tool_end = syntax.call[0].cores[0], syntax.call[2].cores[-1]
    start: int | str = added[tool_start].id if tool_start in added else tool_start
    end = f"<[{added[tool_end].id}]>" if tool_end in added else json.dumps(tool_end)
    key = json.dumps(syntax.arguments.keys[0])
    tools = {t["function"]["name"]: t["function"].get("parameters") for t in chat_input.tools or []}
    tail = f'"}}\\n" {end}'  # the call's closing brace, a newline and the end marker
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        text = f'\n{{"name": {json.dumps(name)}, {key}: '
        grammar = f"start: {_schema(tools[name])} {tail}\n"
    else:  # the name is part of the grammar: each name leads to its own tool's arguments
        text = '\n{"name": "'
        rules = []
        for n, (name, schema) in enumerate(tools.items()):
            rest = json.dumps(f'{name}", {key}: ')  # the name's end and the arguments key, as a Lark string
            rules.append(f"call{n}: {rest} {_schema(schema)} {tail}")
        grammar = "start: " + " | ".join(f"call{n}" for n in range(len(rules))) + "\n" + "\n".join(rules) + "\n"
    return ForcedCall(start, text, grammar)


def _schema(schema: Any) -> str:
    """A tool's parameters as an llguidance ``%json`` item, compact and strict (:func:`strict_objects`); no schema (or
    an empty one) is any object."""
    schema = strict_objects(dict(schema)) if isinstance(schema, dict) and schema else {"type": "object"}
    schema["x-guidance"] = {**schema.get("x-guidance", {}), **_COMPACT}
    return "%json " + json.dumps(schema)


#: Keywords whose value is one subschema, or a list or a map of them, that a forced call's object may be inside.
_ONE, _LISTS, _MAPS = (
    ("items", "additionalItems", "contains", "not", "if", "then", "else"),
    (
        "prefixItems",
        "anyOf",
        "oneOf",
    ),
    ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"),
)


def strict_objects(schema: Any, *, in_all_of: bool = False) -> Any:
    """The schema with every object that names its properties closed to other keys (``additionalProperties: false``
    where it says nothing), as OpenAI's strict mode decodes tools.

    JSON Schema leaves an object open by default, so a grammar from an ordinary tool schema lets the model add keys
    of any shape, and a small model sampled that way runs on (``{"city": "Oslo", "temperature": {"temperature": ...``)
    until the token budget cuts the call. A schema that says ``additionalProperties`` keeps what it says; an object
    with no named properties stays open (it asked for any object); the members of an ``allOf`` stay open, since each
    names only its share of the keys and closing them would allow no object at all.
    """
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _ONE:
        if key in out:
            out[key] = strict_objects(out[key])
    for key in _LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict_objects(item) for item in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [strict_objects(item, in_all_of=True) for item in out["allOf"]]
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: strict_objects(item) for name, item in out[key].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict_objects(out["additionalProperties"])
    names_keys = isinstance(out.get("properties"), dict) and out["properties"]
    if names_keys and not in_all_of and "additionalProperties" not in out and "allOf" not in out:
        out["additionalProperties"] = False
    return out


def constraint_for(fmt: ChatFormat, req: ChatRequest) -> Callable[[], JsonConstraint] | None:
    """A maker of one :class:`JsonConstraint` per choice (for ``response_format``, or a forced tool call), or
    ``None`` for a free reply. A schema llguidance cannot compile is a 400 naming the field. Slow the first time for
    a tokenizer: call it in a thread."""
    forced = forced_call(fmt, req.chat_input)
    if forced is not None and forced.grammar is None:
        forced = None  # a call's start only: the rest is the model's (or response_format's, where given)
    if forced is None and req.response_format is None:
        return None
    import llguidance

    try:
        if forced is not None and forced.grammar is not None:
            param = "tools"
            grammar = llguidance.LLMatcher.grammar_from_lark(forced.grammar)
        else:
            assert req.response_format is not None
            param = "response_format"
            schema = req.response_format.get("schema") if req.response_format["type"] == "json_schema" else None
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema or {"type": "object"}, defaults=_COMPACT)
    except (ValueError, TypeError) as exc:
        raise APIError(400, f"{param}: the JSON schema cannot be used: {exc}", param=param) from None
    tokenizer = _ll_tokenizer(fmt)
    JsonConstraint(tokenizer, grammar, param)  # compile once now: a bad schema is a 400 before anything generates
    return lambda: JsonConstraint(tokenizer, grammar, param)


async def checked(chunks: AsyncGenerator[dict[str, Any], None]) -> AsyncGenerator[dict[str, Any], None]:
    """The chat chunks, unchanged, then a check that every choice's content is whole JSON: a reply cut short is a
    400 ``incomplete_json`` (raised before the usage chunk, so a whole response is never folded from it)."""
    contents: dict[int, list[str]] = {}
    finishes: dict[int, str | None] = {}
    try:
        async for chunk in chunks:
            if not chunk["choices"]:
                for index, parts in sorted(contents.items()):
                    _check_json("".join(parts), finishes.get(index), index)
            for choice in chunk["choices"]:
                contents.setdefault(choice["index"], []).append(choice["delta"].get("content") or "")
                finishes[choice["index"]] = choice["finish_reason"] or finishes.get(choice["index"])
            yield chunk
    finally:
        await chunks.aclose()


def _check_json(text: str, finish: str | None, index: int) -> None:
    try:
        json.loads(text)
    except ValueError:
        why = "max_tokens" if finish == "length" else "a stop string or the end of the reply"
        raise APIError(
            400,
            f"choice {index}: the JSON reply was cut short by {why} before it was complete; raise max_tokens "
            "(the reply would not parse)",
            param="max_tokens" if finish == "length" else "response_format",
            code="incomplete_json",
        ) from None
