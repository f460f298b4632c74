"""``turnkit inspect``: one self-contained HTML page of a conversation's tokens, or of rows sampled from prepared
shards (``--data``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from turnkit.cli.common import (
    RENDER_SET,
    UsageError,
    encode_set,
    key_value,
    load_conversation,
    load_tools,
    model_path,
    positive_int,
    template_variables,
)
from turnkit.format import ChatFormat

#: What inspect sets itself (see ``template_variables``): it shows a conversation that ends with an assistant turn as
#: trained, one that does not as served, and splits turns where the template is not prefix-stable.
_SET_BY_INSPECT = encode_set({"tools": RENDER_SET["tools"]})


def _cmd_inspect(args: argparse.Namespace) -> int:
    from turnkit.inspect import conversation_page, render_html, shards_page

    if (args.conversation is None) == (args.data is None):
        raise UsageError("give either CONVERSATION.json or --data SHARDS")
    fmt = ChatFormat.from_pretrained(model_path(args.model))
    if args.data is not None:
        page = shards_page(fmt, args.data, sample=args.sample, seed=args.seed)
    else:
        messages, tools, extra = load_conversation(args.conversation)
        tools = load_tools(args, tools)
        variables = template_variables(args, extra, args.conversation, _SET_BY_INSPECT)
        source = "stdin" if args.conversation == "-" else Path(args.conversation).name
        page = conversation_page(fmt, messages, tools=tools, variables=variables, source=source)
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
    inspect.add_argument(
        "--model", required=True, metavar="PATH|default", help="a model folder, a .gguf file, or default"
    )
    inspect.add_argument("--tools", metavar="FILE", help="a JSON list of tool schemas")
    inspect.add_argument("--var", metavar="KEY=VALUE", type=key_value, action="append", help="a template variable")
    inspect.add_argument("--data", metavar="SHARDS", help="the folder `turnkit prepare --out` wrote (or a .parquet)")
    inspect.add_argument(
        "--sample", type=positive_int, default=5, metavar="N", help="rows to show from --data (default 5)"
    )
    inspect.add_argument("--seed", type=int, default=0, metavar="S", help="which rows --sample draws (default 0)")
    inspect.add_argument("-o", "--output", metavar="PAGE.html", help="write the page here (default: standard output)")
    inspect.set_defaults(handler=_cmd_inspect)
