"""Scaling out: aggregate tokens/s of ``turnkit serve --ray`` with 1 and 2 replicas (one torch thread each) at 16
concurrent streaming clients, with plain ``turnkit serve --threads 1`` as the reference, in one run.

Usage: python benchmarks/serve_ray.py [--clients 16] [--requests N] [--max-tokens T] [--rounds R] [--no-plain]

Each configuration is the real command in its own process (``--ray`` starts a private local Ray instance and stops
it); the load is the same streaming load as benchmarks/serve.py (the official ``openai`` client, greedy, fresh
process per configuration). Target: 2 replicas at least 1.6x one replica. The load average is printed with each
measurement: on a machine shared with other work the figures are only as good as the spare cores. CPU ms per token
(the server's whole process tree, Ray's processes included) does not depend on spare cores: it prices Ray's share.
Prints a JSON line at the end for records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import _free_port, _level  # the same load generator as benchmarks/serve.py


def _tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) used so far by a process and all its descendants (a local Ray instance's
    processes descend from the ``turnkit serve`` that started it)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
            ticks[int(entry.name)] = int(fields[11]) + int(fields[12])
    tree, frontier = {root}, [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier and pid not in tree]
        tree.update(children)
        frontier = children
    return sum(ticks.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


def _measure(extra: list[str], clients: int, requests: int, max_tokens: int) -> dict:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port), "--threads", "1", "--no-ui", *extra]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.pop("RAY_ADDRESS", None)
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        start = time.monotonic()
        while True:
            if server.poll() is not None or time.monotonic() - start > 600:
                raise RuntimeError(f"{' '.join(extra) or 'plain'} did not come up")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        ready = time.monotonic() - start
        asyncio.run(_level(url, "default", clients, 1, 8))  # warm up every replica
        cpu = _tree_cpu_s(server.pid)
        stats = asyncio.run(_level(url, "default", clients, requests, max_tokens))
        cpu = _tree_cpu_s(server.pid) - cpu
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
    ttft = sorted(stats.ttft) or [float("nan")]
    return {
        "tokens_per_s": stats.rate,
        "ttft_p50_ms": statistics.median(ttft) * 1000,
        "ttft_max_ms": ttft[-1] * 1000,
        "errors": len(stats.errors),
        "ready_s": ready,
        "cpu_ms_per_token": 1000 * cpu / max(1, stats.tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="measure each configuration this many times, interleaved")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain turnkit serve reference")
    args = parser.parse_args()

    configs = {} if args.no_plain else {"plain, 1 thread": []}
    configs["ray, 1 replica"] = ["--ray", "--replicas", "1"]
    configs["ray, 2 replicas"] = ["--ray", "--replicas", "2"]
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    print(
        f"{args.clients} streaming clients x {args.requests} requests, {args.max_tokens} max tokens, greedy; "
        f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the start\n"
    )
    header = ("server", "tokens/s", "p50 TTFT ms", "max TTFT ms", "errors", "ready s", "load", "CPU ms/token")
    print("{:<18} {:>9} {:>12} {:>12} {:>7} {:>8} {:>5} {:>13}".format(*header))
    for round_ in range(args.rounds):
        order = list(configs) if round_ % 2 == 0 else list(reversed(configs))  # drift in load falls on both sides
        for name in order:
            r = _measure(configs[name], args.clients, args.requests, args.max_tokens)
            r["load"] = os.getloadavg()[0]
            runs[name].append(r)
            print(
                f"{name:<18} {r['tokens_per_s']:>9.1f} {r['ttft_p50_ms']:>12.0f} {r['ttft_max_ms']:>12.0f} "
                f"{r['errors']:>7} {r['ready_s']:>8.0f} {r['load']:>5.1f} {r['cpu_ms_per_token']:>13.1f}",
                flush=True,
            )
    rate = {name: statistics.median(r["tokens_per_s"] for r in rs) for name, rs in runs.items()}
    ratio = rate["ray, 2 replicas"] / rate["ray, 1 replica"]
    print(f"\n2 replicas / 1 replica = {ratio:.2f} (target >= 1.6; medians over {args.rounds} rounds)")
    if "plain, 1 thread" in rate:
        print(f"1 replica / plain turnkit serve = {rate['ray, 1 replica'] / rate['plain, 1 thread']:.2f}")
    print(json.dumps({"runs": runs, "median_tokens_per_s": rate, "ratio_2_over_1": ratio}))


if __name__ == "__main__":
    main()
