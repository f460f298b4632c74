"""Each engine option declared once: its flag, its help, the kind of value it takes, its default and how it is
derived, and the engines that take it.

``turnkit serve`` adds one flag a row (:func:`turnkit.cli.serve.register`, with the row's :class:`ValueKind` as the
flag's type), refuses a flag that no engine it serves takes, and hands the values derived from the flags given
(:func:`derive`) to the engines, under the row's ``keyword``: the keyword their constructors take. A new option is one
row here and its parameter in the engine that takes it; its default is the row's derivation, or the engine's own
where the derivation leaves it None (a flag left out passes nothing).

The options every engine reads in its own way (``threads``, ``prefill_threads``, ``context``, ``max_batch``,
``draft_max``) arrive as typed fields of :class:`~turnkit.serve.engines.EngineOptions`; the others in its
``declared``, handed on by :func:`taken_by`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from turnkit.argtypes import positive_int, whole_number
from turnkit.serve.request_fields import EngineKind

__all__ = [
    "DRAFT_LIMIT",
    "DRAFT_MAX",
    "ENGINE_OPTIONS",
    "MAX_BATCH",
    "EngineOption",
    "Launch",
    "OptionValue",
    "ValueKind",
    "derive",
    "idle_options",
    "taken_by",
    "taken_flags",
]

#: The longest speculative draft the llama.cpp engine makes unless told (``--spec-draft-n-max``).
DRAFT_MAX = 16

#: The longest draft ``--spec-draft-n-max`` takes (llama-server's n-gram drafts default to 48 at most).
DRAFT_LIMIT = 256

#: Requests generated together unless told (``--max-batch``), on llama.cpp and torch; vLLM keeps its own default.
MAX_BATCH = 16

#: An option's value, as its kind reads it.
OptionValue = int | str


def _tokens(text: str) -> int:
    """A number of tokens for a context or a cache (at least 16)."""
    value = positive_int(text)
    if value < 16:
        raise argparse.ArgumentTypeError(f"must be at least 16 tokens, got {value}")
    return value


def _draft_tokens(text: str) -> int:
    """The longest speculative draft, at most :data:`DRAFT_LIMIT` tokens (each is verified in the step's one batch,
    which llama.cpp sizes for the longest draft of every stream)."""
    value = positive_int(text)
    if value > DRAFT_LIMIT:
        raise argparse.ArgumentTypeError(f"must be at most {DRAFT_LIMIT} tokens, not {value}")
    return value


def _mebibytes(text: str) -> int:
    """A size in MiB, 0 included (off), at most this machine's memory (the host cache is parked there: a budget past
    it would swap, then fail)."""
    value = whole_number(text, least=0, unit="MiB")
    memory = _memory_mib()
    if memory is not None and value > memory:
        raise argparse.ArgumentTypeError(f"must be at most this machine's memory, {memory} MiB, not {value}")
    return value


def _memory_mib() -> int | None:
    import os

    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class ValueKind:
    """The kind of value a flag takes: ``read``, its argparse type (a bad value is argparse's one-line error naming
    the flag), and how ``--help`` shows it: ``metavar``, or the ``choices`` it takes."""

    read: Callable[[str], OptionValue]
    metavar: str | None = "N"
    choices: tuple[str, ...] | None = None


COUNT = ValueKind(positive_int)
TOKENS = ValueKind(_tokens)
DRAFT_TOKENS = ValueKind(_draft_tokens)
MEBIBYTES = ValueKind(_mebibytes, "MIB")
SPEC_TYPE = ValueKind(str, None, ("ngram", "none"))


@dataclass(frozen=True)
class Launch:
    """What a derivation sees besides the flags: the cores the engines may use (this process's, or with ``--ray``
    each replica's share: its ``--threads``, 1 unless given), and whether it is a ``--ray`` launch."""

    cores: int
    ray: bool = False


#: The flags given, by their attribute on argparse's namespace (``spec_type``): None where left out.
Given = Mapping[str, OptionValue | None]


def _as_given(dest: str) -> Callable[[Given, Launch], OptionValue | None]:
    """A derivation that passes the flag's value as given (None: the engine's own default)."""
    return lambda given, launch: given[dest]


def _threads(given: Given, launch: Launch) -> OptionValue:
    """Every core but one decodes one stream (the server's event loop keeps one); a Ray replica 1 unless told."""
    return given["threads"] or (1 if launch.ray else max(1, launch.cores - 1))


def _prefill_threads(given: Given, launch: Launch) -> OptionValue | None:
    """Prompts are compute-bound: every core, unless ``--threads`` was given (then as many, as llama-server's
    ``-tb``); a Ray replica leaves it to the engine (its ``threads``)."""
    if launch.ray:
        return given["prefill_threads"]
    return given["prefill_threads"] or given["threads"] or launch.cores


def _draft_max(given: Given, launch: Launch) -> OptionValue:
    """The longest speculative draft: 0 (off) for ``--spec-type none``, else ``--spec-draft-n-max`` or
    :data:`DRAFT_MAX`."""
    if given["spec_type"] == "none":
        return 0
    return DRAFT_MAX if given["spec_draft_n_max"] is None else given["spec_draft_n_max"]


_LLAMA_CPP: frozenset[EngineKind] = frozenset({"llama.cpp"})
_MODEL_ENGINES: frozenset[EngineKind] = frozenset({"llama.cpp", "torch", "vllm"})


@dataclass(frozen=True)
class EngineOption:
    """One engine option: ``flag`` on the command line, ``keyword`` in the engines' constructors (None: the flag
    reaches no engine itself, it shapes another row's derivation), ``kind`` of value, ``help`` (which says the
    default), the ``engines`` that take it, ``derived``: the value the engines get from the flags given (default: the
    flag's own value), and ``place``: where ``--help`` lists it, among the engine's settings or with the queue's."""

    flag: str
    keyword: str | None
    kind: ValueKind
    help: str
    engines: frozenset[EngineKind]
    derived: Callable[[Given, Launch], OptionValue | None] | None = None
    place: Literal["engine", "queue"] = "engine"

    @property
    def dest(self) -> str:
        """The flag's attribute on argparse's namespace."""
        return self.flag.removeprefix("--").replace("-", "_")

    def value(self, given: Given, launch: Launch) -> OptionValue | None:
        """The value the engines get (None: the engine's own default)."""
        return (self.derived or _as_given(self.dest))(given, launch)


#: In ``--help``'s order within each place.
ENGINE_OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "--threads",
        "threads",
        COUNT,
        "engine threads decoding one stream (default: CPU cores - 1; with --ray: 1 per replica)",
        _MODEL_ENGINES,
        _threads,
    ),
    EngineOption(
        "--prefill-threads",
        "prefill_threads",
        COUNT,
        "llama.cpp threads for prompts and batches of streams (default: --threads if given, else every core; "
        "on a machine busy with other work, 1 can be faster; llama.cpp only)",
        _LLAMA_CPP,
        _prefill_threads,
    ),
    EngineOption(
        "--context",
        "context",
        TOKENS,
        "the longest request (prompt and reply) in tokens (default: the model's; longer is RoPE scaled with "
        "YaRN on llama.cpp; a models file may set context per model)",
        _MODEL_ENGINES,
    ),
    EngineOption(
        "--kv-tokens",
        "kv_tokens",
        TOKENS,
        "llama.cpp's key/value cache shared by the slots, in tokens (default: every slot a whole context, within a "
        "sixteenth of the machine's memory)",
        _LLAMA_CPP,
    ),
    EngineOption(
        "--cache-ram",
        "cache_ram_mib",
        MEBIBYTES,
        "llama.cpp: host memory for finished requests' prefixes, parked off the key/value cache (so running requests "
        "attend over their own cells only) and restored when a prompt starts alike; llama-server's flag and default, "
        "8192; 0 keeps them in the cache",
        _LLAMA_CPP,
    ),
    EngineOption(
        "--spec-type",
        None,
        SPEC_TYPE,
        "speculative decoding on llama.cpp: ngram (the default) drafts tokens from the prompt and the reply so "
        "far and verifies them in one batch, the same tokens as without it; none turns it off",
        _LLAMA_CPP,
    ),
    EngineOption(
        "--spec-draft-n-max",
        "draft_max",
        DRAFT_TOKENS,
        f"the longest draft of speculative decoding (default {DRAFT_MAX}, at most {DRAFT_LIMIT})",
        _LLAMA_CPP,
        _draft_max,
    ),
    EngineOption(
        "--max-batch",
        "max_batch",
        COUNT,
        f"sequences generated together (default {MAX_BATCH}; on vllm, vLLM's own max_num_seqs: 128 on CPU, 256 to "
        "1024 on GPUs)",
        _MODEL_ENGINES,
        place="queue",
    ),
)


def idle_options(engines: set[str], given: Given) -> list[EngineOption]:
    """The rows whose flag was given though none of ``engines`` takes it (each would do nothing)."""
    return [option for option in ENGINE_OPTIONS if given[option.dest] is not None and not option.engines & engines]


def derive(given: Given, launch: Launch) -> dict[str, OptionValue]:
    """The values the engines get, by keyword, from the flags ``given`` (by dest): each row's derivation; a row whose
    value is None (the engine's own default) is left out."""
    values = {option.keyword: option.value(given, launch) for option in ENGINE_OPTIONS if option.keyword is not None}
    return {keyword: value for keyword, value in values.items() if value is not None}


def taken_by(engine: EngineKind, given: Mapping[str, OptionValue]) -> dict[str, Any]:
    """The options given (by keyword) that ``engine`` takes, under their keywords: keywords for its constructor,
    which types each."""
    return {
        option.keyword: given[option.keyword]
        for option in ENGINE_OPTIONS
        if engine in option.engines and option.keyword is not None and option.keyword in given
    }


def taken_flags(engine: EngineKind) -> list[str]:
    """The flags of the options ``engine`` takes, in ``--help``'s order: ``/health`` shows them per model."""
    return [option.flag for option in ENGINE_OPTIONS if engine in option.engines]
