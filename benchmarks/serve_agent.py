"""Where agents spend their time, side by side in one run: ``turnkit serve`` (llama.cpp engine, with and without its
speculative decoding) against llama.cpp's own llama-server (with and without its ngram speculation).

Usage: python benchmarks/serve_agent.py [--threads T] [--prefill-threads P] [--turns 10] [--system-tokens 4400]
       [--turn-tokens 270] [--file-tokens 2000] [--streams 16] [--repeats R] [--llama-server PATH] [--only NAME ...]
       [--loops agent edit decode] [--smoke]

Per server, on the embedded SmolLM2 GGUF with the same threads (``-t``/``-tb`` on llama-server), greedy:

* the agent loop: one conversation of ``--turns`` turns through the chat API, a ``--system-tokens`` system prompt
  (the tools and instructions an agent sends) and ``--turn-tokens`` of new text a turn (a tool's output), the reply
  kept in the history: the first turn's time to first token, and the later turns' (median), when the server reuses
  the conversation so far from its cache;
* the edit loop: a ``--file-tokens`` source file in the prompt, the reply asked to print it back with a few changes:
  the reply's tokens per second after its first token and the whole reply's time (what speculative decoding from the
  context is for);
* decode: 1 and ``--streams`` concurrent short prompts, 64 tokens each: aggregate tokens per second.

Every server gets one warm-up request first (not measured). In a round, the servers take turns request by request
(every server's agent turn 3, then every server's turn 4, ...; the order rotated each step; never two servers at
once), so a noisy second of this shared machine falls on all of them alike. Each server gets the same texts in a
round and fresh ones (their own numbers) the next, so no server reuses a cached prompt from an earlier round, and
greedy replies can be compared (turnkit's two are the same tokens). Ratios are turnkit over llama-server (times: < 1
is faster; rates: > 1 is faster), and turnkit with speculation over without; the load average is printed, since the
machine is shared. llama-server is ``--llama-server``, ``$LLAMA_SERVER`` or ``PATH`` (built from the llama.cpp that
llama-cpp-python 0.3.36 vendors, ``-DGGML_NATIVE=OFF``); its ngram speculation is ``--spec-type ngram-simple``
(``common/arg.cpp`` of that version). ``--smoke``: a few turns, a short file, 4 streams (checks the script, measures
nothing worth quoting). ``--loops edit`` runs only the edit loop. Each server has a client of its own for each part:
a dropped connection costs only that server's part (its error names the part, the request and the transport's
exception).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import openai
from serve import Peer, _client, _free_port, _ready, _Running  # the same server handling as benchmarks/serve.py

LOOPS = ("agent", "edit", "decode")


@dataclass
class Round:
    """One server's figures in one round."""

    first_turn: float = float("nan")
    later_turns: list[float] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    edit_rate: float = float("nan")
    edit_time: float = float("nan")
    edit_tokens: int = 0
    decode: dict[int, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _tokens(fmt, text: str) -> int:
    return len(fmt.encode([{"role": "user", "content": text}], add_generation_prompt=True).input_ids)


def _fill(fmt, tokens: int, line) -> str:
    """Lines ``line(n)`` until the text is about ``tokens`` tokens long."""
    lines: list[str] = []
    step = 64
    while True:
        more = [line(len(lines) + i) for i in range(step)]
        if _tokens(fmt, "".join(lines + more)) > tokens:
            if step == 1:
                return "".join(lines)
            step = max(1, step // 4)
            continue
        lines += more


def _source(fmt, tokens: int, seed: int) -> str:
    """A Python file of about ``tokens`` tokens, with names of its own (``seed``)."""

    def line(n: int) -> str:
        if n % 4 == 0:
            return f"\ndef step_{seed}_{n // 4}(value, scale={n % 7 + 1}):\n"
        if n % 4 == 1:
            return f'    """Scale value by {n % 7 + 1} and shift it by {seed % 97}."""\n'
        if n % 4 == 2:
            return f"    result = value * scale + {(seed * 31 + n) % 997}\n"
        return "    return result\n"

    return _fill(fmt, tokens, line)


async def _stream(
    client: openai.AsyncOpenAI, model: str, messages: list, max_tokens: int
) -> tuple[float, float, str, int, int]:
    """One streamed chat request: (time to first token, whole time, text, completion tokens, cached tokens)."""
    started = time.perf_counter()
    first, text, usage = None, [], None
    chunks = await client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    end = time.perf_counter()
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    cached = (getattr(details, "cached_tokens", None) or 0) if details else 0
    return (first or end) - started, end - started, "".join(text), usage.completion_tokens if usage else 0, cached


@dataclass
class Lane:
    """One server in one part of a round: its client (and connections) of its own, its figures, and the request it
    is on (for its error)."""

    name: str
    model: str
    client: openai.AsyncOpenAI
    run: Round
    stage: str = ""
    failed: bool = False


async def _round(servers: list[_Running], texts: dict, args: argparse.Namespace) -> dict[str, Round]:
    """The parts of ``--loops`` in turn, the servers **interleaved request by request** (the agent loop's turn 3 on
    every server, then turn 4 on every server, ...; never two servers at once), so a noisy second on this shared
    machine falls on every server alike instead of on one server's whole round. Each server has a client of its own
    for each part, so a part that fails on a server (its error names the part, the request and the transport's own
    exception) costs no other part or server its figures."""
    runs = {server.peer.name: Round() for server in servers}
    for part in LOOPS:
        if part not in args.loops:
            continue
        lanes = [Lane(s.peer.name, s.peer.model, _client(s.url, 3600), runs[s.peer.name], part) for s in servers]
        try:
            await PARTS[part](lanes, texts, args)
        finally:
            for lane in lanes:
                await lane.client.close()
    return runs


async def _each(lanes: list[Lane], step: int, stage: str, request: Callable[[Lane], Awaitable[None]]) -> None:
    """``request(lane)`` on every server still in the part, one after another, the order rotated by ``step`` so that
    no server always goes first (or always follows the same one); a server whose request fails records the error and
    leaves the part."""
    live = [lane for lane in lanes if not lane.failed]
    if not live:
        return
    first = step % len(live)
    for lane in live[first:] + live[:first]:
        lane.stage = stage
        try:
            await request(lane)
        except openai.OpenAIError as exc:
            cause = exc.__cause__
            why = f" ({type(cause).__name__}: {cause or 'no message'})" if cause else ""
            lane.run.errors.append(f"{stage}: {type(exc).__name__}: {exc}{why}")
            lane.failed = True


async def _agent(lanes: list[Lane], texts: dict, args: argparse.Namespace) -> None:
    histories = {lane.name: [{"role": "system", "content": texts["system"]}] for lane in lanes}
    for turn, output in enumerate(texts["turns"]):

        async def one(lane: Lane, turn: int = turn, output: str = output) -> None:
            messages = histories[lane.name]
            messages.append({"role": "user", "content": output})
            ttft, _, reply, _, cached = await _stream(lane.client, lane.model, messages, args.reply_tokens)
            messages.append({"role": "assistant", "content": reply})
            if turn == 0:
                lane.run.first_turn = ttft
            else:
                lane.run.later_turns.append(ttft)
                lane.run.cached.append(cached)

        await _each(lanes, turn, f"agent turn {turn + 1}", one)


async def _edit(lanes: list[Lane], texts: dict, args: argparse.Namespace) -> None:
    ask = "Print this file back whole, with every `scale` argument renamed to `factor`:\n\n" + texts["file"]

    async def one(lane: Lane) -> None:
        ttft, total, _, tokens, _ = await _stream(
            lane.client, lane.model, [{"role": "user", "content": ask}], args.edit_tokens
        )
        lane.run.edit_time, lane.run.edit_tokens = total, tokens
        lane.run.edit_rate = (tokens - 1) / max(1e-9, total - ttft)

    await _each(lanes, 0, "edit", one)


async def _decode(lanes: list[Lane], texts: dict, args: argparse.Namespace) -> None:
    for step, streams in enumerate((1, args.streams)):
        asks = [[{"role": "user", "content": question}] for question in texts["questions"][:streams]]

        async def one(lane: Lane, streams: int = streams, asks: list = asks) -> None:
            started = time.perf_counter()
            results = await asyncio.gather(*(_stream(lane.client, lane.model, ask, 64) for ask in asks))
            lane.run.decode[streams] = sum(r[3] for r in results) / (time.perf_counter() - started)

        await _each(lanes, step, f"decode {streams}", one)


PARTS = {"agent": _agent, "edit": _edit, "decode": _decode}


def _peers(args: argparse.Namespace, gguf: Path) -> tuple[list[tuple[Peer, int]], list[str]]:
    python = sys.executable
    peers, missing = [], []
    for name, extra in (("turnkit", []), ("turnkit no-spec", ["--spec-type", "none"])):
        port = _free_port()
        command = [python, "-m", "turnkit.cli", "serve", "--model", str(gguf), "--engine", "llama.cpp", "--no-ui"]
        command += ["--threads", str(args.threads), "--prefill-threads", str(args.prefill_threads)]
        command += ["--context", str(args.context), "--max-batch", "16", "--port", str(port), *extra]
        peers.append((Peer(name, command, "default"), port))
    binary = args.llama_server or os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if binary:
        for name, extra in (("llama-server", []), ("llama-server ngram", ["--spec-type", "ngram-simple"])):
            port = _free_port()
            command = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", "16"]
            command += ["--kv-unified", "-c", str(args.context * 4), "-t", str(args.threads)]
            command += ["-tb", str(args.prefill_threads), "--no-webui", *extra]
            peers.append((Peer(name, command, "smol"), port))
    else:
        missing.append("llama-server: give --llama-server PATH (built from llama.cpp with -DLLAMA_BUILD_SERVER=ON)")
    return peers, missing


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=max(1, cores - 1), help="decoding threads (default cores - 1)")
    parser.add_argument("--prefill-threads", type=int, default=cores, help="prompt threads (default: every core)")
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--system-tokens", type=int, default=4400)
    parser.add_argument("--turn-tokens", type=int, default=270)
    parser.add_argument("--reply-tokens", type=int, default=32)
    parser.add_argument("--file-tokens", type=int, default=2000)
    parser.add_argument("--edit-tokens", type=int, default=2200, help="the edit reply's budget")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary (else $LLAMA_SERVER, else PATH)")
    parser.add_argument("--only", nargs="*", help="run only these servers (names as printed)")
    parser.add_argument(
        "--loops", nargs="*", choices=LOOPS, default=list(LOOPS), help="run only these parts (default: all)"
    )
    parser.add_argument("--smoke", action="store_true", help="3 turns, a 300-token file, 4 streams: checks the script")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers on the way out
    if args.smoke:
        args.turns, args.system_tokens, args.turn_tokens, args.reply_tokens = 3, 600, 120, 8
        args.file_tokens, args.edit_tokens, args.streams = 300, 360, 4

    from turnkit import ChatFormat
    from turnkit.embedded import default_model_path

    gguf = default_model_path()
    fmt = ChatFormat.from_pretrained(gguf)
    peers, missing = _peers(args, gguf)
    if args.only:
        peers = [(peer, port) for peer, port in peers if peer.name in args.only]
    log_dir = Path(tempfile.mkdtemp(prefix="turnkit-bench-agent-"))
    print(
        f"{cores} cores; threads {args.threads} decoding, {args.prefill_threads} prefill; agent loop {args.turns} "
        f"turns from {args.system_tokens} tokens, {args.turn_tokens} new a turn; edit loop a {args.file_tokens}-token "
        f"file; decode 1 and {args.streams} streams; greedy; logs in {log_dir}"
    )
    print(
        "speculation: turnkit's own (drafts of up to 16 tokens from the context; 'turnkit no-spec': --spec-type none); "
        "'llama-server ngram': --spec-type ngram-simple with its defaults (a 12-token match, drafts of up to 48 "
        "tokens); every request on a new connection (benchmarks/serve.py's _client says why)"
    )
    for line in missing:
        print(f"not run: {line}")
    servers = [_Running(peer, port, log_dir) for peer, port in peers]
    results: dict[str, list[Round]] = {}
    loads = []
    seed = 0
    try:
        ready = [server for server in _ready(servers) if _warmed(server)]
        results.update((server.peer.name, []) for server in ready)
        for seed in range(1, args.repeats + 1):  # the same texts for every server in a round, fresh ones a round
            texts = {
                "system": _fill(
                    fmt, args.system_tokens, lambda n, s=seed: f"Rule {s}.{n}: tool_{n % 23} takes arg_{n}.\n"
                ),
                "turns": [
                    _fill(fmt, args.turn_tokens, lambda n, s=seed, t=t: f"out {s}-{t}-{n}: ok {n * 7 % 101}\n")
                    for t in range(args.turns)
                ],
                "file": _source(fmt, args.file_tokens, seed),
                "questions": [f"Question {seed}-{n}: tell me about the number {n * 37}." for n in range(args.streams)],
            }
            loads.append(os.getloadavg()[0])
            for name, run in asyncio.run(_round(ready, texts, args)).items():
                results[name].append(run)
            print(f"  round {seed} done", flush=True)
        loads.append(os.getloadavg()[0])
    finally:
        for server in servers:
            server.stop()
    _report(results, loads, args)


def _warmed(server: _Running) -> bool:
    """One short request before the rounds (not measured): what a server builds on its first request is no round's
    cost. False, with a ``not run`` line naming its log, when it fails."""

    async def ask() -> None:
        client = _client(server.url, 600)
        try:
            await _stream(client, server.peer.model, [{"role": "user", "content": "Say hello."}], 8)
        finally:
            await client.close()

    try:
        asyncio.run(ask())
    except openai.OpenAIError as exc:
        print(f"not run: {server.peer.name}: its warm-up request failed: {exc} (log: {server.log_path})")
        return False
    return True


def _report(results: dict[str, list[Round]], loads: list[float], args: argparse.Namespace) -> None:
    def med(runs: list[Round], pick) -> float:
        return statistics.median(pick(run) for run in runs)

    picks = {
        "turn 1 TTFT": lambda r: r.first_turn,
        "later TTFT": lambda r: statistics.median(r.later_turns) if r.later_turns else float("nan"),
        "edit tok/s": lambda r: r.edit_rate,
        "edit time": lambda r: r.edit_time,
        "decode 1": lambda r: r.decode.get(1, float("nan")),
        f"decode {args.streams}": lambda r: r.decode.get(args.streams, float("nan")),
    }
    print(f"\nload average (1 min) at each round's start and the end: {', '.join(f'{x:.1f}' for x in loads)}")
    print(f"{'server':<20}" + "".join(f"{label:>13}" for label in picks) + f"{'edit tokens':>12}{'err':>5}")
    for name, runs in results.items():
        row = "".join(f"{med(runs, pick):>13.2f}" for pick in picks.values())
        print(f"{name:<20}{row}{med(runs, lambda r: r.edit_tokens):>12.0f}{sum(len(r.errors) for r in runs):>5}")
        for error in [e for r in runs for e in r.errors][:2]:
            print("      ", error)
    pairs = [
        ("turnkit", "llama-server"),
        ("turnkit", "llama-server ngram"),
        ("turnkit", "turnkit no-spec"),
        ("turnkit no-spec", "llama-server"),
    ]
    print("\nratios (times: < 1 is faster; tok/s: > 1 is faster):")
    for mine, peer in pairs:
        if results.get(mine) and results.get(peer):
            shares = {label: med(results[mine], pick) / med(results[peer], pick) for label, pick in picks.items()}
            ratios = "  ".join(f"{label} {share:.2f}" for label, share in shares.items() if share == share)  # not nan
            print(f"  {mine} / {peer}: {ratios}")


if __name__ == "__main__":
    main()
