"""The fields of an API's body, checked: each API lists the top-level fields its body may carry in a :class:`Fields`
table next to its parser (what it reads, what real clients send that does not change the reply, what it refuses), and
reads each field with the readers here (:func:`read_field`, :func:`read_number` ...), so that a field of the wrong type
is a 400 naming it wherever it appears and never reaches the encoder.

Any field a table does not list is a 400 naming it and the nearest known name (a misspelt ``max_token`` is never
silently the default budget).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from turnkit.errors import APIError

__all__ = ["Fields", "Refusal", "is_token_ids", "read_field", "read_number", "read_optional_number"]


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


def read_number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    """A number between ``low`` and ``high`` (inclusive), ``default`` when absent."""
    value = read_field(body, name, (int, float), default)
    if not low <= value <= high:
        raise APIError(400, f"{name} must be between {low} and {high}, got {value}", param=name)
    return float(value)


def is_token_ids(value: Any) -> TypeGuard[list[int]]:
    """A list of non-negative integers (booleans are not ids)."""
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def read_optional_number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    """A number between ``low`` and ``high``, or ``None`` (the model's default) when absent."""
    return None if body.get(name) is None else read_number(body, name, 0.0, low, high)
