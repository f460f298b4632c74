"""``turnkit serve --engine vllm`` against vLLM's own server, on the same model folder, same clients, in one run.

Usage (in a venv with vLLM and turnkit: ``./dev.sh vllm-setup`` makes ``.venv-vllm`` here; on a GPU machine
``pip install -e '.[vllm]'`` in a fresh venv):

    python benchmarks/serve_vllm.py                       # the embedded model, as a folder, on vLLM's CPU build
    python benchmarks/serve_vllm.py --model /models/Qwen2.5-7B-Instruct --vllm-arg gpu_memory_utilization=0.45

Both servers are up at once (started one after the other) and take turns in each of ``--rounds`` rounds, each going
first in turn, so that what else the machine runs falls on both; figures are medians over the rounds. On a GPU, give
each its half: ``--vllm-arg gpu_memory_utilization=0.45`` (both get it). The same vLLM options go to both:
``--max-num-seqs`` (turnkit's ``--max-batch``), ``--max-model-len``, ``--dtype`` and any ``--vllm-arg KEY=VALUE``
(vLLM's server gets it as ``--KEY VALUE``). turnkit's queue is set wide (``--max-queue``) so that no request of the
benchmark is refused. vLLM's server renders with the folder's template and its tokenizer; turnkit encodes with its
own, from the same folder. vLLM's server runs as people run it (its periodic stats log on).

Loads, through the official ``openai`` client, greedy, streamed:

* 1, 16 and 64 concurrent streams (``--levels``), each sending ``--requests`` requests of ``--max-tokens`` tokens:
  completion tokens/s of all streams together, p50 time to first token (TTFT) and p50 inter-token latency (ITL);
* one prompt of about 4,000 tokens (a log to read), alone: its TTFT;
* ``--agents`` concurrent agent conversations of 10 turns: each turn sends the whole conversation so far (the replies
  the server gave, a tool's output, the next question), so each prompt extends the last one (prefix caching counts):
  the wall time of all turns and the p50 TTFT of a turn.

``--turnkit-src DIR`` adds a third server: ``turnkit serve`` from another source tree (its ``src`` first on the
path), e.g. a worktree of an earlier commit, so that a change is measured before and after in the same run, each
against vLLM's own server. ``--no-long`` leaves out the 4k-token prompt, ``--agents 0`` the agent conversations.

``--burst N`` adds a burst: N chat requests of ``--max-tokens`` tokens sent at once, non-streamed, timed until the last
answer (after one untimed burst of 8-token replies: vLLM's CPU build compiles its graphs for each new batch size);
refused ones (429) are counted. ``--defaults`` gives neither server a batch size nor turnkit a wide queue:
each runs as a user starts it (vLLM's own ``max_num_seqs`` on both, turnkit's default ``--max-queue``), where the other
runs give both the same ``--max-num-seqs``. ``--levels`` with no value leaves out the streaming levels.

For each level, the CPU seconds per completion token spent in each server's own process (``/proc/PID/stat``, all its
threads, not its children: vLLM's engine core runs in a child process of both), which is the front end's cost
whatever the load: turnkit's front end (its server, session, reply parser and the in-process ``AsyncLLM`` client)
against vLLM's own (its API server with the same ``AsyncLLM`` client).

Printed: each server's figures and turnkit / vLLM ratios (throughput: above 1 is turnkit faster; latency: below 1 is
turnkit faster). The issue's target: turnkit's front end costs under 5% of vLLM's throughput (ratio >= 0.95). The
load average after each round is printed beside them (a shared machine makes any single figure noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import Peer, Stats, _free_port, _level, _long_text, _pct, _Running, _stream, _wait_up

TURNS = 10


@dataclass
class Figures:
    """What one server measured."""

    levels: dict[int, Stats] = field(default_factory=dict)
    long_ttft: float = float("nan")
    agent_wall: float = float("nan")
    agent_ttft: list[float] = field(default_factory=list)
    burst_wall: float = float("nan")
    burst_refused: int = 0
    errors: list[str] = field(default_factory=list)


async def _burst(url: str, model: str, requests: int, max_tokens: int) -> tuple[float, int, list[str]]:
    """``requests`` chats sent at once, non-streamed: the wall time until the last answer, how many were refused
    (429), and the other errors."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=900)

    async def one(n: int) -> str | None:
        try:
            await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"Write a short note to colleague number {n}."}],
                max_tokens=max_tokens,
                temperature=0,
            )
        except openai.RateLimitError:
            return "refused"
        except Exception as exc:  # noqa: BLE001 - counted and reported
            return repr(exc)[:200]
        return None

    start = time.perf_counter()
    outcomes = await asyncio.gather(*(one(n) for n in range(requests)))
    wall = time.perf_counter() - start
    await client.close()
    errors = [outcome for outcome in outcomes if outcome not in (None, "refused")]
    return wall, sum(outcome == "refused" for outcome in outcomes), errors


async def _agents(url: str, model: str, conversations: int, max_tokens: int, stats: Stats) -> float:
    """``conversations`` agent loops of :data:`TURNS` turns at once; returns the wall time of all of them."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)

    async def one(c: int) -> None:
        messages = [
            {"role": "system", "content": "You are a build agent. Read each tool output and say what to do next."},
            {"role": "user", "content": f"Project {c}: the build fails. Find out why."},
        ]
        for turn in range(TURNS):
            start, first, text = time.perf_counter(), None, []
            try:
                stream = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True
                )
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        first = first if first is not None else time.perf_counter() - start
                        text.append(chunk.choices[0].delta.content)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                stats.errors.append(repr(exc)[:200])
                return
            stats.ttft.append(first if first is not None else time.perf_counter() - start)
            reply = "".join(text)
            messages.append({"role": "assistant", "content": reply})
            output = f"$ make step-{turn}\nerror {turn}: module_{c}_{turn}.c:{turn * 7}: undefined reference\n"
            messages.append({"role": "user", "content": f"Tool output:\n{output}What next?"})

    start = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(conversations)))
    wall = time.perf_counter() - start
    await client.close()
    return wall


async def _measure(url: str, model: str, pid: int, args: argparse.Namespace, long_text: str) -> Figures:
    figures = Figures()
    await _level(url, model, 2, 1, 8)  # warm up: first requests compile and fill caches on both servers
    for clients in args.levels:
        cpu = _front_cpu_seconds(pid)
        stats = await _level(url, model, clients, args.requests, args.max_tokens)
        stats.cpu = _front_cpu_seconds(pid) - cpu
        figures.levels[clients] = stats
        figures.errors += stats.errors
    if args.long:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        long_stats = Stats()
        ttft = await _stream(client, model, [{"role": "user", "content": long_text}], 8, long_stats)
        await client.close()
        figures.long_ttft = ttft if ttft is not None else float("nan")
        figures.errors += long_stats.errors
    if args.burst:
        # once untimed first: vLLM's CPU build compiles its graphs for batch sizes it has not run yet
        await _burst(url, model, args.burst, 8)
        figures.burst_wall, figures.burst_refused, errors = await _burst(url, model, args.burst, args.max_tokens)
        figures.errors += errors
    if not args.agents:
        return figures
    agent_stats = Stats()
    figures.agent_wall = await _agents(url, model, args.agents, args.agent_tokens, agent_stats)
    figures.agent_ttft = agent_stats.ttft
    figures.errors += agent_stats.errors
    return figures


def _servers(folder: Path, args: argparse.Namespace) -> list[Peer]:
    python = sys.executable
    turnkit = [python, "-m", "turnkit.cli", "serve", "--engine", "vllm", "--model", str(folder), "--no-ui"]
    turnkit += ["--model-id", "bench", "--context", str(args.max_model_len), "--vllm-arg", f"dtype={args.dtype}"]
    vllm = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--served-model-name"]
    vllm += ["bench", "--max-model-len", str(args.max_model_len), "--dtype", args.dtype]
    if not args.defaults:  # the same batch size on both, and no request of the benchmark refused by turnkit's queue
        turnkit += ["--max-batch", str(args.max_num_seqs), "--max-queue", "4096"]
        vllm += ["--max-num-seqs", str(args.max_num_seqs)]
    for item in args.vllm_arg:
        key, _, value = item.partition("=")
        turnkit += ["--vllm-arg", item]
        vllm += [f"--{key.replace('_', '-')}", value]
    peers = [Peer("turnkit/vllm", turnkit, "bench"), Peer("vllm", vllm, "bench")]
    if args.turnkit_src:  # the same command, run from the other tree's modules
        src = Path(args.turnkit_src).resolve() / "src"
        if not (src / "turnkit").is_dir():
            sys.exit(f"--turnkit-src {args.turnkit_src}: no src/turnkit there (give a turnkit checkout or worktree)")
        path = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
        peers.insert(1, Peer(f"turnkit@{src.parent.name}", list(turnkit), "bench", {"PYTHONPATH": path}))
    return peers


def _folder(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    from serve import _transformers_folder

    from turnkit.embedded import default_model_path

    return _transformers_folder(default_model_path())  # the embedded GGUF's weights and tokenizer, as a folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a Hugging Face model folder (default: the embedded model, converted)")
    parser.add_argument("--levels", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument("--requests", type=int, default=2, help="requests each stream sends per level")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--agents", type=int, default=4, help="agent conversations at once")
    parser.add_argument("--agent-tokens", type=int, default=48, help="tokens of each agent reply")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the servers taking turns in each")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--vllm-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--no-long", dest="long", action="store_false", help="leave out the 4k-token prompt")
    parser.add_argument("--burst", type=int, default=0, metavar="N", help="N chats sent at once (0: none)")
    parser.add_argument(
        "--defaults", action="store_true", help="each server's own batch size and queue, as a user starts it"
    )
    parser.add_argument(
        "--turnkit-src", metavar="DIR", help="also run turnkit serve from this checkout (e.g. an earlier commit's)"
    )
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    folder = _folder(args)
    long_text = _long_text()
    logs = Path(tempfile.mkdtemp(prefix="turnkit-bench-vllm-"))
    servers: list[_Running] = []
    try:
        for peer in _servers(folder, args):
            port = _free_port()
            peer.command += ["--port", str(port)]
            running = _Running(peer, port, logs)
            servers.append(running)
            why = _wait_up(running.url, running.process, timeout=1800)  # one start at a time: each compiles
            if why:
                sys.exit(f"{peer.name}: {why} (log: {running.log_path})")
            print(f"{peer.name}: up", flush=True)
        results: dict[str, list[Figures]] = {server.peer.name: [] for server in servers}
        loads = []
        for r in range(args.rounds):
            for server in servers if r % 2 == 0 else servers[::-1]:  # each goes first in turn
                print(f"round {r + 1}: {server.peer.name}", flush=True)
                figures = asyncio.run(_measure(server.url, server.peer.model, server.process.pid, args, long_text))
                results[server.peer.name].append(figures)
            loads.append(os.getloadavg()[0])
    finally:
        for server in servers:
            server.stop()
    _report(results, args, folder, loads)


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _front_cpu_seconds(pid: int) -> float:
    """The CPU seconds of the process ``pid``'s threads (not its children's), as the scheduler counts them in ns
    (``/proc/PID/task/*/schedstat``; ``/proc/PID/stat`` counts in ticks of 10 ms, too coarse for a short level)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _front_cpu(stats: Stats) -> float:
    """CPU seconds the front-end process spent per completion token: the server process's own time (all its threads;
    not vLLM's engine-core child process), whatever else the machine runs."""
    return stats.cpu / stats.tokens if stats.tokens else float("nan")


def _summary(rounds: list[Figures], args: argparse.Namespace) -> dict[str, float]:
    """Medians over the rounds of each figure."""
    out: dict[str, float] = {}
    for clients in args.levels:
        out[f"rate{clients}"] = _med([f.levels[clients].rate for f in rounds])
        out[f"ttft{clients}"] = _med([_pct(f.levels[clients].ttft, 0.5) for f in rounds])
        out[f"itl{clients}"] = _med([_pct(f.levels[clients].itl, 0.5) for f in rounds])
        out[f"cpu{clients}"] = _med([_front_cpu(f.levels[clients]) for f in rounds])
    out["long"] = _med([f.long_ttft for f in rounds])
    out["agent_wall"] = _med([f.agent_wall for f in rounds])
    out["agent_ttft"] = _med([_med(f.agent_ttft) for f in rounds])
    out["burst_wall"] = _med([f.burst_wall for f in rounds])
    out["burst_refused"] = _med([f.burst_refused for f in rounds])
    out["errors"] = sum(len(f.errors) for f in rounds)
    return out


def _report(results: dict[str, list[Figures]], args: argparse.Namespace, folder: Path, loads: list[float]) -> None:
    print(f"\nmodel {folder}; {os.cpu_count()} cores; load average after each round {loads}")
    sizes = "each server's own batch size and queue" if args.defaults else f"max_num_seqs {args.max_num_seqs} on both"
    print(f"medians of {args.rounds} rounds; {args.requests} requests a stream, {args.max_tokens} tokens each; {sizes}")
    print(f"{'server':<18} {'streams':>7} {'tok/s':>9} {'TTFT p50':>9} {'ITL p50':>9} {'front CPU/token':>16}")
    summaries = {name: _summary(rounds, args) for name, rounds in results.items()}
    for name, s in summaries.items():
        for clients in args.levels:
            print(
                f"{name:<18} {clients:>7} {s[f'rate{clients}']:>9.1f} {s[f'ttft{clients}']:>8.3f}s "
                f"{s[f'itl{clients}'] * 1000:>7.1f}ms {s[f'cpu{clients}'] * 1000:>14.2f}ms"
            )
        print(
            f"{name:<18} 4k-token prompt TTFT {s['long']:.3f}s; {args.agents} agents x {TURNS} turns: "
            f"{s['agent_wall']:.1f}s, turn TTFT p50 {s['agent_ttft']:.3f}s; errors {s['errors']:.0f}"
        )
        if args.burst:
            print(f"{name:<18} burst of {args.burst}: {s['burst_wall']:.1f}s, refused {s['burst_refused']:.0f}")
    theirs = summaries["vllm"]
    for name, ours in summaries.items():
        if name == "vllm":
            continue
        print(f"\n{name} / vLLM (throughput: >1 turnkit faster; times: <1 turnkit faster)")
        for clients in args.levels:
            print(
                f"  {clients:>2} streams: tok/s {_ratio(ours, theirs, f'rate{clients}'):.3f}, TTFT p50 "
                f"{_ratio(ours, theirs, f'ttft{clients}'):.3f}, ITL p50 {_ratio(ours, theirs, f'itl{clients}'):.3f}, "
                f"front CPU/token {_ratio(ours, theirs, f'cpu{clients}'):.3f}"
            )
        if args.long:
            print(f"  4k-token prompt TTFT {_ratio(ours, theirs, 'long'):.3f}")
        if args.burst:
            print(f"  burst of {args.burst}: wall {_ratio(ours, theirs, 'burst_wall'):.3f}")
        if args.agents:
            print(
                f"  agent conversations: wall {_ratio(ours, theirs, 'agent_wall'):.3f}, "
                f"turn TTFT p50 {_ratio(ours, theirs, 'agent_ttft'):.3f}"
            )


def _ratio(ours: dict[str, float], theirs: dict[str, float], key: str) -> float:
    return ours[key] / theirs[key] if theirs[key] else float("nan")


if __name__ == "__main__":
    main()
