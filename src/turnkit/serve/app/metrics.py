"""``GET /metrics``: the server in Prometheus' text format (``prometheus-client``), and the figures ``/health`` shares.

What is counted, and where it comes from:

* per request, when it is over (:class:`~.inflight.InFlight` calls :meth:`Metrics.record` with the request's
  :class:`~turnkit.serve.session.Ledger`): ``turnkit_requests_total{endpoint, model, status}`` (status 499: the client
  left before its answer ended, also counted in ``turnkit_requests_aborted_total``), the prompt, cached and generated
  tokens, and the latency histograms (time to first token, time per output token, end to end), per model. A request
  is one observation however many choices (``n``) it asked for: its first token, its end
  (:func:`~turnkit.serve.session.choices_timing`);
* at each scrape, read from the engines (the same :class:`~turnkit.serve.engines.base.Load` readings ``/health``
  shows): requests running and waiting, the key/value cache's size, what is promised to running requests, what is
  free to promise and what finished requests keep for reuse, per model; and speculative decoding's tokens drafted
  and accepted (counters, as vLLM's ``spec_decode_num_draft_tokens`` and ``spec_decode_num_accepted_tokens``).

Every route is counted without writing anything: a wire API added later (the Responses or Messages API) has its
requests, tokens and latencies here as soon as its route starts sessions with :mod:`~turnkit.serve.session`. Names
follow Prometheus' conventions (``turnkit_`` prefix, base units, ``_total`` counters), and vLLM's metrics where one
exists (``time_to_first_token_seconds``, ``e2e_request_latency_seconds``, ``kv_cache_usage``). Each server has its
own registry, so servers in one process (tests) do not mix. Behind the API key when one is set, unless
``--metrics-public``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from turnkit.serve.engines.base import Load
from turnkit.serve.models import ModelRegistry
from turnkit.serve.session import Ledger, choices_timing

__all__ = ["Metrics"]

_SECONDS_TO_FIRST_TOKEN = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
_SECONDS_PER_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5)
_SECONDS_PER_REQUEST = (0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
#: Probes, not traffic: not counted.
_UNCOUNTED = frozenset({"/health", "/metrics"})


class Metrics:
    """The server's metrics. ``endpoints``: the paths counted under their own name (any other path is ``other``, so a
    client cannot grow the label set)."""

    def __init__(self, models: ModelRegistry, endpoints: Iterable[str]) -> None:
        self.endpoints = frozenset(endpoints) - _UNCOUNTED
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "turnkit_requests", "HTTP requests answered", ["endpoint", "model", "status"], registry=registry
        )
        self.aborted = Counter(
            "turnkit_requests_aborted",
            "requests whose client left before the answer ended (their generation was stopped)",
            ["endpoint", "model"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "turnkit_prompt_tokens", "prompt tokens of admitted requests", ["model"], registry=registry
        )
        self.cached_tokens = Counter(
            "turnkit_prompt_cached_tokens",
            "prompt tokens reused from the engine's cache instead of computed",
            ["model"],
            registry=registry,
        )
        self.generation_tokens = Counter("turnkit_generation_tokens", "tokens generated", ["model"], registry=registry)
        self.ttft = Histogram(
            "turnkit_time_to_first_token_seconds",
            "from submitting a request to the engine (queue wait included) to its first token",
            ["model"],
            buckets=_SECONDS_TO_FIRST_TOKEN,
            registry=registry,
        )
        self.tpot = Histogram(
            "turnkit_time_per_output_token_seconds",
            "a reply's mean time between tokens after the first",
            ["model"],
            buckets=_SECONDS_PER_TOKEN,
            registry=registry,
        )
        self.e2e = Histogram(
            "turnkit_e2e_request_latency_seconds",
            "from submitting a request to the engine to the end of its reply",
            ["model"],
            buckets=_SECONDS_PER_REQUEST,
            registry=registry,
        )
        registry.register(_EngineCollector(models))

    def endpoint(self, path: str) -> str:
        return path if path in self.endpoints else "other"

    def record(self, scope: dict[str, Any], status: int, ledger: Ledger) -> None:
        """One HTTP request is over: count it, and what its sessions did."""
        path = scope.get("path", "")
        if path in _UNCOUNTED:
            return
        endpoint = self.endpoint(path)
        started = [session for session in ledger.sessions if session.admitted]
        model = ledger.sessions[0].model if ledger.sessions else ""
        self.requests.labels(endpoint, model, str(status)).inc()
        if status == 499:
            self.aborted.labels(endpoint, model).inc()
        if not started:
            return
        first = started[0]  # the choices of one request share its prompt: counted once, as usage does
        self.prompt_tokens.labels(model).inc(first.prompt_tokens)
        self.cached_tokens.labels(model).inc(min(first.generation.cached_tokens, first.prompt_tokens))
        self.generation_tokens.labels(model).inc(sum(session.completion_tokens for session in started))
        timing = choices_timing(started)  # one request, one observation, whatever its n
        if timing.first_token is not None:
            self.ttft.labels(model).observe(timing.first_token)
        if timing.per_token is not None:
            self.tpot.labels(model).observe(timing.per_token)
        if timing.total is not None:
            self.e2e.labels(model).observe(timing.total)

    def aborted_total(self) -> int:
        """Requests whose client left, all endpoints and models (``/health`` shows it too)."""
        return int(sum(sample.value for sample in _samples(self.aborted, "turnkit_requests_aborted_total")))

    async def endpoint_metrics(self, request: Request) -> Response:
        """``GET /metrics``."""
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


#: The gauges read from each engine at a scrape: name, help, and the figure of a :class:`Load` (None: not shown).
_GAUGES: tuple[tuple[str, str, Callable[[Load], float | None]], ...] = (
    ("turnkit_requests_running", "requests generating", lambda load: load.running),
    ("turnkit_requests_waiting", "requests waiting for admission", lambda load: load.waiting),
    ("turnkit_kv_cache_capacity_tokens", "the key/value cache, in tokens", lambda load: load.kv_capacity),
    (
        "turnkit_kv_cache_used_tokens",
        "key/value cache tokens promised to running requests (prompt plus max_tokens each)",
        lambda load: None if load.kv_capacity is None else load.kv_reserved,
    ),
    ("turnkit_kv_cache_free_tokens", "key/value cache tokens admission can still promise", lambda load: load.kv_free),
    (
        "turnkit_kv_cache_cached_tokens",
        "key/value cache tokens finished requests keep for prefix reuse (freed when needed)",
        lambda load: None if load.kv_capacity is None else load.kv_cached,
    ),
    (
        "turnkit_kv_cache_usage_ratio",
        "used / capacity of the key/value cache",
        lambda load: None if not load.kv_capacity else load.kv_reserved / load.kv_capacity,
    ),
)


#: The counters read from each engine at a scrape (running totals since it started): name, help, figure.
_COUNTERS: tuple[tuple[str, str, Callable[[Load], float]], ...] = (
    (
        "turnkit_spec_decode_draft_tokens",
        "tokens drafted by speculative decoding from the context",
        lambda load: load.drafted,
    ),
    (
        "turnkit_spec_decode_accepted_tokens",
        "drafted tokens accepted (what decoding without a draft would have produced)",
        lambda load: load.accepted,
    ),
)


class _EngineCollector:
    """Read at each scrape: what every loaded model's engine is doing (the readings ``/health`` shows)."""

    def __init__(self, models: ModelRegistry) -> None:
        self.models = models

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        loads = self.models.loads()
        for name, text, figure in _GAUGES:
            gauge = GaugeMetricFamily(name, text, labels=["model"])
            for model, load in loads.items():
                value = figure(load)
                if value is not None:
                    gauge.add_metric([model], value)
            yield gauge
        for name, text, count in _COUNTERS:
            counter = CounterMetricFamily(name, text, labels=["model"])
            for model, load in loads.items():
                counter.add_metric([model], count(load))
            yield counter


def _samples(metric: Counter, name: str) -> Iterator[Any]:
    for family in metric.collect():
        yield from (sample for sample in family.samples if sample.name == name)
