"""``turnkit doctor``: audit a checkpoint or prepared data for chat-format mistakes, each finding with a fix."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from turnkit.cli.common import add_count, add_switch, hub_name, missing_model
from turnkit.errors import UsageError


def _runtime_list(value: str) -> bool:
    """Whether ``value`` names runtimes only (``llama.cpp,minijinja``, ``all``), as ``--runtimes`` takes them."""
    from turnkit.doctor.runtimes import RUNTIMES

    parts = [part.strip() for part in value.split(",") if part.strip()]
    return bool(parts) and all(part in RUNTIMES or part == "all" for part in parts)


def _runtimes_and_path(args: argparse.Namespace) -> None:
    """``--runtimes`` takes an optional value, so argparse gives it the word after it: ``turnkit doctor --runtimes
    my-model`` read ``my-model`` as the runtime list and then asked for the checkpoint. A value given with a space that
    names no runtime is the checkpoint when none was given; ``--runtimes=RUNTIME,...`` (the explicit form) always names
    runtimes, and ``PATH --runtimes RUNTIME,...`` (the documented form) still does."""
    if not args.runtimes:
        return
    explicit = {token for token in getattr(args.command_parser, "_given", []) if token.startswith("--runtimes=")}
    for index, value in enumerate(args.runtimes):
        if f"--runtimes={value}" in explicit or _runtime_list(value):
            continue  # runtimes (a name that is none is refused by the runtime table, with the names)
        if args.path is None and args.data is None:
            args.path, args.runtimes[index] = value, "all"


def _cmd_doctor(args: argparse.Namespace) -> int:
    from turnkit import doctor
    from turnkit.doctor.output import format_ci, format_human

    _runtimes_and_path(args)
    if (args.path is None) == (args.data is None):
        raise UsageError("give a checkpoint (turnkit doctor PATH) or prepared data (turnkit doctor --data DIR)")
    for flag, value in (("", args.path), ("--model", args.model), ("--base", args.base)):
        if value is not None and hub_name(value) and not Path(value).exists():  # told how to download it
            raise missing_model(value, flag)
    if args.tokenizer is not None and args.path is None:
        raise UsageError("--tokenizer goes with a template file: turnkit doctor TEMPLATE.jinja --tokenizer PATH")
    if args.data is not None and args.runtimes is not None:
        raise UsageError("--runtimes checks a checkpoint's template: turnkit doctor PATH --runtimes")
    if args.data is not None:
        report = doctor.run_data(args.data, model=args.model, ignore=args.ignore or [], limit=args.limit)
    else:
        if args.model is not None:
            raise UsageError("--model goes with --data; audit a checkpoint with turnkit doctor PATH")
        report = doctor.run(
            args.path, ignore=args.ignore or [], base=args.base, runtimes=args.runtimes, tokenizer=args.tokenizer
        )
    if args.json:
        json.dump(report.to_dict(), sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    elif args.ci:
        sys.stdout.write(format_ci(report, strict=args.strict))
    else:
        sys.stdout.write(format_human(report))
    return report.exit_code(strict=args.strict)


def register(commands: Any) -> None:
    """Add this module's command(s) to ``turnkit``'s subcommands."""
    doc = commands.add_parser(
        "doctor", help="audit a checkpoint (or prepared training data) for chat-format mistakes, with fixes"
    )
    doc.add_argument(
        "path",
        nargs="?",
        metavar="PATH",
        help="a Hugging Face folder, a .gguf file, default, a PEFT adapter folder, or a .jinja template",
    )
    doc.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="a .jinja template's tokenizer (a model folder or a .gguf file), for the checks that need token ids",
    )
    doc.add_argument(
        "--base", metavar="PATH", help="a PEFT adapter's base model folder (when base_model_name_or_path is a hub name)"
    )
    doc.add_argument(
        "--runtimes",
        nargs="?",
        const="all",
        action="append",
        metavar="RUNTIME[,RUNTIME...]",
        help="also render the template in other Jinja runtimes: llama.cpp, minijinja, hf-jinja (default: all); "
        "--runtimes=RUNTIME names them explicitly, and a word after --runtimes that names no runtime is the PATH",
    )
    doc.add_argument("--data", metavar="DIR|FILE", help="prepared data: turnkit prepare output, Parquet or JSONL")
    doc.add_argument("--model", metavar="PATH|default", help="the model --data trains (default: from its manifest)")
    add_switch(doc, "--json", "one JSON object: target, checks_run, findings ...")
    add_switch(doc, "--ci", "a short report for a CI job, with the forged-turn test")
    add_switch(doc, "--strict", "exit 1 on warnings too")
    doc.add_argument("--ignore", metavar="CHECK[,CHECK...]", action="append", help="check ids to skip (repeatable)")
    add_count(doc, "--limit", "rows of --data to check (default 2000)", default=2000)
    doc.set_defaults(handler=_cmd_doctor)
