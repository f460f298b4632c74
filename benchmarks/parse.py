"""Reply parsing cost per token, per reply syntax, for replies of about 1k to 16k tokens.

Usage: python benchmarks/parse.py [--rounds R] [--sizes 1000,4000,16000] [--formats qwen3,hermes,...]

For each format of the catalog (one per syntax), a reply of about N tokens is written in that syntax: reasoning
(when the format has any), content, and tool calls whose string arguments are long (they stream as they are
written). It is tokenized by the SmolLM2 tokenizer holding the format's markers as tokens, then streamed one token per
``feed`` (what a server does). Printed per size: µs per token (median over rounds, in CPU time of this process, so
that other work on a shared machine counts less), the same relative to the reference measured in the same run
(turning the ids into text alone, ``TextDecoder``: the floor any parser pays), and, per format, the largest reply's
cost per token over the smallest's (linear work keeps it near 1.0). Targets: under 5 µs per token; the ratio under
1.5. The load average is printed: CPU time still varies with it (caches are shared).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import marker_tokenizer

from turnkit import ChatFormat
from turnkit.parse import REPLY_FORMATS, Arguments, Hole, Lit, ReplyFormat, ToolSyntax
from turnkit.parse.reading.detokenize import TextDecoder
from turnkit.tokenizer import TokenizerBinding

WORDS = "the weather in paris is mild today so a light jacket will do and the museums open at nine".split()
FORMATS = (
    "qwen3", "qwen3_coder", "glm45", "llama3", "mistral", "deepseek_v31", "deepseek_v32", "kimi_k2", "minimax_m2",
    "pythonic", "gemma4", "cohere", "harmony",
)  # fmt: skip
END = "<|im_end|>"


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _arguments(spec: Arguments, name: str, arguments: dict[str, Any]) -> str:
    if spec.encoding == "json":
        return json.dumps(arguments)
    if spec.encoding == "json_call":
        body = {name: arguments} if spec.name_as_key else {spec.name_key: name, spec.keys[0]: arguments}
        return json.dumps(body)
    if spec.encoding == "python":
        return ", ".join(f"{key}={value!r}" for key, value in arguments.items())
    if spec.encoding == "gemma":
        return "{" + ",".join(f"{k}:{spec.quote}{v}{spec.quote}" for k, v in arguments.items()) + "}"
    if spec.encoding == "xml":
        return "".join(f"{spec.quote}<{k}>{_value(v)}{spec.quote}</{k}>" for k, v in arguments.items())
    out = []
    for key, value in arguments.items():
        for element in spec.param:
            if isinstance(element, Lit):
                out.append(element.text)
            elif element.kind == "key":
                out.append(key)
            elif element.kind == "type":
                out.append(spec.raw_types[0] if isinstance(value, str) else "false")
            else:
                out.append(_value(value))
    return "".join(out)


def written(syntax: ToolSyntax, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Calls written in ``syntax`` (its literals, the names, ids and arguments filled in)."""
    out = [syntax.block[0]] if syntax.block else []
    for n, (name, arguments) in enumerate(calls):
        if n:
            out.append(syntax.separator)
        for element in syntax.call:
            if isinstance(element, Lit):
                out.append(element.text)
            elif isinstance(element, Arguments):
                out.append(_arguments(element, name, arguments))
            elif isinstance(element, Hole):
                holes = {"name": name, "named_id": f"functions.{name}:{n}", "id": f"call{n:05d}"}
                out.append(holes.get(element.kind, ""))
    if syntax.block:
        out.append(syntax.block[1])
    return "".join(out)


def reply_text(fmt: ReplyFormat, tokens: int, rng: random.Random) -> str:
    """About ``tokens`` tokens (a word is about one token): reasoning, content, tool calls with long strings."""
    reasoning, content = _words(rng, int(tokens * 0.4)), _words(rng, int(tokens * 0.4))
    calls = [("get_weather", {"city": "Paris", "notes": _words(rng, int(tokens * 0.2 / 4))}) for _ in range(4)]
    if fmt.channels is not None:  # Harmony: headed messages
        parts = [f"<|channel|>analysis<|message|>{reasoning}<|end|>"]
        parts.append(f"<|start|>assistant<|channel|>commentary<|message|>{content}<|end|>")
        for name, arguments in calls:
            parts.append(f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>")
            parts.append(json.dumps(arguments) + "<|call|>")
        return "".join(parts)
    text = f"{fmt.reasoning.start}\n{reasoning}\n{fmt.reasoning.end}\n\n" if fmt.reasoning else ""
    syntax = fmt.tools[0]
    if syntax.bare:  # calls only at the reply's start: the reply is the calls (content made into a longer string)
        calls = [(name, {**arguments, "notes": f"{arguments['notes']} {content}"}) for name, arguments in calls]
        return text + written(syntax, calls) + END
    return text + content + "\n" + written(syntax, calls) + END


def _measure(fmt: ChatFormat, spec: ReplyFormat, ids: list[int], rounds: int) -> tuple[float, float]:
    """Median µs per token: the parser streamed one token at a time, and the byte decoding alone (the reference)."""
    parse, decode = [], []
    binding = fmt.tokenizer
    for _ in range(rounds + 1):  # the first round warms up (and is left out)
        start = time.process_time()
        decoder = TextDecoder(binding.byte_table, binding.backend)
        for token in ids:
            decoder.feed(token)
        decode.append((time.process_time() - start) / len(ids) * 1e6)
        start = time.process_time()
        parser = fmt.stream_parser(reply_format=spec, call_id=str)
        for token in ids:
            parser.feed((token,))
        reply = parser.finish()
        parse.append((time.process_time() - start) / len(ids) * 1e6)
    parse, decode = parse[1:], decode[1:]
    if spec.reads_tools:
        assert len(reply.tool_calls) == 4 and reply.ok, (spec.name, reply.tool_calls[:1])
    return statistics.median(parse), statistics.median(decode)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="1000,2000,4000,8000,16000")
    parser.add_argument("--formats", default=",".join(FORMATS))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    print(f"{'format':<14} {'tokens':>7} {'µs/token':>9} {'x decode':>9}")
    worst, ratios = 0.0, {}
    rng = random.Random(0)
    for name in args.formats.split(","):
        spec = REPLY_FORMATS[name].ending_with((END,))
        # the format's markers as single tokens (not its punctuation: ``[`` and ``,`` are ordinary tokens)
        markers = tuple(sorted({*(m for m in spec.markers if any(c.isalpha() for c in m)), END}))
        binding = TokenizerBinding.from_any(marker_tokenizer(markers))
        fmt = ChatFormat.from_template("{{ messages[0].content }}", eos_token=END).with_tokenizer(binding)
        per_size = {}
        for size in sizes:
            ids = binding.encode(reply_text(spec, size, rng)).ids
            cost, floor = _measure(fmt, spec, ids, args.rounds)
            per_size[size] = cost
            worst = max(worst, cost)
            print(f"{name:<14} {len(ids):>7} {cost:>9.2f} {cost / floor:>9.1f}")
        ratios[name] = per_size[sizes[-1]] / per_size[sizes[0]]
    print(f"\nworst median: {worst:.2f} µs/token (target < 5)")
    print("cost per token, largest reply over smallest (linear is about 1.0; target < 1.5):")
    print("  " + ", ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items()))


if __name__ == "__main__":
    main()
