"""Reply parsing cost per token, for replies of about 1k, 4k and 16k tokens with reasoning and tool calls.

Usage: python benchmarks/parse.py [--rounds R]

Each reply is streamed token by token (``feed([id])``, what a server does) with a stop string set, and parsed in one
call (``parse(ids)``). Targets: under 5 µs per token (median), and the 16k reply costs at most 4.5x the 4k one (the
work is linear in the reply: nothing is re-parsed per token).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import smollm2_tokenizer_folder, tokenizer_with_markers

from turnkit import ChatFormat

WORDS = "the weather in paris is mild today so a light jacket will do and the museums open at nine".split()


def reply_text(tokens: int, rng: random.Random) -> str:
    """Reasoning, content and tool calls, about ``tokens`` tokens long (one word is about one token)."""

    def words(count: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(count))

    parts = ["<think>\n", words(int(tokens * 0.4)), "\n</think>\n\n", words(int(tokens * 0.4))]
    calls = max(1, tokens // 400)
    for n in range(calls):
        arguments = {"city": "Paris", "notes": words(int(tokens * 0.2 / calls / 2)), "n": n}
        parts.append("\n<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": arguments}) + "\n</tool_call>")
    parts.append("<|im_end|>")
    return "".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    tokenizer = tokenizer_with_markers(
        smollm2_tokenizer_folder(), ["<tool_call>", "</tool_call>", "<think>", "</think>"]
    )
    fmt = ChatFormat.from_family("qwen2.5", tokenizer=tokenizer)
    rng = random.Random(0)
    fmt.parse(fmt.tokenizer.encode("warm up: build the byte table once").ids)
    results = {}
    print(f"{'reply':>8} {'tokens':>7} {'stream µs/token':>16} {'parse µs/token':>15} {'tool calls':>11}")
    for size in (1000, 4000, 16000):
        ids = fmt.tokenizer.encode(reply_text(size, rng)).ids
        stream, whole = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            stream_parser = fmt.stream_parser(stop=["never appears in the reply"], reply_format="qwen3", call_id=str)
            for token in ids:
                stream_parser.feed((token,))
            reply = stream_parser.finish()
            stream.append((time.perf_counter() - start) / len(ids) * 1e6)
            start = time.perf_counter()
            parsed = fmt.parse(ids, stop=["never appears in the reply"], reply_format="qwen3", call_id=str)
            whole.append((time.perf_counter() - start) / len(ids) * 1e6)
        assert parsed == reply and all(c.status == "ok" for c in reply.tool_calls) and reply.reasoning_content
        results[size] = (len(ids), statistics.median(stream), statistics.median(whole))
        print(
            f"{size:>8} {len(ids):>7} {results[size][1]:>16.2f} {results[size][2]:>15.2f} {len(reply.tool_calls):>11}"
        )
    t4 = results[4000][0] * results[4000][1]
    t16 = results[16000][0] * results[16000][1]
    print(f"\nstreaming: median {max(r[1] for r in results.values()):.2f} µs/token at worst (target < 5)")
    print(f"16k reply / 4k reply total time: {t16 / t4:.2f} (target <= 4.5; linear is about 4)")


if __name__ == "__main__":
    main()
