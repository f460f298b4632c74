"""``turnkit serve``: the OpenAI-compatible server over one or several models (``--model``, ``--models``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from turnkit import families
from turnkit.argtypes import whole_number
from turnkit.cli.common import add_count, add_switch, missing_model
from turnkit.errors import UsageError
from turnkit.serve.engines import ENGINES, MAX_BATCH, EngineOptions
from turnkit.serve.engines.options import ENGINE_OPTIONS, EngineOption, Launch, derive, idle_options
from turnkit.serve.replicas import INGRESSES

#: How long running replies may go on after SIGTERM, unless --drain-seconds says otherwise.
_DRAIN_SECONDS = 30.0


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
    if args.template is not None or args.family is not None:
        specs = [_template_override(args, specs)]
    if args.engine:  # for every model whose models-file entry names no engine of its own
        specs = [replace(spec, engine=spec.engine or args.engine) for spec in specs]
    for spec in specs:
        if not spec.embedded and not Path(spec.path).exists():
            raise missing_model(spec.path, f"the model {spec.name!r}:" if spec.name != spec.path else "--model")
        if spec.template is not None and not Path(spec.template).is_file():
            raise UsageError(f"the template {spec.template} of the model {spec.name!r} does not exist")
    return modelspec.unique(specs)


def _template_override(args: argparse.Namespace, specs: list[Any]) -> Any:
    """``--template FILE`` or ``--family NAME``: the one model served with that template in place of its own (as in
    ``generate`` and ``chat``); its tokenizer stays. Several models each take their own (a models file's ``template``
    or ``family``, or ``--model NAME=PATH:FAMILY``)."""
    from dataclasses import replace

    flag = "--template" if args.template is not None else "--family"
    if len(specs) != 1:
        raise UsageError(
            f"{flag} replaces one model's template; with several, give each its own (template = FILE or family = "
            "NAME in a models file, or --model NAME=PATH:FAMILY)"
        )
    (spec,) = specs
    if spec.family is not None or spec.template is not None:
        own = f"family {spec.family}" if spec.family is not None else f"template {spec.template}"
        raise UsageError(f"{flag} and the {own} the model {spec.name!r} is given already exclude each other")
    if args.family is not None:
        return replace(spec, family=args.family)
    template = Path(args.template)
    if not template.is_file():
        raise UsageError(f"--template {args.template} does not exist")
    return replace(spec, template=str(template.resolve()))  # absolute: Ray replicas run in another folder


def _engine_of(spec: Any) -> str:
    from turnkit.embedded import resolve_model
    from turnkit.serve.engines import default_engine

    return str(spec.engine or default_engine(resolve_model(spec.path)))


def _given(args: argparse.Namespace, *flags: str) -> list[str]:
    """Those of ``flags`` the command line set (none of them has a default: unset is None)."""
    return [flag for flag in flags if getattr(args, flag.removeprefix("--").replace("-", "_")) is not None]


def _refuse_idle_flags(args: argparse.Namespace, specs: list[Any]) -> None:
    """A flag that would do nothing beside the others given is refused, naming what it needs: a user who sets
    ``--replicas 4`` without ``--ray``, or ``--kv-tokens`` for a torch model, would otherwise believe it took."""
    if not args.ray:
        given = _given(args, "--replicas", "--autoscale", "--ray-address", "--ray-ingress")
        if given:
            raise UsageError(f"{given[0]} goes with --ray (replicas on Ray Serve): add --ray, or drop {given[0]}")
    else:
        if args.replicas is not None and args.autoscale is not None:
            raise UsageError(
                "--replicas and --autoscale exclude each other: a fixed number of replicas, or Ray Serve scaling "
                "between MIN and MAX"
            )
        if args.drain_seconds is not None:
            raise UsageError(
                "--drain-seconds is for turnkit serve without --ray (Ray Serve drains its replicas itself): drop it"
            )
    if args.metrics_public and args.api_key is None:
        raise UsageError("--metrics-public exempts /metrics from --api-key; without --api-key it is public already")
    if args.vllm_arg and not any(_engine_of(spec) == "vllm" for spec in specs):
        raise UsageError(
            '--vllm-arg goes with --engine vllm (or engine = "vllm" in a models file): add it, or drop --vllm-arg'
        )
    if args.spec_type == "none" and args.spec_draft_n_max is not None:
        raise UsageError("--spec-draft-n-max sizes speculative drafts, which --spec-type none turns off: drop one")
    engines = {_engine_of(spec) for spec in specs}
    for option in idle_options(engines, _option_flags(args))[:1]:
        _refuse_engine_flag(option.flag, sorted(option.engines), specs, engines)


def _refuse_engine_flag(flag: str, takers: list[str], specs: list[Any], engines: set[str]) -> None:
    """A flag that only engines none of the models runs on take would do nothing: a usage error naming them."""
    which = "the model runs" if len(specs) == 1 else "every model here runs"
    serve = "a .gguf file with --engine llama.cpp" if takers == ["llama.cpp"] else f"with --engine {takers[0]}"
    raise UsageError(
        f"{flag} is a {' or '.join(takers)} engine setting and {which} on {' or '.join(sorted(engines))}, where it "
        f"would do nothing: drop it, or serve {serve}"
    )


def _option_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options' flags (:data:`~turnkit.serve.engines.options.ENGINE_OPTIONS`) as given, by dest."""
    return {option.dest: getattr(args, option.dest) for option in ENGINE_OPTIONS}


def _vllm_args(args: argparse.Namespace) -> tuple[tuple[str, Any], ...]:
    """``--vllm-arg KEY=VALUE`` as vLLM engine keywords, checked against the installed vLLM's own (names and types)
    and against the turnkit flags that set the same option: a wrong one is one error line, before any model is read
    (:mod:`turnkit.serve.engines.vllm_args`)."""
    from turnkit.errors import ServeConfigError
    from turnkit.serve.engines.vllm_args import check_vllm_args, parse_vllm_args, refuse_both

    try:
        engine_args = parse_vllm_args(args.vllm_arg or ())
        refuse_both(engine_args, {"--max-batch": args.max_batch, "--context": args.context})
        if engine_args:
            with contextlib.suppress(ImportError):  # no vLLM here: the engine's start says how to install it
                check_vllm_args(engine_args)
    except ServeConfigError as exc:
        raise UsageError(str(exc)) from None
    return tuple(engine_args.items())


def _engine_options(args: argparse.Namespace, launch: Launch) -> EngineOptions:
    """The flags every engine is given (:class:`~turnkit.serve.engines.EngineOptions`): each engine option as its row
    derives it for this ``launch`` (one server on this machine's cores, or ``--ray`` replicas), and the queue's."""
    return EngineOptions.of(
        derive(_option_flags(args), launch),
        max_queue=args.max_queue,
        queue_timeout=args.queue_timeout or None,
        vllm_args=_vllm_args(args),
    )


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flags the server's app is built with (:class:`~turnkit.serve.app.routes.Server`'s keywords), here and in
    each ``--ray`` replica."""
    return {
        "api_key": args.api_key,
        "allow_template_override": args.allow_template_override,
        "default_max_tokens": args.default_max_tokens,
        "ui": not args.no_ui,
        "metrics_public": args.metrics_public,
        "refuse_builtin_tools": args.refuse_builtin_tools,
    }


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging
    import os

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    specs = _model_specs(args)
    _refuse_idle_flags(args, specs)
    if args.ray:
        return _serve_on_ray(args, specs)
    from turnkit.serve.app import lifecycle

    sockets = lifecycle.bind(args.host, args.port)  # before any model loads: a port in use fails at once
    try:
        return _serve(args, specs, sockets)
    finally:
        for sock in sockets:  # uvicorn closes them when it ran; here too when reading a model failed
            sock.close()


def _serve(args: argparse.Namespace, specs: list[Any], sockets: list[Any]) -> int:
    """Read the models (the default one's weights unless ``--lazy``), then serve on the bound ``sockets``."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2

    from turnkit.serve.app import lifecycle
    from turnkit.serve.app.routes import Server
    from turnkit.serve.models import ModelRegistry

    registry = ModelRegistry(specs, max_loaded=args.max_loaded, options=_engine_options(args, Launch(cores)))
    first = registry.default_name
    spec = registry.spec(first)
    engine = _engine_of(spec)
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
            described = registry.preload(first).backend.describe()
            if described is not None:
                print(f"turnkit: {first}: {described}", file=sys.stderr)
    except APIError as exc:
        raise UsageError(exc.message) from None
    server = Server(registry, **_server_options(args))
    names = ", ".join(repr(name) for name in registry.names)
    port = sockets[0].getsockname()[1]  # --port 0: the one the system chose
    print(f"turnkit: serving {names} on {_url(args.host, port)}/v1 (OpenAI API)", file=sys.stderr)
    if not args.no_ui:
        print(f"turnkit: playground at {_url(args.host, port)}/ (--no-ui turns it off)", file=sys.stderr)
    drain = _DRAIN_SECONDS if args.drain_seconds is None else args.drain_seconds
    try:
        lifecycle.run(server, host=args.host, port=port, drain_seconds=drain, sockets=sockets)
    finally:
        registry.close()
    print("turnkit: stopped", file=sys.stderr)
    return 0


def _serve_on_ray(args: argparse.Namespace, specs: list[Any]) -> int:
    """``--ray``: the same app in every replica of a Ray Serve deployment (:mod:`turnkit.serve.replicas`)."""
    import functools

    from turnkit.serve.app import lifecycle
    from turnkit.serve.models import ModelRegistry
    from turnkit.serve.protocol import APIError
    from turnkit.serve.replicas import ReplicaOptions, parse_autoscale, run_on_ray

    engine = _engine_options(args, Launch(cores=args.threads or 1, ray=True))
    options = ReplicaOptions(
        replicas=args.replicas or 1,
        autoscale=parse_autoscale(args.autoscale) if args.autoscale else None,
        threads=engine.threads or 1,
        max_ongoing_requests=args.max_batch or MAX_BATCH,
        max_queued_requests=args.max_queue,
        host=args.host,
        port=args.port,
        address=args.ray_address,
        ingress=args.ray_ingress or "haproxy",
        gpus=_replica_gpus(args, specs),
    )
    if not 1 <= args.port <= 65535:  # 0 too: the endpoint Ray Serve announces needs a port of its own
        raise UsageError(f"--port must be between 1 and 65535 for --ray's endpoint, not {args.port}")
    if args.ray_address is None:  # a local instance: its endpoint is this machine's port, so a taken one fails now
        for sock in lifecycle.bind(args.host, args.port):
            sock.close()
    try:  # a broken template or tokenizer fails here, in one line, before any replica starts
        registry = ModelRegistry(specs, max_loaded=args.max_loaded, options=engine)
        for name in registry.names:
            _ = registry.format(name).stop_ids
    except APIError as exc:
        raise UsageError(exc.message) from None
    factory = functools.partial(_replica_app, specs, args.max_loaded, engine, _server_options(args), args.lazy)
    run_on_ray(factory, options, announce=lambda line: print(f"turnkit: {line}", file=sys.stderr, flush=True))
    return 0


def _replica_gpus(args: argparse.Namespace, specs: list[Any]) -> int:
    """GPUs a ``--ray`` replica reserves: what its vLLM engine takes (CUDA build), the most of any model it serves."""
    if not any(_engine_of(spec) == "vllm" for spec in specs):
        return 0
    from turnkit.serve.engines.vllm_args import gpus_per_engine

    return gpus_per_engine(dict(_vllm_args(args)))


def _replica_app(specs: list[Any], max_loaded: int, engine: Any, server: dict[str, Any], lazy: bool) -> Any:
    """Runs inside each Ray replica: the same server ``turnkit serve`` builds, as an ASGI app."""
    from turnkit.serve.app.routes import Server
    from turnkit.serve.models import ModelRegistry

    registry = ModelRegistry(specs, max_loaded=max_loaded, options=engine)
    if not lazy:
        registry.preload(registry.default_name)
    return Server(registry, **server).app()


def _queue_places(text: str) -> int:
    """An argparse type: requests that may wait, 0 included (none wait: 429 once every slot runs)."""
    return whole_number(text, least=0)


def _seconds(text: str) -> float:
    """An argparse type: a duration in seconds, 0 included."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds of at least 0, not {text}")
    return value


def _add_options(command: Any, place: str) -> None:
    """The engine options listed at ``place`` in ``--help``, one flag a row, each of its row's value kind."""
    for option in ENGINE_OPTIONS:
        if option.place == place:
            _add_option(command, option)


def _add_option(command: Any, option: EngineOption) -> None:
    kind = option.kind
    command.add_argument(option.flag, type=kind.read, choices=kind.choices, metavar=kind.metavar, help=option.help)


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
    add_count(serve, "--max-loaded", "models kept loaded (least recently used unloaded; default 2)", default=2)
    add_switch(serve, "--lazy", "load even the default model on its first request, not at start")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="the address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for every interface)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=8000,
        metavar="N",
        help="the port to listen on (default 8000); 0 takes a free one, which the start names",
    )
    serve.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY'")
    serve.add_argument(
        "--engine",
        choices=ENGINES,
        help="llama.cpp (the default for .gguf files), transformers on torch (the default for folders), or vllm "
        "(vLLM's engine in process, installed beside turnkit: docs/guides/serve.md, On vLLM)",
    )
    serve.add_argument(
        "--vllm-arg",
        action="append",
        metavar="KEY=VALUE",
        help="an option of vLLM's engine (AsyncEngineArgs), repeatable: tensor_parallel_size=2, "
        "gpu_memory_utilization=0.8, dtype=bfloat16, enable_prefix_caching=true (a value is JSON where it reads as "
        "JSON); --engine vllm only",
    )
    _add_options(serve, "engine")
    serve.add_argument("--model-id", metavar="NAME", help="the one model's name for clients (default: from the file)")
    override = serve.add_mutually_exclusive_group()
    override.add_argument(
        "--template", metavar="FILE", help="the one model's chat template: a Jinja file instead of the model's own"
    )
    override.add_argument("--family", choices=families.names(), help="the one model's template: a built-in family's")
    _add_options(serve, "queue")
    serve.add_argument(
        "--max-queue",
        type=_queue_places,
        default=64,
        metavar="N",
        help="requests waiting before 429 answers (default 64)",
    )
    serve.add_argument(
        "--queue-timeout",
        type=_seconds,
        default=60.0,
        metavar="S",
        help="seconds a request may wait for a slot and cache room before a 503 (0: no limit; default 60)",
    )
    serve.add_argument(
        "--drain-seconds",
        type=_seconds,
        metavar="S",
        help="on SIGTERM/SIGINT, how long running replies may take to finish before they end with an error "
        f"(default {_DRAIN_SECONDS:g}; not with --ray, whose replicas Ray Serve drains)",
    )
    add_switch(serve, "--metrics-public", "with --api-key: serve /metrics without the API key")
    add_count(serve, "--default-max-tokens", "reply budget when a request sets none (default 512)", default=512)
    add_switch(serve, "--allow-template-override", "let requests bring their own chat_template or family")
    add_switch(
        serve,
        "--refuse-builtin-tools",
        "answer 400 to a Responses or Messages request that offers one of OpenAI's or Anthropic's built-in "
        "tools (web search, code execution, computer use ...), which this server cannot run (default: serve it "
        "without them, named in the turnkit-dropped-tools header)",
    )
    add_switch(serve, "--no-ui", "do not serve the playground page at /")
    add_switch(serve, "--ray", "run replicas on Ray Serve behind one endpoint")
    serve.add_argument("--ray-address", metavar="ADDRESS", help="join this Ray cluster (default: start a local one)")
    add_count(serve, "--replicas", "--ray: replicas (default 1; threads each: --threads)")
    serve.add_argument("--autoscale", metavar="MIN:MAX", help="--ray: let Ray Serve scale between MIN and MAX replicas")
    serve.add_argument(
        "--ray-ingress",
        choices=INGRESSES,
        help="--ray: Ray Serve's HAProxy ingress (replicas serve HTTP themselves; the default) or its Python proxy",
    )
    serve.set_defaults(handler=_cmd_serve)
