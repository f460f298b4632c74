"""``turnkit encode``: a conversation's tokens: boundaries, which are trained and which came from data (colours on a
terminal, a table otherwise, ``--json`` for machines); ``--check-prefix`` reports prefix stability and
``--split-turns`` encodes one example per trained turn."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

from turnkit.cli.common import (
    RENDER_SET,
    add_format_arguments,
    add_training_arguments,
    encode_set,
    read_conversation,
    render_options,
    training_options,
    visible_whitespace,
)

_DIM, _TRAINED, _DATA, _RESET = "\x1b[2m", "\x1b[42;30m", "\x1b[1m", "\x1b[0m"


#: What this command sets itself, with the flag that does (see ``template_variables``).
_SET_BY_FLAGS = encode_set(
    {
        "tools": RENDER_SET["tools"],
        "add_generation_prompt": "use --generation-prompt",
        "template_name": "use --template-name NAME",
        "turns": "use --turns",
        "train_end_marker": "use --no-end-marker",
        "split_turns": "use --split-turns",
        "allow_dropped": "use --allow-dropped",
    }
)


def _token_table(encoding: Any, pieces: list[str]) -> str:
    lines = [f"{'#':>5} {'id':>7} {'msg':>4}  {'source':<8} {'trained':<7} text"]
    for n, piece in enumerate(pieces):
        source = "data" if encoding.is_data[n] else "template"
        trained = "yes" if encoding.assistant_mask[n] else ""
        lines.append(
            f"{n:>5} {int(encoding.input_ids[n]):>7} {int(encoding.message_index[n]):>4}  {source:<8} {trained:<7} "
            f"{piece!r}"
        )
    return "\n".join(lines) + "\n"


def _token_colours(encoding: Any, pieces: list[str]) -> str:
    """Inline: template text dim, data bold, trained tokens on green; a thin bar between tokens."""
    out = []
    for n, piece in enumerate(pieces):
        style = _TRAINED if encoding.assistant_mask[n] else _DATA if encoding.is_data[n] else _DIM
        out.append(f"{style}{visible_whitespace(piece)}{_RESET}")
    legend = f"{_DIM}template{_RESET} {_DATA}data{_RESET} {_TRAINED}trained{_RESET}  (│ separates tokens)"
    return "│".join(out) + "\n\n" + legend + "\n"


def _cmd_encode(args: argparse.Namespace) -> int:
    fmt, messages, tools, variables = read_conversation(args, _SET_BY_FLAGS)
    if args.check_prefix:
        report = fmt.check_prefix_stable(messages, tools=tools, **variables)
        sys.stdout.write(str(report) + "\n")
        for diff in fmt.diff_prompts(messages, tools=tools, **variables):
            if not diff.agrees:
                sys.stdout.write(str(diff) + "\n")
        return 0 if report else 1
    training = training_options(args)
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages) and args.turns != "none":
        # The library refuses to make a training example that trains nothing (EmptyMaskError); a person looking at
        # a prompt wants its tokens, so they are shown with nothing trained, and this says so.
        training.update(turns="none", split_turns=False)
        print(
            "turnkit: note: the conversation has no assistant turn, so nothing is trained: these are the prompt's "
            "tokens (prepare would reject it as a training record)",
            file=sys.stderr,
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        encoded = fmt.encode(
            messages,
            tools=tools,
            **render_options(args),
            **training,
            **variables,
        )
    for warning in caught:  # one line each, like errors (a marker the tokenizer lacks, trusted data)
        print(f"turnkit: warning: {warning.message}", file=sys.stderr)
    examples = encoded if isinstance(encoded, list) else [encoded]
    for number, encoding in enumerate(examples, start=1):
        pieces = [fmt.tokenizer.decode([int(i)]) for i in encoding.input_ids]
        if args.json:
            payload = {
                **encoding.to_dict(),
                "message_index": encoding.message_index.tolist(),
                "is_data": encoding.is_data.tolist(),
                "tokens": pieces,
                "text": encoding.text,
                "control_counts": encoding.control_counts,
            }
            json.dump(payload, sys.stdout, ensure_ascii=False)
            sys.stdout.write("\n")
            continue
        if args.split_turns:
            trained = sorted({int(i) for i in encoding.message_index[encoding.assistant_mask.astype(bool)]})
            if number > 1:
                sys.stdout.write("\n")
            sys.stdout.write(f"example {number} of {len(examples)}: trains message {', '.join(map(str, trained))}\n")
        if sys.stdout.isatty():
            sys.stdout.write(_token_colours(encoding, pieces))
        else:
            sys.stdout.write(_token_table(encoding, pieces))
    return 0


def register(commands: Any) -> None:
    """Add this module's command(s) to ``turnkit``'s subcommands."""
    encode = commands.add_parser(
        "encode", help="show the tokens of a conversation: boundaries, trained tokens, data tokens"
    )
    add_format_arguments(encode)
    encode.add_argument("--tokenizer", metavar="PATH", help="tokenizer for --template/--family (folder or .gguf)")
    add_training_arguments(encode, turns=("all", "last", "none"), dropped="error")
    encode.add_argument("--json", action="store_true", help="machine-readable output (one JSON object per example)")
    encode.add_argument(
        "--check-prefix",
        action="store_true",
        help="report prefix stability and the token diff of serving vs training prompts",
    )
    encode.set_defaults(handler=_cmd_encode)
