"""``--vllm-arg KEY=VALUE``: vLLM's engine options, read, checked against vLLM's own, never fighting turnkit's flags.

One rule for a vLLM option that a turnkit flag also sets (``max_num_seqs`` is ``--max-batch``, ``max_model_len`` is
``--context``): give it either way, not both. Given both, the start is refused naming the two; given one, it is what
vLLM runs with; given neither, vLLM's own default holds (``max_num_seqs`` 128 on CPU, 256-1024 on GPUs, where turnkit's
other engines take 16 sequences), and turnkit's queue admits as many as vLLM runs.

A name vLLM's ``AsyncEngineArgs`` does not have, or a value of the wrong type (``enable_prefix_caching=maybe``), is one
line before any model is read, checked against the installed vLLM's own field types: vLLM itself would report it as
a traceback once the engine is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from turnkit.errors import ServeConfigError

__all__ = ["SHARED_WITH_FLAGS", "check_vllm_args", "gpus_per_engine", "parse_vllm_args", "refuse_both"]

#: vLLM options turnkit sets itself: a ``--vllm-arg`` may not change them (vLLM would detokenize, or read a tokenizer).
_OWN = frozenset({"model", "skip_tokenizer_init"})

#: vLLM options a turnkit flag also sets, and that flag.
SHARED_WITH_FLAGS: dict[str, str] = {"max_num_seqs": "--max-batch", "max_model_len": "--context"}


def parse_vllm_args(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--vllm-arg``) as ``AsyncEngineArgs`` keywords: a value is read as JSON where it is
    JSON (``4``, ``0.9``, ``true``, ``{"a": 1}``), else kept as a string (``bfloat16``); ``-`` in a key is ``_``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().removeprefix("--").replace("-", "_")
        if not sep or not key:
            raise ServeConfigError(f"--vllm-arg {item!r}: give KEY=VALUE, e.g. --vllm-arg gpu_memory_utilization=0.8")
        if key in _OWN:
            raise ServeConfigError(f"--vllm-arg {key}: turnkit sets {key} itself (give the model with --model)")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def refuse_both(engine_args: Mapping[str, Any], flags: Mapping[str, Any]) -> None:
    """:class:`ServeConfigError` where an option is given both as ``--vllm-arg`` and as the turnkit flag that sets it
    (``flags``: the flag's name to its value, None where not given)."""
    for key, flag in SHARED_WITH_FLAGS.items():
        given = flags.get(flag)
        if key in engine_args and given is not None:
            raise ServeConfigError(
                f"--vllm-arg {key}={engine_args[key]} and {flag} {given} set the same vLLM option: give one of them"
            )


def check_vllm_args(engine_args: Mapping[str, Any]) -> None:
    """Each option a name of the installed vLLM's ``AsyncEngineArgs``, with a value its type takes (checked by
    pydantic, as vLLM's config classes check theirs; a type this cannot resolve is left to vLLM).

    Raises:
        ServeConfigError: the first unknown name (with the closest known ones) or value of the wrong type.
    """
    if not engine_args:
        return
    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = {field.name: field for field in dataclasses.fields(AsyncEngineArgs)}
    for key, value in engine_args.items():
        field = fields.get(key)
        if field is None:
            close = difflib.get_close_matches(key, fields, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ServeConfigError(f"--vllm-arg {key}: vLLM's engine has no option {key!r}{hint}")
        problem = _type_problem(AsyncEngineArgs, field, value)
        if problem is not None:
            raise ServeConfigError(f"--vllm-arg {key}={json.dumps(value)}: {problem}")


def _type_problem(owner: type, field: dataclasses.Field[Any], value: Any) -> str | None:
    """Why ``value`` is not of ``field``'s type, or None (also where the annotation cannot be resolved here)."""
    import pydantic

    annotation: Any = field.type
    if isinstance(annotation, str):
        namespace: dict[str, Any] = {}
        for cls in reversed(owner.__mro__):
            namespace.update(vars(sys.modules[cls.__module__]))
        try:
            annotation = eval(annotation, namespace)  # vLLM's own annotation text, in its module's names
        except Exception:  # noqa: BLE001  a name only vLLM's type checking knows: vLLM checks the value itself
            return None
    try:
        pydantic.TypeAdapter(annotation).validate_python(value, strict=isinstance(value, bool | int | float))
    except pydantic.ValidationError as exc:
        return f"not a value vLLM takes there: {exc.errors()[0]['msg'][:1].lower()}{exc.errors()[0]['msg'][1:]}"
    except Exception:  # noqa: BLE001  a type pydantic cannot build a validator for: left to vLLM
        return None
    return None


def gpus_per_engine(engine_args: Mapping[str, Any]) -> int:
    """The GPUs one vLLM engine takes (``tensor_parallel_size`` x ``pipeline_parallel_size``) where the installed vLLM
    is the CUDA build (the ``vllm`` distribution); 0 for the CPU build. What a ``--ray`` replica reserves. Read from
    the installed distributions: importing vLLM takes seconds."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        return 0
    return int(engine_args.get("tensor_parallel_size", 1)) * int(engine_args.get("pipeline_parallel_size", 1))
