"""The ``turnkit`` command line.

``turnkit render (--model PATH | --template FILE | --family NAME) [--tools FILE] [--generation-prompt] CONV.json``
prints the exact text a conversation renders to. ``--show`` makes whitespace and special tokens visible.

``turnkit encode ...`` shows its tokens: the boundaries, which tokens are trained and which came from data (colours
on a terminal, a table otherwise, ``--json`` for machines); ``--check-prefix`` reports prefix stability and
``--split-turns`` encodes one example per trained turn (for templates that are not prefix-stable).

``turnkit parse --model PATH REPLY`` reads a reply (text, or ids with ``--ids``) back into a message and says which
reply format read it and why; ``--stream N`` parses in chunks as a server streams.

``turnkit inspect CONV.json --model PATH [-o PAGE.html]`` (or ``--family``/``--template`` with ``--tokenizer``) writes
one self-contained HTML page of its tokens; ``--data SHARDS`` does the same for rows sampled from ``turnkit prepare``'s
shards (the model: the one their manifest names, unless given).

``turnkit add-chatml BASE --out DIR`` gives a base model folder the ChatML format and audits the result with doctor.

Errors are printed as one clear line (``turnkit: error: message 2, field 'role': ...``) with exit status 2, never as a
stack trace; turnkit's own warnings as one line each (``turnkit: warning: ...``), without the library's source line;
advice in the library's messages that names Python arguments is given as the flags instead.

One module per command (``render.py``, ``encode.py``, ``parse.py``, ``inspect.py``, ``prepare.py``, ``doctor.py``,
``serve.py``, ``terminal.py`` for ``generate`` and ``chat``, ``chatml.py`` for ``add-chatml``), each with a
``register`` that adds its parser; ``common.py`` holds what they share.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from turnkit import __version__
from turnkit.cli import chatml, doctor, encode, inspect, parse, prepare, render, serve, terminal
from turnkit.cli.common import FLAG_ADVICE, command_line_message, one_line_warnings
from turnkit.errors import TurnkitError, UsageError

__all__ = ["FLAG_ADVICE", "UsageError", "build_parser", "command_line_message", "main"]

#: The commands in the order ``turnkit --help`` lists them.
_COMMANDS = (render, encode, parse, inspect, prepare, doctor, serve, chatml, terminal)


_NUMBER = re.compile(r"-\d+(\.\d+)?")


class _CommandParser(argparse.ArgumentParser):
    """A command's parser that names a misspelt flag, with the nearest real one, instead of the error it causes
    (``render --modle default`` otherwise says that one of --model, --template, --family is required)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def unknown_flag(self) -> str | None:
        flags = [option for action in self._actions for option in action.option_strings]
        for token in self._given:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if not name.startswith("-") or name == "-" or _NUMBER.fullmatch(name) or name in flags:
                continue
            if name.startswith("--") and any(flag.startswith(name) for flag in flags):
                continue  # an abbreviation argparse accepts (or reports as ambiguous itself)
            nearest = difflib.get_close_matches(name, flags, n=1)
            return f"unknown flag {name}" + (f" (did you mean {nearest[0]}?)" if nearest else "")
        return None

    def error(self, message: str) -> NoReturn:
        super().error(self.unknown_flag() or message)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnkit", description="Chat formatting that is correct by construction.")
    parser.add_argument("--version", action="version", version=f"turnkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    for command in _COMMANDS:
        command.register(commands)
    for command_parser in commands.choices.values():
        command_parser.set_defaults(command_parser=command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # what argparse reports as "unrecognized arguments", told by the command's parser
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with one_line_warnings():
            return args.handler(args)
    except (TurnkitError, UsageError, ValueError) as exc:
        print(f"turnkit: error: {command_line_message(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
