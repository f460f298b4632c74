"""The ``turnkit`` command line.

``turnkit render (--model PATH | --template FILE | --family NAME) [--tools FILE] [--generation-prompt] CONV.json``
prints the exact text a conversation renders to. ``--show`` makes whitespace and special tokens visible.

Errors are printed as one clear line (``turnkit: error: message 2, field 'role': ...``) with exit status 2, never as a
stack trace.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turnkit import __version__, families
from turnkit.errors import TurnkitError
from turnkit.format import ChatFormat

_MARKER = re.compile(r"<\|[^\s|<>]{1,48}\|>|<｜[^｜\s]{1,48}｜>|\[/?[A-Z][A-Z_]{1,30}\]")


class UsageError(Exception):
    """A problem with the command line or its input files (reported without a stack trace)."""


def _read_json(path: str, what: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


def _load_conversation(path: str) -> tuple[list[Any], list[Any] | None, dict[str, Any]]:
    """A conversation file is a list of messages, or an object with ``messages`` (and optional ``tools``)."""
    data = _read_json(path, "conversation")
    if isinstance(data, list):
        return data, None, {}
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        extra = {k: v for k, v in data.items() if k not in ("messages", "tools")}
        return data["messages"], data.get("tools"), extra
    raise UsageError(f"conversation {path} must be a JSON list of messages or an object with a 'messages' list")


def model_path(name: str) -> Path:
    """``default`` is the embedded SmolLM2 model (fetched once); anything else is a path."""
    if name == "default":
        from turnkit.embedded import default_model_path

        return default_model_path()
    return Path(name)


def _format_from_args(args: argparse.Namespace) -> ChatFormat:
    if args.model:
        return ChatFormat.from_pretrained(model_path(args.model))
    if args.template:
        try:
            text = Path(args.template).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read template {args.template}: {exc.strerror}") from None
        tokens = dict(args.token or [])
        return ChatFormat.from_template(text, **tokens)
    return ChatFormat.from_family(args.family)


def show_visible(text: str, markers: Sequence[str], *, color: bool) -> str:
    """Make whitespace visible (``·`` for spaces, ``→`` for tabs, ``↵`` before each newline) and set special
    tokens apart (reverse video on a terminal, ``⟦...⟧`` otherwise)."""
    known = sorted({m for m in markers if m}, key=len, reverse=True)
    pattern = re.compile("|".join([*map(re.escape, known), _MARKER.pattern]))
    out: list[str] = []
    last = 0
    for match in pattern.finditer(text):
        out.append(_visible_whitespace(text[last : match.start()]))
        token = match.group(0)
        out.append(f"\x1b[7m{token}\x1b[0m" if color else f"⟦{token}⟧")
        last = match.end()
    out.append(_visible_whitespace(text[last:]))
    return "".join(out)


def _visible_whitespace(text: str) -> str:
    return text.replace(" ", "·").replace("\t", "→").replace("\n", "↵\n")


def _cmd_render(args: argparse.Namespace) -> int:
    messages, tools, extra = _load_conversation(args.conversation)
    if args.tools:
        tools = _read_json(args.tools, "tools file")
        if isinstance(tools, dict) and "tools" in tools:
            tools = tools["tools"]
        if not isinstance(tools, list):
            raise UsageError(f"tools file {args.tools} must hold a JSON list of tool schemas")
    fmt = _format_from_args(args)
    variables = {**extra.get("chat_template_kwargs", {}), **dict(args.var or [])}
    text = fmt.render(
        messages,
        tools=tools,
        add_generation_prompt=args.generation_prompt,
        continue_final_message=args.continue_final_message,
        template_name=args.template_name,
        **variables,
    )
    if args.show:
        markers = [*fmt.special_tokens.values(), *(fmt.family.stop_tokens if fmt.family else ())]
        text = show_visible(text, markers, color=sys.stdout.isatty())
        sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))
    else:
        sys.stdout.write(text)
    return 0


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnkit", description="Chat formatting that is correct by construction.")
    parser.add_argument("--version", action="version", version=f"turnkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    render = commands.add_parser("render", help="print the exact text a conversation renders to")
    source = render.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="PATH", help="a Hugging Face model folder, a .gguf file, or 'default'")
    source.add_argument("--template", metavar="FILE", help="a Jinja chat template file")
    source.add_argument("--family", choices=families.names(), help="a built-in family")
    render.add_argument("conversation", metavar="CONVERSATION.json", help="messages as JSON ('-' reads stdin)")
    render.add_argument("--tools", metavar="FILE", help="a JSON list of tool schemas")
    render.add_argument("--generation-prompt", action="store_true", help="end with a new assistant turn's header")
    render.add_argument("--continue", dest="continue_final_message", action="store_true",
                        help="leave the final message open for the model to continue")  # fmt: skip
    render.add_argument("--template-name", metavar="NAME", help="a named template of the checkpoint (tool_use ...)")
    render.add_argument("--token", metavar="NAME=TEXT", type=_key_value, action="append",
                        help="a special token for --template, e.g. bos_token='<s>' (repeatable)")  # fmt: skip
    render.add_argument("--var", metavar="KEY=VALUE", type=_key_value, action="append",
                        help="a template variable, JSON or text, e.g. enable_thinking=false (repeatable)")  # fmt: skip
    render.add_argument("--show", action="store_true", help="make whitespace and special tokens visible")
    render.set_defaults(handler=_cmd_render)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (TurnkitError, UsageError, ValueError) as exc:
        print(f"turnkit: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
