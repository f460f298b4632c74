"""Each request field that reaches an engine, declared once: its name in each API, the range each API takes, the
value that changes nothing, and which engines honour it.

A sampler (temperature, top_k ...) is one attribute of :class:`SamplerValues`, and its declaration is that
attribute's :func:`sampler` row. From the rows follow, with nothing spelled again:

* the API field tables (``protocol.sampling_fields``: the fields each API reads, and the other APIs' samplers named
  as foreign where an API has no such field) and the body readers, which check each API's range;
* :class:`~turnkit.serve.engines.base.GenerationRequest`, which is a :class:`SamplerValues`, and a model's sampling
  defaults (``serve.sampling``: the same values; the models file's keys);
* the refusal of a field the model's engine cannot honour (:data:`ENGINE_FIELDS`: a 400 naming the request's own
  field, in the API's own words), and ``/health``'s list of the fields each loaded model's engine honours
  (:func:`honoured_fields`).

A new sampler is one row here and its arithmetic in the engines that honour it (``engines/sampler.py`` for llama.cpp,
``engines/torch.py``); an engine not listed in its row refuses requests that set it. A request field that is not a
sampler (``logit_bias``, ``stop_token_ids``) is an :data:`ENGINE_FIELDS` row: the APIs whose body has it (their field
tables read it, the others name it as another API's field), the engines that honour it; its reader is in
``protocol/sampling_fields.py`` and its value a field of the ``Sampling`` request and of ``GenerationRequest``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Literal, TypeVar

__all__ = [
    "APIS",
    "ENGINE_FIELDS",
    "OPENAI_APIS",
    "EngineField",
    "EngineKind",
    "SamplerRow",
    "SamplerValues",
    "WireRange",
    "body_fields",
    "foreign_body_fields",
    "honoured_fields",
    "samplers",
]

#: The APIs a body arrives in: chat completions, completions, Responses, Anthropic's Messages.
Api = Literal["chat", "completions", "responses", "messages"]
APIS: tuple[Api, ...] = ("chat", "completions", "responses", "messages")

#: The engines, by the name ``--engine`` takes (``replay``: the tests' scripted engine).
EngineKind = Literal["llama.cpp", "torch", "vllm", "replay"]
_EVERY_ENGINE: frozenset[EngineKind] = frozenset({"llama.cpp", "torch", "vllm", "replay"})
#: The engines that run a model: a scripted reply honours no sampler but the temperature and top_p it ignores alike.
_MODEL_ENGINES: frozenset[EngineKind] = frozenset({"llama.cpp", "torch", "vllm"})


@dataclass(frozen=True)
class WireRange:
    """The values one API takes for a sampler: ``low`` to ``high``, whole numbers where ``integer``.

    ``off``: a value the API takes for "off" (vLLM's ``top_k: -1``, OpenAI's ``top_p: 0``), read as the sampler's
    neutral value; ``above_low``: ``low`` itself is refused (``repetition_penalty: 0`` would divide by zero);
    ``must_be``: the refusal's words for a whole-number range, where ``between low and high`` would not say it."""

    low: float
    high: float = math.inf
    integer: bool = False
    off: float | None = None
    above_low: bool = False
    must_be: str | None = None


@dataclass(frozen=True)
class SamplerRow:
    """A sampler's declaration: the range each API that has it takes (an API left out has no such field, and names
    it as another API's), and the engines that honour it (vLLM's under the same name in its ``SamplingParams``)."""

    reads: Mapping[Api, WireRange]
    engines: frozenset[EngineKind] = _MODEL_ENGINES


Number = TypeVar("Number", int, float)


def sampler(neutral: Number, reads: Mapping[Api, WireRange], engines: frozenset[EngineKind] = _MODEL_ENGINES) -> Number:
    """A :class:`SamplerValues` attribute: ``neutral`` (the value that changes nothing, OpenAI's default) and its
    row."""
    return field(default=neutral, metadata={"row": SamplerRow(reads, engines)})


#: The two OpenAI-style APIs, which read the sampling fields alike.
OPENAI_APIS: frozenset[Api] = frozenset({"chat", "completions"})


def _openai(wire: WireRange) -> dict[Api, WireRange]:
    """The range of both OpenAI-style APIs, which read the samplers alike."""
    return {"chat": wire, "completions": wire}


@dataclass(frozen=True, kw_only=True)
class SamplerValues:
    """The samplers' values: what an engine samples with, and a model's defaults for what a request leaves out.
    Each attribute is a sampler's whole declaration (:func:`sampler`); the neutral values change nothing."""

    temperature: float = sampler(
        1.0,
        {**_openai(WireRange(0.0, 2.0)), "responses": WireRange(0.0, 2.0), "messages": WireRange(0.0, 1.0)},
        _EVERY_ENGINE,
    )
    top_p: float = sampler(
        1.0,
        {**_openai(WireRange(0.0, 1.0, off=0.0)), "responses": WireRange(0.0, 1.0), "messages": WireRange(0.0, 1.0)},
        _EVERY_ENGINE,
    )
    top_k: int = sampler(
        0,
        {
            **_openai(WireRange(-1, integer=True, off=-1, must_be="-1 or 0 (off) or a positive number of tokens")),
            "messages": WireRange(0, integer=True, must_be="0 or more"),
        },
    )
    min_p: float = sampler(0.0, _openai(WireRange(0.0, 1.0)))
    repetition_penalty: float = sampler(1.0, _openai(WireRange(0.0, 10.0, above_low=True)))
    presence_penalty: float = sampler(0.0, _openai(WireRange(-2.0, 2.0)))
    frequency_penalty: float = sampler(0.0, _openai(WireRange(-2.0, 2.0)))

    def honoured_by(self, engine: EngineKind) -> dict[str, float]:
        """The samplers ``engine`` honours, by name: vLLM's ``SamplingParams`` takes each under the name declared
        here."""
        return {name: getattr(self, name) for name, row in samplers() if engine in row.engines}


def samplers() -> Iterator[tuple[str, SamplerRow]]:
    """Every sampler's name and row, in declaration order."""
    for each in fields(SamplerValues):
        yield each.name, each.metadata["row"]


@dataclass(frozen=True)
class EngineField:
    """A request field an engine may not honour: ``name`` is the request's own (chat completions') field that asks
    for it, ``param`` the field a refusal names where that is another (``echo``, which asks for the prompt's
    log-probabilities with ``logprobs``; each API's wording renames it: ``response_format`` is the Responses API's
    ``text.format``); ``what``: the refusal's words where the field alone does not say it. ``apis``: the APIs whose
    body carries it under ``name``, read with the sampling fields (the other APIs name it as another API's field);
    none where each API's parser reads it in its own way (samplers have their rows, ``response_format`` its API's
    shape)."""

    name: str
    engines: frozenset[EngineKind]
    param: str | None = None
    what: str | None = None
    apis: frozenset[Api] = frozenset()


#: What an engine may not honour: every sampler, and the request's other engine-facing fields (``logit_bias``;
#: ``stop_token_ids``, vLLM's: more ids that end the reply, which every engine stops on as it stops on the template's
#: own, so that a template whose reply ends at the next role's marker serves an RL loop; ``response_format``, the
#: engine's grammar constraint; ``prompt_logprobs``, asked for by ``echo`` with ``logprobs``).
ENGINE_FIELDS: tuple[EngineField, ...] = (
    *(EngineField(name, row.engines) for name, row in samplers()),
    EngineField("logit_bias", _MODEL_ENGINES, apis=OPENAI_APIS),
    EngineField("stop_token_ids", _EVERY_ENGINE, apis=OPENAI_APIS),
    EngineField("response_format", _MODEL_ENGINES),
    EngineField("prompt_logprobs", _EVERY_ENGINE, param="echo", what="echo with logprobs"),
)


def body_fields(api: Api) -> frozenset[str]:
    """The :data:`ENGINE_FIELDS` that are not samplers and that ``api``'s body carries, by name."""
    return frozenset(each.name for each in ENGINE_FIELDS if api in each.apis)


def foreign_body_fields(api: Api) -> frozenset[str]:
    """The :data:`ENGINE_FIELDS` other APIs' bodies carry and ``api``'s has not."""
    return frozenset(each.name for each in ENGINE_FIELDS if each.apis and api not in each.apis)


def honoured_fields(engine: EngineKind) -> list[str]:
    """The request fields ``engine`` honours, by the request's own name (:attr:`EngineField.name`), in declaration
    order: ``/health`` shows them per model; a request that sets another is refused."""
    return [each.name for each in ENGINE_FIELDS if engine in each.engines]
