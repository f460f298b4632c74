"""``turnkit render``: the exact text a conversation renders to (``--show`` makes whitespace and special tokens
visible)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from turnkit.cli.common import (
    RENDER_SET,
    add_format_arguments,
    read_conversation,
    render_options,
    show_visible,
)


def _cmd_render(args: argparse.Namespace) -> int:
    fmt, messages, tools, variables = read_conversation(args, RENDER_SET)
    rendered = fmt.render_with_spans(
        messages,
        tools=tools,
        continue_final_message=args.continue_final_message,
        with_data_spans=args.show,
        **render_options(args),
        **variables,
    )
    text = rendered.text
    if args.show:
        markers = [*fmt.special_tokens.values(), *(fmt.family.stop_tokens if fmt.family else ())]
        text = show_visible(text, markers, color=sys.stdout.isatty(), data=rendered.data_spans)
        sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))
    else:
        sys.stdout.write(text)
    return 0


def register(commands: Any) -> None:
    """Add this module's command(s) to ``turnkit``'s subcommands."""
    render = commands.add_parser("render", help="print the exact text a conversation renders to")
    add_format_arguments(render)
    render.add_argument(
        "--continue",
        dest="continue_final_message",
        action="store_true",
        help="leave the final message open for the model to continue",
    )
    render.add_argument("--show", action="store_true", help="make whitespace and special tokens visible")
    render.set_defaults(handler=_cmd_render)
