"""``turnkit parse``: a reply read back into a message, the first thing to run when "tool calls come back as text".

The reply is text (what a server or a log shows) or token ids (``--ids``). It goes through ``ChatFormat.parse`` and
prints one JSON object: the OpenAI message, each tool call with its parse status, why the reply ended, and which reply
format was used and why. ``--stream N`` feeds the same reply to ``ChatFormat.stream_parser`` in chunks of N tokens,
prints each delta as a JSON line, and checks that the streamed message is the one the whole parse gives. A call
written without an id gets a numbered one of the shape the template takes back (``fmt.replies.call_ids``: Mistral's
templates raise on any id but nine letters and digits), so the message can be sent back with its results.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from turnkit.argtypes import positive_int
from turnkit.cli.common import add_source_arguments, format_from_args, load_tools
from turnkit.errors import UsageError
from turnkit.format import ChatFormat
from turnkit.parse import REPLY_FORMATS, EndReason, ReplyFormat

_IDS = re.compile(r"[\s,\[\]]+")


def _read_reply(path: str, ids: bool) -> str | list[int]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the reply {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"the reply {path} is not UTF-8 text") from None
    if not ids:
        return text
    numbers = [part for part in _IDS.split(text) if part]
    wrong = next((part for part in numbers if not (part.isascii() and part.isdigit())), None)
    if not numbers or wrong is not None:
        what = f": {wrong[:20]!r} is not a token id" if wrong is not None else ": it is empty"
        raise UsageError(
            f"--ids: {path} must hold token ids (a JSON list, or numbers separated by spaces or commas){what}"
        )
    return [int(part) for part in numbers]


def _chosen(fmt: ChatFormat, spec: ReplyFormat, named: bool) -> str:
    """Why this reply format: named on the command line, else declared by the family, else the reason its selection
    gives (what the template's renders showed)."""
    if named:
        return "named with --reply-format"
    if fmt.chat_template.reply_format is not None:
        return f"declared by the family {fmt.family.name if fmt.family else fmt.chat_template.reply_format!r}"
    if spec.reason:
        return spec.reason
    return "the template's renders show no reasoning or tool-call syntax"


def _hint(reply: Any, spec: ReplyFormat) -> str | None:
    """Tool calls left in the content because the reply format reads none of their kind: which format would."""
    if spec.reads_tools and reply.tool_calls:
        return None
    own = {syntax.trigger for syntax in spec.tools}
    for other in REPLY_FORMATS.values():
        for syntax in other.tools:
            start = syntax.trigger
            if len(start) > 1 and start not in own and start in reply.content:
                return (
                    f"the content holds {start!r}, how the {other.name} format writes tool calls, but this format "
                    f"({spec.name}) reads none there: the template does not teach the model tool calls (pick another "
                    f"template or family), or read the reply with --reply-format {other.name}"
                )
    return None


def _summary(reply: Any, spec: ReplyFormat, why: str) -> dict[str, Any]:
    message = reply.message()
    for call, shown in zip(reply.tool_calls, message.get("tool_calls", []), strict=True):
        shown["status"] = str(call.status)
        if call.error:
            shown["error"] = call.error
            shown["raw"] = call.raw
    out = {
        "message": message,
        # null for a reply that never ended: the API's "stop" would say it stopped (see _unended)
        "finish_reason": None if reply.end == EndReason.NONE else reply.finish_reason,
        "end": str(reply.end),
        "stop": reply.stop,
        "ended_cleanly": reply.ended_cleanly,
        "reply_format": {"name": spec.name, "why": why},
    }
    hint = _hint(reply, spec)
    if hint is not None:
        out["hint"] = hint
    return out


def _unended(reply: Any) -> str | None:
    """The warning for a reply that never ended: what it lacks, and the flag for a reply its token budget cut."""
    if reply.end != EndReason.NONE:
        return None
    return (
        "the reply did not end: it holds no end-of-turn marker, EOS id or stop string (finish_reason null); if the "
        "token budget cut it, pass --length"
    )


def _text_chunks(fmt: ChatFormat, text: str, size: int) -> Iterator[str]:
    """The text in pieces of ``size`` tokens (the tokenizer's own split), or of ``size`` characters without one."""
    if fmt.tokenizer_loader is None:
        for start in range(0, len(text), size):
            yield text[start : start + size]
        return
    offsets = fmt.tokenizer.backend.encode(text, add_special_tokens=False).offsets
    cuts = [start for start, _ in offsets[size::size]]
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        yield text[start:end]


def _stream(fmt: ChatFormat, reply: str | list[int], size: int, options: dict[str, Any]) -> Any:
    """Parse in chunks, printing each delta as a JSON line; returns the finished reply."""
    with_ids = not isinstance(reply, str)
    parser = fmt.stream_parser(
        stop=options["stop"],
        tools=options["tools"],
        reply_format=options["reply_format"],
        call_id=options["call_id"],
        text=not with_ids,
    )
    pieces: Sequence[Any] = (
        list(_text_chunks(fmt, reply, size))
        if isinstance(reply, str)
        else [reply[i : i + size] for i in range(0, len(reply), size)]
    )
    for piece in pieces:
        deltas = parser.feed(piece) if with_ids else parser.feed_text(piece)
        for delta in deltas:
            print(json.dumps({"delta": delta.to_dict()}, ensure_ascii=False))
    finished = parser.finish(length=options["length"])
    for delta in parser.final_deltas:
        print(json.dumps({"delta": delta.to_dict()}, ensure_ascii=False))
    return finished


def _cmd_parse(args: argparse.Namespace) -> int:
    reply = _read_reply(args.reply, args.ids)
    fmt = format_from_args(args)
    tools = load_tools(args, None)
    named = args.reply_format is not None
    spec = REPLY_FORMATS[args.reply_format] if named else fmt.reply_format
    options = {
        "stop": args.stop,
        "tools": tools,
        "reply_format": spec,
        # ids of the shape the template takes back (Mistral's nine letters and digits, else call_N), numbered, so
        # the whole and the streamed parse, and every run, give the same ones
        "call_id": fmt.replies.call_ids.numbered(),
        "length": args.length,
    }
    whole = fmt.parse(reply, **options)
    result = _summary(whole, spec, _chosen(fmt, spec, named))
    warning = _unended(whole)
    if warning is not None:
        print(f"turnkit: warning: {warning}", file=sys.stderr)
    if args.stream is not None and isinstance(reply, str) and fmt.tokenizer_loader is None:
        print(
            f"turnkit: warning: --stream {args.stream} cuts the text in chunks of {args.stream} characters, not "
            "tokens: --template and --family give no tokenizer (add --tokenizer PATH to cut it where the model's "
            "tokens end)",
            file=sys.stderr,
        )
    if args.stream is None:
        json.dump(result, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
        return 0
    streamed = _summary(_stream(fmt, reply, args.stream, options), spec, result["reply_format"]["why"])
    print(json.dumps(streamed, ensure_ascii=False))
    if streamed != result:  # pragma: no cover - a parser bug, said rather than hidden
        raise UsageError("the streamed parse differs from the whole parse (a turnkit bug: please report it)")
    return 0


def register(commands: Any) -> None:
    """Add this module's command(s) to ``turnkit``'s subcommands."""
    parse = commands.add_parser(
        "parse", help="read a reply back into a message: content, reasoning, tool calls with their status"
    )
    add_source_arguments(parse)
    parse.add_argument(
        "reply", metavar="REPLY", help="the reply: a text file, or token ids with --ids ('-' reads stdin)"
    )
    parse.add_argument("--tokenizer", metavar="PATH", help="tokenizer for --template/--family (folder or .gguf)")
    parse.add_argument(
        "--ids", action="store_true", help="REPLY holds token ids (a JSON list, or numbers separated by spaces)"
    )
    parse.add_argument("--tools", metavar="FILE", help="a JSON list of the tool schemas offered (others: unknown_tool)")
    parse.add_argument(
        "--reply-format",
        choices=sorted(REPLY_FORMATS),
        help="the reply format to read with (default: the model's, as the server picks it)",
    )
    parse.add_argument("--stop", action="append", metavar="TEXT", help="a stop string of the request (repeatable)")
    parse.add_argument("--length", action="store_true", help="the reply was cut by its token budget (max_tokens)")
    parse.add_argument(
        "--stream",
        type=positive_int,
        metavar="N",
        help="parse in chunks of N tokens as a server streams: each delta as a JSON line, then the message (text "
        "from --template or --family without --tokenizer is cut in chunks of N characters)",
    )
    parse.set_defaults(handler=_cmd_parse)
