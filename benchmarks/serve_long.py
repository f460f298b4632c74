"""Long prompts, side by side in one run: ``turnkit serve`` (llama.cpp engine) against llama.cpp's own llama-server.

Usage: python benchmarks/serve_long.py [--threads T] [--prefill-threads P] [--context C] [--kv-tokens K]
       [--conversations N] [--prompt-tokens 4000] [--long-tokens 10000] [--max-tokens 32] [--repeats R]
       [--llama-server PATH] [--only NAME ...] [--parts 4k long many]

What agents send: prompts of thousands of tokens, many at once. Per server, on the embedded SmolLM2 GGUF with the same
threads (``--threads`` decoding, ``--prefill-threads`` for prompts; llama-server's ``-t`` and ``-tb``), the same
context (``--context``, default 16,384: past the model's trained 8,192, so both RoPE-scale with YaRN) and the same
unified key/value cache of ``--kv-tokens`` shared by 16 slots:

* time to first token (TTFT) of one ~4,000-token prompt, then of one ~10,000-token prompt, each alone on the server:
  the prefill rate a single agent call sees;
* 16 concurrent ~4,000-token conversations (``--conversations``): wall time, prompt tokens per second, TTFT p50 and
  max, errors.

Every server first answers one short request (llama-server warms its model up when it starts; turnkit's first request
pays about 0.2 s of first use in the server's Python, not in llama.cpp). ``--parts 4k`` times only the lone
~4,000-token prompt (a minute and a half with ``--repeats 3`` on a quiet machine; the whole run takes about 25). Every
prompt is fresh (its own numbers throughout), so no server reuses a cached prefix. Figures are medians over
``--repeats`` rounds, servers interleaved within a round; the load average is printed, since the machine is shared.
The peer is llama.cpp's ``llama-server`` (``--llama-server``, ``$LLAMA_SERVER`` or ``PATH``), built from the llama.cpp
that llama-cpp-python 0.3.36 vendors (the same kernels as turnkit's engine); without it, llama-cpp-python's own
server (the ``bench`` extra) is the peer, which runs one sequence at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai
from serve import Peer, _client, _free_port, _ready, _Running  # the same server handling as benchmarks/serve.py

TRAINED_CONTEXT = 8192
#: The parts of a round (``--parts``): the lone ~4k prompt, the lone long one, the concurrent conversations.
PARTS = ("4k", "long", "many")


@dataclass
class Round:
    """One server's figures in one round."""

    ttft_4k: float = float("nan")
    ttft_long: float = float("nan")
    prompt_4k: int = 0
    prompt_long: int = 0
    wall: float = float("nan")
    ttfts: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    errors: list[str] = field(default_factory=list)


def _prompt(fmt, tokens: int, seed: int) -> str:
    """A log to read, about ``tokens`` tokens as the chat template renders it, with numbers of its own (``seed``)."""
    head = f"Log {seed}: read it and say which machine failed first.\n"
    lines, n = [head], 0
    step = 200
    while True:
        chunk = [f"{seed}-{n + i:05d} machine-{(seed + n + i) * 7 % 997} load {(n + i) % 13}\n" for i in range(step)]
        text = "".join(lines + chunk)
        count = len(fmt.encode([{"role": "user", "content": text}], add_generation_prompt=True).input_ids)
        if count > tokens:
            if step == 1:
                return "".join(lines)
            step = max(1, step // 4)
            continue
        lines += chunk
        n += step


async def _ask(client: openai.AsyncOpenAI, model: str, text: str, max_tokens: int, run: Round) -> tuple[float, int]:
    """One streamed request: (TTFT, prompt tokens); errors go to ``run.errors``."""
    started = time.perf_counter()
    first, prompt = None, 0
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": text}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if first is None and chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason):
                first = time.perf_counter() - started
            if getattr(chunk, "usage", None):
                prompt = chunk.usage.prompt_tokens
    except Exception as exc:  # noqa: BLE001 - counted and reported
        run.errors.append(repr(exc)[:200])
        return float("nan"), 0
    return (first if first is not None else float("nan")), prompt


async def _warm(url: str, model: str) -> None:
    """One short request, so no server's first timed request pays for its first use (llama-server warms its model
    up when it starts; turnkit's first request takes about 0.2 s more than later ones, outside llama.cpp)."""
    client = _client(url, 600)
    await _ask(client, model, "Say hello.", 4, Round())
    await client.close()


async def _round(url: str, model: str, texts: dict[str, list[str]], max_tokens: int) -> Round:
    run = Round()
    client = _client(url, 3600)
    if texts["4k"]:
        run.ttft_4k, run.prompt_4k = await _ask(client, model, texts["4k"][0], max_tokens, run)
    if texts["long"]:
        run.ttft_long, run.prompt_long = await _ask(client, model, texts["long"][0], max_tokens, run)
    if texts["many"]:
        started = time.perf_counter()
        results = await asyncio.gather(*(_ask(client, model, text, max_tokens, run) for text in texts["many"]))
        run.wall = time.perf_counter() - started
        run.ttfts = [ttft for ttft, _ in results]
        run.prompt_tokens = sum(prompt for _, prompt in results)
    await client.close()
    return run


def _peers(args: argparse.Namespace, gguf: Path) -> tuple[list[tuple[Peer, int]], list[str]]:
    python = sys.executable
    peers, missing = [], []
    port = _free_port()
    turnkit = [python, "-m", "turnkit.cli", "serve", "--model", str(gguf), "--engine", "llama.cpp", "--no-ui"]
    turnkit += ["--threads", str(args.threads), "--prefill-threads", str(args.prefill_threads)]
    turnkit += ["--context", str(args.context), "--kv-tokens", str(args.kv_tokens), "--max-batch", "16"]
    turnkit += ["--queue-timeout", "0", "--port", str(port)]
    peers.append((Peer("turnkit", turnkit, "default"), port))
    binary = args.llama_server or os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if binary:
        port = _free_port()
        command = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", "16", "--kv-unified"]
        command += ["-c", str(args.kv_tokens), "-t", str(args.threads), "-tb", str(args.prefill_threads)]
        command += ["--no-webui"]  # its own batch sizes (2,048 / 512); turnkit reads a lone prompt 512 tokens a step
        if args.context > TRAINED_CONTEXT:
            command += ["--rope-scaling", "yarn", "--rope-scale", f"{args.context / TRAINED_CONTEXT:g}"]
            command += ["--yarn-orig-ctx", str(TRAINED_CONTEXT)]
        peers.append((Peer("llama-server", command, "smol"), port))
    else:
        missing.append("llama-server: give --llama-server PATH (built from llama.cpp with -DLLAMA_BUILD_SERVER=ON)")
        if all(importlib.util.find_spec(m) for m in ("llama_cpp", "sse_starlette", "pydantic_settings")):
            port = _free_port()
            command = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--n_threads", str(args.threads)]
            command += ["--n_threads_batch", str(args.prefill_threads), "--n_ctx", str(args.context)]
            command += ["--port", str(port), "--model_alias", "smol"]
            if args.context > TRAINED_CONTEXT:
                command += ["--rope_scaling_type", "2", "--rope_freq_scale", f"{TRAINED_CONTEXT / args.context:g}"]
                command += ["--yarn_orig_ctx", str(TRAINED_CONTEXT)]
            peers.append((Peer("llama-cpp-python", command, "smol"), port))
    return peers, missing


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=max(1, cores - 1), help="decoding threads (default cores - 1)")
    parser.add_argument("--prefill-threads", type=int, default=cores, help="prompt threads (default: every core)")
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--kv-tokens", type=int, default=81920, help="the cache shared by 16 slots (default 80k)")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--long-tokens", type=int, default=10000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary (else $LLAMA_SERVER, else PATH)")
    parser.add_argument("--only", nargs="*", help="run only these servers (names as printed)")
    parser.add_argument(
        "--parts", nargs="*", choices=PARTS, default=list(PARTS), help="run only these parts (default: all)"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers on the way out

    from turnkit import ChatFormat
    from turnkit.embedded import default_model_path

    gguf = default_model_path()
    fmt = ChatFormat.from_pretrained(gguf)
    peers, missing = _peers(args, gguf)
    if args.only:
        peers = [(peer, port) for peer, port in peers if peer.name in args.only]
    log_dir = Path(tempfile.mkdtemp(prefix="turnkit-bench-long-"))
    print(
        f"{cores} cores; threads {args.threads} decoding, {args.prefill_threads} prefill; context {args.context}; "
        f"cache {args.kv_tokens} tokens, 16 slots; {args.max_tokens} max tokens, greedy; logs in {log_dir}"
    )
    for line in missing:
        print(f"not run: {line}")
    servers = [_Running(peer, port, log_dir) for peer, port in peers]
    results: dict[str, list[Round]] = {}
    loads = []
    seed = 0
    try:
        ready = _ready(servers)
        for server in ready:
            asyncio.run(_warm(server.url, server.peer.model))
        results.update((server.peer.name, []) for server in ready)
        for _ in range(args.repeats):
            for server in ready:
                seed += 1
                texts = {
                    "4k": [_prompt(fmt, args.prompt_tokens, seed * 100)] if "4k" in args.parts else [],
                    "long": [_prompt(fmt, args.long_tokens, seed * 100 + 1)] if "long" in args.parts else [],
                    "many": [_prompt(fmt, args.prompt_tokens, seed * 100 + 2 + n) for n in range(args.conversations)]
                    if "many" in args.parts
                    else [],
                }
                loads.append(os.getloadavg()[0])
                run = asyncio.run(_round(server.url, server.peer.model, texts, args.max_tokens))
                results[server.peer.name].append(run)
                print(f"  {server.peer.name}: round done (lone prompt TTFT {run.ttft_4k:.1f} s)", flush=True)
        loads.append(os.getloadavg()[0])
    finally:
        for server in servers:
            server.stop()
    _report(results, loads, args)


def _report(results: dict[str, list[Round]], loads: list[float], args: argparse.Namespace) -> None:
    def med(runs: list[Round], pick) -> float:
        return statistics.median(pick(run) for run in runs)

    print(f"\nload average (1 min) at each server's round start and the end: {', '.join(f'{x:.1f}' for x in loads)}")
    nan = float("nan")
    short, long, many = f"{args.prompt_tokens / 1000:g}k", f"{args.long_tokens / 1000:g}k", args.conversations
    print(
        f"{'server':<17} {f'{short} TTFT':>8} {'tok/s':>6} {f'{long} TTFT':>9} {'tok/s':>6} "
        f"{f'{many}x{short} wall':>12} {'prompt tok/s':>12} {'TTFT p50':>9} {'max':>7} {'err':>4}"
    )
    for name, runs in results.items():
        print(
            f"{name:<17} {_cell(med(runs, lambda r: r.ttft_4k), 7, '.1f', 's')} "
            f"{_cell(med(runs, lambda r: r.prompt_4k / r.ttft_4k), 6, '.0f')} "
            f"{_cell(med(runs, lambda r: r.ttft_long), 8, '.1f', 's')} "
            f"{_cell(med(runs, lambda r: r.prompt_long / r.ttft_long), 6, '.0f')} "
            f"{_cell(med(runs, lambda r: r.wall), 11, '.0f', 's')} "
            f"{_cell(med(runs, lambda r: r.prompt_tokens / r.wall), 12, '.0f')} "
            f"{_cell(med(runs, lambda r: statistics.median(r.ttfts or [nan])), 8, '.1f', 's')} "
            f"{_cell(med(runs, lambda r: max(r.ttfts or [nan])), 6, '.0f', 's')} "
            f"{sum(len(r.errors) for r in runs):>4}"
        )
        for error in [e for r in runs for e in r.errors][:2]:
            print("      ", error)
    mine, peer = results.get("turnkit"), next((results[n] for n in results if n != "turnkit"), None)
    if mine and peer:
        print("\nratios (turnkit / peer; < 1 is faster for TTFT and wall, > 1 is faster for tok/s):")
        for label, pick in (
            (f"{short} TTFT", lambda r: r.ttft_4k),
            (f"{long} TTFT", lambda r: r.ttft_long),
            (f"{many}x{short} wall", lambda r: r.wall),
            ("prompt tok/s", lambda r: r.prompt_tokens / r.wall),
        ):
            ratio = med(mine, pick) / med(peer, pick)
            if ratio == ratio:  # not nan: the part ran (--parts)
                print(f"  {label}: {ratio:.2f}")


def _cell(value: float, width: int, spec: str, unit: str = "") -> str:
    """A table cell: the value and its unit, or "-" for a part not run (--parts), in the column's width."""
    return f"{value:>{width}{spec}}{unit}" if value == value else f"{'-':>{width + len(unit)}}"


if __name__ == "__main__":
    main()
