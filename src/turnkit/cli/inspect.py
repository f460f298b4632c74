"""``turnkit inspect``: one self-contained HTML page of a conversation's tokens, or of rows sampled from prepared
shards (``--data``).

The format comes from ``--model``, ``--template`` or ``--family`` (with ``--tokenizer``), as for ``encode``; with
``--data`` it may be left out, and the model the shards' manifest names is used (the tokenizer they were made with is
checked either way). The page's notes give advice as flags (``--allow-dropped``), not as Python arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from turnkit import families
from turnkit.cli.common import (
    RENDER_SET,
    add_token_argument,
    command_line_message,
    encode_set,
    format_from_args,
    key_value,
    load_conversation,
    load_tools,
    positive_int,
    template_variables,
)
from turnkit.errors import UsageError
from turnkit.format import ChatFormat

#: What inspect sets itself (see ``template_variables``): it shows a conversation that ends with an assistant turn as
#: trained, one that does not as served, and splits turns where the template is not prefix-stable.
_SET_BY_INSPECT = encode_set({"tools": RENDER_SET["tools"], "allow_dropped": "use --allow-dropped"})


def _format(args: argparse.Namespace) -> ChatFormat:
    """The format the flags name; for ``--data`` without one, the model its manifest names."""
    if args.model is None and args.template is None and args.family is None:
        if args.data is None:
            raise UsageError(
                "give the format to read CONVERSATION.json with: --model PATH|default, --template FILE or --family "
                "NAME (the last two with --tokenizer PATH)"
            )
        from turnkit.inspect import prepared_model

        args.model = prepared_model(args.data)
        if args.model != "default" and not Path(args.model).exists():
            raise UsageError(
                f"--data {args.data}: its manifest names the model {args.model}, which is not here: give --model PATH "
                "(the same tokenizer)"
            )
    return format_from_args(args)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from turnkit.inspect import conversation_page, render_html, shards_page

    if (args.conversation is None) == (args.data is None):
        raise UsageError("give either CONVERSATION.json or --data SHARDS")
    if args.data is not None and args.allow_dropped:
        raise UsageError("--allow-dropped goes with CONVERSATION.json: shards hold what prepare trained already")
    fmt = _format(args)
    if args.data is not None:
        page = shards_page(fmt, args.data, sample=args.sample, seed=args.seed)
    else:
        messages, tools, extra = load_conversation(args.conversation)
        tools = load_tools(args, tools)
        variables = template_variables(args, extra, args.conversation, _SET_BY_INSPECT)
        source = "stdin" if args.conversation == "-" else Path(args.conversation).name
        page = conversation_page(
            fmt, messages, tools=tools, variables=variables, source=source, allow_dropped=args.allow_dropped
        )
    page = dataclasses.replace(page, notes=[command_line_message(note) for note in page.notes])
    html = render_html(page)
    if args.output is None:
        sys.stdout.write(html)
        return 0
    try:
        Path(args.output).write_text(html, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror}") from None
    print(
        f"turnkit: wrote {args.output} ({page.tokens:,} tokens, {page.trained:,} trained, "
        f"{len(html.encode()) / 1024:.0f} KiB); open it in a browser",
        file=sys.stderr,
    )
    return 0


def register(commands: Any) -> None:
    """Add this module's command(s) to ``turnkit``'s subcommands."""
    inspect = commands.add_parser("inspect", help="an HTML page of a conversation's tokens, or of prepared shards")
    inspect.add_argument("conversation", nargs="?", metavar="CONVERSATION.json", help="messages as JSON ('-': stdin)")
    source = inspect.add_mutually_exclusive_group()
    source.add_argument(
        "--model",
        metavar="PATH|default",
        help="a model folder, a .gguf file, or default (with --data: default from the shards' manifest)",
    )
    source.add_argument("--template", metavar="FILE", help="a Jinja chat template file (with --tokenizer)")
    source.add_argument("--family", choices=families.names(), help="a built-in family (with --tokenizer)")
    add_token_argument(inspect)
    inspect.add_argument("--tokenizer", metavar="PATH", help="tokenizer for --template/--family (folder or .gguf)")
    inspect.add_argument("--tools", metavar="FILE", help="a JSON list of tool schemas")
    inspect.add_argument("--var", metavar="KEY=VALUE", type=key_value, action="append", help="a template variable")
    inspect.add_argument(
        "--allow-dropped",
        action="store_true",
        help="train an assistant turn even when the template leaves out its tool calls or content (default: shown "
        "untrained, with the reason)",
    )
    inspect.add_argument("--data", metavar="SHARDS", help="the folder `turnkit prepare --out` wrote (or a .parquet)")
    inspect.add_argument(
        "--sample", type=positive_int, default=5, metavar="N", help="rows to show from --data (default 5)"
    )
    inspect.add_argument("--seed", type=int, default=0, metavar="S", help="which rows --sample draws (default 0)")
    inspect.add_argument("-o", "--output", metavar="PAGE.html", help="write the page here (default: standard output)")
    inspect.set_defaults(handler=_cmd_inspect)
