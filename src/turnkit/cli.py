"""The ``turnkit`` command line.

``turnkit render (--model PATH | --template FILE | --family NAME) [--tools FILE] [--generation-prompt] CONV.json``
prints the exact text a conversation renders to. ``--show`` makes whitespace and special tokens visible.

``turnkit encode ...`` shows its tokens: the boundaries, which tokens are trained and which came from data (colours
on a terminal, a table otherwise, ``--json`` for machines); ``--check-prefix`` reports prefix stability.

``turnkit inspect CONV.json --model PATH [-o PAGE.html]`` writes one self-contained HTML page of its tokens;
``--data SHARDS`` does the same for rows sampled from ``turnkit prepare``'s shards.

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
from turnkit.embedded import resolve_model
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


def _format_from_args(args: argparse.Namespace) -> ChatFormat:
    if args.model:
        return ChatFormat.from_pretrained(resolve_model(args.model))
    if args.template:
        try:
            text = Path(args.template).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read template {args.template}: {exc.strerror}") from None
        fmt = ChatFormat.from_template(text, **dict(args.token or []))
    else:
        fmt = ChatFormat.from_family(args.family)
    tokenizer = getattr(args, "tokenizer", None)
    if tokenizer:
        from turnkit.tokenizer import TokenizerBinding

        path = resolve_model(tokenizer)
        binding = TokenizerBinding.from_gguf(path) if path.is_file() else TokenizerBinding.from_folder(path)
        fmt = fmt.with_tokenizer(binding)
    return fmt


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
    tools = _load_tools(args, tools)
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


def _load_tools(args: argparse.Namespace, tools: Any) -> Any:
    if args.tools:
        tools = _read_json(args.tools, "tools file")
        if isinstance(tools, dict) and "tools" in tools:
            tools = tools["tools"]
        if not isinstance(tools, list):
            raise UsageError(f"tools file {args.tools} must hold a JSON list of tool schemas")
    return tools


_DIM, _TRAINED, _DATA, _RESET = "\x1b[2m", "\x1b[42;30m", "\x1b[1m", "\x1b[0m"


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
        out.append(f"{style}{_visible_whitespace(piece)}{_RESET}")
    legend = f"{_DIM}template{_RESET} {_DATA}data{_RESET} {_TRAINED}trained{_RESET}  (│ separates tokens)"
    return "│".join(out) + "\n\n" + legend + "\n"


def _cmd_encode(args: argparse.Namespace) -> int:
    messages, tools, extra = _load_conversation(args.conversation)
    tools = _load_tools(args, tools)
    fmt = _format_from_args(args)
    variables = {**extra.get("chat_template_kwargs", {}), **dict(args.var or [])}
    if args.check_prefix:
        report = fmt.check_prefix_stable(messages, tools=tools, **variables)
        sys.stdout.write(str(report) + "\n")
        for diff in fmt.diff_prompts(messages, tools=tools, **variables):
            if not diff.agrees:
                sys.stdout.write(str(diff) + "\n")
        return 0 if report else 1
    encoding = fmt.encode(
        messages,
        tools=tools,
        add_generation_prompt=args.generation_prompt,
        turns=args.turns,
        train_end_marker=not args.no_end_marker,
        template_name=args.template_name,
        **variables,
    )
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
    elif sys.stdout.isatty():
        sys.stdout.write(_token_colours(encoding, pieces))
    else:
        sys.stdout.write(_token_table(encoding, pieces))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from turnkit.inspect import conversation_page, render_html, shards_page

    if (args.conversation is None) == (args.data is None):
        raise UsageError("give either CONVERSATION.json or --data SHARDS")
    fmt = ChatFormat.from_pretrained(resolve_model(args.model))
    if args.data is not None:
        page = shards_page(fmt, args.data, sample=args.sample, seed=args.seed)
    else:
        messages, tools, extra = _load_conversation(args.conversation)
        tools = _load_tools(args, tools)
        variables = {**extra.get("chat_template_kwargs", {}), **dict(args.var or [])}
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


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging
    import os

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    threads = args.threads or max(1, (os.cpu_count() or 2) - 1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    path = resolve_model(args.model)
    if not path.exists():
        raise UsageError(f"the model {path} does not exist (give a Hugging Face folder, a .gguf file, or 'default')")
    if args.ray:
        return _serve_on_ray(args, path)
    import uvicorn

    from turnkit.serve.routes import Server
    from turnkit.serve.torch_backend import TorchBackend

    print(f"turnkit: loading {path} ({threads} torch threads)", file=sys.stderr, flush=True)
    fmt = ChatFormat.from_pretrained(path)
    _ = fmt.tokenizer, fmt.stop_ids  # load now, not on the first request
    backend = TorchBackend.load(path, threads=threads, max_batch=args.max_batch, max_queue=args.max_queue)
    model_id = args.model_id or ("SmolLM2-135M-Instruct" if args.model == "default" else backend.name)
    server = Server(
        fmt,
        backend,
        model_id=model_id,
        api_key=args.api_key,
        allow_template_override=args.allow_template_override,
        default_max_tokens=args.default_max_tokens,
        ui=not args.no_ui,
    )
    print(f"turnkit: serving {model_id!r} on http://{args.host}:{args.port}/v1 (OpenAI API)", file=sys.stderr)
    if not args.no_ui:
        print(f"turnkit: playground at http://{args.host}:{args.port}/ (--no-ui turns it off)", file=sys.stderr)
    try:
        uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning")
    finally:
        backend.close()
    return 0


def _serve_on_ray(args: argparse.Namespace, path: Path) -> int:
    """``--ray``: the same app in every replica of a Ray Serve deployment (:mod:`turnkit.serve.replicas`)."""
    import functools

    from turnkit.serve.replicas import ReplicaOptions, parse_autoscale, run_on_ray

    options = ReplicaOptions(
        replicas=args.replicas,
        autoscale=parse_autoscale(args.autoscale) if args.autoscale else None,
        threads=args.threads or 1,
        max_ongoing_requests=args.max_batch,
        max_queued_requests=args.max_queue,
        host=args.host,
        port=args.port,
        address=args.ray_address,
    )
    _ = ChatFormat.from_pretrained(path).stop_ids  # a broken model fails here, in one line, before any replica
    settings = {k: getattr(args, k) for k in ("model", "model_id", "api_key", "allow_template_override", "no_ui")}
    settings.update(path=str(path), threads=options.threads, max_batch=args.max_batch, max_queue=args.max_queue)
    settings["default_max_tokens"] = args.default_max_tokens
    run_on_ray(
        functools.partial(_ray_replica_app, **settings),
        options,
        announce=lambda line: print(f"turnkit: {line}", file=sys.stderr, flush=True),
    )
    return 0


def _ray_replica_app(**settings: Any) -> Any:
    """Runs inside each Ray replica: the same server ``turnkit serve`` builds, as an ASGI app."""
    from turnkit.serve.routes import Server
    from turnkit.serve.torch_backend import TorchBackend

    fmt = ChatFormat.from_pretrained(settings["path"])
    _ = fmt.tokenizer, fmt.stop_ids
    backend = TorchBackend.load(
        settings["path"], threads=settings["threads"], max_batch=settings["max_batch"], max_queue=settings["max_queue"]
    )
    model_id = settings["model_id"] or ("SmolLM2-135M-Instruct" if settings["model"] == "default" else backend.name)
    server = Server(
        fmt,
        backend,
        model_id=model_id,
        api_key=settings["api_key"],
        allow_template_override=settings["allow_template_override"],
        default_max_tokens=settings["default_max_tokens"],
        ui=not settings["no_ui"],
    )
    return server.app()


def _cmd_prepare(args: argparse.Namespace) -> int:
    from turnkit.data import FieldMap, PrepareConfig, prepare, report

    model = args.model if args.model == "default" else str(Path(args.model).resolve())
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
        turns=args.turns,
        train_end_marker=not args.no_end_marker,
        split_turns=args.split_turns,
        markers=args.markers,
    )
    manifest = prepare(
        args.inputs, args.out, config, workers=args.workers, engine=args.engine, shard_records=args.shard_records
    )
    print(report(manifest))
    print(f"\nwrote {args.out}/manifest.json, {args.out}/rejects.jsonl and {len(manifest['files'])} Parquet files")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from turnkit import doctor
    from turnkit.doctor.output import format_ci, format_human

    if (args.path is None) == (args.data is None):
        raise UsageError("give a checkpoint (turnkit doctor PATH) or prepared data (turnkit doctor --data DIR)")
    if args.data is not None:
        report = doctor.run_data(args.data, model=args.model, ignore=args.ignore or [], limit=args.limit)
    else:
        if args.model is not None:
            raise UsageError("--model goes with --data; audit a checkpoint with turnkit doctor PATH")
        report = doctor.run(args.path, ignore=args.ignore or [])
    if args.json:
        json.dump(report.to_dict(), sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    elif args.ci:
        sys.stdout.write(format_ci(report, strict=args.strict))
    else:
        sys.stdout.write(format_human(report))
    return report.exit_code(strict=args.strict)


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
    _add_format_arguments(render)
    render.add_argument(
        "--continue",
        dest="continue_final_message",
        action="store_true",
        help="leave the final message open for the model to continue",
    )
    render.add_argument("--show", action="store_true", help="make whitespace and special tokens visible")
    render.set_defaults(handler=_cmd_render)

    encode = commands.add_parser(
        "encode", help="show the tokens of a conversation: boundaries, trained tokens, data tokens"
    )
    _add_format_arguments(encode)
    encode.add_argument("--tokenizer", metavar="PATH", help="tokenizer for --template/--family (folder or .gguf)")
    encode.add_argument("--turns", choices=["all", "last", "none"], default="all", help="assistant turns to train")
    encode.add_argument("--no-end-marker", action="store_true", help="do not train the end-of-turn marker")
    encode.add_argument("--json", action="store_true", help="machine-readable output")
    encode.add_argument(
        "--check-prefix",
        action="store_true",
        help="report prefix stability and the token diff of serving vs training prompts",
    )
    encode.set_defaults(handler=_cmd_encode)

    inspect = commands.add_parser("inspect", help="an HTML page of a conversation's tokens, or of prepared shards")
    inspect.add_argument("conversation", nargs="?", metavar="CONVERSATION.json", help="messages as JSON ('-': stdin)")
    inspect.add_argument(
        "--model", required=True, metavar="PATH|default", help="a model folder, a .gguf file, or default"
    )
    inspect.add_argument("--tools", metavar="FILE", help="a JSON list of tool schemas")
    inspect.add_argument("--var", metavar="KEY=VALUE", type=_key_value, action="append", help="a template variable")
    inspect.add_argument("--data", metavar="SHARDS", help="the folder `turnkit prepare --out` wrote (or a .parquet)")
    inspect.add_argument("--sample", type=int, default=5, metavar="N", help="rows to show from --data (default 5)")
    inspect.add_argument("--seed", type=int, default=0, metavar="S", help="which rows --sample draws (default 0)")
    inspect.add_argument("-o", "--output", metavar="PAGE.html", help="write the page here (default: standard output)")
    inspect.set_defaults(handler=_cmd_inspect)

    prep = commands.add_parser("prepare", help="datasets to tokenized training shards, every record accounted for")
    prep.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help=".jsonl[.gz|.zst], .json, .parquet, a datasets folder, or hub:NAME[:SPLIT]",
    )
    prep.add_argument("--model", required=True, metavar="PATH|default", help="a model folder, a .gguf file, or default")
    prep.add_argument("--out", required=True, metavar="DIR", help="the output folder (rerun to resume)")
    prep.add_argument("--format", choices=["auto", "openai", "sharegpt", "alpaca"], default="auto")
    prep.add_argument("--messages-field", metavar="NAME", help="where messages are (default: messages/conversations)")
    prep.add_argument("--tools-field", default="tools", metavar="NAME")
    prep.add_argument("--system-field", default="system", metavar="NAME")
    prep.add_argument("--instruction-field", default="instruction", metavar="NAME")
    prep.add_argument("--input-field", default="input", metavar="NAME")
    prep.add_argument("--output-field", default="output", metavar="NAME")
    prep.add_argument("--max-length", type=int, metavar="N", help="longest example in tokens")
    prep.add_argument(
        "--truncation",
        choices=["drop", "turns"],
        default="drop",
        help="over --max-length: drop the record, or drop whole earliest turns",
    )
    prep.add_argument("--turns", choices=["all", "last"], default="all", help="assistant turns to train")
    prep.add_argument("--no-end-marker", action="store_true", help="do not train the end-of-turn marker")
    prep.add_argument("--split-turns", action="store_true", help="one example per assistant turn")
    prep.add_argument(
        "--markers",
        choices=["keep", "reject", "strip"],
        default="keep",
        help="control-marker strings found in data: keep as text (safe), reject, or strip",
    )
    prep.add_argument("--workers", type=int, default=1, metavar="N")
    prep.add_argument("--engine", choices=["local", "ray"], default="local")
    prep.add_argument("--shard-records", type=int, default=1024, metavar="N", help="records per output shard")
    prep.set_defaults(handler=_cmd_prepare)

    doc = commands.add_parser(
        "doctor", help="audit a checkpoint (or prepared training data) for chat-format mistakes, with fixes"
    )
    doc.add_argument(
        "path", nargs="?", metavar="PATH", help="a Hugging Face folder, a .gguf file, default, or a PEFT adapter folder"
    )
    doc.add_argument("--data", metavar="DIR|FILE", help="prepared data: turnkit prepare output, Parquet or JSONL")
    doc.add_argument("--model", metavar="PATH|default", help="the model --data trains (default: from its manifest)")
    doc.add_argument("--json", action="store_true", help="one JSON object: target, checks_run, findings ...")
    doc.add_argument("--ci", action="store_true", help="a short report for a CI job, with the forged-turn test")
    doc.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    doc.add_argument("--ignore", metavar="CHECK[,CHECK...]", action="append", help="check ids to skip (repeatable)")
    doc.add_argument("--limit", type=int, default=2000, metavar="N", help="rows of --data to check (default 2000)")
    doc.set_defaults(handler=_cmd_doctor)

    serve = commands.add_parser("serve", help="an OpenAI-compatible server (default: the embedded SmolLM2 model)")
    serve.add_argument(
        "--model",
        default="default",
        metavar="PATH|default",
        help="a Hugging Face folder, a .gguf file, or 'default' (SmolLM2-135M-Instruct)",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY'")
    serve.add_argument(
        "--threads", type=int, metavar="N", help="torch threads (default: CPU cores - 1; with --ray: 1 per replica)"
    )
    serve.add_argument("--model-id", metavar="NAME", help="the model name clients use (default: from the file)")
    serve.add_argument("--max-batch", type=int, default=16, help="sequences generated together")
    serve.add_argument("--max-queue", type=int, default=64, help="requests waiting before 429 answers")
    serve.add_argument("--default-max-tokens", type=int, default=512, help="reply budget when a request sets none")
    serve.add_argument(
        "--allow-template-override", action="store_true", help="let requests bring their own chat_template or family"
    )
    serve.add_argument("--no-ui", action="store_true", help="do not serve the playground page at /")
    serve.add_argument("--ray", action="store_true", help="run replicas on Ray Serve behind one endpoint")
    serve.add_argument("--ray-address", metavar="ADDRESS", help="join this Ray cluster (default: start a local one)")
    serve.add_argument("--replicas", type=int, default=1, metavar="N", help="--ray: replicas (threads each: --threads)")
    serve.add_argument("--autoscale", metavar="MIN:MAX", help="--ray: let Ray Serve scale between MIN and MAX replicas")
    serve.set_defaults(handler=_cmd_serve)
    return parser


def _add_format_arguments(command: argparse.ArgumentParser) -> None:
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="PATH", help="a Hugging Face model folder, a .gguf file, or 'default'")
    source.add_argument("--template", metavar="FILE", help="a Jinja chat template file")
    source.add_argument("--family", choices=families.names(), help="a built-in family")
    command.add_argument("conversation", metavar="CONVERSATION.json", help="messages as JSON ('-' reads stdin)")
    command.add_argument("--tools", metavar="FILE", help="a JSON list of tool schemas")
    command.add_argument("--generation-prompt", action="store_true", help="end with a new assistant turn's header")
    command.add_argument("--template-name", metavar="NAME", help="a named template of the checkpoint (tool_use ...)")
    command.add_argument(
        "--token",
        metavar="NAME=TEXT",
        type=_key_value,
        action="append",
        help="a special token for --template, e.g. bos_token='<s>' (repeatable)",
    )
    command.add_argument(
        "--var",
        metavar="KEY=VALUE",
        type=_key_value,
        action="append",
        help="a template variable, JSON or text, e.g. enable_thinking=false (repeatable)",
    )


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
