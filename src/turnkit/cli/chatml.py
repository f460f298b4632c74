"""``turnkit add-chatml``: give a base model folder the ChatML format and audit the result with doctor."""

from __future__ import annotations

import argparse
from typing import Any


def _cmd_add_chatml(args: argparse.Namespace) -> int:
    from turnkit.chatml import LORA_FILE, add_chatml_to_folder
    from turnkit.doctor.output import summary_line

    result = add_chatml_to_folder(
        args.base,
        args.out,
        system_prompt=args.system_prompt,
        pad_to_multiple_of=args.pad_to_multiple_of,
        init=args.init,
        force=args.force,
    )
    print(f"turnkit add-chatml: {args.base} -> {result.out} (the base is unchanged)")
    print(result.changes.summary())
    print(f"wrote {result.out / LORA_FILE} (modules_to_save for a training script)")
    print(f"turnkit doctor {result.out}: {summary_line(result.report)}")
    for finding in result.report.warnings:
        print(f"  warning {finding.check}: {finding.message}")
    return 0


def register(commands: Any) -> None:
    """Add this module's command(s) to ``turnkit``'s subcommands."""
    chatml = commands.add_parser(
        "add-chatml", help="give a base model folder the ChatML format (tokens, resized weights, template, EOS)"
    )
    chatml.add_argument("base", metavar="BASE", help="a Hugging Face model folder (only read, never changed)")
    chatml.add_argument("--out", required=True, metavar="DIR", help="the new model folder (must not exist or be empty)")
    chatml.add_argument("--system-prompt", metavar="TEXT", help="a default system turn when a conversation has none")
    chatml.add_argument(
        "--pad-to-multiple-of", type=int, metavar="N", help="round the embedding rows up to a multiple of N (e.g. 64)"
    )
    chatml.add_argument(
        "--init", choices=["mean", "random"], default="mean", help="new rows: mean of the old rows (default) or random"
    )
    chatml.add_argument("--force", action="store_true", help="replace a chat template the base already has")
    chatml.set_defaults(handler=_cmd_add_chatml)
