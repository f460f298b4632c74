"""Each engine option declared once: its flag, its help, the kind of value it takes, and the engines that take it.

``turnkit serve`` adds one flag a row (:func:`turnkit.cli.serve.register`), refuses a flag that no engine it serves
takes, and hands the values given to the engines whose rows name them, under the row's ``keyword``: the keyword their
constructors take. A new option is one row here and its parameter in the engine that takes it; its default is the
engine's own (a flag left out passes nothing).

The options every engine reads in its own way (the threads, the context, the batch and queue) stay typed fields of
:class:`~turnkit.serve.engines.EngineOptions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from turnkit.serve.request_fields import EngineKind

__all__ = ["ENGINE_OPTIONS", "EngineOption", "OptionValue", "ValueKind", "taken_by"]

#: The kinds of value a flag takes, each checked by its own argparse type on the command line: ``tokens`` (16 or
#: more), ``mebibytes`` (0 or more, at most this machine's memory).
ValueKind = Literal["tokens", "mebibytes"]

#: An option's value, as its kind reads it.
OptionValue = int


@dataclass(frozen=True)
class EngineOption:
    """One engine option: ``flag`` on the command line, ``keyword`` in the engines' constructors, ``help`` (which
    says the engine's default), ``kind`` of value and its ``metavar``, and the ``engines`` that take it."""

    flag: str
    keyword: str
    kind: ValueKind
    metavar: str
    help: str
    engines: frozenset[EngineKind]

    @property
    def dest(self) -> str:
        """The flag's attribute on argparse's namespace."""
        return self.flag.removeprefix("--").replace("-", "_")


_LLAMA_CPP: frozenset[EngineKind] = frozenset({"llama.cpp"})

ENGINE_OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "--kv-tokens",
        "kv_tokens",
        "tokens",
        "N",
        "llama.cpp's key/value cache shared by the slots, in tokens (default: every slot a whole context, within a "
        "sixteenth of the machine's memory)",
        _LLAMA_CPP,
    ),
    EngineOption(
        "--cache-ram",
        "cache_ram_mib",
        "mebibytes",
        "MIB",
        "llama.cpp: host memory for finished requests' prefixes, parked off the key/value cache (so running requests "
        "attend over their own cells only) and restored when a prompt starts alike; llama-server's flag and default, "
        "8192; 0 keeps them in the cache",
        _LLAMA_CPP,
    ),
)


def taken_by(engine: EngineKind, given: Mapping[str, OptionValue]) -> dict[str, OptionValue]:
    """The options given (by keyword) that ``engine`` takes, under their keywords."""
    return {
        option.keyword: given[option.keyword]
        for option in ENGINE_OPTIONS
        if engine in option.engines and option.keyword in given
    }
