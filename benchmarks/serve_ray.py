"""Scaling out: aggregate tokens/s of ``turnkit serve --ray`` with 1 and 2 replicas (one engine thread each) at 16
concurrent streaming clients, against the references that bound it, measured in one run.

Usage: python benchmarks/serve_ray.py [--clients 16] [--requests N] [--max-tokens T] [--rounds R] [--no-plain]
       [--no-bound] [--cpu] [--ingress haproxy,proxy]

Configurations (each the real command in its own processes; ``--ray`` starts a private local Ray instance and stops
it):

* ``plain, 1 thread``: one ``turnkit serve --threads 1`` taking all clients (what one replica would be without Ray);
* ``2 plain, 8+8``: the bound. Two independent ``turnkit serve --threads 1`` processes, each taking half the clients
  from the same load generator: what any replica scheme could do here (no proxy, no routing, a perfect split);
* ``ray, 1 replica`` and ``ray, 2 replicas``: ``turnkit serve --ray --replicas N`` (Ray Serve's HAProxy ingress, the
  default); with ``--ingress haproxy,proxy`` also ``proxy, 1 replica`` and ``proxy, 2 replicas``: the same through
  Serve's Python proxy (``--ray-ingress proxy``).

The load is the same streaming load as benchmarks/serve.py (the official ``openai`` client, greedy, one asyncio load
generator in this process, on the same cores as the servers), measured after one request per client of the same
length has warmed every server up. Target: 2 replicas at least 1.6x one replica. With each
measurement: the load average, and "others", the cores that work outside this benchmark took during the measured load
(from /proc/stat): on a machine shared with other work, tokens/s is only as good as the spare cores, and a figure is
clean when "others" is near 0. CPU ms per token (the servers' whole process trees, Ray's processes included) depends
much less on spare cores: it prices Ray's share. ``--cpu`` prints, for each configuration, where the CPU went during
the measured load (each replica, Ray Serve's proxy, Ray's other processes, the load generator, the rest of the
machine), from /proc tick counts before and after. The CPU ceiling (tokens/s with every core to the servers and the
load generator, from their CPU per token) is printed too. Prints a JSON line at the end for records.
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
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serve import Stats, _free_port, _level  # the same load generator as benchmarks/serve.py
from serve_harness import wait_until_up

TICK = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, int, str]]:
    """Every process: pid -> (parent, CPU ticks used so far, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            found[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]), command)
    return found


def _machine_ticks() -> int:
    """Busy ticks of all cores together since boot (everything but idle and iowait)."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values) - values[3] - values[4]


def _tree(processes: dict[int, tuple[int, int, str]], roots: list[int]) -> set[int]:
    tree, frontier = set(roots), list(roots)
    while frontier:
        children = [pid for pid, (parent, _, _) in processes.items() if parent in frontier and pid not in tree]
        tree.update(children)
        frontier = children
    return tree


def _role(pid: int, command: str, roots: list[int]) -> str:
    """Which part of the serving system a process is (for the CPU breakdown)."""
    if pid in roots:
        return f"turnkit serve #{roots.index(pid) + 1}" if len(roots) > 1 else "turnkit serve (driver)"
    for marker, role in (
        ("ServeReplica", "replica"),
        ("ProxyActor", "Ray Serve proxy"),
        ("HAProxyManager", "Ray Serve's HAProxy manager"),
    ):
        if marker in command:
            return role
    if command.split(" ", 1)[0].rsplit("/", 1)[-1] == "haproxy":
        return "HAProxy"
    if "ServeController" in command:
        return "Ray Serve controller"
    for marker in ("raylet", "gcs_server"):
        if marker in command:
            return marker
    return "Ray, other processes"


class _Cpu:
    """CPU ticks per process between two snapshots, grouped by role."""

    def __init__(self, roots: list[int]) -> None:
        self.roots = roots
        self.before = _processes()
        self.machine = _machine_ticks()
        self.me = os.times()

    def finish(self) -> tuple[float, dict[str, float]]:
        """(the servers' CPU seconds, CPU seconds by role, the load generator and the rest of the machine included)."""
        after = _processes()
        me = os.times()
        machine = (_machine_ticks() - self.machine) / TICK
        tree = _tree(after, self.roots) | (_tree(self.before, self.roots) & after.keys())
        roles: dict[str, float] = {}
        replicas = sorted(pid for pid in tree if "ServeReplica" in after[pid][2])
        for pid in tree:
            used = (after[pid][1] - (self.before[pid][1] if pid in self.before else 0)) / TICK
            role = _role(pid, after[pid][2], self.roots)
            if role == "replica":
                role = f"replica #{replicas.index(pid) + 1}"
            roles[role] = roles.get(role, 0.0) + used
        servers = sum(roles.values())
        roles["load generator (this process)"] = (me.user + me.system) - (self.me.user + self.me.system)
        roles["rest of the machine"] = max(0.0, machine - sum(roles.values()))
        others = {  # the busiest processes outside the servers: who else took the cores
            pid: (ticks - self.before.get(pid, (0, 0, ""))[1]) / TICK
            for pid, (_, ticks, _) in after.items()
            if pid not in tree and pid != os.getpid()
        }
        for pid in sorted(others, key=lambda pid: -others[pid])[:3]:
            if others[pid] >= 0.5:
                roles[f"  of which: {after[pid][2][:60] or pid}"] = others[pid]
        return servers, roles


def _start(extra: list[str]) -> tuple[subprocess.Popen, str, Path]:
    """A server and its URL and log (``--ray`` says in it when its endpoint routes to the replicas)."""
    port = _free_port()
    command = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port), "--threads", "1", "--no-ui", *extra]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.pop("RAY_ADDRESS", None)
    log = Path(tempfile.gettempdir()) / f"turnkit-bench-serve-ray-{port}.log"
    with log.open("w") as sink:
        server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    return server, f"http://127.0.0.1:{port}", log


async def _split(urls: list[str], clients: int, requests: int, max_tokens: int) -> Stats:
    """The load generator's clients, split evenly over the servers (one server: all of them), as one load."""
    start = time.perf_counter()
    parts = await asyncio.gather(*(_level(url, "default", clients // len(urls), requests, max_tokens) for url in urls))
    merged = Stats(wall=time.perf_counter() - start)
    for part in parts:
        merged.tokens += part.tokens
        merged.ttft += part.ttft
        merged.errors += part.errors
    return merged


def _measure(extra: list[str], servers: int, clients: int, requests: int, max_tokens: int) -> dict:
    started = [_start(extra) for _ in range(servers)]
    try:
        start = time.monotonic()
        for process, url, log in started:
            wait_until_up(url, process, timeout=600, announced=log if "--ray" in extra else None)
        ready = time.monotonic() - start
        urls = [url for _, url, _ in started]
        # warm up every server and replica with one request per client of the measured length: after a shorter one the
        # first full load still paid one-time costs (its median first token twice the next load's, for every server)
        asyncio.run(_split(urls, clients, 1, max_tokens))
        cpu = _Cpu([process.pid for process, _, _ in started])
        stats = asyncio.run(_split(urls, clients, requests, max_tokens))
        server_cpu, roles = cpu.finish()
    finally:
        for process, _, _ in started:
            process.send_signal(signal.SIGTERM)
        for process, _, log in started:
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
            log.unlink(missing_ok=True)
    ttft = sorted(stats.ttft) or [float("nan")]
    return {
        "tokens_per_s": stats.rate,
        "tokens": stats.tokens,
        "wall_s": stats.wall,
        "ttft_p50_ms": statistics.median(ttft) * 1000,
        "ttft_max_ms": ttft[-1] * 1000,
        "errors": len(stats.errors),
        "ready_s": ready,
        "cpu_ms_per_token": 1000 * server_cpu / max(1, stats.tokens),
        "cpu_s_by_role": roles,
    }


def _print_cpu(name: str, r: dict) -> None:
    wall = r["wall_s"]
    parts = sorted(r["cpu_s_by_role"].items(), key=lambda item: -item[1])
    total = sum(seconds for role, seconds in parts if not role.startswith(" "))
    parts = [item for item in parts if not item[0].startswith(" ")] + [
        item for item in parts if item[0].startswith(" ")
    ]
    print(f"    CPU during {name} ({wall:.1f} s of load, {total / wall:.2f} cores busy in all):")
    for role, seconds in parts:
        per_token = 1000 * seconds / max(1, r["tokens"])
        print(f"      {role[:44]:<44} {seconds:>6.1f} s  {seconds / wall:>5.2f} cores  {per_token:>5.1f} ms/token")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="measure each configuration this many times, interleaved")
    parser.add_argument("--no-plain", action="store_true", help="skip plain turnkit serve (and the bound)")
    parser.add_argument("--no-bound", action="store_true", help="skip the two plain servers (the bound)")
    parser.add_argument("--only-ray", action="store_true", help="only the two Ray configurations")
    parser.add_argument("--cpu", action="store_true", help="print where the CPU went in each configuration")
    parser.add_argument("--ingress", default="haproxy", help="Ray Serve ingresses to measure: haproxy, proxy or both")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers on the way out

    configs: dict[str, tuple[list[str], int]] = {}
    if not (args.no_plain or args.only_ray):
        configs["plain, 1 thread"] = ([], 1)
        if not args.no_bound:
            configs["2 plain, 8+8"] = ([], 2)
    ingresses = args.ingress.split(",")
    for ingress in ingresses:
        prefix = "ray" if ingress == "haproxy" else ingress
        for n in (1, 2):
            configs[f"{prefix}, {n} replica{'s' if n > 1 else ''}"] = (
                ["--ray", "--ray-ingress", ingress, "--replicas", str(n)],
                1,
            )
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    print(
        f"{args.clients} streaming clients x {args.requests} requests, {args.max_tokens} max tokens, greedy; "
        f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the start\n"
    )
    header = ("server", "tokens/s", "p50 TTFT ms", "max TTFT ms", "errors", "ready s", "load", "others", "CPU ms/token")
    print("{:<18} {:>9} {:>12} {:>12} {:>7} {:>8} {:>5} {:>6} {:>13}".format(*header))
    for round_ in range(args.rounds):
        order = list(configs) if round_ % 2 == 0 else list(reversed(configs))  # drift in load falls on both sides
        for name in order:
            extra, servers = configs[name]
            r = _measure(extra, servers, args.clients, args.requests, args.max_tokens)
            r["load"] = os.getloadavg()[0]
            runs[name].append(r)
            others = r["cpu_s_by_role"]["rest of the machine"] / r["wall_s"]  # cores other work took meanwhile
            print(
                f"{name:<18} {r['tokens_per_s']:>9.1f} {r['ttft_p50_ms']:>12.0f} {r['ttft_max_ms']:>12.0f} "
                f"{r['errors']:>7} {r['ready_s']:>8.0f} {r['load']:>5.1f} {others:>6.2f} "
                f"{r['cpu_ms_per_token']:>13.1f}",
                flush=True,
            )
            if args.cpu:
                _print_cpu(name, r)
    rate = {name: statistics.median(r["tokens_per_s"] for r in rs) for name, rs in runs.items()}
    # What each configuration would do with every core to itself (the servers' and the load generator's CPU per token
    # only): a figure the other work on a shared machine barely moves, unlike tokens/s. One replica or one plain
    # server cannot use it (one engine thread is about one core): their measured rate is their figure.
    cores = os.cpu_count() or 1
    ceiling = {
        name: statistics.median(
            1000
            * cores
            / (r["cpu_ms_per_token"] + 1000 * r["cpu_s_by_role"]["load generator (this process)"] / r["tokens"])
            for r in rs
        )
        for name, rs in runs.items()
    }
    print(f"\nmedians over {args.rounds} rounds:")
    ratios = {}
    for prefix, what in (("ray", "HAProxy ingress"), ("proxy", "Serve's Python proxy")):
        if f"{prefix}, 1 replica" not in rate:
            continue
        one, two = rate[f"{prefix}, 1 replica"], rate[f"{prefix}, 2 replicas"]
        ratios[prefix] = two / one
        paired = [
            b["tokens_per_s"] / a["tokens_per_s"]
            for a, b in zip(runs[f"{prefix}, 1 replica"], runs[f"{prefix}, 2 replicas"], strict=True)
        ]
        print(f"  {what}: 2 replicas / 1 replica = {two / one:.2f} (target >= 1.6)")
        print(f"    per round: {', '.join(f'{r:.2f}' for r in paired)}")
        if "plain, 1 thread" in rate:
            plain = rate["plain, 1 thread"]
            print(
                f"    1 replica / plain turnkit serve = {one / plain:.2f}; "
                f"2 replicas / 1 plain server = {two / plain:.2f}"
            )
            if "2 plain, 8+8" in rate:
                print(f"    2 replicas / the bound = {two / rate['2 plain, 8+8']:.2f}")
        print(
            f"    2 replicas' CPU ceiling / 1 replica measured = {ceiling[f'{prefix}, 2 replicas'] / one:.2f} "
            "(an estimate for an otherwise idle machine, not a measurement)"
        )
        if "2 plain, 8+8" in ceiling:
            print(
                f"    2 replicas' ceiling / the bound's ceiling = "
                f"{ceiling[f'{prefix}, 2 replicas'] / ceiling['2 plain, 8+8']:.2f}"
            )
    if "2 plain, 8+8" in rate:
        bound = rate["2 plain, 8+8"] / rate["plain, 1 thread"]
        print(f"  bound: 2 plain servers / 1 plain server = {bound:.2f} (what any replica scheme could do)")
    print(f"  CPU ceiling (all {cores} cores to the servers and the load generator, from CPU ms per token):")
    for name, value in ceiling.items():
        print(f"    {name:<18} {value:>6.0f} tokens/s")
    print(json.dumps({"runs": runs, "median_tokens_per_s": rate, "ratio_2_over_1": ratios, "cpu_ceiling": ceiling}))


if __name__ == "__main__":
    main()
