"""``turnkit generate`` and ``turnkit chat``: one reply, or a conversation, on the terminal through the server's
engine, prompt encoding and request checks (a flag means what the request field of the same name means)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from turnkit import families
from turnkit.argtypes import positive_int
from turnkit.cli.common import missing_model
from turnkit.errors import UsageError
from turnkit.serve.engines import ENGINES
from turnkit.serve.modelspec import SAMPLING_KEYS
from turnkit.serve.request_fields import SamplerValues, samplers

#: The request fields generate and chat take as flags: a models file's sampling keys, the seed and the budget.
_SAMPLING_FLAGS = (*SAMPLING_KEYS, "seed", "max_tokens")

#: How ``--help`` shows a sampler's flag (its value's letter, and a word on its default); a sampler not named here
#: gets its flag all the same, shown as ``X``.
_SAMPLER_LOOKS: dict[str, tuple[str, str | None]] = {
    "temperature": ("T", "default: the model's (0.2 for 'default')"),
    "top_p": ("P", "default: the model's (0.9 for 'default')"),
    "top_k": ("K", None),
    "min_p": ("P", None),
    "repetition_penalty": ("R", None),
}


def _conversation(args: argparse.Namespace) -> Any:
    """The model (with its template or family override) loaded, and the sampling flags as request fields."""
    import os

    from turnkit.serve.chat import parse_chat
    from turnkit.serve.engines import EngineOptions
    from turnkit.serve.models import ModelRegistry
    from turnkit.serve.modelspec import ModelSpec
    from turnkit.serve.protocol import APIError
    from turnkit.serve.terminal import Conversation, describe

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.model != "default" and not Path(args.model).exists():
        raise missing_model(args.model)
    if args.template is not None and not Path(args.template).is_file():
        raise UsageError(f"the template {args.template} does not exist")
    spec = ModelSpec(args.model, args.model, family=args.family, template=args.template, engine=args.engine)
    threads = args.threads or max(1, (os.cpu_count() or 2) - 1)
    registry = ModelRegistry([spec], max_loaded=1, options=EngineOptions(threads=threads, max_batch=1, max_queue=1))
    sampling = {name: getattr(args, name) for name in _SAMPLING_FLAGS if getattr(args, name) is not None}
    if args.stop:
        sampling["stop"] = args.stop
    try:  # the flags first, through the server's request checks: a bad one fails before the model loads
        parse_chat({"model": spec.name, "messages": [{"role": "user", "content": "."}], **sampling})
    except APIError as exc:
        raise UsageError(describe(exc)) from None
    try:
        model = registry.preload(spec.name)
    except APIError as exc:  # the template or the tokenizer cannot be read
        raise UsageError(exc.message) from None
    return Conversation(model, sampling, system=args.system)


def _cmd_generate(args: argparse.Namespace) -> int:
    from turnkit.serve.protocol import APIError
    from turnkit.serve.terminal import describe, run_generate

    conversation = _conversation(args)
    try:
        return run_generate(conversation, args.prompt)
    except APIError as exc:
        raise UsageError(describe(exc)) from None
    finally:
        conversation.model.backend.close()


def _cmd_chat(args: argparse.Namespace) -> int:
    from turnkit.serve.protocol import APIError
    from turnkit.serve.terminal import describe, run_chat

    conversation = _conversation(args)
    try:
        return run_chat(conversation)
    except APIError as exc:
        raise UsageError(describe(exc)) from None
    finally:
        conversation.model.backend.close()


def _add_generation_arguments(command: argparse.ArgumentParser) -> None:
    """``generate`` and ``chat``: the model, its template, and the sampling flags (the request fields' meanings)."""
    command.add_argument(
        "--model", default="default", metavar="PATH|default", help="a Hugging Face folder, a .gguf file, or 'default'"
    )
    override = command.add_mutually_exclusive_group()
    override.add_argument("--template", metavar="FILE", help="a Jinja chat template instead of the model's own")
    override.add_argument("--family", choices=families.names(), help="a built-in family's template instead")
    command.add_argument("--system", metavar="TEXT", help="a system prompt")
    command.add_argument(
        "--engine",
        choices=ENGINES,
        help="llama.cpp (the default for .gguf files) or transformers on torch (the default for folders)",
    )
    command.add_argument("--threads", type=positive_int, metavar="N", help="engine threads (default: CPU cores - 1)")
    command.add_argument("--max-tokens", type=int, metavar="N", help="reply budget (default 512)")
    neutral = SamplerValues()
    for name, _ in samplers():
        metavar, words = _SAMPLER_LOOKS.get(name, ("X", None))
        flag = "--" + name.replace("_", "-")
        command.add_argument(flag, type=type(getattr(neutral, name)), metavar=metavar, help=words)
    command.add_argument("--seed", type=int, metavar="N")
    command.add_argument("--stop", action="append", metavar="TEXT", help="a stop string (repeatable)")


def register(commands: Any) -> None:
    """Add this module's command(s) to ``turnkit``'s subcommands."""
    generate = commands.add_parser("generate", help="one reply to --prompt, streamed to the terminal")
    _add_generation_arguments(generate)
    generate.add_argument("--prompt", required=True, metavar="TEXT", help="the user's message")
    generate.set_defaults(handler=_cmd_generate)

    chat = commands.add_parser(
        "chat", help="an interactive conversation on the terminal (/reset, Ctrl-C stops a reply)"
    )
    _add_generation_arguments(chat)
    chat.set_defaults(handler=_cmd_chat)
