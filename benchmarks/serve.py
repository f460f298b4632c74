"""Serving throughput: 1, 4 and 16 concurrent streaming clients (the official ``openai`` client) against
``turnkit serve`` on the embedded model, and the same prompts through ``model.generate`` directly, in one run.

Usage: python benchmarks/serve.py [--requests N] [--max-tokens T] [--threads K]

Prints aggregate completion tokens/s, p50/p99 time to first token and errors per level of concurrency. Targets:
single-client tokens/s at least 0.9x direct generate; 4 clients at least 2x the single-client aggregate; no errors.
Both sides use the same number of torch threads (default 1 on this 2-core machine: the other core runs HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _client(client: openai.AsyncOpenAI, prompts: list[str], max_tokens: int, stats: dict) -> None:
    for question in prompts:
        start = time.perf_counter()
        first = None
        try:
            stream = await client.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": question}],
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - start
                if chunk.usage:
                    stats["tokens"] += chunk.usage.completion_tokens
            stats["ttft"].append(first if first is not None else time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            stats["errors"].append(repr(exc))


async def _level(url: str, clients: int, requests_each: int, max_tokens: int) -> dict:
    stats: dict = {"tokens": 0, "ttft": [], "errors": []}
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    start = time.perf_counter()
    await asyncio.gather(
        *(
            _client(client, [QUESTIONS[(c + r) % len(QUESTIONS)] for r in range(requests_each)], max_tokens, stats)
            for c in range(clients)
        )
    )
    stats["wall"] = time.perf_counter() - start
    await client.close()
    return stats


def _direct(threads: int, requests: int, max_tokens: int) -> float:
    import torch

    from turnkit import ChatFormat
    from turnkit.embedded import default_model_path
    from turnkit.serve.torch_backend import TorchBackend

    torch.set_num_threads(threads)
    path = default_model_path()
    backend = TorchBackend.load(path, threads=threads)
    model = backend.model
    backend.close()
    fmt = ChatFormat.from_pretrained(path)
    eos = list(fmt.stop_ids)
    tokens, elapsed = 0, 0.0
    for n in range(requests):
        ids = fmt.encode([{"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]}], add_generation_prompt=True)
        prompt = torch.tensor([ids.input_ids.tolist()])
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos)
        elapsed += time.perf_counter() - start
        tokens += out.shape[1] - prompt.shape[1]
    return tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    direct = _direct(args.threads, 8, args.max_tokens)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "turnkit.cli", "serve", "--port", str(port), "--threads", str(args.threads)]
    server = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    try:
        for _ in range(480):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        asyncio.run(_level(url, 1, 1, 8))  # warm up
        print(f"direct model.generate: {direct:.1f} tokens/s ({args.threads} torch threads)\n")
        print(f"{'clients':>7} {'tokens/s':>9} {'p50 TTFT ms':>12} {'p99 TTFT ms':>12} {'errors':>7}")
        results = {}
        for clients in (1, 4, 16):
            stats = asyncio.run(_level(url, clients, args.requests, args.max_tokens))
            rate = stats["tokens"] / stats["wall"]
            ttft = sorted(stats["ttft"]) or [float("nan")]
            p99 = ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))]
            results[clients] = rate
            print(
                f"{clients:>7} {rate:>9.1f} {statistics.median(ttft) * 1000:>12.0f} {p99 * 1000:>12.0f} "
                f"{len(stats['errors']):>7}"
            )
            for error in stats["errors"][:3]:
                print("   ", error)
        print(f"\nsingle client / direct generate = {results[1] / direct:.2f} (target >= 0.9)")
        print(f"4 clients / single client = {results[4] / results[1]:.2f} (target >= 2.0)")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
