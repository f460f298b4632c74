"""The ``turnkit`` command line.

``turnkit render (--model PATH | --template FILE | --family NAME) [--tools FILE] [--generation-prompt] CONV.json``
prints the exact text a conversation renders to. ``--show`` makes whitespace and special tokens visible.

``turnkit encode ...`` shows its tokens: the boundaries, which tokens are trained and which came from data (colours
on a terminal, a table otherwise, ``--json`` for machines); ``--check-prefix`` reports prefix stability and
``--split-turns`` encodes one example per trained turn (for templates that are not prefix-stable).

``turnkit inspect CONV.json --model PATH [-o PAGE.html]`` writes one self-contained HTML page of its tokens;
``--data SHARDS`` does the same for rows sampled from ``turnkit prepare``'s shards.

``turnkit add-chatml BASE --out DIR`` gives a base model folder the ChatML format and audits the result with doctor.

Errors are printed as one clear line (``turnkit: error: message 2, field 'role': ...``) with exit status 2, never as a
stack trace; advice in the library's messages that names Python arguments is given as the flags instead.

One module per command (``render.py``, ``encode.py``, ``inspect.py``, ``prepare.py``, ``doctor.py``, ``serve.py``,
``terminal.py`` for ``generate`` and ``chat``, ``chatml.py`` for ``add-chatml``), each with a ``register`` that adds its
parser; ``common.py`` holds what they share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from turnkit import __version__
from turnkit.cli import chatml, doctor, encode, inspect, prepare, render, serve, terminal
from turnkit.cli.common import FLAG_ADVICE, UsageError, command_line_message
from turnkit.errors import TurnkitError

__all__ = ["FLAG_ADVICE", "UsageError", "build_parser", "command_line_message", "main"]

#: The commands in the order ``turnkit --help`` lists them.
_COMMANDS = (render, encode, inspect, prepare, doctor, serve, chatml, terminal)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnkit", description="Chat formatting that is correct by construction.")
    parser.add_argument("--version", action="version", version=f"turnkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (TurnkitError, UsageError, ValueError) as exc:
        print(f"turnkit: error: {command_line_message(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
