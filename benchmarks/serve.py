"""Serving speed, side by side in one run: ``turnkit serve`` on each engine against the servers people compare it with.

Usage: python benchmarks/serve.py [--repeats R] [--requests N] [--max-tokens T] [--threads K] [--only NAME ...]
       python benchmarks/serve.py --ray [the options of benchmarks/serve_ray.py]: ``turnkit serve --ray`` with 1 and 2
       replicas against plain servers (that script's comparison)

Servers (each on the embedded SmolLM2 GGUF, ``--threads`` threads, default 1; a server that cannot start is listed
with the reason):

* ``turnkit/llama.cpp``: ``turnkit serve --engine llama.cpp`` (continuous batching, chunked prefill);
* ``turnkit/torch``: ``turnkit serve --engine torch`` (dynamic batching on transformers/torch);
* ``llama-cpp-python``: its own server, ``python -m llama_cpp.server`` (needs ``llama-cpp-python[server]``);
* ``transformers``: ``transformers serve --continuous-batching`` on the GGUF's converted safetensors folder.

Load: 1, 4 and 16 concurrent streaming clients (the official ``openai`` client, greedy, ``--max-tokens`` tokens),
each sending ``--requests`` requests. Per level: aggregate completion tokens/s, p50/p99 time to first token (TTFT),
p50/p99 inter-token latency (ITL, the gaps between streamed chunks), errors. Mixed load: 8 streams running, then one
prompt of about 4,000 tokens arrives; the running streams' ITL during its prefill, and its own TTFT. Each figure is
the median over ``--repeats`` rounds (the machine is shared: the load average is printed with the figures).

Targets: one client at least 0.9x llama-cpp-python's server; 16 clients at least 2x ``transformers serve
--continuous-batching``; p50 TTFT under 1.5 s at 16 clients; no errors.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

QUESTIONS = [
    "Explain how a bicycle stays upright.",
    "Write a short story about a lighthouse keeper.",
    "What are the benefits of regular exercise?",
    "Describe the water cycle in simple terms.",
    "Give me three tips for learning a new language.",
    "Why is the sky blue?",
    "Summarize the plot of a heist movie you invent.",
    "How do vaccines train the immune system?",
]
LEVELS = (1, 4, 16)


@dataclass
class Stats:
    """What one load level measured."""

    tokens: int = 0
    wall: float = 0.0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    usage_missing: bool = False
    cpu: float = 0.0  # CPU seconds the server process used (all its threads)

    @property
    def rate(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0

    @property
    def per_cpu(self) -> float:
        """Tokens per CPU second of the server: what the server costs, whatever else the machine is running."""
        return self.tokens / self.cpu if self.cpu else float("nan")


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Peer:
    name: str
    command: list[str]
    model: str
    env: dict[str, str] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _stream(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[dict],
    max_tokens: int,
    stats: Stats,
    stamps: list[float] | None = None,
) -> float | None:
    """One streamed request; returns its TTFT (None on error). Chunk arrival times go to ``stamps``."""
    start = time.perf_counter()
    first = last = None
    counted = 0
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = None
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content:
                counted += 1
                if first is None:
                    first = now - start
                elif last is not None:
                    stats.itl.append(now - last)
                last = now
                if stamps is not None:
                    stamps.append(now)
            if getattr(chunk, "usage", None):
                usage = chunk.usage.completion_tokens
        if usage is None:
            stats.usage_missing = True
        stats.tokens += usage if usage is not None else counted
        ttft = first if first is not None else time.perf_counter() - start
        stats.ttft.append(ttft)
        return ttft
    except Exception as exc:  # noqa: BLE001 - counted and reported
        stats.errors.append(repr(exc)[:200])
        return None


async def _level(
    url: str, model: str, clients: int, requests_each: int, max_tokens: int, pid: int | None = None
) -> Stats:
    stats = Stats()
    cpu = _cpu_seconds(pid)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)

    async def one_client(c: int) -> None:
        for r in range(requests_each):
            question = QUESTIONS[(c + r) % len(QUESTIONS)]
            await _stream(client, model, [{"role": "user", "content": question}], max_tokens, stats)

    start = time.perf_counter()
    await asyncio.gather(*(one_client(c) for c in range(clients)))
    stats.wall = time.perf_counter() - start
    stats.cpu = _cpu_seconds(pid) - cpu
    await client.close()
    return stats


async def _mixed(url: str, model: str, long_text: str) -> tuple[float, float, float, int]:
    """8 streams running, then a ~4,000-token prompt: (ITL p50 before, ITL max during its prefill, its TTFT, errors)."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    stats = Stats()
    stamps: list[list[float]] = [[] for _ in range(8)]
    runners = [
        asyncio.create_task(_stream(client, model, [{"role": "user", "content": QUESTIONS[n]}], 160, stats, stamps[n]))
        for n in range(8)
    ]
    deadline = time.perf_counter() + 120
    while min(len(s) for s in stamps) < 5 and time.perf_counter() < deadline and not all(r.done() for r in runners):
        await asyncio.sleep(0.02)
    submitted = time.perf_counter()
    long_stats = Stats()
    ttft = await _stream(client, model, [{"role": "user", "content": long_text}], 8, long_stats)
    first = submitted + (ttft or 0.0)
    await asyncio.gather(*runners)
    await client.close()
    before, during = [], []
    for times in stamps:
        for a, b in itertools.pairwise(times):
            if b < submitted:
                before.append(b - a)
            elif a <= first:  # a gap that overlaps the long prompt's prefill (a stall would be one long gap)
                during.append(b - a)
    errors = len(stats.errors) + len(long_stats.errors)
    return _pct(before, 0.5), max(during, default=float("nan")), ttft or float("nan"), errors


def _wait_up(url: str, process: subprocess.Popen, timeout: float = 600) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"exited with status {process.returncode}"
        for path in ("/health", "/v1/models"):
            try:
                if httpx.get(url + path, timeout=2).status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    return f"did not answer within {timeout:.0f} s"


def _client(url: str, timeout: float) -> openai.AsyncOpenAI:
    """An OpenAI client that opens a new connection for every request (loopback: a fraction of a millisecond).

    Why not reuse connections: llama-server (the llama.cpp that llama-cpp-python 0.3.36 vendors) closes the connection
    after every streamed reply although it did not say ``Connection: close`` (tools/server/server-http.cpp,
    ``process_handler_response``: its chunked content provider returns ``has_next``, false, right after
    ``sink.done()``, which cpp-httplib's ``write_content_chunked`` takes as a cancelled write, so the keep-alive loop
    ends). A client that sends its next request on that connection before the close arrives gets "Server
    disconnected without sending a response" (``APIConnectionError``), and llama-server logs nothing: it never read
    the request. Every server gets the same fresh connections, so the comparison stays even."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    http = openai.DefaultAsyncHttpxClient(limits=limits, timeout=timeout)
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=timeout, http_client=http)


def _ready(servers: list[_Running]) -> list[_Running]:
    """The servers that answered, in order; each one that did not is a ``not run`` line naming its log."""
    ready = []
    for server in servers:
        why = _wait_up(server.url, server.process)
        if why:
            print(f"not run: {server.peer.name}: {why} (log: {server.log_path})")
        else:
            ready.append(server)
    return ready


def _peers(gguf: Path, threads: int, port_of: Callable[[], int]) -> tuple[list[tuple[Peer, int]], list[str]]:
    """The servers to run, each with its port, and a line for each one that cannot run."""
    python = sys.executable
    missing = []
    peers = []
    turnkit = [python, "-m", "turnkit.cli", "serve", "--model", str(gguf), "--threads", str(threads), "--no-ui"]
    for engine in ("llama.cpp", "torch"):
        port = port_of()
        peers.append((Peer(f"turnkit/{engine}", [*turnkit, "--engine", engine, "--port", str(port)], "default"), port))
    if all(
        importlib.util.find_spec(m) for m in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings")
    ):
        port = port_of()
        command = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--n_threads", str(threads)]
        command += ["--n_threads_batch", str(threads), "--n_ctx", "8192", "--port", str(port), "--model_alias", "smol"]
        peers.append((Peer("llama-cpp-python", command, "smol"), port))
    else:
        missing.append("llama-cpp-python server: needs pip install -e '.[bench]' (llama-cpp-python[server])")
    cli = shutil.which("transformers", path=str(Path(python).parent)) or shutil.which("transformers")
    if cli:
        folder = _transformers_folder(gguf)
        port = port_of()
        command = [cli, "serve", str(folder), "--continuous-batching", "--device", "cpu", "--port", str(port)]
        command += ["--host", "127.0.0.1"]
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        peers.append((Peer("transformers", command, str(folder), env), port))
    else:
        missing.append("transformers serve: the transformers command is not installed")
    return peers, missing


def _transformers_folder(gguf: Path) -> Path:
    """The GGUF's model as transformers serve loads it: turnkit's converted safetensors folder plus the tokenizer
    (transformers serve cannot load this GGUF itself: its config names no architecture)."""
    from transformers import AutoTokenizer

    from turnkit.serve.engines.torch import _converted_gguf

    converted = _converted_gguf(gguf)
    folder = Path(tempfile.mkdtemp(prefix="turnkit-bench-model-"))
    for item in converted.iterdir():
        (folder / item.name).symlink_to(item)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    return folder


def _long_text() -> str:
    from turnkit import ChatFormat
    from turnkit.embedded import default_model_path

    fmt = ChatFormat.from_pretrained(default_model_path())
    text = "Read this log and say which machine failed first.\n"
    n = 0
    while True:
        chunk = "".join(f"{n + i:05d} machine-{(n + i) * 7 % 97} status ok load {(n + i) % 13}\n" for i in range(50))
        n += 50
        candidate = text + chunk
        if len(fmt.encode([{"role": "user", "content": candidate}], add_generation_prompt=True).input_ids) > 4000:
            return text
        text = candidate


class _Running:
    """A started server: its process, log and URL."""

    def __init__(self, peer: Peer, port: int, log_dir: Path) -> None:
        self.peer, self.url = peer, f"http://127.0.0.1:{port}"
        self.log_path = log_dir / f"{peer.name.replace('/', '-')}.log"
        self.log = self.log_path.open("w")
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **peer.env}
        self.process = subprocess.Popen(peer.command, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def _median(rounds: list[Stats], pick: Callable[[Stats], float]) -> float:
    return statistics.median(pick(s) for s in rounds)


def main() -> None:
    if "--ray" in sys.argv[1:]:  # scaling out has its own comparison: replicas against plain servers and the bound
        import serve_ray

        sys.argv.remove("--ray")
        serve_ray.main()
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3, help="rounds per server; figures are medians")
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", help="run only these servers (names as printed)")
    parser.add_argument("--no-mixed", action="store_true", help="skip the mixed load")
    parser.add_argument("--levels", type=int, nargs="*", default=list(LEVELS), help="concurrent clients (1 4 16)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers on the way out

    from turnkit.embedded import default_model_path

    gguf = default_model_path()
    peers, missing = _peers(gguf, args.threads, _free_port)
    if args.only:
        peers = [(peer, port) for peer, port in peers if peer.name in args.only]
    long_text = _long_text()
    log_dir = Path(tempfile.mkdtemp(prefix="turnkit-bench-"))
    print(f"{os.cpu_count()} cores, {args.threads} thread(s) per server, greedy, {args.max_tokens} max tokens; ")
    print(f"all servers up at once, rounds interleaved, medians of {args.repeats} rounds; server logs in {log_dir}")
    for line in missing:
        print(f"not run: {line}")
    servers = [_Running(peer, port, log_dir) for peer, port in peers]
    results: dict[str, dict] = {}
    loads = []
    try:
        ready = []
        for server in servers:
            why = _wait_up(server.url, server.process)
            warm = None if why else asyncio.run(_level(server.url, server.peer.model, 1, 1, 8))
            if why or (warm and warm.errors):
                print(f"not run: {server.peer.name}: {why or warm.errors[0]} (log: {server.log_path})")
                continue
            ready.append(server)
            results[server.peer.name] = {clients: [] for clients in args.levels} | {"mixed": []}
        for _ in range(args.repeats):
            loads.append(os.getloadavg()[0])
            for clients in args.levels:
                requests = args.requests if clients > 1 else args.requests * 2
                for server in ready:
                    stats = asyncio.run(
                        _level(server.url, server.peer.model, clients, requests, args.max_tokens, server.process.pid)
                    )
                    results[server.peer.name][clients].append(stats)
            if not args.no_mixed:
                for server in ready:
                    results[server.peer.name]["mixed"].append(
                        asyncio.run(_mixed(server.url, server.peer.model, long_text))
                    )
        loads.append(os.getloadavg()[0])
    finally:
        for server in servers:
            server.stop()
    _report(results, loads)
    _targets(results)


def _report(results: dict[str, dict], loads: list[float]) -> None:
    print(f"\nload average (1 min) at each round's start and the end: {', '.join(f'{x:.1f}' for x in loads)}")
    print("tok/s: completion tokens per second of wall time; tok/CPU-s: per CPU second the server process used")
    header = (
        f"{'server':<18} {'clients':>7} {'tok/s':>7} {'tok/CPU-s':>9} {'TTFT p50':>9} {'p99':>7} {'ITL p50':>8} "
        f"{'p99':>7} {'err':>4}"
    )
    print(header)
    for name, outcome in results.items():
        for clients in [level for level in LEVELS if outcome.get(level)]:
            rounds = outcome[clients]
            errors = sum(len(s.errors) for s in rounds)
            print(
                f"{name:<18} {clients:>7} {_median(rounds, lambda s: s.rate):>7.1f} "
                f"{_median(rounds, lambda s: s.per_cpu):>9.1f} "
                f"{_median(rounds, lambda s: _pct(s.ttft, 0.5)) * 1000:>7.0f}ms "
                f"{_median(rounds, lambda s: _pct(s.ttft, 0.99)) * 1000:>5.0f}ms "
                f"{_median(rounds, lambda s: _pct(s.itl, 0.5)) * 1000:>6.0f}ms "
                f"{_median(rounds, lambda s: _pct(s.itl, 0.99)) * 1000:>5.0f}ms {errors:>4}"
                + ("  (no usage in stream: chunks counted)" if any(s.usage_missing for s in rounds) else "")
            )
            for error in [e for s in rounds for e in s.errors][:2]:
                print("      ", error)
    print("\nmixed load: 8 streams running, then a ~4,000-token prompt arrives")
    for name, outcome in results.items():
        if outcome["mixed"]:
            before, during, ttft, errors = (statistics.median(m[i] for m in outcome["mixed"]) for i in range(4))
            print(
                f"  {name:<18} streams' ITL p50 {before * 1000:.0f} ms before it, longest gap during its prefill "
                f"{during * 1000:.0f} ms; its TTFT {ttft:.1f} s; errors {errors:.0f}"
            )


def _targets(results: dict[str, dict]) -> None:
    mine = results.get("turnkit/llama.cpp")
    if not mine:
        return
    print("\ntargets (turnkit/llama.cpp):")

    def rate(name: str, clients: int) -> float | None:
        return _median(results[name][clients], lambda s: s.rate) if results.get(name, {}).get(clients) else None

    one, peer_one = rate("turnkit/llama.cpp", 1), rate("llama-cpp-python", 1)
    if one and peer_one:
        print(f"  1 client: {one:.1f} / llama-cpp-python {peer_one:.1f} = {one / peer_one:.2f}x (target >= 0.9)")
    sixteen, peer_sixteen = rate("turnkit/llama.cpp", 16), rate("transformers", 16)
    if sixteen and peer_sixteen:
        print(
            f"  16 clients: {sixteen:.1f} / transformers serve {peer_sixteen:.1f} = {sixteen / peer_sixteen:.2f}x "
            "(target >= 2)"
        )
    if mine.get(16):
        ttft = _median(mine[16], lambda s: _pct(s.ttft, 0.5))
        print(f"  16 clients: p50 TTFT {ttft:.2f} s (target < 1.5 s)")
    errors = sum(len(s.errors) for clients in LEVELS for s in mine.get(clients, []))
    print(f"  errors: {errors} (target 0)")


if __name__ == "__main__":
    main()
