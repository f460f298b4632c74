"""``turnkit serve``: the OpenAI-compatible server over one or several models (``--model``, ``--models``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from turnkit.cli.common import UsageError, missing_model, positive_int
from turnkit.serve.engines import ENGINES
from turnkit.serve.replicas import INGRESSES


def _model_specs(args: argparse.Namespace) -> list[Any]:
    """The models ``--model`` (repeatable) and ``--models`` (a folder or a TOML/JSON models file) name; the embedded
    model when neither is given. ``--model-id`` names the one model when there is exactly one."""
    from dataclasses import replace

    from turnkit.serve import modelspec

    specs = [modelspec.from_argument(text) for text in args.model or []]
    for source in args.models or []:
        specs += modelspec.from_directory(source) if Path(source).is_dir() else modelspec.from_file(source)
    if not specs:
        specs = [modelspec.from_argument("default")]
    if args.model_id:
        if len(specs) != 1:
            raise UsageError("--model-id names a single model; with several, write --model NAME=PATH")
        specs = [replace(specs[0], name=args.model_id)]
    if args.engine:  # for every model whose models-file entry names no engine of its own
        specs = [replace(spec, engine=spec.engine or args.engine) for spec in specs]
    for spec in specs:
        if not spec.embedded and not Path(spec.path).exists():
            raise missing_model(spec.path, f"the model {spec.name!r}:" if spec.name != spec.path else "--model")
        if spec.template is not None and not Path(spec.template).is_file():
            raise UsageError(f"the template {spec.template} of the model {spec.name!r} does not exist")
    return modelspec.unique(specs)


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging
    import os

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    specs = _model_specs(args)
    if args.ray:
        return _serve_on_ray(args, specs)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
    threads = args.threads or max(1, cores - 1)
    # Prompts are compute-bound: every core, unless --threads was given (then as many, as llama-server's -tb).
    prefill_threads = args.prefill_threads or args.threads or cores

    from turnkit.embedded import resolve_model
    from turnkit.serve.app import lifecycle
    from turnkit.serve.app.routes import Server
    from turnkit.serve.engines import EngineOptions, default_engine
    from turnkit.serve.models import ModelRegistry

    options = EngineOptions(
        threads=threads,
        prefill_threads=prefill_threads,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        queue_timeout=args.queue_timeout or None,
        context=args.context,
        kv_tokens=args.kv_tokens,
    )
    registry = ModelRegistry(specs, max_loaded=args.max_loaded, options=options)
    first = registry.default_name
    spec = registry.spec(first)
    engine = spec.engine or default_engine(resolve_model(spec.path))
    print(f"turnkit: reading {first} ({engine} engine, {cores} cores present)", file=sys.stderr, flush=True)
    from turnkit.serve.protocol import APIError

    try:  # every model's template now (a broken one is one line here, not a 503 later); weights stay lazy
        for name in registry.names:
            registry.format(name)
        fmt = registry.format(first)
        # The default model's tokenizer and its encoder's lazily built parts now, not on the first request (building
        # them holds the interpreter for a second: every client would wait).
        fmt.encode([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        _ = fmt.stop_ids
        if not args.lazy:
            describe = getattr(registry.preload(first).backend, "describe", None)
            if describe is not None:
                print(f"turnkit: {first}: {describe()}", file=sys.stderr)
    except APIError as exc:
        raise UsageError(exc.message) from None
    server = Server(
        registry,
        api_key=args.api_key,
        allow_template_override=args.allow_template_override,
        default_max_tokens=args.default_max_tokens,
        ui=not args.no_ui,
        metrics_public=args.metrics_public,
    )
    names = ", ".join(repr(name) for name in registry.names)
    print(f"turnkit: serving {names} on http://{args.host}:{args.port}/v1 (OpenAI API)", file=sys.stderr)
    if not args.no_ui:
        print(f"turnkit: playground at http://{args.host}:{args.port}/ (--no-ui turns it off)", file=sys.stderr)
    try:
        lifecycle.run(server, host=args.host, port=args.port, drain_seconds=args.drain_seconds)
    finally:
        registry.close()
    print("turnkit: stopped", file=sys.stderr)
    return 0


def _serve_on_ray(args: argparse.Namespace, specs: list[Any]) -> int:
    """``--ray``: the same app in every replica of a Ray Serve deployment (:mod:`turnkit.serve.replicas`)."""
    import functools

    from turnkit.serve.engines import EngineOptions
    from turnkit.serve.models import ModelRegistry
    from turnkit.serve.protocol import APIError
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
        ingress=args.ray_ingress,
    )
    engine = EngineOptions(
        threads=options.threads,
        prefill_threads=args.prefill_threads,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        queue_timeout=args.queue_timeout or None,
        context=args.context,
        kv_tokens=args.kv_tokens,
    )
    try:  # a broken template or tokenizer fails here, in one line, before any replica starts
        registry = ModelRegistry(specs, max_loaded=args.max_loaded, options=engine)
        for name in registry.names:
            _ = registry.format(name).stop_ids
    except APIError as exc:
        raise UsageError(exc.message) from None
    server = {
        "api_key": args.api_key,
        "allow_template_override": args.allow_template_override,
        "default_max_tokens": args.default_max_tokens,
        "ui": not args.no_ui,
        "metrics_public": args.metrics_public,
    }
    factory = functools.partial(_replica_app, specs, args.max_loaded, engine, server, args.lazy)
    run_on_ray(factory, options, announce=lambda line: print(f"turnkit: {line}", file=sys.stderr, flush=True))
    return 0


def _replica_app(specs: list[Any], max_loaded: int, engine: Any, server: dict[str, Any], lazy: bool) -> Any:
    """Runs inside each Ray replica: the same server ``turnkit serve`` builds, as an ASGI app."""
    from turnkit.serve.app.routes import Server
    from turnkit.serve.models import ModelRegistry

    registry = ModelRegistry(specs, max_loaded=max_loaded, options=engine)
    if not lazy:
        registry.preload(registry.default_name)
    return Server(registry, **server).app()


def _tokens(text: str) -> int:
    """An argparse type: a number of tokens for a context or a cache (at least 16)."""
    value = positive_int(text)
    if value < 16:
        raise argparse.ArgumentTypeError(f"must be at least 16 tokens, got {value}")
    return value


def register(commands: Any) -> None:
    """Add this module's command(s) to ``turnkit``'s subcommands."""
    serve = commands.add_parser("serve", help="an OpenAI-compatible server (default: the embedded SmolLM2 model)")
    serve.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]PATH[:FAMILY]",
        help="a Hugging Face folder, a .gguf file, or 'default' (SmolLM2-135M-Instruct), optionally named and with a "
        "family's template (repeatable; default: the embedded model)",
    )
    serve.add_argument(
        "--models",
        action="append",
        metavar="DIR|FILE",
        help="every .gguf file and Hugging Face folder in DIR, or the models of a TOML/JSON models file (repeatable)",
    )
    serve.add_argument(
        "--max-loaded",
        type=positive_int,
        default=2,
        metavar="N",
        help="models kept loaded (least recently used unloaded; default 2)",
    )
    serve.add_argument(
        "--lazy", action="store_true", help="load even the default model on its first request, not at start"
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="the address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for every interface)",
    )
    serve.add_argument("--port", type=int, default=8000, metavar="N", help="the port to listen on (default 8000)")
    serve.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY'")
    serve.add_argument(
        "--engine",
        choices=ENGINES,
        help="llama.cpp (the default for .gguf files) or transformers on torch (the default for folders)",
    )
    serve.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="engine threads decoding one stream (default: CPU cores - 1; with --ray: 1 per replica)",
    )
    serve.add_argument(
        "--prefill-threads",
        type=positive_int,
        metavar="N",
        help="llama.cpp threads for prompts and batches of streams (default: --threads if given, else every core; "
        "on a machine busy with other work, 1 can be faster)",
    )
    serve.add_argument(
        "--context",
        type=_tokens,
        metavar="N",
        help="the longest request (prompt and reply) in tokens (default: the model's; longer is RoPE scaled with "
        "YaRN on llama.cpp; a models file may set context per model)",
    )
    serve.add_argument(
        "--kv-tokens",
        type=_tokens,
        metavar="N",
        help="llama.cpp's key/value cache shared by the slots, in tokens (default: every slot a whole context, "
        "within a sixteenth of the machine's memory)",
    )
    serve.add_argument("--model-id", metavar="NAME", help="the one model's name for clients (default: from the file)")
    serve.add_argument(
        "--max-batch", type=positive_int, default=16, metavar="N", help="sequences generated together (default 16)"
    )
    serve.add_argument(
        "--max-queue", type=int, default=64, metavar="N", help="requests waiting before 429 answers (default 64)"
    )
    serve.add_argument(
        "--queue-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a request may wait for a slot and cache room before a 503 (0: no limit; default 60)",
    )
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM/SIGINT, how long running replies may take to finish before they end with an error "
        "(default 30)",
    )
    serve.add_argument("--metrics-public", action="store_true", help="serve /metrics without the API key (--api-key)")
    serve.add_argument(
        "--default-max-tokens",
        type=positive_int,
        default=512,
        metavar="N",
        help="reply budget when a request sets none (default 512)",
    )
    serve.add_argument(
        "--allow-template-override", action="store_true", help="let requests bring their own chat_template or family"
    )
    serve.add_argument("--no-ui", action="store_true", help="do not serve the playground page at /")
    serve.add_argument("--ray", action="store_true", help="run replicas on Ray Serve behind one endpoint")
    serve.add_argument("--ray-address", metavar="ADDRESS", help="join this Ray cluster (default: start a local one)")
    serve.add_argument(
        "--replicas", type=positive_int, default=1, metavar="N", help="--ray: replicas (threads each: --threads)"
    )
    serve.add_argument("--autoscale", metavar="MIN:MAX", help="--ray: let Ray Serve scale between MIN and MAX replicas")
    serve.add_argument(
        "--ray-ingress",
        choices=INGRESSES,
        default="haproxy",
        help="--ray: Ray Serve's HAProxy ingress (replicas serve HTTP themselves; the default) or its Python proxy",
    )
    serve.set_defaults(handler=_cmd_serve)
