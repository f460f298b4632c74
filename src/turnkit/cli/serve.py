"""``turnkit serve``: the OpenAI-compatible server over one or several models (``--model``, ``--models``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from turnkit.cli.common import UsageError
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
            raise UsageError(
                f"the model {spec.path} does not exist (give a Hugging Face folder, a .gguf file, or 'default')"
            )
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
    threads = args.threads or max(1, (os.cpu_count() or 2) - 1)
    import uvicorn

    from turnkit.embedded import resolve_model
    from turnkit.serve.app.routes import Server
    from turnkit.serve.engines import EngineOptions, default_engine
    from turnkit.serve.models import ModelRegistry

    options = EngineOptions(threads=threads, max_batch=args.max_batch, max_queue=args.max_queue)
    registry = ModelRegistry(specs, max_loaded=args.max_loaded, options=options)
    first = registry.default_name
    spec = registry.spec(first)
    engine = spec.engine or default_engine(resolve_model(spec.path))
    print(f"turnkit: reading {first} ({engine} engine, {threads} threads)", file=sys.stderr, flush=True)
    from turnkit.serve.protocol import APIError

    try:  # every model's template now (a broken one is one line here, not a 503 later); weights stay lazy
        for name in registry.names:
            registry.format(name)
        fmt = registry.format(first)
        _ = fmt.tokenizer, fmt.stop_ids  # the default model's tokenizer now, not on the first request
        if not args.lazy:
            registry.preload(first)
    except APIError as exc:
        raise UsageError(exc.message) from None
    server = Server(
        registry,
        api_key=args.api_key,
        allow_template_override=args.allow_template_override,
        default_max_tokens=args.default_max_tokens,
        ui=not args.no_ui,
    )
    names = ", ".join(repr(name) for name in registry.names)
    print(f"turnkit: serving {names} on http://{args.host}:{args.port}/v1 (OpenAI API)", file=sys.stderr)
    if not args.no_ui:
        print(f"turnkit: playground at http://{args.host}:{args.port}/ (--no-ui turns it off)", file=sys.stderr)
    try:
        uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning")
    finally:
        registry.close()
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
    engine = EngineOptions(threads=options.threads, max_batch=args.max_batch, max_queue=args.max_queue)
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
        "--max-loaded", type=int, default=2, metavar="N", help="models kept loaded (least recently used unloaded)"
    )
    serve.add_argument(
        "--lazy", action="store_true", help="load even the default model on its first request, not at start"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY'")
    serve.add_argument(
        "--engine",
        choices=ENGINES,
        help="llama.cpp (the default for .gguf files) or transformers on torch (the default for folders)",
    )
    serve.add_argument(
        "--threads", type=int, metavar="N", help="engine threads (default: CPU cores - 1; with --ray: 1 per replica)"
    )
    serve.add_argument("--model-id", metavar="NAME", help="the one model's name for clients (default: from the file)")
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
    serve.add_argument(
        "--ray-ingress",
        choices=INGRESSES,
        default="haproxy",
        help="--ray: Ray Serve's HAProxy ingress (replicas serve HTTP themselves; the default) or its Python proxy",
    )
    serve.set_defaults(handler=_cmd_serve)
