"""``turnkit prepare``: datasets to tokenized training shards, every record written or rejected with a reason.

It exits 1, after the summary, when no record was written (every one rejected, or none read): a run that produced
nothing to train on is a failure a script must see. Records that share an id, and a rerun that found every shard
already written, are said on their own lines.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from turnkit.cli.common import add_count, add_training_arguments, model_path, training_options
from turnkit.errors import UsageError

#: Where ``--runner`` prepares the shards: worker processes here, or Ray actors.
RUNNERS = ("local", "ray")


def _runner(args: argparse.Namespace) -> str:
    """``--runner``, or ``--engine``, its old name ("engine" names the serving engines only), with a warning that
    says the new one; both given must agree."""
    if args.engine is None:
        return str(args.runner or "local")
    if args.runner is not None and args.runner != args.engine:
        raise UsageError(f"--engine is --runner's old name: --runner {args.runner} and --engine {args.engine} disagree")
    print(f"turnkit: warning: --engine is now --runner (--runner {args.engine})", file=sys.stderr)
    return str(args.engine)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from turnkit.data import FieldMap, PrepareConfig, prepare, report

    model = args.model if args.model == "default" else str(model_path(args.model).resolve())
    fields = FieldMap(
        messages=args.messages_field,
        tools=args.tools_field,
        system=args.system_field,
        instruction=args.instruction_field,
        input=args.input_field,
        output=args.output_field,
    )
    config = PrepareConfig(
        model=model,
        input_format=args.format,
        fields=fields,
        max_length=args.max_length,
        truncation=args.truncation,
        **training_options(args),
        markers=args.markers,
        id_field=args.id_field,
    )
    manifest = prepare(
        args.inputs,
        args.out,
        config,
        workers=args.workers,
        runner=_runner(args),
        shard_records=args.shard_records,
        ray_address=args.ray_address,
    )
    print(report(manifest))
    counts, shards, out = manifest["counts"], manifest["shards"], args.out
    if shards["total"] and shards["resumed"] == shards["total"]:
        print(
            f"\nnothing to do: {out} holds all {shards['total']:,} shards from an earlier run with the same options "
            f"(delete {out} to prepare it again); manifest.json and rejects.jsonl rewritten from them"
        )
    else:
        resumed = (
            f" ({shards['resumed']:,} of {shards['total']:,} shards from an earlier run)" if shards["resumed"] else ""
        )
        print(f"\nwrote {out}/manifest.json, {out}/rejects.jsonl and {len(manifest['files'])} Parquet files{resumed}")
    duplicates = manifest["duplicate_ids"]
    if duplicates["ids"]:
        first, ids = duplicates["examples"][0], duplicates["ids"]
        shared = f"share {ids:,} ids (first: " if ids > 1 else "share the id "
        more = " (the manifest's duplicate_ids lists more)" if ids > 1 else ""
        print(
            f"turnkit: warning: {duplicates['records']:,} written records {shared}{first['record_id']!r}, read at "
            f"{' and '.join(first['sources'])}{')' if ids > 1 else ''}: an id no longer names one record; give each "
            f"record its own id, or --id-field another field{more}",
            file=sys.stderr,
        )
    if counts["written"] == 0:
        why = (
            f"all {counts['read']:,} records read were rejected (see {out}/rejects.jsonl)"
            if counts["read"]
            else "the inputs hold no records"
        )
        print(f"turnkit: error: no record was written: {why}", file=sys.stderr)
        return 1
    return 0


def register(commands: Any) -> None:
    """Add this module's command(s) to ``turnkit``'s subcommands."""
    prep = commands.add_parser("prepare", help="datasets to tokenized training shards, every record accounted for")
    prep.add_argument("--model", required=True, metavar="PATH|default", help="a model folder, a .gguf file, or default")
    prep.add_argument("--out", required=True, metavar="DIR", help="the output folder (rerun to resume)")
    prep.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help=".jsonl[.gz|.zst], .json, .parquet, a datasets folder, or hub:NAME[:SPLIT]",
    )
    prep.add_argument("--format", choices=["auto", "openai", "sharegpt", "alpaca"], default="auto")
    prep.add_argument("--messages-field", metavar="NAME", help="where messages are (default: messages/conversations)")
    prep.add_argument("--tools-field", default="tools", metavar="NAME")
    prep.add_argument("--system-field", default="system", metavar="NAME")
    prep.add_argument("--instruction-field", default="instruction", metavar="NAME")
    prep.add_argument("--input-field", default="input", metavar="NAME")
    prep.add_argument("--output-field", default="output", metavar="NAME")
    add_count(prep, "--max-length", "longest example in tokens")
    prep.add_argument(
        "--truncation",
        choices=["drop", "turns"],
        default="drop",
        help="over --max-length: drop the record, or drop whole earliest turns",
    )
    add_training_arguments(prep, turns=("all", "last"), dropped="reject")
    prep.add_argument(
        "--markers",
        choices=["keep", "reject", "strip"],
        default="keep",
        help="control-marker strings found in data: keep as text (safe), reject, or strip",
    )
    prep.add_argument(
        "--id-field", metavar="NAME", help="the field holding each record's own id (default: id where present)"
    )
    add_count(prep, "--workers", "worker processes (default 1)", default=1)
    prep.add_argument(
        "--runner",
        choices=RUNNERS,
        help="where shards are prepared: local worker processes (the default) or Ray actors",
    )
    prep.add_argument("--engine", choices=RUNNERS, help=argparse.SUPPRESS)  # --runner's old name, still taken
    prep.add_argument(
        "--ray-address", metavar="ADDRESS", help="run on an existing Ray cluster (with --runner ray), e.g. HOST:6379"
    )
    add_count(prep, "--shard-records", "records per output shard", default=1024)
    prep.set_defaults(handler=_cmd_prepare)
